"""Fault injection for tests: kill or stop a run at a named point, the Nth time it is reached.

A run reads its faults from the ``RLCORE_FAULTS`` environment variable, a comma-separated list
of ``POINT@COUNT=ACTION``::

    RLCORE_FAULTS="update@3=sigkill"          # SIGKILL the trainer after its 3rd optimizer step
    RLCORE_FAULTS="checkpoint@2=sigkill"      # ... in the middle of writing its 2nd checkpoint
    RLCORE_FAULTS="engine_generate@4=exit"    # the engine process exits after its 4th generate

Points (each is a call to :func:`fault_point` in rlcore's code):

- ``generate``: the trainer is about to ask for a step's batch (before it is generated);
- ``update``: the trainer's optimizer step is done and the weights are published;
- ``checkpoint``: a checkpoint's model is written, its state file not yet;
- ``engine_generate``: the engine process (split placement) answered a generate call.

Actions: ``sigkill``, ``sigterm``, ``sigusr1`` (sent to the process that reaches the point) and
``exit`` (``os._exit(3)``, no clean-up). A point with ``RANK`` set counts per process; add
``:rank=N`` to the action (``update@2=sigkill:rank=1``) to fire on one rank only.

Unset (every production run), :func:`fault_point` is one dictionary lookup. Nothing here imports
torch.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass

ENV = "RLCORE_FAULTS"
POINTS = ("generate", "update", "checkpoint", "engine_generate")
ACTIONS = ("sigkill", "sigterm", "sigusr1", "exit")

_counts: dict[str, int] = {}


@dataclass(frozen=True)
class Fault:
    point: str
    count: int
    action: str
    rank: int | None = None

    def spec(self) -> str:
        return f"{self.point}@{self.count}={self.action}" + (
            f":rank={self.rank}" if self.rank is not None else ""
        )


def parse(text: str) -> list[Fault]:
    """The faults a ``RLCORE_FAULTS`` value names; ``ValueError`` saying what is wrong otherwise."""
    faults = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            where, action = part.split("=", 1)
            point, count = where.split("@", 1)
            rank = None
            if ":" in action:
                action, option = action.split(":", 1)
                key, value = option.split("=", 1)
                if key != "rank":
                    raise ValueError(f"unknown option {key!r}")
                rank = int(value)
            fault = Fault(point.strip(), int(count), action.strip(), rank)
        except ValueError as exc:
            raise ValueError(f"{ENV}: {part!r} is not POINT@COUNT=ACTION[:rank=N] ({exc})") from None
        if fault.point not in POINTS:
            raise ValueError(f"{ENV}: unknown point {fault.point!r}; known: {', '.join(POINTS)}")
        if fault.action not in ACTIONS:
            raise ValueError(f"{ENV}: unknown action {fault.action!r}; known: {', '.join(ACTIONS)}")
        faults.append(fault)
    return faults


def env(*faults: str) -> dict[str, str]:
    """The environment entry that arms ``faults`` (each ``POINT@COUNT=ACTION``), for a subprocess."""
    parse(",".join(faults))  # a typo in a test fails here, not silently in the run
    return {ENV: ",".join(faults)}


def fault_point(point: str) -> None:
    """Reached ``point``: fire the fault armed for this point and count, if any."""
    text = os.environ.get(ENV)
    if not text:
        return
    _counts[point] = _counts.get(point, 0) + 1
    rank = int(os.environ.get("RANK", "0"))
    for fault in parse(text):
        if fault.point == point and fault.count == _counts[point] and fault.rank in (None, rank):
            _fire(fault)


def _fire(fault: Fault) -> None:
    sys.stderr.write(f"rlcore fault injection: {fault.spec()} (pid {os.getpid()})\n")
    sys.stderr.flush()
    if fault.action == "exit":
        os._exit(3)
    signum = {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM, "sigusr1": signal.SIGUSR1}[fault.action]
    os.kill(os.getpid(), signum)
