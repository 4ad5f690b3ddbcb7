"""Manifest options of this plugin's components (keys of their ``[filters.NAME]`` / ``[shapers.NAME]`` tables)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlcore.components import Options


class DynamicSamplingOptions(Options):
    metric: Literal["acc", "score"] = Field(
        "acc",
        description="what a group's samples must differ in to be kept: acc, their correctness before the score shapers "
        "(the reward's acc where it reports one, else its score; the DAPO paper's and verl's metric = acc); score, "
        "the score trained on, the overlong penalty included (verl's seq_reward)",
    )
    max_generation_rounds: int = Field(
        3,
        ge=0,
        description="generation rounds a step takes at most to fill its batch with informative groups, the first "
        "included (verl's max_num_gen_batches); 0 = unlimited",
    )
    on_exhausted: Literal["pad", "raise"] = Field(
        "pad",
        description="out of rounds with too few informative groups: pad, fill the step with uniform groups that are "
        "left out of the loss and its divisor (the update is the one of the groups found); raise, stop the run with "
        "an error (verl)",
    )


class OverlongOptions(Options):
    buffer: int = Field(
        ...,
        ge=1,
        description="over the last this many tokens before data.max_response_tokens the score falls linearly",
    )
    penalty: float = Field(1.0, ge=0.0, description="the largest punishment (at data.max_response_tokens)")


class MaskTruncatedOptions(Options):
    pass
