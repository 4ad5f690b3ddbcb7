"""The rollout engine in a process of its own (``[rollout] placement = "split"``).

:class:`EngineProcess` stands in for the engine in the trainer's process: the same
``RolloutEngine`` protocol, each call sent to a child process that built the manifest's engine
with the manifest's factory. The child generates on its own device (``[rollout] engine_device``)
and with its own weights, so it can generate while the trainer trains without sharing a Python
interpreter (no GIL between decoding and the update) or, on separate GPUs, a device.

Weights go to the child in buckets of ``[rollout] weight_bucket_mb``, through one of two
transports:

- ``shared``: one bucket buffer in memory both processes map, CPU shared memory or, on CUDA, a
  CUDA IPC handle (two processes on one GPU cannot form an NCCL group; IPC works there and across
  the GPUs of one host). The trainer fills the buffer, the child copies out of it.
- ``gloo``: a two-process gloo group (trainer and engine) on a TCP store, each bucket broadcast
  from the trainer; CUDA tensors are staged through host memory. For an engine whose memory the
  trainer cannot map.

Only what arrives complete is handed to the engine, as the engine's one ``update_weights`` call
per sync consuming a stream of tensors: an engine sees the same call as in the trainer's process.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import pickle
import threading
import traceback
from collections.abc import Iterable, Iterator
from typing import Any

from rlcore.errors import RlcoreError

_DTYPES = ("float32", "bfloat16", "float16", "float64", "int64", "int32", "int8", "uint8", "bool")


class EngineProcessError(RlcoreError):
    """The engine's process failed or ended."""


