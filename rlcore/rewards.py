"""Running reward functions safely: the builtin ``python`` reward, and a runner with time limits.

A reward function is user code that sees model output, so it may raise, return nonsense, or
loop forever. :class:`RewardRunner` scores a batch so that none of these can crash or stall a
run: such an item scores 0 and is counted in the batch's metrics.

Why worker *processes*: a Python thread cannot be killed, so a pure-Python infinite loop in a
thread would keep a core (and the GIL) busy for the rest of the run. A worker process past its
deadline is killed and replaced. On Linux the workers are *forked*, so lambdas, closures and
objects built by a plugin's factory work without pickling, and starting one costs milliseconds
(copy-on-write, even when the trainer holds a model). Workers start at the first batch and are
reused. Where ``fork`` is missing, a picklable function runs in ``spawn``-ed workers, anything
else in threads (whose timeouts are then abandoned, not killed). ``isolation="thread"`` asks for
threads explicitly, e.g. for a function that shares a large in-memory object it must not copy.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import multiprocessing
import numbers
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from hashlib import sha1
from multiprocessing.connection import Connection, wait as wait_connections
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Sequence

from loguru import logger

from rlcore.errors import RlcoreError, did_you_mean
from rlcore.interfaces import Prompt, RewardInput, RewardResult

__all__ = [
    "PythonReward",
    "RewardBatch",
    "RewardRunner",
    "build_python_reward",
    "check_required_fields",
    "load_python_function",
]

# Statuses of one scored item, and the batch metric that counts each failure.
FAILURE_METRICS = {"error": "reward/errors", "invalid": "reward/invalid", "timeout": "reward/timeouts"}
_DESCRIBE = {
    "error": "raised an exception",
    "invalid": "returned something that is not a finite number or RewardResult",
    "timeout": "ran past its time limit",
}


# ----------------------------------------------------------------------------- the python reward


def load_python_function(target: str) -> tuple[Callable[..., Any], str]:
    """Import ``FILE.py:FUNC`` or ``package.module:FUNC``; return the function and where it came from."""
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise RlcoreError(f"expected 'FILE.py:FUNCTION' or 'package.module:FUNCTION', got {target!r}")
    if where.endswith(".py"):
        module = _import_file(Path(where))
        origin = str(Path(where))
    else:
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as exc:
            raise RlcoreError(f"reward module {where!r} cannot be imported: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the user's module failed while importing
            raise RlcoreError(f"importing reward module {where!r} failed: {type(exc).__name__}: {exc}") from None
        origin = f"module {where}"
    fn = getattr(module, name, None)
    if fn is None:
        available = sorted(
            n for n, v in vars(module).items() if callable(v) and not n.startswith("_") and not inspect.isclass(v)
        )
        hint = did_you_mean(name, available)
        raise RlcoreError(
            f"{origin} has no function {name!r}"
            + (f"; did you mean {hint!r}?" if hint else "")
            + "; functions defined there: "
            + (", ".join(available) or "(none)")
        )
    if not callable(fn):
        raise RlcoreError(f"{origin}: {name!r} is not a function but a {type(fn).__name__} value")
    return fn, origin


def _import_file(path: Path) -> Any:
    path = path.expanduser().resolve()
    if not path.is_file():
        raise RlcoreError(f"reward file {str(path)!r} does not exist")
    # A stable, unique module name, registered in sys.modules, so that the file's own classes
    # pickle by reference and a second import of the same file is the same module.
    module_name = f"rlcore_user_reward_{path.stem}_{sha1(str(path).encode()).hexdigest()[:8]}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Helpers next to the file are importable from it, as when running it as a script.
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        del sys.modules[module_name]
        raise RlcoreError(f"syntax error in reward file {str(path)!r}, line {exc.lineno}: {exc.msg}") from None
    except BaseException as exc:  # noqa: BLE001 - anything the user's file raises at import
        del sys.modules[module_name]
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise RlcoreError(f"importing reward file {str(path)!r} failed: {type(exc).__name__}: {exc}") from None
    return module


_VERL_NAMES = ("data_source", "solution_str", "ground_truth")


class PythonReward:
    """A user's function as a reward: ``fn(item: RewardInput)`` or verl's
    ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``, told apart by the
    signature. verl functions may return a dict with a ``score`` key; its other numeric keys
    become metrics (see :func:`_normalise`)."""

    required_fields: frozenset[str] = frozenset()

    def __init__(self, fn: Callable[..., Any], origin: str = "") -> None:
        self.fn = fn
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


def _detect_style(fn: Callable[..., Any], origin: str) -> str:
    """"item" for fn(item); "verl3", "verl4" or "verl_kw" (how extra_info is passed) for verl's form."""
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


