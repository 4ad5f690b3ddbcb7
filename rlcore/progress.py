"""Where a run is within a step: its phase (generating, scoring, updating) and how far along it is.

A step takes seconds on a GPU and minutes on a CPU; without this a newcomer watches a silent
terminal. The trainer marks phases with :func:`phase` and moves them on with :func:`advance`;
whoever listens (the console sink: a second bar line on a terminal, a heartbeat line every few
seconds when piped) is told. Nothing listens by default, and then the calls cost a function call.

    with progress.phase("generating", total=64, unit="samples"):
        ...
        progress.advance(16)

Calls come from the main thread of the training process (other threads' are ignored: background
rollouts are not the step's phase). A listener may read :func:`describe` from another thread (a
heartbeat): the stack of phases is replaced, never changed in place, and a count only grows.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Phase:
    """One phase under way: ``name`` ("generating"), ``done`` of ``total`` ``unit``s so far."""

    name: str
    total: int | None = None
    unit: str = ""
    within_step: bool = True  # False: validation, a checkpoint (between steps)
    done: int = 0
    started: float = field(default_factory=time.monotonic)

    def describe(self) -> str:
        """``generating 32/64 samples`` (``scoring`` without a total)."""
        if self.total is None:
            return self.name
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.name} {self.done}/{self.total}{unit}"

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


class Listener(Protocol):
    def phase_changed(self, phase: Phase | None) -> None:
        """A phase began, advanced or ended (``None``: between phases)."""


_listeners: list[Listener] = []
_stack: tuple[Phase, ...] = ()  # outermost first; replaced as a whole, so a reader sees a consistent one


def listen(listener: Listener) -> None:
    if listener not in _listeners:
        _listeners.append(listener)


def unlisten(listener: Listener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def current() -> Phase | None:
    """The innermost phase under way, or None."""
    stack = _stack
    return stack[-1] if stack else None


def describe() -> str:
    """The phases under way, outermost first: ``validating: generating 0/128 samples``."""
    return ": ".join(p.describe() for p in _stack)


def stack() -> tuple[Phase, ...]:
    """The phases under way, outermost first."""
    return _stack


def _tell() -> None:
    for listener in list(_listeners):
        listener.phase_changed(current())


@contextlib.contextmanager
def phase(name: str, total: int | None = None, unit: str = "", within_step: bool = True) -> Iterator[Phase]:
    """Mark a phase for the length of the block; phases nest (``validating`` around ``generating``).
    ``within_step``: part of a training step (generating, updating), or not (validating)."""
    global _stack
    entered = Phase(name, total, unit, within_step)
    if threading.current_thread() is not threading.main_thread():  # background rollouts: not the step's phase
        yield entered
        return
    outer = _stack
    _stack = (*outer, entered)
    _tell()
    try:
        yield entered
    finally:
        _stack = outer
        _tell()


def during(name: str, within_step: bool = True) -> Callable[[F], F]:
    """A decorator: the function's calls are a phase ``name``."""

    def wrap(function: F) -> F:
        @functools.wraps(function)
        def wrapped(*args, **kwargs):
            with phase(name, within_step=within_step):
                return function(*args, **kwargs)

        return wrapped  # type: ignore[return-value]

    return wrap


def each(items: list[T], name: str, unit: str = "") -> Iterator[T]:
    """``items``, one by one, inside a phase ``name`` of ``len(items)`` units: each counts as done
    when the loop's body for it has run (the loop asks for the next one)."""
    with phase(name, len(items), unit):
        for item in items:
            yield item
            advance()


def advance(count: int = 1) -> None:
    """``count`` more units of the current phase are done."""
    now = current()
    if now is None or threading.current_thread() is not threading.main_thread():
        return
    now.done = now.done + count if now.total is None else min(now.done + count, now.total)
    _tell()
