"""The ``reasoning_gym`` data source: reasoning-gym items as verl-format rows.

Each task's rows are drawn from its procedural generator (``create_dataset(task, seed, ...)``,
item by item). Train and test never share a question: a question belongs to the test half when a
hash of its task and text falls in one fifth of the space, whatever the seed or size, so any
training set and any validation set are disjoint (as for rlcore's ``synthetic:`` tasks). A
mixture gives each task a share of ``size`` by weight (largest remainders), and every row names
its task in ``data_source`` (``reasoning_gym/TASK``), so ``[data] source_weights`` and
``[reward.routes]`` work on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from hashlib import sha1
from typing import Any

from loguru import logger

from rlcore.errors import RlcoreError
from rlcore_reasoning_gym.options import ReasoningGymSourceOptions

PREFIX = "reasoning_gym/"
TEST_EVERY = 5  # one question in TEST_EVERY belongs to the test split
_ATTEMPTS_PER_ROW = 30  # distinct questions looked for before a small question space is accepted


def in_split(task: str, question: str, split: str) -> bool:
    is_test = int(sha1(f"{task}\n{question}".encode()).hexdigest()[:8], 16) % TEST_EVERY == 0
    return is_test == (split == "test")


def shares(total: int, weights: dict[str, float]) -> dict[str, int]:
    """``total`` split in proportion to ``weights`` by largest remainders (sums to ``total``)."""
    whole = sum(weights.values())
    exact = {k: total * w / whole for k, w in weights.items()}
    out = {k: math.floor(v) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: (out[k] - exact[k], k))[: total - sum(out.values())]:
        out[k] += 1
    return out


def task_seed(seed: int, task: str, index: int) -> int:
    """Each task of a mixture gets its own seed, so adding a task does not change another's items."""
    return (seed * 1_000_003 + int(sha1(task.encode()).hexdigest()[:8], 16) + index) % (2**32)


@dataclass
class ReasoningGymSource:
    options: ReasoningGymSourceOptions

    def rows(self, role: str) -> list[dict[str, Any]]:
        import reasoning_gym

        o = self.options
        split = o.split or ("test" if role == "val" else "train")
        counts = shares(o.size, {name: entry["weight"] for name, entry in o.tasks.items()})
        rows: list[dict[str, Any]] = []
        for task, count in counts.items():
            if count == 0:
                continue
            config = {k: v for k, v in o.tasks[task].items() if k != "weight"}
            budget = _ATTEMPTS_PER_ROW * count + 100
            dataset = reasoning_gym.create_dataset(
                task, seed=task_seed(o.seed, task, 0), size=budget, **config
            )
            found, seen, repeats = [], set(), 0
            for index in range(budget):
                entry = dataset[index]
                question = entry["question"]
                if not in_split(task, question, split) or question in seen:
                    continue
                seen.add(question)
                found.append((index, entry))
                if len(found) == count:
                    break
            if not found:
                raise RlcoreError(
                    f"reasoning_gym task {task!r} gave no question of the {split} split in {budget} tries; "
                    "widen its options (the question space is too small to split)"
                )
            if len(found) < count:  # a small question space: repeat what there is, and say so
                repeats = count - len(found)
                found += [found[i % len(found)] for i in range(repeats)]
                logger.warning(
                    "reasoning_gym task {!r} has only {} distinct {} questions with these options; {} rows repeat one",
                    task,
                    len(found) - repeats,
                    split,
                    repeats,
                )
            for position, (index, entry) in enumerate(found):
                rows.append(self._row(task, config, entry, index, position, split))
        return rows

    def _row(
        self, task: str, config: dict[str, Any], entry: dict[str, Any], index: int, position: int, split: str
    ) -> dict[str, Any]:
        o = self.options
        text = entry["question"] + (f"\n{o.instruction}" if o.instruction else "")
        messages = ([{"role": "system", "content": o.system_prompt}] if o.system_prompt else []) + [
            {"role": "user", "content": text}
        ]
        answer = entry.get("answer")
        return {
            "data_source": PREFIX + task,
            "prompt": messages,
            "ability": "reasoning",
            "reward_model": {"style": "rule", "ground_truth": "" if answer is None else str(answer)},
            "extra_info": {
                "split": split,
                "index": position,
                "reasoning_gym": {
                    "task": task,
                    "item": index,
                    "seed": task_seed(o.seed, task, 0),
                    "config": config,
                    "entry": entry,
                },
            },
        }


def build(options: ReasoningGymSourceOptions, context: Any = None) -> ReasoningGymSource:
    return ReasoningGymSource(options)
