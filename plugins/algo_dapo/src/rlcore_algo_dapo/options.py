"""Manifest options of this plugin's components (keys of their ``[filters.NAME]`` / ``[shapers.NAME]`` tables)."""

from __future__ import annotations

from pydantic import Field

from rlcore.components import Options


class DynamicSamplingOptions(Options):
    max_generation_rounds: int = Field(
        3, ge=1, le=64, description="generation rounds a step takes at most to fill its batch with informative groups"
    )


class OverlongOptions(Options):
    buffer: int = Field(
        ..., ge=1, description="over the last this many tokens before data.max_response_tokens the score falls linearly"
    )
    penalty: float = Field(1.0, ge=0.0, description="the largest punishment (at data.max_response_tokens)")


class MaskTruncatedOptions(Options):
    pass
