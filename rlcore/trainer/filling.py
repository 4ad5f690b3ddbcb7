"""How one step's batch is filled: its prompts from a data cursor, generated and scored, the
scores changed by the manifest's score shapers (``[shapers.NAME]``), the groups chosen by its
batch filters (``[filters.NAME]``), over one round or several when a filter asks for more (DAPO's
dynamic sampling, in the rlcore-algo-dapo plugin). Every scheduler fills batches this way, in
whatever thread it generates in."""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from rlcore.interfaces import Prompt, SamplingParams, Trajectory
from rlcore.trainer.data_cursor import DataCursor
from rlcore.trainer.metrics import merge_metrics
from rlcore.trainer.scoring import Scorer

# (step, cursor) -> the step's prompts and sampling parameters; advances the cursor.
StepInputs = Callable[[int, DataCursor], tuple[list[Prompt], SamplingParams]]


@dataclass
class ScoredBatch:
    step: int
    prompts: list[Prompt]
    params: SamplingParams
    trajectories: list[Trajectory]
    scores: list[float]
    cursor: dict[str, int]  # the data position after this batch's prompts
    metrics: dict[str, float] = field(default_factory=dict)

    def staleness(self) -> list[int]:
        """Per trajectory: optimizer steps between the weights that generated it and the ones it trains."""
        return [self.step - (t.policy_version if t.policy_version is not None else self.step) for t in self.trajectories]


@dataclass
class Filling:
    """How a step's batch is filled beyond "generate once, score": ``shapers`` (score shapers)
    change each round's scores, in order; ``filters`` (batch filters with ``select``) keep the
    groups every one of them selects, and the largest ``max_rounds`` among them is how many
    rounds a step may generate until it holds as many groups as one round's prompts (then it pads
    with groups left out, which keep the batch's size). ``score_chunks`` above 1 generates a
    round's prompts in that many chunks and scores each while the next one generates (the
    reward's workers are other processes, or a reward model's own device), instead of all after
    all."""

    shapers: list[Any] = field(default_factory=list)
    filters: list[Any] = field(default_factory=list)
    score_chunks: int = 1  # generate a round in this many chunks, each scored while the next generates

    @property
    def selecting(self) -> list[Any]:
        return [f for f in self.filters if hasattr(f, "select")]

    @property
    def max_rounds(self) -> int:
        return max((int(getattr(f, "max_rounds", 1)) for f in self.selecting), default=1)


