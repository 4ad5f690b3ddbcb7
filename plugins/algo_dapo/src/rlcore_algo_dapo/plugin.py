"""Registers this plugin's components; imports nothing heavy."""

from __future__ import annotations

import rlcore
from rlcore.components import Component
from rlcore_algo_dapo.options import DynamicSamplingOptions, MaskTruncatedOptions, OverlongOptions


@rlcore.hookimpl
def rlcore_batch_filters():
    return [
        Component(
            "dynamic_sampling",
            "rlcore_algo_dapo.filters:build_dynamic_sampling",
            DynamicSamplingOptions,
            "DAPO dynamic sampling: keep groups whose scores differ, generate more rounds to fill the step",
            needs={"groups"},
        ),
        Component(
            "mask_truncated",
            "rlcore_algo_dapo.filters:build_mask_truncated",
            MaskTruncatedOptions,
            "DAPO overlong filtering: responses cut at data.max_response_tokens leave the loss",
        ),
    ]


@rlcore.hookimpl
def rlcore_score_shapers():
    return [
        Component(
            "overlong",
            "rlcore_algo_dapo.shapers:build_overlong",
            OverlongOptions,
            "DAPO soft overlong punishment: scores fall linearly over the last buffer tokens of the length",
        ),
    ]
