"""Device memory between a trainer and an engine that share one GPU.

A colocated vLLM or SGLang engine sleeps while the trainer runs and, at wake-up, maps its weights
and KV cache again through its own allocator, outside torch's. Blocks that torch's caching
allocator still holds for the trainer (freed tensors of the last update: logits, activations)
are invisible to that allocator, so waking can fail for want of memory that nothing uses (seen on
an H100: a 1.5B GRPO step with vLLM colocated died at its third wake-up). verl empties torch's
cache at the same point.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator


def release_cached_blocks() -> None:
    """Return the blocks torch's caching allocator holds but no tensor uses to the driver, before
    an engine allocates outside torch. A no-op where torch or CUDA was never started."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return
    torch.cuda.empty_cache()


@contextlib.contextmanager
def waking(what: str) -> Iterator[None]:
    """Around an engine's wake-up: torch's cached blocks go back first, and the engine allocator's
    own out-of-memory failure (a plain RuntimeError, e.g. vLLM's "CUDA Error: out of memory at
    cumem_allocator.cpp") becomes torch's ``OutOfMemoryError``, which the trainer reports with the
    options that free the phase's memory instead of a traceback."""
    release_cached_blocks()
    try:
        yield
    except RuntimeError as exc:
        torch = sys.modules.get("torch")
        if (
            torch is None
            or isinstance(exc, torch.OutOfMemoryError)
            or "out of memory" not in str(exc).lower()
        ):
            raise
        raise torch.OutOfMemoryError(f"{what}: {exc}") from exc