class BatchMaker:
    """Generate (one round or several) and score one step's batch, the same way for every scheduler."""

    def __init__(self, scorer: Scorer, tokenizer, inputs: StepInputs, filling: Filling | None = None):
        self.scorer, self.tokenizer, self.inputs = scorer, tokenizer, inputs
        self.filling = filling or Filling()

    def make(self, generate, step: int, cursor: DataCursor, version: int,
             phase: Callable[[str], Any] = lambda name: contextlib.nullcontext()) -> ScoredBatch:
        """The step's scored batch (its metrics hold ``timing_s/gen`` and ``timing_s/reward``);
        ``cursor`` advances past every round's prompts. ``phase(name)`` wraps generation and
        scoring (the trainer's timer: labels, memory, out-of-memory messages)."""
        f = self.filling
        selecting = f.selecting
        rounds = f.max_rounds
        kept: list[tuple[Prompt, list[Trajectory], list[float]]] = []
        spare: list[tuple[Prompt, list[Trajectory], list[float]]] = []  # uniform groups, for padding
        metrics: dict[str, list[float]] = {}
        gen_s = reward_s = 0.0
        dropped = wanted = 0
        params = None
        for round_ in range(rounds):
            prompts, round_params = self.inputs(step, cursor)
            if round_ == 0:
                params, wanted = round_params, len(prompts)
            else:  # another round of the same step: other samples
                round_params = round_params.model_copy(update={"seed": (round_params.seed + 104_729 * round_) % (2**31)})
            trajectories, scores, round_metrics, generating, waiting = self._generate_and_score(
                generate, prompts, round_params, version, phase
            )
            gen_s += generating
            reward_s += waiting
            for shaper in f.shapers:
                scores, shaped = shaper.shape(trajectories, scores)
                scores = list(scores)
                round_metrics.update(shaped)
            for key, value in round_metrics.items():
                metrics.setdefault(key, []).append(value)
            n = round_params.n
            groups = range(len(prompts))
            if selecting:
                chosen = set(groups)
                for selector in selecting:
                    chosen &= set(selector.select(trajectories, scores, n))
                groups = sorted(chosen)
                dropped += len(prompts) - len(groups)
                spare.extend((prompts[g], trajectories[g * n : (g + 1) * n], scores[g * n : (g + 1) * n])
                             for g in range(len(prompts)) if g not in groups)
            for g in groups:
                kept.append((prompts[g], trajectories[g * n : (g + 1) * n], scores[g * n : (g + 1) * n]))
            if len(kept) >= wanted:
                break
        kept = kept[:wanted]
        out = {k: (sum(v) if k == "reward/time_s" else sum(v) / len(v)) for k, v in metrics.items()}
        out.update({"timing_s/gen": gen_s, "timing_s/reward": reward_s})
        if selecting:
            # Out of rounds: fill up with groups that teach nothing (zero advantages), so the
            # batch keeps its size (and every rank the same mini-batches).
            padded = spare[: wanted - len(kept)]
            out.update({"dynamic_sampling/groups_kept": float(len(kept)), "dynamic_sampling/groups_dropped": float(dropped),
                        "dynamic_sampling/groups_padded": float(len(padded)), "dynamic_sampling/rounds": float(round_ + 1)})
            kept += padded
        batch = ScoredBatch(
            step, [p for p, _, _ in kept], params, [t for _, ts, _ in kept for t in ts], [s for _, _, ss in kept for s in ss],
            cursor.state(), out,
        )
        return batch

    def _generate_and_score(self, generate, prompts: list[Prompt], params: SamplingParams, version: int, phase):
        """One round: ``(trajectories, scores, metrics, generation seconds, seconds waiting for
        scores after generation)``, the chunks' scores in the trajectories' order."""
        bounds = _chunk_bounds(len(prompts), self.filling.score_chunks)
        started = time.perf_counter()
        if len(bounds) == 1:
            with phase("gen"):
                trajectories = generate(prompts, params)
            generated = time.perf_counter()
            for trajectory in trajectories:
                trajectory.policy_version = version
            with phase("reward"):
                scores, metrics = self.scorer.score(trajectories, self.tokenizer)
            return trajectories, scores, metrics, generated - started, time.perf_counter() - generated
        trajectories, pending = [], []
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rlcore-scoring") as scoring:
            for index, (lo, hi) in enumerate(bounds):
                # Each chunk its own seed: the same seed twice would repeat the random draws.
                chunk_params = params if not index or params.seed is None else params.model_copy(
                    update={"seed": (params.seed + 7_919 * index) % (2**31)})
                with phase("gen"):
                    part = generate(prompts[lo:hi], chunk_params)
                for trajectory in part:
                    trajectory.policy_version = version
                trajectories.extend(part)
                pending.append(scoring.submit(self.scorer.score, part, self.tokenizer))
            generated = time.perf_counter()
            with phase("reward"):
                results = [future.result() for future in pending]
        scores = [score for chunk_scores, _ in results for score in chunk_scores]
        return trajectories, scores, merge_chunk_metrics([(m, len(c)) for c, m in results]), generated - started, \
            time.perf_counter() - generated


def _chunk_bounds(prompts: int, chunks: int) -> list[tuple[int, int]]:
    """``chunks`` nearly equal runs of prompt indices (fewer when there are fewer prompts)."""
    chunks = max(1, min(chunks, prompts))
    edges = [round(i * prompts / chunks) for i in range(chunks + 1)]
    return [(edges[i], edges[i + 1]) for i in range(chunks)]


def merge_chunk_metrics(parts: list[tuple[dict[str, float], int]]) -> dict[str, float]:
    """The reward metrics of chunks scored apart, of ``(metrics, size)``, as one batch's: counts and
    seconds (the chunks were scored one after another) add up, means are weighted by size."""
    from rlcore.reward_pool import COUNT_METRICS, FAILURE_METRICS

    return merge_metrics([m for m, _ in parts], [n for _, n in parts],
                         summed=set(FAILURE_METRICS.values()) | set(COUNT_METRICS) | {"reward/time_s"})
