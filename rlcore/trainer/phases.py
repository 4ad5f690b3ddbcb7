"""The phases of a step (gen, reward, old_log_prob, update_actor, ...): their wall time, their
peak GPU memory, a label in profiler traces, and an out-of-memory error that says which phase ran
out and which knob to turn. And :func:`profiled`, the ``[trainer] profile_steps`` trace."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Iterator

import torch

from rlcore.errors import RlcoreError

# Where memory goes in each phase, and what frees it.
_KNOBS = {
    "gen": "[rollout] max_batch_size (hf), gpu_memory_utilization (vllm, sglang) or [data] max_response_tokens",
    "reward": "the reward's own batch size (a reward model) or [reward] workers",
}
_TRAINING_KNOBS = ("[trainer] micro_batch_tokens (the tokens of one forward/backward row), [model] "
                   "gradient_checkpointing = true, or more [algorithm] mini_batches")


class OutOfMemory(RlcoreError):
    """The GPU ran out of memory in a named phase."""


class Timer:
    """``with timer("update_actor"):`` adds the phase's seconds to ``timing_s/update_actor`` and, on
    CUDA, its peak memory to ``perf/max_memory_allocated_gb/update_actor`` (and reserved)."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.memory: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            with self.phase(name):
                yield
        finally:
            self.times[f"timing_s/{name}"] = self.times.get(f"timing_s/{name}", 0.0) + time.perf_counter() - start

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """The phase's label, memory peak and out-of-memory message, without timing it."""
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if cuda and name != "step":
            torch.cuda.reset_peak_memory_stats()
        try:
            with torch.profiler.record_function(name):
                yield
        except torch.OutOfMemoryError as exc:
            raise out_of_memory(name, exc) from None
        finally:
            if cuda and name != "step":
                gib = 2**30
                allocated = torch.cuda.max_memory_allocated() / gib
                reserved = torch.cuda.max_memory_reserved() / gib
                key = f"perf/max_memory_allocated_gb/{name}"
                self.memory[key] = max(self.memory.get(key, 0.0), allocated)
                key = f"perf/max_memory_reserved_gb/{name}"
                self.memory[key] = max(self.memory.get(key, 0.0), reserved)


def out_of_memory(phase: str, exc: BaseException) -> OutOfMemory:
    knobs = _KNOBS.get(phase, _TRAINING_KNOBS)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else "CUDA out of memory"
    return OutOfMemory(
        f"out of GPU memory in the {phase!r} phase ({first}); to fit, lower {knobs}. The last checkpoint is intact: "
        "rlcore run --resume continues from it"
    )


@contextlib.contextmanager
def profiled(step: int, steps: list[int], run_dir: Path) -> Iterator[None]:
    """Inside: step ``step`` is traced by the torch profiler when it is one of ``steps`` (CPU, and
    CUDA when present), phases labelled; the trace goes to ``run_dir/profile/step_N.pt.trace.json``,
    which Perfetto (ui.perfetto.dev) and TensorBoard's profiler plugin open."""
    if step not in steps:
        yield
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    target = run_dir / "profile" / f"step_{step:06d}.pt.trace.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    with torch.profiler.profile(activities=activities, record_shapes=False) as profile:
        yield
    profile.export_chrome_trace(str(target))
    from loguru import logger

    logger.info("profiler trace of step {}: {} (open it in ui.perfetto.dev or TensorBoard)", step, target)
