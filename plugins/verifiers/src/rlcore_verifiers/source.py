"""The ``verifiers`` data source: an environment's tasks as verl-format rows.

Each task becomes one row: its system prompt and prompt as chat messages, ``data_source``
``verifiers/<env>`` (so ``[data] source_weights`` and ``[reward.routes]`` work on it), and in
``extra_info.verifiers`` the environment (canonical spec and options) and the task's own data, from
which the reward and the agent loop rebuild the task in any process. verifiers tasksets have no
train/test split of their own: give ``data.val`` other taskset options (a ``split`` option, if the
taskset has one) or another ``skip``/``limit`` window.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from rlcore.errors import RlcoreError
from rlcore_verifiers.options import VerifiersSourceOptions
from rlcore_verifiers.traces import KEY

PREFIX = "verifiers/"


def prompt_messages(data: Any) -> list[dict[str, Any]]:
    """A task's opening messages as OpenAI-style dicts: its system prompt, then its prompt."""
    out: list[dict[str, Any]] = []
    if data.system_prompt:
        out.append({"role": "system", "content": data.system_prompt})
    if isinstance(data.prompt, str):
        out.append({"role": "user", "content": data.prompt})
    else:
        out.extend(m.model_dump(mode="json", exclude_none=True) for m in data.prompt or [])
    return out


@dataclass
class VerifiersSource:
    options: VerifiersSourceOptions
    manifest_dir: str | None = None

    def rows(self, role: str) -> list[dict[str, Any]]:
        from rlcore_verifiers import envs

        o = self.options
        loaded = envs.load(o.env, o.taskset_options, o.env_options, self.manifest_dir)
        taskset = loaded.taskset()
        if o.shuffle:
            taskset = taskset.shuffle(o.shuffle_seed)
        tasks = itertools.islice(iter(taskset), o.skip, None if o.limit is None else o.skip + o.limit)
        label = PREFIX + loaded.classes.ref.label
        rows = []
        for position, task in enumerate(tasks):
            if task.data.prompt is None:
                raise RlcoreError(
                    f"verifiers environment {o.env!r}, task {task.data.idx}: it has no prompt (the user opens the "
                    "conversation); rlcore starts every episode from the row's prompt"
                )
            rows.append(
                {
                    "data_source": label,
                    "prompt": prompt_messages(task.data),
                    "ability": "verifiers",
                    "reward_model": {"style": "verifiers", "ground_truth": ""},
                    "extra_info": {
                        "split": role,
                        "index": position,
                        KEY: {
                            "env": o.env,
                            "taskset_options": o.taskset_options,
                            "env_options": o.env_options,
                            "task": task.data.model_dump(
                                mode="json", exclude_none=True, exclude_defaults=True
                            ),
                        },
                    },
                }
            )
        if not rows:
            raise RlcoreError(
                f"verifiers environment {o.env!r} gave no task (skip = {o.skip}, limit = {o.limit})"
            )
        return rows


def build(options: VerifiersSourceOptions, context: Any = None) -> VerifiersSource:
    return VerifiersSource(options, getattr(context, "manifest_dir", None))
