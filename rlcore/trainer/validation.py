"""Validation: a policy's samples on held-out prompts, scored as training scores them.

The trainer validates every ``[trainer] eval_every`` steps, and ``rlcore eval`` validates a
checkpoint or an export on its sets; both call :func:`validate` with the roles they built, so the
numbers are comparable (same engine, agent loop, reward, sampling and seeds)."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from rlcore.interfaces import Prompt, Trajectory


def validate(
    roles: Any,
    prompts: Sequence[Prompt],
    step: int,
    *,
    quiet: Callable[[], Any] = contextlib.nullcontext,
    sinks: Sequence[Any] = (),
    log_generations: int = 0,
) -> dict[str, float]:
    """``val/*`` metrics of ``prompts`` (every rank's share gathered): the mean reward, and per
    data source its mean reward, pass@1 and, with several samples, pass@k. ``quiet()`` holds off
    background rollouts while the engine validates; the first ``log_generations`` samples go to
    the ``sinks`` that take samples."""
    params = roles.sampling(train=False, step=step)
    start = time.perf_counter()
    with quiet():
        trajectories = roles.rollout.generate(roles.dist.shard(prompts), params)
    scores, _ = roles.scorer.score(trajectories, roles.tokenizer)
    log_samples(trajectories, scores, roles.tokenizer, step, sinks, log_generations)
    results = [
        (t.prompt.data_source or "default", t.prompt.index, s, len(t.response_ids))
        for t, s in zip(trajectories, scores)
    ]
    results = [r for part in roles.dist.gather(results) for r in part]
    by_source: dict[str, list[float]] = defaultdict(list)
    passed: dict[str, dict[int, bool]] = defaultdict(dict)
    for src, index, s, _ in results:
        by_source[src].append(s)
        passed[src][index] = passed[src].get(index, False) or s > 0
    all_scores = [r[2] for r in results]
    metrics: dict[str, float] = {"val/reward/mean": sum(all_scores) / max(len(all_scores), 1)}
    for src, values in by_source.items():
        metrics[f"val/{src}/reward/mean"] = sum(values) / len(values)
        metrics[f"val/{src}/pass@1"] = sum(v > 0 for v in values) / len(values)
        if params.n > 1:
            metrics[f"val/{src}/pass@{params.n}"] = sum(passed[src].values()) / len(passed[src])
    metrics["val/response_length/mean"] = sum(r[3] for r in results) / max(len(results), 1)
    metrics["timing_s/val"] = time.perf_counter() - start
    return metrics


def log_samples(
    trajectories: list[Trajectory],
    scores: list[float],
    tokenizer: Any,
    step: int,
    sinks: Sequence[Any],
    count: int,
) -> None:
    """The first ``count`` validation samples (this rank's), to the sinks that take them."""
    takers = [sink for sink in sinks if hasattr(sink, "log_samples")]
    if not count or not takers:
        return
    decode = tokenizer.decode
    rows = [
        {
            "data_source": t.prompt.data_source or "default",
            "prompt": decode(t.prompt.token_ids, skip_special_tokens=True),
            "response": decode(t.response_ids, skip_special_tokens=True),
            "score": float(score),
        }
        for t, score in list(zip(trajectories, scores))[:count]
    ]
    for sink in takers:
        sink.log_samples(rows, step)