def build_python_reward(options: Any, context: Any = None) -> PythonReward:
    """Factory of the builtin ``python`` reward (options: :class:`rlcore.builtin.options.PythonRewardOptions`)."""
    fn, origin = load_python_function(options.target)
    return PythonReward(fn, origin)


# ----------------------------------------------------------------------------- required fields


def check_required_fields(prompts: Sequence[Prompt], required: Iterable[str], source_name: str) -> None:
    """Fail early, naming the data file, the first row and the field, when a reward needs a field
    (``ground_truth``, ``data_source``, or ``extra_info.KEY``) that a prompt lacks."""
    required = sorted(set(required or ()))
    for field_name in required:
        for prompt in prompts:
            if _missing(prompt, field_name):
                where = field_name if not field_name.startswith("extra_info.") else field_name
                hint = " (verl's format keeps it in reward_model.ground_truth)" if field_name == "ground_truth" else ""
                raise RlcoreError(
                    f"data {source_name!r}: row {prompt.index} has no {where!r}, which the reward function "
                    f"needs{hint}; fields the reward needs: {', '.join(required)}"
                )


def _missing(prompt: Prompt, name: str) -> bool:
    if name.startswith("extra_info."):
        value = (prompt.extra_info or {}).get(name.removeprefix("extra_info."))
    elif hasattr(prompt, name):
        value = getattr(prompt, name)
    else:
        raise RlcoreError(
            f"a reward function requires the unknown field {name!r}; known: ground_truth, data_source, extra_info.KEY"
        )
    return value is None or (isinstance(value, str) and value == "")


# ----------------------------------------------------------------------------- scoring one item


def _normalise(result: Any) -> tuple:
    """Turn what a reward function returned into ``("ok", score, metrics)`` or ``("invalid", why)``."""
    metrics: dict[str, float] = {}
    if isinstance(result, RewardResult):
        score, raw_metrics = result.score, result.metrics or {}
    elif isinstance(result, dict) and "score" in result:  # verl's dict form
        score, raw_metrics = result["score"], {k: v for k, v in result.items() if k != "score"}
    else:
        score, raw_metrics = result, {}
    if not isinstance(score, numbers.Real) or isinstance(score, (str, bytes)):
        return ("invalid", f"returned {type(result).__name__} {_short(result)}")
    score = float(score)
    if not math.isfinite(score):
        return ("invalid", f"returned the non-finite score {score}")
    if isinstance(raw_metrics, dict):
        for key, value in raw_metrics.items():
            if isinstance(value, numbers.Real) and math.isfinite(float(value)):
                metrics[str(key)] = float(value)
    return ("ok", score, metrics)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _invoke(fn: Callable[[RewardInput], Any], item: RewardInput) -> tuple:
    try:
        result = fn(item)
    except BaseException as exc:  # noqa: BLE001 - user code: SystemExit and friends score 0 too
        frames = traceback.extract_tb(exc.__traceback__)
        last = frames[-1] if frames else None
        where = f" ({Path(last.filename).name}:{last.lineno})" if last else ""
        return ("error", f"{type(exc).__name__}: {exc}{where}")
    try:
        return _normalise(result)
    except Exception as exc:  # noqa: BLE001 - e.g. a score whose __float__ raises
        return ("invalid", f"returned a value that could not be read: {type(exc).__name__}: {exc}")


# ----------------------------------------------------------------------------- worker pools


