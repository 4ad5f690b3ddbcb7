"""How one step's batch is filled: its prompts from a data cursor, generated and scored, over
one round or several (DAPO's dynamic sampling), with the overlong punishment added to the scores.
Every scheduler fills batches this way, in whatever thread it generates in."""

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
    """How a step's batch is filled beyond "generate once, score" (DAPO's recipe):
    ``dynamic_sampling`` keeps only groups whose scores differ and generates more prompts, up to
    ``max_rounds`` rounds, until the step holds as many groups as one round's prompts (then pads
    with uniform groups, which teach nothing but keep the batch's size); the soft
    overlong punishment (``overlong_buffer`` tokens before ``max_response_tokens``, down to
    ``-overlong_factor``) is added to each score first. ``score_chunks`` above 1 generates a round's
    prompts in that many chunks and scores each while the next one generates (the reward's
    workers are other processes, or a reward model's own device), instead of all after all."""

    dynamic_sampling: bool = False
    max_rounds: int = 1
    overlong_buffer: int = 0
    overlong_factor: float = 1.0
    max_response_tokens: int = 0
    score_chunks: int = 1  # generate a round in this many chunks, each scored while the next generates


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
        rounds = f.max_rounds if f.dynamic_sampling else 1
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
            if f.overlong_buffer:
                from rlcore.algorithms.shaping import overlong_penalty

                penalties = [overlong_penalty(len(t.response_ids), f.max_response_tokens, f.overlong_buffer, f.overlong_factor)
                             for t in trajectories]
                scores = [s + p for s, p in zip(scores, penalties)]
                round_metrics["reward/overlong_penalty/mean"] = sum(penalties) / max(len(penalties), 1)
            for key, value in round_metrics.items():
                metrics.setdefault(key, []).append(value)
            n = round_params.n
            groups = range(len(prompts))
            if f.dynamic_sampling:
                from rlcore.algorithms.shaping import informative_groups

                groups = informative_groups(scores, n)
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
        if f.dynamic_sampling:
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
