"""The phases of a step (gen, reward, old_log_prob, update_actor, ...): their wall time, their
peak GPU memory, a label in profiler traces, and an out-of-memory error that says which phase ran
out and which knob to turn. And :func:`profiled`, the ``[trainer] profile_steps`` trace, and
:class:`MemoryHistory`, the ``[trainer] memory_snapshot_steps`` / ``memory_snapshot_on_oom``
CUDA memory snapshots."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from rlcore.errors import RlcoreError

# Where memory goes in each phase, and what frees it.
# The generation phase's come from the engine (its options' ``memory_options``): see generation_knobs.
_KNOBS = {
    "gen": "the engine's batch or memory options in [rollout], or [data] max_response_tokens",
    "reward": "the reward's own batch size (a reward model) or [reward] workers",
}
_TRAINING_KNOBS = (
    "[trainer] micro_batch_tokens (the tokens of one forward/backward row), [model] "
    "gradient_checkpointing = true, or more [algorithm] mini_batches"
)


class OutOfMemory(RlcoreError):
    """The GPU ran out of memory in a named phase."""


class Timer:
    """``with timer("update_actor"):`` adds the phase's seconds to ``timing_s/update_actor`` and, on
    CUDA, its peak memory to ``perf/max_memory_allocated_gb/update_actor`` (and reserved). With a
    ``history`` that is recording, an out-of-memory error first writes its snapshot and names it."""

    def __init__(self, history: MemoryHistory | None = None, knobs: dict[str, str] | None = None) -> None:
        self.times: dict[str, float] = {}
        self.memory: dict[str, float] = {}
        self.history = history
        self.knobs = knobs or {}  # phase -> what frees its memory, where the run knows better than _KNOBS

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            with self.phase(name):
                yield
        finally:
            self.times[f"timing_s/{name}"] = (
                self.times.get(f"timing_s/{name}", 0.0) + time.perf_counter() - start
            )

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
            snapshot = self.history.oom_snapshot() if self.history is not None else None
            raise out_of_memory(name, exc, snapshot, self.knobs.get(name)) from None
        finally:
            if cuda and name != "step":
                gib = 2**30
                allocated = torch.cuda.max_memory_allocated() / gib
                reserved = torch.cuda.max_memory_reserved() / gib
                key = f"perf/max_memory_allocated_gb/{name}"
                self.memory[key] = max(self.memory.get(key, 0.0), allocated)
                key = f"perf/max_memory_reserved_gb/{name}"
                self.memory[key] = max(self.memory.get(key, 0.0), reserved)


def generation_knobs(engine: str, options: type) -> str:
    """What frees the generation phase's memory: the engine's own ``memory_options`` (declared on
    its options model) and the response length."""
    names = tuple(getattr(options, "memory_options", ()))
    own = f"[rollout] {', '.join(names)} (the {engine} engine's) or " if names else ""
    return f"{own}[data] max_response_tokens"


def out_of_memory(
    phase: str, exc: BaseException, snapshot: Path | None = None, knobs: str | None = None
) -> OutOfMemory:
    """``snapshot``: the CUDA memory snapshot written at the failure, named in the message;
    ``knobs``: what frees this phase's memory, when the run knows (else the phase's usual ones)."""
    knobs = knobs or _KNOBS.get(phase, _TRAINING_KNOBS)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else "CUDA out of memory"
    where = (
        f". The CUDA memory history up to the failure is in {snapshot} (open it in {MEMORY_VIZ})"
        if snapshot is not None
        else ""
    )
    return OutOfMemory(
        f"out of GPU memory in the {phase!r} phase ({first}); to fit, lower {knobs}. The last checkpoint is intact: "
        f"rlcore run --resume continues from it{where}"
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


# The allocator events (allocations, frees) a memory history keeps, the newest; PyTorch's own example's figure.
MEMORY_HISTORY_ENTRIES = 100_000
MEMORY_VIZ = "https://pytorch.org/memory_viz"


class MemoryHistory:
    """``[trainer] memory_snapshot_steps`` and ``memory_snapshot_on_oom``: CUDA's allocator history
    (``torch.cuda.memory._record_memory_history``) recorded over chosen steps, each written at its
    end to ``run_dir/memory/step_N.pickle``; with ``on_oom``, recorded over the whole run. While it
    records, an out-of-memory error in a phase writes ``memory/oom_step_N.pickle`` (:class:`Timer`
    calls :meth:`oom_snapshot`). Files are written whole (a temporary name, then a rename); a rank
    other than 0 adds ``.rankR`` to the name. Without CUDA it records nothing, and says so once.

    ``with history.run():`` around the loop, ``with history.step(n):`` around step ``n`` (1 = the first).
    """

    def __init__(self, steps: list[int], on_oom: bool, run_dir: Path, *, cuda: bool, rank: int = 0) -> None:
        self.steps = frozenset(steps)
        self.on_oom = on_oom
        self.directory = Path(run_dir) / "memory"
        self.cuda = cuda
        self.rank = rank
        self.recording = False
        self.current = 0  # the step running, for the out-of-memory snapshot's name
        if (self.steps or on_oom) and not cuda:
            from loguru import logger

            logger.warning(
                "[trainer] memory_snapshot_steps / memory_snapshot_on_oom: this run has no CUDA device, so "
                "no CUDA memory history is recorded and no snapshot written; the run goes on without them"
            )

    def _record(self, on: bool) -> None:
        if on:
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
        else:
            torch.cuda.memory._record_memory_history(enabled=None)
        self.recording = on

    def _dump(self, stem: str) -> Path:
        rank = f".rank{self.rank}" if self.rank else ""
        target = self.directory / f"{stem}{rank}.pickle"
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")
        torch.cuda.memory._dump_snapshot(str(partial))
        os.replace(partial, target)
        return target

    @contextlib.contextmanager
    def run(self) -> Iterator[MemoryHistory]:
        """The whole run: recording throughout with ``on_oom``; recording stopped at the end in any case."""
        if self.cuda and self.on_oom:
            self._record(True)
        try:
            yield self
        finally:
            if self.recording:
                self._record(False)

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Step ``step``: recorded, and its snapshot written at its end, when it is a chosen step.
        A step that fails writes no step snapshot (an out-of-memory error has written its own)."""
        self.current = step
        chosen = self.cuda and step in self.steps
        if chosen and not self.recording:
            self._record(True)
        try:
            yield
        except BaseException:
            if chosen and self.recording and not self.on_oom:
                self._record(False)
            raise
        if chosen:
            try:
                target = self._dump(f"step_{step:06d}")
            finally:
                if not self.on_oom:
                    self._record(False)
            from loguru import logger

            logger.info("CUDA memory snapshot of step {}: {} (open it in {})", step, target, MEMORY_VIZ)

    def oom_snapshot(self) -> Path | None:
        """Write ``memory/oom_step_N.pickle`` when recording; its path, or None (not recording, or
        the write failed: the out-of-memory error matters more than its snapshot)."""
        if not self.recording:
            return None
        try:
            return self._dump(f"oom_step_{self.current:06d}")
        except Exception as exc:  # noqa: BLE001 - the out-of-memory error must not be hidden by its snapshot's
            from loguru import logger

            logger.warning(
                "could not write the CUDA memory snapshot of the out-of-memory error: {}: {}",
                type(exc).__name__,
                exc,
            )
            return None
