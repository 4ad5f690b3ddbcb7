"""Options models of the builtin components (kept apart so that listing them imports nothing heavy)."""

from __future__ import annotations

from pydantic import Field

from rlcore.components import Options


class LocalLauncherOptions(Options):
    pass


class ConsoleOptions(Options):
    every: int = Field(1, ge=1, description="print a table of metrics every N steps")
    live: bool = Field(True, description="a live progress bar when the terminal allows it")
    heartbeat_s: float = Field(
        10.0,
        ge=0,
        description="without the live bar (piped, redirected), print where the step is (generating 0/64 "
        "samples, 35 s) every this many seconds of silence; 0 = never",
    )
    plot: bool = Field(
        True,
        description="at the end, write curves.png (reward, validation, response length) into the run directory",
    )


class JsonlOptions(Options):
    filename: str = "metrics.jsonl"


class SingleTurnOptions(Options):
    pass


class PPOClipOptions(Options):
    clip_ratio_low: float = Field(0.2, ge=0.0, lt=1.0, description="ratio floor is 1 - clip_ratio_low")
    clip_ratio_high: float = Field(
        0.2, ge=0.0, description="ratio ceiling is 1 + clip_ratio_high (clip-higher: 0.28)"
    )
    clip_ratio_c: float | None = Field(
        3.0, gt=1.0, description="dual-clip constant for negative advantages; None disables"
    )


class PythonRewardOptions(Options):
    target: str = Field(..., description="FILE.py:FUNCTION or package.module:FUNCTION")
