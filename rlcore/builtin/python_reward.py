"""The builtin ``python`` reward: ``[reward] function = "python:file.py:function"``.

The user's function takes an :class:`rlcore.interfaces.RewardInput` or has verl's
``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` signature; which one is
read from the signature. The trainer's reward runner calls it in worker processes, so a reward
built from a file pickles as its target and is loaded again there.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from rlcore.errors import RlcoreError
from rlcore.interfaces import RewardInput
from rlcore.targets import load_target


def load_python_function(target: str) -> tuple[Callable[..., Any], str]:
    """Import ``FILE.py:FUNC`` or ``package.module:FUNC``; return the function and where it came from."""
    fn, origin = load_target(target, what="function", source="reward")
    if _is_batched(fn):
        return fn, origin
    if not callable(fn):
        raise RlcoreError(
            f"{origin}: {target.rpartition(':')[2]!r} is not a function but a {type(fn).__name__} value"
        )
    return fn, origin


_VERL_NAMES = ("data_source", "solution_str", "ground_truth")


class PythonReward:
    """A user's function as a reward: ``fn(item: RewardInput)`` or verl's
    ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``, told apart by the
    signature. verl functions may return a dict with a ``score`` key; its other numeric keys
    become metrics (see :func:`rlcore.reward_pool._normalise`)."""

    required_fields: frozenset[str] = frozenset()

    def __init__(self, fn: Callable[..., Any], origin: str = "", target: str = "") -> None:
        self.fn, self.target = fn, target
        self.origin = origin or getattr(fn, "__qualname__", repr(fn))
        self.style = _detect_style(fn, self.origin)
        self.__name__ = getattr(fn, "__name__", "reward")

    def __call__(self, item: RewardInput) -> Any:
        if self.style == "item":
            return self.fn(item)
        if self.style == "verl_kw":
            return self.fn(item.data_source, item.response, item.ground_truth, extra_info=item.extra_info)
        if self.style == "verl4":
            return self.fn(item.data_source, item.response, item.ground_truth, item.extra_info)
        return self.fn(item.data_source, item.response, item.ground_truth)

    def __repr__(self) -> str:
        return f"PythonReward({self.origin}, style={self.style})"

    def __reduce__(self) -> tuple:
        # A function loaded from a file lives in a module no other process can import by name:
        # a worker process loads it again from its target instead.
        if self.target:
            return (_rebuild_python_reward, (self.target,))
        return (PythonReward, (self.fn, self.origin))


def _detect_style(fn: Callable[..., Any], origin: str) -> str:
    """ "item" for fn(item); "verl3", "verl4" or "verl_kw" (how extra_info is passed) for verl's form."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return "item"  # a builtin or C callable: assume the rlcore signature
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var_positional = any(p.kind == p.VAR_POSITIONAL for p in params)
    var_keyword = any(p.kind == p.VAR_KEYWORD for p in params)
    required = [p for p in positional if p.default is p.empty]
    if [p.name for p in positional[:3]] == list(_VERL_NAMES) or len(required) >= 3:
        if "extra_info" in sig.parameters or var_keyword:
            return "verl_kw"
        return "verl4" if len(positional) >= 4 or var_positional else "verl3"
    if len(required) <= 1 and (positional or var_positional):
        return "item"
    raise RlcoreError(
        f"reward function {origin} has the signature {getattr(fn, '__name__', 'fn')}{sig}; expected fn(item) "
        "taking an rlcore.interfaces.RewardInput, or verl's compute_score(data_source, solution_str, "
        "ground_truth, extra_info=None)"
    )


def _is_batched(obj: Any) -> bool:
    return bool(getattr(obj, "batched", False)) and callable(getattr(obj, "score_batch", None))


def build_python_reward(options: Any, context: Any = None) -> Any:
    """Factory of the builtin ``python`` reward (options: :class:`rlcore.builtin.options.PythonRewardOptions`).
    A target that is a batched reward (``batched = True`` and ``score_batch``, see
    :class:`rlcore.interfaces.BatchRewardFunction`) is used as it is."""
    fn, origin = load_python_function(options.target)
    if _is_batched(fn):
        return fn
    return PythonReward(fn, origin, target=options.target)


def _rebuild_python_reward(target: str) -> PythonReward:
    fn, origin = load_python_function(target)
    return PythonReward(fn, origin, target=target)


# ----------------------------------------------------------------------------- required fields