def _process_worker(fn: Callable, conn: Connection, parent_pid: int) -> None:
    """Loop in a worker process: receive ``(ticket, item)``, send back ``(ticket, outcome)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle

    def orphan_watch() -> None:  # exit if the parent died, even while fn loops forever
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=orphan_watch, daemon=True).start()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        if message is None:
            break
        ticket, item = message
        outcome = _invoke(fn, item)
        try:
            conn.send((ticket, outcome))
        except Exception as exc:  # noqa: BLE001 - an unpicklable metric value, say
            conn.send((ticket, ("invalid", f"result could not be sent back: {type(exc).__name__}: {exc}")))
    os._exit(0)


class _ProcessPool:
    """Worker processes, one pipe each. A worker past its deadline is killed and replaced."""

    def __init__(self, fn: Callable, size: int, method: str) -> None:
        self.fn, self.size, self.ctx = fn, size, multiprocessing.get_context(method)
        self.procs: list[Any] = [None] * size
        self.conns: list[Connection | None] = [None] * size

    def _start(self, slot: int) -> None:
        parent_end, child_end = self.ctx.Pipe(duplex=True)
        proc = self.ctx.Process(
            target=_process_worker, args=(self.fn, child_end, os.getpid()), daemon=True, name=f"rlcore-reward-{slot}"
        )
        proc.start()
        child_end.close()
        self.procs[slot], self.conns[slot] = proc, parent_end

    def submit(self, slot: int, ticket: int, item: RewardInput) -> None:
        if self.procs[slot] is None:
            self._start(slot)
        try:
            self.conns[slot].send((ticket, item))  # type: ignore[union-attr]
        except (BrokenPipeError, OSError):
            self.replace(slot)
            self.conns[slot].send((ticket, item))  # type: ignore[union-attr]

    def wait(self, slots: list[int], timeout: float) -> list[tuple[int, int, tuple]]:
        by_conn = {self.conns[s]: s for s in slots}
        out = []
        for conn in wait_connections(list(by_conn), timeout=max(0.0, timeout)):
            slot = by_conn[conn]  # type: ignore[index]
            try:
                ticket, outcome = conn.recv()  # type: ignore[union-attr]
            except (EOFError, OSError):
                proc = self.procs[slot]
                proc.join(1.0)
                code = proc.exitcode
                self.replace(slot)
                out.append((slot, -1, ("error", f"the reward worker process died (exit code {code})")))
                continue
            out.append((slot, ticket, outcome))
        return out

    def replace(self, slot: int) -> None:
        proc, conn = self.procs[slot], self.conns[slot]
        if proc is not None and proc.is_alive():
            proc.kill()
        if proc is not None:
            proc.join(2.0)
        if conn is not None:
            conn.close()
        self.procs[slot] = self.conns[slot] = None  # restarted lazily by the next submit

    def close(self) -> None:
        for slot, conn in enumerate(self.conns):
            if conn is not None:
                try:
                    conn.send(None)
                except Exception:  # noqa: BLE001
                    pass
        deadline = time.monotonic() + 1.0
        for slot, proc in enumerate(self.procs):
            if proc is not None:
                proc.join(max(0.0, deadline - time.monotonic()))
            self.replace(slot)


class _ThreadPool:
    """Worker threads sharing one result queue. A thread past its deadline cannot be killed: it is
    abandoned (its late result ignored) and a fresh thread takes its slot."""

    def __init__(self, fn: Callable, size: int) -> None:
        self.fn, self.size = fn, size
        self.results: queue.Queue = queue.Queue()
        self.inboxes: list[queue.Queue | None] = [None] * size
        self.abandoned = 0

    def _start(self, slot: int) -> None:
        inbox: queue.Queue = queue.Queue()
        self.inboxes[slot] = inbox

        def loop() -> None:
            while True:
                message = inbox.get()
                if message is None:
                    return
                ticket, item = message
                self.results.put((slot, ticket, _invoke(self.fn, item)))

        threading.Thread(target=loop, daemon=True, name=f"rlcore-reward-{slot}").start()

    def submit(self, slot: int, ticket: int, item: RewardInput) -> None:
        if self.inboxes[slot] is None:
            self._start(slot)
        self.inboxes[slot].put((ticket, item))  # type: ignore[union-attr]

    def wait(self, slots: list[int], timeout: float) -> list[tuple[int, int, tuple]]:
        out = []
        try:
            out.append(self.results.get(timeout=max(0.0, timeout)))
            while True:
                out.append(self.results.get_nowait())
        except queue.Empty:
            pass
        return out

    def replace(self, slot: int) -> None:
        inbox = self.inboxes[slot]
        if inbox is not None:
            inbox.put(None)  # the thread exits once (if ever) its current call returns
            self.abandoned += 1
        self.inboxes[slot] = None

    def close(self) -> None:
        for inbox in self.inboxes:
            if inbox is not None:
                inbox.put(None)
        self.inboxes = [None] * self.size


# ----------------------------------------------------------------------------- the runner


@dataclass
class RewardBatch:
    """Scores of a batch, in item order, and its metrics (``reward/errors``, ``reward/invalid``,
    ``reward/timeouts``, ``reward/time_s`` and ``reward/<name>``: the mean of each per-item metric
    over the items that reported it). ``statuses[i]`` is ok, error, invalid or timeout."""

    scores: list[float]
    metrics: dict[str, float] = field(default_factory=dict)
    statuses: list[str] = field(default_factory=list)


class RewardRunner:
    """Scores items with ``fn`` on ``workers`` workers; a call past ``timeout_s`` scores 0.

    Use as a context manager, or call :meth:`close` when done (workers are daemons, so they also
    end with the process).
    """

    def __init__(
        self,
        fn: Callable[[RewardInput], Any],
        timeout_s: float = 10.0,
        workers: int = 8,
        *,
        isolation: Literal["auto", "process", "thread"] = "auto",
    ) -> None:
        if not callable(fn):
            raise RlcoreError(f"a reward function must be callable, got {type(fn).__name__}")
        if timeout_s <= 0:
            raise RlcoreError(f"reward timeout_s must be > 0, got {timeout_s}")
        if workers < 1:
            raise RlcoreError(f"reward workers must be >= 1, got {workers}")
        self.fn, self.timeout_s, self.workers = fn, float(timeout_s), int(workers)
        self.isolation = self._choose_isolation(isolation)
        self._pool: _ProcessPool | _ThreadPool | None = None
        self._logged: set[str] = set()
        self._ticket = 0

    def _choose_isolation(self, isolation: str) -> str:
        if isolation == "thread":
            return "thread"
        methods = multiprocessing.get_all_start_methods()
        if "fork" in methods:
            return "fork"
        try:
            pickle.dumps(self.fn)
        except Exception as exc:  # noqa: BLE001
            if isolation == "process":
                raise RlcoreError(
                    f"this platform cannot fork, and the reward function cannot be pickled for spawned workers: {exc}"
                ) from None
            logger.warning(
                "reward function cannot be pickled ({}); scoring in threads, where a call past the time limit "
                "is abandoned but keeps running",
                exc,
            )
            return "thread"
        return "spawn"

    def _get_pool(self) -> _ProcessPool | _ThreadPool:
        if self._pool is None:
            if self.isolation == "thread":
                self._pool = _ThreadPool(self.fn, self.workers)
            else:
                self._pool = _ProcessPool(self.fn, self.workers, self.isolation)
        return self._pool

    def score(self, items: Sequence[RewardInput]) -> RewardBatch:
        start = time.perf_counter()
        n = len(items)
        scores = [0.0] * n
        statuses = ["ok"] * n
        item_metrics: list[dict[str, float]] = [{} for _ in range(n)]
        pool = self._get_pool()
        pending = deque(range(n))
        busy: dict[int, tuple[int, int, float]] = {}  # slot -> (item index, ticket, deadline)
        idle = list(range(min(self.workers, n)))[::-1]

        def finish(index: int, outcome: tuple) -> None:
            status = outcome[0]
            if status == "ok":
                scores[index], item_metrics[index] = outcome[1], outcome[2]
                return
            statuses[index] = status
            self._log_first(status, index, items[index], outcome[1])

        while pending or busy:
            while pending and idle:
                slot, index = idle.pop(), pending.popleft()
                self._ticket += 1
                pool.submit(slot, self._ticket, items[index])
                busy[slot] = (index, self._ticket, time.monotonic() + self.timeout_s)
            next_deadline = min(deadline for _, _, deadline in busy.values())
            for slot, ticket, outcome in pool.wait(list(busy), next_deadline - time.monotonic()):
                if slot not in busy or (ticket != -1 and busy[slot][1] != ticket):
                    continue  # a late answer from an abandoned thread
                index = busy.pop(slot)[0]
                finish(index, outcome)
                idle.append(slot)
            now = time.monotonic()
            for slot, (index, _, deadline) in list(busy.items()):
                if now >= deadline:
                    busy.pop(slot)
                    pool.replace(slot)
                    finish(index, ("timeout", f"no result after {self.timeout_s:g} s"))
                    idle.append(slot)

        metrics = {name: float(statuses.count(status)) for status, name in FAILURE_METRICS.items()}
        sums: dict[str, list[float]] = {}
        for m in item_metrics:
            for key, value in m.items():
                sums.setdefault(key, []).append(value)
        for key, values in sums.items():
            metrics[key if key.startswith("reward/") else f"reward/{key}"] = sum(values) / len(values)
        metrics["reward/time_s"] = time.perf_counter() - start
        return RewardBatch(scores=scores, metrics=metrics, statuses=statuses)

    def _log_first(self, status: str, index: int, item: RewardInput, detail: str) -> None:
        if status in self._logged:
            return
        self._logged.add(status)
        source = f" (data source {item.data_source!r})" if item.data_source else ""
        logger.warning(
            "reward function {} on item {}{}: {}; such items score 0 and are counted in {} (only the first is logged)",
            _DESCRIBE[status],
            index,
            source,
            detail,
            FAILURE_METRICS[status],
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> "RewardRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass
