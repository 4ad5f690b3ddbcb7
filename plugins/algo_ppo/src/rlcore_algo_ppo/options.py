"""Manifest options of ``gae`` (keys of the ``[algorithm]`` table)."""

from __future__ import annotations

from pydantic import Field

from rlcore.components import Options


class GAEOptions(Options):
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="discount per model token")
    lam: float = Field(
        1.0, ge=0.0, le=1.0, description="GAE lambda: 1 is Monte Carlo minus the value, 0 is one-step TD"
    )
    whiten: bool = Field(True, description="whiten advantages over every model token of the batch")