@dataclasses.dataclass
class _Piece:
    """Part (or all) of one tensor in a bucket: ``nbytes`` bytes at ``offset`` in the buffer, which
    are bytes ``start..start+nbytes`` of the tensor ``name`` (``total`` bytes in all)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    total: int
    start: int
    offset: int
    nbytes: int


class EngineProcess:
    """A ``RolloutEngine`` whose work runs in a child process (see the module docstring).

    ``component``/``options``: the engine the manifest chose; ``context``: the ``BuildContext``
    the child builds it with (its ``device`` is the engine's). Calls are serialized: the
    background rollout thread and the trainer's validation may both use the engine.
    """

    shares_actor = False

    def __init__(
        self,
        component: Any,
        options: Any,
        context: Any,
        trainer_device: str,
        transport: str = "shared",
        bucket_mb: int = 256,
        start_timeout_s: float = 600.0,
    ):
        import torch.multiprocessing as mp

        if transport not in ("shared", "gloo"):
            raise RlcoreError(f"[rollout] weight_transport must be shared or gloo, not {transport!r}")
        self.transport = transport
        self.device = context.device
        self._bucket_bytes = max(1, int(bucket_mb)) << 20
        self._trainer_device = trainer_device
        self._lock = threading.Lock()
        self._buffer = None
        self._group = None
        self._closed = False
        spawn = mp.get_context("spawn")
        self._conn, child_end = spawn.Pipe()
        store = None
        if transport == "gloo":
            store, port = _tcp_store()
            transport_spec = ("gloo", port)
        else:
            transport_spec = ("shared", None)
        self._process = spawn.Process(
            # Not a daemon: an engine may start processes of its own (vLLM, tensor-parallel workers);
            # close() at exit ends it instead.
            target=_serve,
            args=(child_end, transport_spec, self._bucket_bytes),
            name="rlcore-engine",
            daemon=False,
        )
        self._process.start()
        atexit.register(self._close_at_exit)
        child_end.close()
        self.pid = self._process.pid
        try:  # through the pipe, not the start-up arguments: a child that dies starting is then noticed
            self._conn.send((component, options, context))
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            self.close()
            raise EngineProcessError(
                f"rollout engine {getattr(component, 'name', component)!r} cannot be sent to a process of its own "
                f'([rollout] placement = "split"): {exc}; its factory and options must be importable by name '
                '("package.module:function"), as entry points register them'
            ) from None
        except (BrokenPipeError, EOFError, OSError):
            self._process.join(timeout=10)
            raise EngineProcessError(
                f"the rollout engine's process (pid {self.pid}) exited with code {self._process.exitcode} while "
                "starting; a script that runs rlcore in its own process must guard its entry point with "
                'if __name__ == "__main__": (the engine\'s process is spawned and imports the script)'
            ) from None
        if store is not None:
            self._group = _gloo_group(store, rank=0)
        self._reply(timeout=start_timeout_s, what="start")  # the engine is built (or its error raised here)
        if transport == "shared":
            self._buffer = self._shared_buffer()
            self._call("attach", self._buffer)

    # ------------------------------------------------------------------ the protocol

    def generate(self, prompts, params):
        return self._call("generate", [list(p) for p in prompts], params)

    def top_logprobs(self, prompts, completions, k, temperature):
        return self._call("top_logprobs", prompts, completions, k, temperature)

    def sleep(self) -> None:
        self._call("sleep")

    def wake_up(self) -> None:
        self._call("wake_up")

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]], **kwargs: Any) -> None:
        """Stream ``named_tensors`` to the child in buckets; it hands them to its engine's
        ``update_weights`` (with ``kwargs``, e.g. ``lora=``) as they arrive."""
        with self._lock:
            self._check_alive()
            self._conn.send(("update_weights", (), kwargs))
            try:
                for pieces, buffer in self._buckets(named_tensors):
                    self._conn.send(("bucket", pieces))
                    if self._group is not None:
                        self._group.broadcast(buffer, 0).wait()
                    self._reply(what="update_weights")  # the child copied the bucket out
            except BaseException:
                if self._process.is_alive():  # end the child's sync, so that the next call is in step
                    self._conn.send(("end", None))
                    with contextlib.suppress(Exception):
                        self._reply(what="update_weights")
                raise
            self._conn.send(("end", None))
            self._reply(what="update_weights")

    def _close_at_exit(self) -> None:
        try:
            self.close()
        except EngineProcessError:  # at interpreter exit there is no run left to fail
            pass

    def close(self) -> None:
        """End the child (politely, then by force). Raises :class:`EngineProcessError` when the
        child had already died: nothing else may have noticed (the run's last batch was made)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._close_at_exit)
        died = (
            None
            if self._process.is_alive() or getattr(self, "_death_said", False)
            else self._process.exitcode
        )
        died = None if died == 0 else died  # 0: it ended on its own after saying why (a failed start)
        try:
            if self._process.is_alive():
                self._conn.send(("close", (), {}))
                self._process.join(timeout=30)
        except (OSError, EOFError, BrokenPipeError):
            pass
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=10)
        self._conn.close()
        if died is not None:  # it ended before being told to, and no call has said so
            how = f"was killed by signal {-died}" if died < 0 else f"exited with code {died}"
            raise EngineProcessError(
                f"the rollout engine's process (pid {self.pid}) {how} before the run "
                "closed it (after the last batch it was needed for)"
            )

    # ------------------------------------------------------------------ the trainer's side

    def _call(self, method: str, *args: Any) -> Any:
        with self._lock:
            self._check_alive()
            self._conn.send((method, args, {}))
            return self._reply(what=method)

    def _check_alive(self) -> None:
        if self._closed:
            raise EngineProcessError("the rollout engine's process was closed")
        if not self._process.is_alive():
            self._death_said = True
            raise EngineProcessError(
                f"the rollout engine's process (pid {self.pid}) exited with code {self._process.exitcode}"
            )

    def _reply(self, what: str, timeout: float | None = None) -> Any:
        while not self._conn.poll(1.0 if timeout is None else min(timeout, 1.0)):
            if not self._process.is_alive():
                self._death_said = True
                raise EngineProcessError(
                    f"the rollout engine's process (pid {self.pid}) exited with code {self._process.exitcode} "
                    f"during {what}"
                )
            if timeout is not None:
                timeout -= 1.0
                if timeout <= 0:
                    raise EngineProcessError(
                        f"the rollout engine's process (pid {self.pid}) did not answer {what} in time"
                    )
        try:
            status, value = self._conn.recv()
        except EOFError:
            self._death_said = True
            raise EngineProcessError(
                f"the rollout engine's process (pid {self.pid}) ended during {what}"
            ) from None
        if status == "error":
            raise _unpickle_error(value)
        return value

    def _shared_buffer(self):
        import torch

        buffer = torch.empty(self._bucket_bytes, dtype=torch.uint8, device=self._trainer_device)
        return buffer.share_memory_() if buffer.device.type == "cpu" else buffer

    def _buckets(self, named_tensors: Iterable[tuple[str, Any]]) -> Iterator[tuple[list[_Piece], Any]]:
        """Pack the tensors into the bucket buffer; yield each full bucket's pieces once the
        buffer holds them. A tensor larger than a bucket is split over several."""
        import torch

        if self._buffer is None:  # gloo: a host buffer the group broadcasts
            self._buffer = torch.empty(self._bucket_bytes, dtype=torch.uint8)
        buffer = self._buffer
        pieces: list[_Piece] = []
        used = 0
        for name, tensor in named_tensors:
            tensor = tensor.detach()
            dtype = str(tensor.dtype).removeprefix("torch.")
            if dtype not in _DTYPES:
                raise RlcoreError(
                    f"update_weights: {name!r} has dtype {dtype}, which the engine process does not carry"
                )
            data = tensor.contiguous().reshape(-1).view(torch.uint8)
            same_kind = data.device.type == buffer.device.type
            total, start = data.numel(), 0
            while True:
                if used == self._bucket_bytes:
                    self._settle(buffer)
                    yield pieces, buffer
                    pieces, used = [], 0
                n = min(total - start, self._bucket_bytes - used)
                buffer[used : used + n].copy_(data[start : start + n], non_blocking=same_kind)
                pieces.append(_Piece(name, dtype, tuple(tensor.shape), total, start, used, n))
                used += n
                start += n
                if start >= total:
                    break
        if pieces:
            self._settle(buffer)
            yield pieces, buffer

    @staticmethod
    def _settle(buffer) -> None:
        import torch

        if buffer.device.type == "cuda":  # the child reads the buffer on its own stream
            torch.cuda.current_stream(buffer.device).synchronize()


# ---------------------------------------------------------------------- the child


def _serve(conn, transport_spec, bucket_bytes: int) -> None:
    """The engine process: build the engine, then answer calls until told to close."""
    import torch

    try:
        component, options, context = conn.recv()
    except (EOFError, OSError):
        return

    run = (context.manifest or {}).get("run") or {}
    if run.get("threads"):  # as the trainer's process does: the same settings, the same numbers
        torch.set_num_threads(int(run["threads"]))
    torch.manual_seed(context.seed)
    try:  # the group first: the trainer waits for it before the engine's (maybe long) start
        group = _gloo_group(_tcp_client(transport_spec[1]), rank=1) if transport_spec[0] == "gloo" else None
        engine = component.build(options, context)
    except BaseException as exc:  # noqa: BLE001 - reported to the trainer, which raises it
        conn.send(("error", _pickle_error(exc)))
        return
    conn.send(("ok", None))
    receiver = _Receiver(conn, group, bucket_bytes, context.device)
    while True:
        try:
            method, args, kwargs = conn.recv()
        except (EOFError, OSError):
            return  # the trainer is gone
        if method == "close":
            _close(engine)
            return
        try:
            if method == "attach":
                receiver.buffer = args[0]
                value = None
            elif method == "update_weights":
                value = engine.update_weights(receiver.tensors(), **kwargs)
                receiver.drain()
            else:
                value = getattr(engine, method)(*args)
            conn.send(("ok", value))
            if method == "generate":
                from rlcore.testing.faults import fault_point

                fault_point("engine_generate")
        except BaseException as exc:  # noqa: BLE001
            if method == "update_weights":
                receiver.drain()
            conn.send(("error", _pickle_error(exc)))


class _Receiver:
    """The child's side of a weight sync: buckets in, complete tensors out (copies on the engine's
    device, so the buffer can take the next bucket)."""

    def __init__(self, conn, group, bucket_bytes: int, device: str | None):
        self.conn, self.group, self.device = conn, group, device or "cpu"
        self.buffer = None
        self._bucket_bytes = bucket_bytes
        self._ended = True

    def tensors(self) -> Iterator[tuple[str, Any]]:
        import torch

        self._ended = False
        partial: dict[str, Any] = {}
        while True:
            kind, pieces = self.conn.recv()
            if kind == "end":
                self._ended = True
                return
            if self.group is not None:
                if self.buffer is None:
                    self.buffer = torch.empty(self._bucket_bytes, dtype=torch.uint8)
                self.group.broadcast(self.buffer, 0).wait()
            done = []
            for p in pieces:
                dtype = getattr(torch, p.dtype)
                if p.start == 0 and p.nbytes == p.total:
                    raw = self.buffer[p.offset : p.offset + p.nbytes].to(self.device, copy=True)
                    done.append((p.name, raw.view(dtype).reshape(p.shape)))
                    continue
                whole = partial.setdefault(
                    p.name, torch.empty(p.total, dtype=torch.uint8, device=self.device)
                )
                whole[p.start : p.start + p.nbytes].copy_(self.buffer[p.offset : p.offset + p.nbytes])
                if p.start + p.nbytes == p.total:
                    done.append((p.name, partial.pop(p.name).view(dtype).reshape(p.shape)))
            if self.buffer.device.type == "cuda" or str(self.device).startswith("cuda"):
                torch.cuda.synchronize()  # the copies are done before the trainer refills the buffer
            self.conn.send(("ok", None))  # the buffer may take the next bucket
            yield from done

    def drain(self) -> None:
        """Read the rest of a sync the engine stopped consuming (or failed in), to stay in step."""
        if self._ended:
            return
        for _ in self.tensors():
            pass


def _close(engine) -> None:
    close = getattr(engine, "close", None)
    if callable(close):
        close()


# ---------------------------------------------------------------------- helpers


def _tcp_store():
    """A loopback TCP store on a free port, hosted by the trainer."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1", 0, world_size=2, is_master=True, timeout=timedelta(seconds=180), wait_for_workers=False
    )
    return store, store.port


def _tcp_client(port: int):
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, world_size=2, is_master=False, timeout=timedelta(seconds=180))


def _gloo_group(store, rank: int):
    """A two-process gloo group of its own (the trainer's ranks may have a default group already)."""
    from datetime import timedelta

    import torch.distributed as dist

    return dist.ProcessGroupGloo(dist.PrefixStore("rlcore-engine", store), rank, 2, timedelta(seconds=600))


def _pickle_error(exc: BaseException) -> bytes:
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001 - an exception that does not travel: its text does
        text = "".join(traceback.format_exception(exc)).rstrip()
        return pickle.dumps(
            EngineProcessError(f"the rollout engine's process failed: {type(exc).__name__}: {exc}\n{text}")
        )


def _unpickle_error(data: bytes) -> BaseException:
    return pickle.loads(data)
