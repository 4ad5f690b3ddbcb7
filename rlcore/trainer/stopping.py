"""Stopping a run on a signal without losing work.

SIGTERM (a SLURM time limit or preemption, a Kubernetes eviction, ``kill``) or SIGUSR1 (what
``sbatch --signal=USR1@120`` sends ahead of a time limit) let the step under way finish, then the
trainer writes a checkpoint and exits with 128 + the signal's number; ``rlcore run --resume``
continues from there. A second signal stops at once, keeping the previous checkpoint. With several
ranks the request is agreed on at the end of every step (one tiny all-reduce), so all ranks save
the same step.
"""

from __future__ import annotations

import signal
import threading

from loguru import logger

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_requested: list[str] = []  # the signal this process was asked to stop by, for the driver's last word


def requested() -> str | None:
    """The name of the stop signal this process received, if any (``"SIGTERM"``)."""
    return _requested[-1] if _requested else None


class Stopped(Exception):
    """The run stopped on ``signum``; ``checkpoint`` is the one written for it (None: stopped at once)."""

    def __init__(self, signum: int, checkpoint=None):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.checkpoint = signum, checkpoint

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class StopRequest:
    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.signum:
            raise Stopped(signum)
        self.signum = signum
        _requested.append(signal.Signals(signum).name)
        # Every rank gets the signal (srun, torchrun); one line on the console is enough, and it
        # promises the checkpoint only as an intent (a rank that died cannot write its share).
        import os

        quiet = os.environ.get("RANK", "0") != "0"
        logger.bind(file_only=quiet).warning(
            "received {}: finishing this step, then writing a checkpoint (send it again to stop at once)",
            signal.Signals(signum).name,
        )

    def agreed(self, dist) -> int:
        """The signal any rank received (0 for none): every rank calls this at the end of a step."""
        return dist.max(self.signum)
