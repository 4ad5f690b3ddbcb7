"""Running reward functions safely: a runner with time limits, and the data-field check.

A reward function is user code that sees model output, so it may raise, return nonsense, or
loop forever. :class:`RewardRunner` scores a batch so that none of these can crash or stall a
run: such an item scores 0 and is counted in the batch's metrics.

Why worker *processes*: a Python thread cannot be killed, so a pure-Python infinite loop in a
thread would keep a core (and the GIL) busy for the rest of the run. A worker process past its
deadline is killed and replaced. How workers start (``isolation``):

- ``fork`` (the default on Linux): lambdas, closures and objects built by a plugin's factory work
  without pickling, and a worker starts in milliseconds. The cost: a forked child shares the
  trainer's memory copy-on-write, so pages the trainer rewrites later (weights and optimizer
  state held on CPU) are kept once more for the workers. Call :meth:`RewardRunner.start` early
  (before models load) to keep that small.
- ``forkserver`` or ``spawn`` on request, or where fork is missing: clean, small workers, but the
  function must pickle, and Python re-imports the main script in each worker, so a script without
  an ``if __name__ == "__main__":`` guard would run again there. That is why they are not the
  default. A worker imports the reward's module once, before it is given work: the time limit
  starts after that. If such workers cannot start, the runner falls back to fork.
- threads only where no process works (or with ``isolation="thread"``): a call past the limit is
  then abandoned, not killed.

Workers start at :meth:`RewardRunner.start` or the first batch, all at once, and are reused; a
killed one is replaced.
"""

from __future__ import annotations

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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_connections
from pathlib import Path
from typing import Any, Literal

from loguru import logger

from rlcore.errors import RlcoreError
from rlcore.interfaces import Prompt, RewardInput, RewardResult

__all__ = ["RewardBatch", "RewardRunner", "check_required_fields"]

# Statuses of one scored item, and the batch metric that counts each failure.
FAILURE_METRICS = {"error": "reward/errors", "invalid": "reward/invalid", "timeout": "reward/timeouts"}
# Batch metrics that count (they add up over chunks of one batch), beside FAILURE_METRICS.
COUNT_METRICS = ("reward/worker_deaths", "reward/output_bytes", "reward/output_dropped_bytes")
_DESCRIBE = {
    "error": "raised an exception",
    "invalid": "returned something that is not a finite number or RewardResult",
    "timeout": "ran past its time limit",
}


# ----------------------------------------------------------------------------- the python reward


# ----------------------------------------------------------------------------- required fields


def check_required_fields(prompts: Sequence[Prompt], required: Iterable[str], source_name: str) -> None:
    """Fail early, naming the data file, the first row and the field, when a reward needs a field
    (``ground_truth``, ``data_source``, or ``extra_info.KEY``) that a prompt lacks."""
    required = sorted(set(required or ()))
    for field_name in required:
        for prompt in prompts:
            if _missing(prompt, field_name):
                where = field_name if not field_name.startswith("extra_info.") else field_name
                hint = (
                    " (verl's format keeps it in reward_model.ground_truth)"
                    if field_name == "ground_truth"
                    else ""
                )
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


OUTPUT_TAIL = 4096  # bytes of each call's printed output that come back (the rest is counted)
_BATCH_OUTPUT_LOG = 16384  # bytes of reward output written into run.log per batch, at most


