"""One way to merge metrics measured in parts (ranks, scoring chunks) into the whole's.

By key: maxima (``*/max``) and phase timings (``timing_s/*``, which ran side by side) take the
largest, minima (``*/min``) the smallest, counts (``summed``) add up, and every other metric is a
mean, weighted by each part's size when the sizes differ (chunks of a batch) or plain (ranks,
which hold equal shares).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

# Counts and totals that add up over ranks.
RANK_SUMS = frozenset(
    {
        "perf/total_num_tokens",
        "perf/throughput_total",
        "reward/errors",
        "reward/timeouts",
        "agent/tool_errors/sum",
    }
)


def merge_metrics(
    parts: Sequence[Mapping[str, float]],
    weights: Sequence[float] | None = None,
    summed: Collection[str] = RANK_SUMS,
) -> dict[str, float]:
    """The metrics of ``parts`` as one; ``weights``: each part's size for the means (default equal)."""
    out: dict[str, float] = {}
    for key in sorted({k for m in parts for k in m}):
        have = [(m[key], 1.0 if weights is None else weights[i]) for i, m in enumerate(parts) if key in m]
        values = [v for v, _ in have]
        if key.endswith("/max") or key.startswith("timing_s/"):
            out[key] = max(values)
        elif key.endswith("/min"):
            out[key] = min(values)
        elif key in summed:
            out[key] = sum(values)
        elif weights is None:
            out[key] = sum(values) / len(values)
        else:
            out[key] = sum(v * n for v, n in have) / max(sum(n for _, n in have), 1)
    return out
