"""Refusing ground truths a reward can never compare (a dict, or a list where one answer is
expected): such a row would score 0 every time, silently, which reads as a model that cannot learn."""

from __future__ import annotations

from collections.abc import Sequence

from rlcore.errors import RlcoreError
from rlcore.interfaces import Prompt

_SCALARS = (str, int, float)


def _comparable(value: object, lists: bool) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, _SCALARS):
        return True
    if lists and isinstance(value, (list, tuple)):
        return bool(value) and all(_comparable(v, lists=False) for v in value)
    return False


def refuse_uncomparable(
    prompts: Sequence[Prompt], source_name: str, reward: str, *, lists: bool = False
) -> None:
    """Raise :class:`RlcoreError` naming the file, the first bad row and the field when a row's
    ground truth is not text or a number (or, with ``lists``, a non-empty list of them: any one
    matching counts). Rows without a ground truth are left to the required-fields check."""
    bad = [p for p in prompts if p.ground_truth is not None and not _comparable(p.ground_truth, lists)]
    if not bad:
        return
    first = bad[0]
    expected = "text or a number" + (", or a list of them (any one may match)" if lists else "")
    shown = repr(first.ground_truth)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise RlcoreError(
        f"data {source_name!r}: row {first.index}: field 'ground_truth' (reward_model.ground_truth) is a "
        f"{type(first.ground_truth).__name__} ({shown}), which the {reward!r} reward cannot compare; expected "
        f"{expected}" + (f" ({len(bad)} row(s) like it)" if len(bad) > 1 else "")
    )