class _OutputCapture:
    """A worker's stdout and stderr (file descriptors 1 and 2, so C code and subprocesses are
    caught too) go to a pipe that a thread drains, keeping the last :data:`OUTPUT_TAIL` bytes
    of each call and counting the rest: a reward that prints 100 MB a call costs no memory and
    no console. After a call, a marker written through the pipe says when its output is in."""

    def __init__(self) -> None:
        self.marker = b"\0rlcore-output-" + os.urandom(8).hex().encode() + b"\0"
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed or odd stream
                pass
        from rlcore import debug

        # A breakpoint in the reward must still tell the console how to attach.
        debug.announce_on(open(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace"))
        read_end, write_end = os.pipe()
        os.dup2(write_end, 1)
        os.dup2(write_end, 2)
        os.close(write_end)
        # Python's streams may have been pointed elsewhere than fds 1 and 2 (a test's capture,
        # rich): give the worker its own, on the pipe.
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
        self.read_end = read_end
        self.cond = threading.Condition()
        self.tail, self.total, self.markers = bytearray(), 0, 0
        threading.Thread(target=self._drain, daemon=True).start()

    def _keep(self, data: bytes) -> None:
        if data:
            self.total += len(data)
            self.tail += data
            del self.tail[:-OUTPUT_TAIL]

    def _drain(self) -> None:
        held = b""
        while True:
            try:
                chunk = os.read(self.read_end, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            data = held + chunk
            with self.cond:
                while (at := data.find(self.marker)) >= 0:
                    self._keep(data[:at])
                    data = data[at + len(self.marker) :]
                    self.markers += 1
                    self.cond.notify_all()
                # Hold back an end that may be the start of a marker split across reads.
                cut = next(
                    (
                        k
                        for k in range(min(len(data), len(self.marker) - 1), 0, -1)
                        if self.marker.startswith(data[-k:])
                    ),
                    0,
                )
                self._keep(data[: len(data) - cut])
                held = data[len(data) - cut :]

    def collect(self) -> tuple[str, int]:
        """The kept tail of the output since the last call, and how many bytes it had in all."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        with self.cond:
            seen = self.markers
        try:
            os.write(1, self.marker)
        except OSError:  # the reward closed its stdout: what came through is all there is
            pass
        else:
            with self.cond:
                self.cond.wait_for(lambda: self.markers > seen, timeout=5.0)
        with self.cond:
            text, total = bytes(self.tail).decode("utf-8", errors="replace"), self.total
            self.tail, self.total = bytearray(), 0
        return text, total


def _process_worker(fn: Callable, conn: Connection) -> None:
    """Loop in a worker process: say ready, then receive ``(ticket, item)`` and send back
    ``(ticket, outcome, (output tail, output bytes))``. ``fn`` arrives already unpickled (or
    inherited, when forked)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    capture = _OutputCapture()
    parent_pid = os.getppid()  # the trainer (fork) or the fork server, which ends with the trainer

    def orphan_watch() -> None:  # exit if the parent died, even while fn loops forever
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=orphan_watch, daemon=True).start()
    conn.send((0, ("ready",)))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        if message is None:
            break
        ticket, item = message
        outcome = _invoke(fn, item)
        output = capture.collect()
        try:
            conn.send((ticket, outcome, output))
        except Exception as exc:  # noqa: BLE001 - an unpicklable metric value, say
            conn.send(
                (ticket, ("invalid", f"result could not be sent back: {type(exc).__name__}: {exc}"), output)
            )
    os._exit(0)


class _ProcessPool:
    """Worker processes, one pipe each. A worker past its deadline is killed and replaced.

    ``state[slot]``: None (not running), "starting" (until its ready message), "ready", or
    "broken" (it failed to start; not retried by this pool)."""

    def __init__(self, fn: Callable, size: int, method: str, start_timeout: float) -> None:
        self.fn, self.size, self.method = fn, size, method
        self.ctx = multiprocessing.get_context(method)
        self.start_timeout = start_timeout
        self.procs: list[Any] = [None] * size
        self.conns: list[Connection | None] = [None] * size
        self.state: list[str | None] = [None] * size
        self.start_deadline: list[float] = [0.0] * size
        self.output: list[tuple[str, int] | None] = [None] * size  # of the last answer read, per slot

    def exit_code_if_dead(self, slot: int) -> int | None:
        """The exit code of a ready worker that has died since (killed from outside, say), else None."""
        proc = self.procs[slot]
        if proc is None or self.state[slot] != "ready" or proc.is_alive():
            return None
        return proc.exitcode

    def start(self, slot: int) -> None:
        parent_end, child_end = self.ctx.Pipe(duplex=True)
        proc = self.ctx.Process(
            target=_process_worker, args=(self.fn, child_end), daemon=True, name=f"rlcore-reward-{slot}"
        )
        proc.start()
        child_end.close()
        self.procs[slot], self.conns[slot] = proc, parent_end
        self.state[slot], self.start_deadline[slot] = "starting", time.monotonic() + self.start_timeout

    def submit(self, slot: int, ticket: int, item: RewardInput) -> None:
        self.conns[slot].send((ticket, item))  # type: ignore[union-attr]

    def wait(self, slots: list[int], timeout: float) -> list[tuple[int, int, tuple]]:
        by_conn = {self.conns[s]: s for s in slots if self.conns[s] is not None}
        out = []
        for conn in wait_connections(list(by_conn), timeout=max(0.0, timeout)):
            slot = by_conn[conn]  # type: ignore[index]
            try:
                ticket, outcome, *output = conn.recv()  # type: ignore[union-attr]
                self.output[slot] = output[0] if output else None
            except (EOFError, OSError):
                proc = self.procs[slot]
                proc.join(1.0)
                starting = self.state[slot] == "starting"
                self.stop(slot)
                if starting:
                    self.state[slot] = "broken"
                    out.append((slot, 0, ("start_failed", f"exit code {proc.exitcode}")))
                else:
                    out.append(
                        (
                            slot,
                            -1,
                            ("error", f"the reward worker process died ({describe_exit(proc.exitcode)})"),
                        )
                    )
                continue
            if outcome[0] == "ready":
                self.state[slot] = "ready"
            out.append((slot, ticket, outcome))
        return out

    def stop(self, slot: int) -> None:
        proc, conn = self.procs[slot], self.conns[slot]
        if proc is not None and proc.is_alive():
            proc.kill()
        if proc is not None:
            proc.join(2.0)
        if conn is not None:
            conn.close()
        self.procs[slot] = self.conns[slot] = None
        self.state[slot] = None

    def replace(self, slot: int) -> None:
        self.stop(slot)
        self.start(slot)

    def close(self) -> None:
        for conn in self.conns:
            if conn is not None:
                try:
                    conn.send(None)
                except Exception:  # noqa: BLE001
                    pass
        deadline = time.monotonic() + 1.0
        for slot, proc in enumerate(self.procs):
            if proc is not None:
                proc.join(max(0.0, deadline - time.monotonic()))
            self.stop(slot)


class _ThreadPool:
    """Worker threads sharing one result queue. A thread past its deadline cannot be killed: it is
    abandoned (its late result ignored) and a fresh thread takes its slot."""

    output: list[None]  # threads share the trainer's stdout: nothing is captured

    def __init__(self, fn: Callable, size: int) -> None:
        self.fn, self.size = fn, size
        self.results: queue.Queue = queue.Queue()
        self.inboxes: list[queue.Queue | None] = [None] * size
        self.state: list[str | None] = [None] * size
        self.start_deadline: list[float] = [0.0] * size
        self.output = [None] * size
        self.abandoned = 0

    def exit_code_if_dead(self, slot: int) -> None:
        return None  # a thread cannot be killed from outside

    def start(self, slot: int) -> None:
        inbox: queue.Queue = queue.Queue()
        self.inboxes[slot], self.state[slot] = inbox, "ready"

        def loop() -> None:
            while True:
                message = inbox.get()
                if message is None:
                    return
                ticket, item = message
                self.results.put((slot, ticket, _invoke(self.fn, item)))

        threading.Thread(target=loop, daemon=True, name=f"rlcore-reward-{slot}").start()

    def submit(self, slot: int, ticket: int, item: RewardInput) -> None:
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
        self.start(slot)

    def close(self) -> None:
        for inbox in self.inboxes:
            if inbox is not None:
                inbox.put(None)
        self.inboxes = [None] * self.size
        self.state = [None] * self.size


def describe_exit(code: int | None) -> str:
    """``exit code 3``, or ``killed by SIGKILL`` for a negative multiprocessing exit code."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _in_debugger(pool: _ProcessPool | _ThreadPool, slot: int) -> bool:
    """Whether the worker of ``slot`` is stopped at an :func:`rlcore.debug.breakpoint` (a thread
    worker: whether this process is)."""
    from rlcore.debug import stopped

    proc = getattr(pool, "procs", None)
    pid = proc[slot].pid if proc is not None and proc[slot] is not None else os.getpid()
    return stopped(pid)


# ----------------------------------------------------------------------------- the runner


@dataclass
class RewardBatch:
    """Scores of a batch, in item order, and its metrics (``reward/errors``, ``reward/invalid``,
    ``reward/timeouts``, ``reward/time_s`` and ``reward/<name>``: the mean of each per-item metric
    over the items that reported it). ``statuses[i]`` is ok, error, invalid or timeout."""

    scores: list[float]
    metrics: dict[str, float] = field(default_factory=dict)
    statuses: list[str] = field(default_factory=list)
    item_metrics: list[dict[str, float]] = field(
        default_factory=list
    )  # each item's own (its "acc": dynamic sampling)


def _batch(
    scores: list[float], statuses: list[str], item_metrics: list[dict[str, float]], start: float
) -> RewardBatch:
    metrics = {name: float(statuses.count(status)) for status, name in FAILURE_METRICS.items()}
    sums: dict[str, list[float]] = {}
    for m in item_metrics:
        for key, value in m.items():
            sums.setdefault(key, []).append(value)
    for key, values in sums.items():
        metrics[key if key.startswith("reward/") else f"reward/{key}"] = sum(values) / len(values)
    metrics["reward/time_s"] = time.perf_counter() - start
    return RewardBatch(scores=scores, metrics=metrics, statuses=statuses, item_metrics=item_metrics)


def _stopped_here() -> bool:
    from rlcore.debug import stopped

    return stopped(os.getpid())


def score_batched(fn: Any, items: Sequence[RewardInput], timeout_s: float) -> RewardBatch:
    """Score ``items`` with a batched reward (``fn.score_batch(items)``, see
    :class:`rlcore.interfaces.BatchRewardFunction`) in this process, with ``timeout_s`` for the
    whole batch. A batch that raises or runs late scores 0 everywhere, counted as errors or
    timeouts (the late call is abandoned, still running in its thread); a result list of the
    wrong length is an error; each result that is not a finite number counts as invalid."""
    start = time.perf_counter()
    n = len(items)
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["result"] = list(fn.score_batch(list(items)))
        except BaseException as exc:  # noqa: BLE001 - user code
            box["error"] = exc

    thread = threading.Thread(target=call, name="rlcore-batched-reward", daemon=True)
    thread.start()
    thread.join(timeout_s)
    while thread.is_alive() and _stopped_here():  # at an rlcore.debug.breakpoint(): not late
        thread.join(1.0)
    scores, statuses, item_metrics = [0.0] * n, ["ok"] * n, [{} for _ in range(n)]
    if thread.is_alive():
        failure = ("timeout", f"the batch of {n} gave no result after {timeout_s:g} s")
    elif "error" in box:
        exc = box["error"]
        failure = ("error", f"{type(exc).__name__}: {exc}")
    elif len(box["result"]) != n:
        failure = ("error", f"score_batch returned {len(box['result'])} results for {n} items")
    else:
        failure = None
    if failure is not None:
        logger.warning(
            "batched reward function: {}; the whole batch scores 0 (counted in {})",
            failure[1],
            FAILURE_METRICS[failure[0]],
        )
        return _batch(scores, [failure[0]] * n, item_metrics, start)
    invalid = None
    for i, result in enumerate(box["result"]):
        try:
            outcome = _normalise(result)
        except Exception as exc:  # noqa: BLE001 - e.g. a score whose __float__ raises
            outcome = ("invalid", f"{type(exc).__name__}: {exc}")
        if outcome[0] == "ok":
            scores[i], item_metrics[i] = outcome[1], outcome[2]
        else:
            statuses[i], invalid = outcome[0], invalid or (i, outcome[1])
    if invalid is not None:
        logger.warning(
            "batched reward function: item {} {}; such items score 0 (counted in reward/invalid)", *invalid
        )
    return _batch(scores, statuses, item_metrics, start)


class RewardRunner:
    """Scores items with ``fn`` on ``workers`` workers; a call past ``timeout_s`` scores 0.

    ``isolation``: "auto" (processes: forkserver when ``fn`` pickles, else fork; threads where
    neither works), "process" (the same, never threads), "thread", or a start method ("fork",
    "forkserver", "spawn"). Use as a context manager, or call :meth:`close` when done (workers are
    daemons, so they also end with the process).
    """

    def __init__(
        self,
        fn: Callable[[RewardInput], Any],
        timeout_s: float = 10.0,
        workers: int = 8,
        *,
        isolation: Literal["auto", "process", "thread", "fork", "forkserver", "spawn"] = "auto",
        start_timeout_s: float = 120.0,
    ) -> None:
        if not callable(fn):
            raise RlcoreError(f"a reward function must be callable, got {type(fn).__name__}")
        if timeout_s <= 0:
            raise RlcoreError(f"reward timeout_s must be > 0, got {timeout_s}")
        if workers < 1:
            raise RlcoreError(f"reward workers must be >= 1, got {workers}")
        self.fn, self.timeout_s, self.workers = fn, float(timeout_s), int(workers)
        self.start_timeout_s = float(start_timeout_s)
        self.isolation = self._choose_isolation(isolation)
        self._pool: _ProcessPool | _ThreadPool | None = None
        self._logged: set[str] = set()
        self._ticket = 0

    def _choose_isolation(self, isolation: str) -> str:
        methods = multiprocessing.get_all_start_methods()
        if isolation == "thread":
            return "thread"
        if isolation in ("fork", "forkserver", "spawn"):
            if isolation not in methods:
                raise RlcoreError(
                    f"start method {isolation!r} is not available here; available: {', '.join(methods)}"
                )
            return isolation
        if "fork" in methods:
            return "fork"
        try:
            pickle.dumps(self.fn)
        except Exception as exc:  # noqa: BLE001 - a lambda, a closure, a local class...
            if isolation == "process":
                raise RlcoreError(
                    f"this platform cannot fork, and the reward function cannot be pickled: {exc}"
                ) from None
            logger.warning(
                "the reward function cannot be pickled ({}) and this platform cannot fork: scoring in threads, "
                "where a call past the time limit is abandoned but keeps running",
                exc,
            )
            return "thread"
        return "forkserver" if "forkserver" in methods else "spawn"

    def start(self) -> RewardRunner:
        """Start every worker now and wait until they are ready (optional: the first batch does it).
        With fork, calling this before the trainer allocates much keeps the workers small."""
        pool = self._get_pool()
        for slot in range(self.workers):
            if pool.state[slot] is None:
                pool.start(slot)
        deadline = time.monotonic() + self.start_timeout_s
        while "starting" in pool.state and time.monotonic() < deadline:
            slots = [s for s, state in enumerate(pool.state) if state == "starting"]
            for _, _, outcome in pool.wait(slots, deadline - time.monotonic()):
                if outcome[0] == "start_failed":
                    self._log_start_failure(outcome[1])
        self._fall_back_if_broken()
        return self

    def _fall_back_if_broken(self) -> None:
        pool = self._pool
        if pool is None or "broken" not in pool.state or self.isolation not in ("forkserver", "spawn"):
            return
        if "fork" in multiprocessing.get_all_start_methods():
            logger.warning(
                "reward workers failed to start with {!r}; using 'fork' from now on", self.isolation
            )
            self.close()
            self.isolation = "fork"

    def _get_pool(self) -> _ProcessPool | _ThreadPool:
        if self._pool is None:
            if self.isolation == "thread":
                self._pool = _ThreadPool(self.fn, self.workers)
            else:
                self._pool = _ProcessPool(self.fn, self.workers, self.isolation, self.start_timeout_s)
        return self._pool

    def score(self, items: Sequence[RewardInput]) -> RewardBatch:
        start = time.perf_counter()
        n = len(items)
        scores = [0.0] * n
        statuses = ["ok"] * n
        item_metrics: list[dict[str, float]] = [{} for _ in range(n)]
        pool = self._get_pool()
        slots = range(min(self.workers, n))
        deaths = 0
        for slot in range(self.workers):  # workers killed between batches (the OOM killer, a user)
            code = pool.exit_code_if_dead(slot)
            if code is not None:
                deaths += 1
                self._log_death(slot, code, "between batches")
                pool.stop(slot)
        for slot in slots:
            if pool.state[slot] is None:
                pool.start(slot)  # all start together; each says when it is ready
        idle = [slot for slot in slots if pool.state[slot] == "ready"][::-1]
        pending = deque(range(n))
        busy: dict[int, tuple[int, int, float]] = {}  # slot -> (item index, ticket, deadline)
        start_failure = ""
        outputs: dict[int, tuple[str, int]] = {}  # item index -> (kept tail, bytes printed)

        def finish(index: int, outcome: tuple, output: tuple[str, int] | None = None) -> None:
            if output is not None and output[1]:
                outputs[index] = output
            status = outcome[0]
            if status == "ok":
                scores[index], item_metrics[index] = outcome[1], outcome[2]
                return
            statuses[index] = status
            detail = outcome[1]
            if output is not None and output[0].strip():
                detail += f"; its output ended with: {output[0].strip()[-1000:]!r}"
            self._log_first(status, index, items[index], detail)

        while pending or busy:
            while pending and idle:
                slot, index = idle.pop(), pending.popleft()
                self._ticket += 1
                try:
                    pool.submit(slot, self._ticket, items[index])
                except OSError:  # the idle worker died (its pipe is closed): replace it, retry the item
                    deaths += 1
                    self._log_death(
                        slot, pool.procs[slot].exitcode if pool.procs[slot] else None, "while idle"
                    )
                    pending.appendleft(index)
                    pool.replace(slot)
                    continue
                busy[slot] = (index, self._ticket, time.monotonic() + self.timeout_s)
            starting = [slot for slot in slots if pool.state[slot] == "starting"]
            if pending and not busy and not starting and not idle:
                # No worker could start: fail the rest rather than wait forever.
                for index in pending:
                    finish(index, ("error", f"no reward worker could start ({start_failure})"))
                break
            deadlines = [d for _, _, d in busy.values()] + [pool.start_deadline[s] for s in starting]
            for slot, ticket, outcome in pool.wait(list(busy) + starting, min(deadlines) - time.monotonic()):
                if outcome[0] == "ready":
                    idle.append(slot)
                elif outcome[0] == "start_failed":
                    start_failure = outcome[1]
                    self._log_start_failure(outcome[1])
                elif slot in busy and (ticket == -1 or busy[slot][1] == ticket):
                    index = busy.pop(slot)[0]
                    finish(index, outcome, pool.output[slot] if ticket != -1 else None)
                    if ticket == -1:
                        deaths += 1
                        self._log_death(slot, None, f"while scoring item {index}: {outcome[1]}")
                        pool.replace(slot)  # the worker died; a new one says when it is ready
                    else:
                        idle.append(slot)
                # else: a late answer from an abandoned thread
            now = time.monotonic()
            for slot, (index, ticket, deadline) in list(busy.items()):
                if now >= deadline and _in_debugger(pool, slot):  # rlcore.debug.breakpoint(): not late
                    busy[slot] = (index, ticket, now + self.timeout_s)
                elif now >= deadline:
                    busy.pop(slot)
                    pool.replace(slot)
                    finish(index, ("timeout", f"no result after {self.timeout_s:g} s"))
                    if pool.state[slot] == "ready":
                        idle.append(slot)
            for slot in starting:
                if pool.state[slot] == "starting" and now >= pool.start_deadline[slot]:
                    pool.stop(slot)  # type: ignore[union-attr]
                    pool.state[slot] = "broken"
                    start_failure = f"no ready message within {self.start_timeout_s:g} s"
                    self._log_start_failure(start_failure)

        self._fall_back_if_broken()
        batch = _batch(scores, statuses, item_metrics, start)
        batch.metrics["reward/worker_deaths"] = float(deaths)
        if self.isolation != "thread":
            self._record_output(outputs, batch.metrics)
        return batch

    def _record_output(self, outputs: dict[int, tuple[str, int]], metrics: dict[str, float]) -> None:
        """Count what the reward printed (``reward/output_bytes``; ``reward/output_dropped_bytes``:
        what did not come back from the workers) and write a bounded part of it into the log at
        debug level (``run.log``, not the console)."""
        printed = sum(total for _, total in outputs.values())
        kept = sum(len(tail.encode("utf-8", errors="replace")) for tail, _ in outputs.values())
        metrics["reward/output_bytes"] = float(printed)
        metrics["reward/output_dropped_bytes"] = float(max(0, printed - kept))
        if not outputs:
            return
        if "output" not in self._logged:
            self._logged.add("output")
            logger.info(
                "the reward function prints: its output is captured (the last {} bytes of each call go to "
                "run.log at debug level; all of it is counted in reward/output_bytes)",
                OUTPUT_TAIL,
            )
        room = _BATCH_OUTPUT_LOG
        for index in sorted(outputs):
            tail, total = outputs[index]
            if room <= 0:
                break
            shown = tail[-room:]
            room -= len(shown)
            logger.debug(
                "reward output of item {} ({} bytes{}):\n{}",
                index,
                total,
                f", the last {len(shown)} shown" if len(shown) < total else "",
                shown,
            )

    def _log_death(self, slot: int, code: int | None, when: str) -> None:
        how = f" ({describe_exit(code)})" if code is not None else ""
        logger.warning(
            "reward worker {} died{} {}; it is replaced, and counted in reward/worker_deaths", slot, how, when
        )

    def _log_start_failure(self, detail: str) -> None:
        if "start" not in self._logged:
            self._logged.add("start")
            logger.error("a reward worker process failed to start ({}); its error is printed above", detail)

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

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass
