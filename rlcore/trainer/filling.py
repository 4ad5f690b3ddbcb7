"""How one step's batch is filled: its prompts from a data cursor, generated and scored, the
scores changed by the manifest's score shapers (``[shapers.NAME]``), the groups chosen by its
batch filters (``[filters.NAME]``), over one round or several when a filter asks for more (DAPO's
dynamic sampling, in the rlcore-algo-dapo plugin). Every scheduler fills batches this way, in
whatever thread it generates in."""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from loguru import logger

from rlcore.errors import RlcoreError
from rlcore.interfaces import Prompt, SamplingParams, Trajectory
from rlcore.trainer.data_cursor import DataCursor
from rlcore.trainer.metrics import merge_metrics
from rlcore.trainer.scoring import Scorer

# (step, cursor) -> the round's prompts and the step's sampling parameters; advances the cursor.
# The trainer's is a step_inputs.StepInputs; tests give plain functions.
Inputs = Callable[[int, DataCursor], tuple[list[Prompt], SamplingParams]]
T = TypeVar("T")
ON_EXHAUSTED = ("pad", "raise")  # what a selecting filter's on_exhausted may be


class SamplingExhausted(RlcoreError):
    """A step's generation rounds ran out with too few selected groups and a batch filter said
    ``on_exhausted = "raise"`` (verl's behaviour at ``max_num_gen_batches``)."""


def more_rounds(rounds_done: int, max_rounds: int) -> bool:
    """Whether a step may generate another round: ``max_rounds`` caps the total, counting the
    first; 0 is unlimited (verl's ``max_num_gen_batches = 0``)."""
    return max_rounds <= 0 or rounds_done < max_rounds


def complete_batch(
    kept: list[T], spare: list[T], wanted: int, on_exhausted: str, *, rounds: int, where: str = ""
) -> tuple[list[T], int]:
    """The step's ``wanted`` groups from the groups ``kept`` (selected) over ``rounds`` rounds, and
    how many of them are padding. With enough groups: the first ``wanted``, no padding (the rest
    is discarded, as verl does). Short of them: ``on_exhausted = "pad"`` fills up with groups left
    out, from ``spare`` (in the order generated), which the trainer keeps out of the loss and its
    divisor; ``"raise"`` stops with :class:`SamplingExhausted`. ``where`` prefixes the error."""
    if on_exhausted not in ON_EXHAUSTED:
        raise ValueError(f"unknown on_exhausted {on_exhausted!r}; expected one of {', '.join(ON_EXHAUSTED)}")
    if len(kept) >= wanted:
        return kept[:wanted], 0
    missing = wanted - len(kept)
    found = (
        f"{where}dynamic sampling found {len(kept)} of the {wanted} informative groups a step needs in "
        f"{rounds} generation round(s)"
    )
    if on_exhausted == "raise":
        raise SamplingExhausted(
            f"{found} (max_generation_rounds of its [filters.NAME] table); the prompts may be too hard or too easy "
            'for the model. Raise max_generation_rounds (0 = unlimited), or set on_exhausted = "pad" to train on '
            "what was found"
        )
    if len(spare) < missing:
        raise SamplingExhausted(
            f"{found}, and only {len(spare)} groups left out to pad the other {missing} with"
        )
    return kept + spare[:missing], missing


def reward_items(scores: Sequence[float], item_metrics: Sequence[dict[str, float]]) -> list[dict[str, float]]:
    """Per sample, its reward as the reward gave it, for the filters that ask (``reward_items =
    True``): the metrics it reported for that item (``acc``, ...) and ``score``, its score before
    any score shaper."""
    if item_metrics and len(item_metrics) != len(scores):
        raise ValueError(f"{len(item_metrics)} reward metrics for {len(scores)} scores")
    return [{**m, "score": float(s)} for s, m in zip(scores, item_metrics or [{}] * len(scores))]


@dataclass
class ScoredBatch:
    step: int
    prompts: list[Prompt]
    params: SamplingParams
    trajectories: list[Trajectory]
    scores: list[float]
    cursor: dict[str, int]  # the data position after this batch's prompts
    metrics: dict[str, float] = field(default_factory=dict)
    padding: list[bool] = field(
        default_factory=list
    )  # per trajectory: a padded group's, out of the loss (empty: none)

    def staleness(self) -> list[int]:
        """Per trajectory: optimizer steps between the weights that generated it and the ones it trains."""
        return [
            self.step - (t.policy_version if t.policy_version is not None else self.step)
            for t in self.trajectories
        ]


@dataclass
class Filling:
    """How a step's batch is filled beyond "generate once, score": ``shapers`` (score shapers)
    change each round's scores, in order; ``filters`` (batch filters with ``select``) keep the
    groups every one of them selects. A step generates rounds (each as many prompts as the step
    input gives: ``[data] gen_batch_size``) until it holds ``groups`` groups (0: one round's
    prompts) or its rounds run out: the largest ``max_rounds`` among the filters, 0 (any filter's)
    unlimited. Short of groups then, it pads with groups left out (out of the loss and its
    divisor) or, when a filter says ``on_exhausted = "raise"``, stops (:func:`complete_batch`).
    ``score_chunks`` above 1 generates a round's prompts in that many chunks and scores each while
    the next one generates (the reward's workers are other processes, or a reward model's own
    device), instead of all after all."""

    shapers: list[Any] = field(default_factory=list)
    filters: list[Any] = field(default_factory=list)
    score_chunks: int = 1  # generate a round in this many chunks, each scored while the next generates
    groups: int = 0  # groups a step keeps (this rank's); 0: as many as one round's prompts

    @property
    def selecting(self) -> list[Any]:
        return [f for f in self.filters if hasattr(f, "select")]

    @property
    def max_rounds(self) -> int:
        """Rounds a step generates at most; 0 unlimited."""
        rounds = [int(getattr(f, "max_rounds", 1)) for f in self.selecting]
        return 0 if 0 in rounds else max(rounds, default=1)

    @property
    def on_exhausted(self) -> str:
        return "raise" if any(getattr(f, "on_exhausted", "pad") == "raise" for f in self.selecting) else "pad"


class BatchMaker:
    """Generate (one round or several) and score one step's batch, the same way for every
    scheduler, from what ``inputs`` gives (its prompts and sampling: step_inputs.py), never
    asking the trainer."""

    def __init__(self, scorer: Scorer, tokenizer, inputs: Inputs, filling: Filling | None = None):
        self.scorer, self.tokenizer, self.inputs = scorer, tokenizer, inputs
        self.filling = filling or Filling()

    def make(
        self,
        generate,
        step: int,
        cursor: DataCursor,
        version: int,
        phase: Callable[[str], Any] = lambda name: contextlib.nullcontext(),
    ) -> ScoredBatch:
        """The step's scored batch (its metrics hold ``timing_s/gen`` and ``timing_s/reward``);
        ``cursor`` advances past every round's prompts. ``phase(name)`` wraps generation and
        scoring (the trainer's timer: labels, memory, out-of-memory messages)."""
        f = self.filling
        selecting = f.selecting
        max_rounds = f.max_rounds
        kept: list[tuple[Prompt, list[Trajectory], list[float]]] = []
        spare: list[tuple[Prompt, list[Trajectory], list[float]]] = []  # groups left out, for padding
        metrics: dict[str, list[float]] = {}
        gen_s = reward_s = 0.0
        dropped = wanted = rounds = 0
        params = None
        while True:
            prompts, round_params = self.inputs(step, cursor)
            if rounds == 0:
                params, wanted = round_params, f.groups or len(prompts)
            else:  # another round of the same step: other samples
                round_params = round_params.model_copy(
                    update={"seed": (round_params.seed + 104_729 * rounds) % (2**31)}
                )
            rounds += 1
            trajectories, scores, round_metrics, item_metrics, generating, waiting = self._generate_and_score(
                generate, prompts, round_params, version, phase
            )
            gen_s += generating
            reward_s += waiting
            items = (
                reward_items(scores, item_metrics)
                if any(getattr(s, "reward_items", False) for s in selecting)
                else None
            )  # before the score shapers
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
                    if getattr(selector, "reward_items", False):
                        chosen &= set(selector.select(trajectories, scores, n, reward_items=items))
                    else:
                        chosen &= set(selector.select(trajectories, scores, n))
                groups = sorted(chosen)
                dropped += len(prompts) - len(groups)
                spare.extend(
                    (prompts[g], trajectories[g * n : (g + 1) * n], scores[g * n : (g + 1) * n])
                    for g in range(len(prompts))
                    if g not in chosen
                )
            for g in groups:
                kept.append((prompts[g], trajectories[g * n : (g + 1) * n], scores[g * n : (g + 1) * n]))
            if len(kept) >= wanted or not selecting or not more_rounds(rounds, max_rounds):
                break
            if max_rounds <= 0 and rounds % 10 == 0:
                logger.warning(
                    "step {}: {} of {} groups selected after {} rounds (max_generation_rounds = 0: "
                    "unlimited)",
                    step + 1,
                    len(kept),
                    wanted,
                    rounds,
                )
        out = {k: (sum(v) if k == "reward/time_s" else sum(v) / len(v)) for k, v in metrics.items()}
        out.update({"timing_s/gen": gen_s, "timing_s/reward": reward_s})
        padded = 0
        if selecting:
            found = len(kept)
            kept, padded = complete_batch(
                kept, spare, wanted, f.on_exhausted, rounds=rounds, where=f"step {step + 1}: "
            )
            if padded:
                logger.warning(
                    "step {}: dynamic sampling found {} of {} informative groups in {} rounds; {} groups "
                    "left out pad the step, out of the loss",
                    step + 1,
                    found,
                    wanted,
                    rounds,
                    padded,
                )
            out.update(
                {
                    "dynamic_sampling/groups_kept": float(min(found, wanted)),
                    "dynamic_sampling/groups_dropped": float(dropped),
                    "dynamic_sampling/groups_padded": float(padded),
                    "dynamic_sampling/rounds": float(rounds),
                }
            )
        else:
            kept = kept[:wanted]
        padding = [g >= len(kept) - padded for g, (_, ts, _) in enumerate(kept) for _ in ts] if padded else []
        return ScoredBatch(
            step,
            [p for p, _, _ in kept],
            params,
            [t for _, ts, _ in kept for t in ts],
            [s for _, _, ss in kept for s in ss],
            cursor.state(),
            out,
            padding,
        )

    def _generate_and_score(
        self, generate, prompts: list[Prompt], params: SamplingParams, version: int, phase
    ):
        """One round: ``(trajectories, scores, metrics, each item's reward metrics, generation
        seconds, seconds waiting for scores after generation)``, the chunks' scores in the
        trajectories' order."""
        bounds = _chunk_bounds(len(prompts), self.filling.score_chunks)
        started = time.perf_counter()
        if len(bounds) == 1:
            with phase("gen"):
                trajectories = generate(prompts, params)
            generated = time.perf_counter()
            for trajectory in trajectories:
                trajectory.policy_version = version
            with phase("reward"):
                scores, metrics, items = self.scorer.score_items(trajectories, self.tokenizer)
            return trajectories, scores, metrics, items, generated - started, time.perf_counter() - generated
        trajectories, pending = [], []
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rlcore-scoring") as scoring:
            for index, (lo, hi) in enumerate(bounds):
                # Each chunk its own seed: the same seed twice would repeat the random draws.
                chunk_params = (
                    params
                    if not index or params.seed is None
                    else params.model_copy(update={"seed": (params.seed + 7_919 * index) % (2**31)})
                )
                with phase("gen"):
                    part = generate(prompts[lo:hi], chunk_params)
                for trajectory in part:
                    trajectory.policy_version = version
                trajectories.extend(part)
                pending.append(scoring.submit(self.scorer.score_items, part, self.tokenizer))
            generated = time.perf_counter()
            with phase("reward"):
                results = [future.result() for future in pending]
        scores = [score for chunk_scores, _, _ in results for score in chunk_scores]
        items = [item for _, _, chunk_items in results for item in chunk_items]
        return (
            trajectories,
            scores,
            merge_chunk_metrics([(m, len(c)) for c, m, _ in results]),
            items,
            generated - started,
            time.perf_counter() - generated,
        )


def _chunk_bounds(prompts: int, chunks: int) -> list[tuple[int, int]]:
    """``chunks`` nearly equal runs of prompt indices (fewer when there are fewer prompts)."""
    chunks = max(1, min(chunks, prompts))
    edges = [round(i * prompts / chunks) for i in range(chunks + 1)]
    return [(edges[i], edges[i + 1]) for i in range(chunks)]


def merge_chunk_metrics(parts: list[tuple[dict[str, float], int]]) -> dict[str, float]:
    """The reward metrics of chunks scored apart, of ``(metrics, size)``, as one batch's: counts and
    seconds (the chunks were scored one after another) add up, means are weighted by size."""
    from rlcore.reward_pool import COUNT_METRICS, FAILURE_METRICS

    return merge_metrics(
        [m for m, _ in parts],
        [n for _, n in parts],
        summed=set(FAILURE_METRICS.values()) | set(COUNT_METRICS) | {"reward/time_s"},
    )
