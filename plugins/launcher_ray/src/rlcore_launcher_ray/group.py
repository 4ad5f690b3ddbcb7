"""Worker groups on Ray: a public API for driving many workers from one process.

One process (the *controller*) holds a :class:`WorkerGroup`: one Ray actor per worker, placed on a
:class:`ResourcePool` (a placement group), each knowing its rank, the world size and torchrun's
variables. Calling a method on the group calls it on the workers; how the arguments are shared out
and how the results come back is declared once, on the worker class, with :func:`group_method`::

    import ray
    from rlcore_launcher_ray.group import ResourcePool, Worker, WorkerGroup, group_method

    class Squarer(Worker):
        @group_method(dispatch="split")          # each worker gets a slice, results are joined
        def square(self, numbers):
            return [n * n for n in numbers]

        @group_method(execute="rank_zero")       # only rank 0 runs it; its result comes back
        def hello(self):
            return f"rank {self.rank} of {self.world_size}"

    ray.init(address="local", _node_ip_address="127.0.0.1")
    with WorkerGroup(ResourcePool(workers=2), Squarer) as group:
        assert group.square([1, 2, 3, 4]) == [1, 4, 9, 16]
        pending = group.square.remote([5, 6])    # non-blocking: a GroupCall holding the refs
        assert pending.result() == [25, 36]

Several worker classes (roles) can share each worker's process, and so its GPU:
``WorkerGroup(pool, colocated(actor=ActorWorker, critic=CriticWorker))`` gives ``group.actor.m()``
and ``group.critic.m()``; inside the process each role sees the others in ``self.colocated``.

A worker that dies fails the call with a :class:`WorkerFailure` naming its rank, pid and node, and
the group is shut down; a worker that raises fails the call the same way. The rlcore ``ray``
launcher runs its training ranks through this module.

Importing this module imports Ray (and says how to install it when it is missing).
"""

from __future__ import annotations

import inspect
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from rlcore.errors import RlcoreError
from rlcore_launcher_ray.connect import import_ray
from rlcore_launcher_ray.output import LineCount, OutputDrain

ray = import_ray()
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError  # noqa: E402
from ray.util.placement_group import placement_group, remove_placement_group  # noqa: E402
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: E402

__all__ = [
    "Dispatch",
    "GroupCall",
    "ResourcePool",
    "Worker",
    "WorkerFailure",
    "WorkerGroup",
    "WorkerInfo",
    "colocated",
    "group_method",
    "with_args",
]

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
DISPATCH_MODES = ("broadcast", "scatter", "split")
EXECUTE_MODES = ("all", "rank_zero")
_SPEC_ATTR = "__rlcore_group_method__"


def _say(message: str) -> None:
    print(f"[rlcore ray] {message}", flush=True)


def _plural(n: float, word: str) -> str:
    return f"{n:g} {word}" if n == 1 else f"{n:g} {word}s"


# ---------------------------------------------------------------------------------------- dispatch
@dataclass(frozen=True)
class Dispatch:
    """A custom way of sharing out a call's arguments and bringing its results back.

    ``split(world_size, *args, **kwargs)`` returns one ``(args, kwargs)`` pair per worker, in rank
    order; ``gather(results)`` turns the workers' results (a list in rank order) into the call's
    value. Both run in the controller.
    """

    split: Callable[..., list[tuple[tuple, dict]]]
    gather: Callable[[list[Any]], Any]


@dataclass(frozen=True)
class MethodSpec:
    dispatch: str | Dispatch
    execute: str


def group_method(dispatch: str | Dispatch = "broadcast", execute: str = "all") -> Callable:
    """Declare a :class:`Worker` method callable on the whole group.

    ``dispatch`` says how a group call's arguments reach the workers and how results come back:

    - ``"broadcast"``: every worker gets the same arguments; the value is the list of results, in
      rank order;
    - ``"scatter"``: every argument is a list with one entry per worker; worker *i* gets entry *i*
      of each; the value is the list of results;
    - ``"split"``: every argument is a sequence (list, tuple, tensor, array) of one common length,
      cut into ``world_size`` contiguous slices whose sizes differ by at most one; worker *i* gets
      slice *i* of each; the results (lists, tuples, tensors or arrays) are joined in rank order;
    - a :class:`Dispatch` for anything else.

    ``execute = "rank_zero"`` runs the method on rank 0 only (with ``"broadcast"``) and returns its
    result alone; ``"all"`` (the default) runs it on every worker.

    The method stays an ordinary method inside the worker's process.
    """
    if not (isinstance(dispatch, Dispatch) or dispatch in DISPATCH_MODES):
        raise ValueError(
            f"group_method(dispatch={dispatch!r}): expected one of {', '.join(map(repr, DISPATCH_MODES))} or a Dispatch(split, gather)"
        )
    if execute not in EXECUTE_MODES:
        raise ValueError(
            f"group_method(execute={execute!r}): expected one of {', '.join(map(repr, EXECUTE_MODES))}"
        )
    if execute == "rank_zero" and dispatch != "broadcast":
        raise ValueError(
            f"group_method(execute='rank_zero') sends the arguments to rank 0 alone: use dispatch='broadcast', not {dispatch!r}"
        )

    def mark(method: Callable) -> Callable:
        if not callable(method) or isinstance(method, (staticmethod, classmethod)):
            raise TypeError(f"@group_method decorates a plain method, not {method!r}")
        setattr(method, _SPEC_ATTR, MethodSpec(dispatch, execute))
        return method

    return mark


def _method_specs(cls: type) -> dict[str, MethodSpec]:
    specs = {}
    for name in dir(cls):
        spec = getattr(getattr(cls, name, None), _SPEC_ATTR, None)
        if isinstance(spec, MethodSpec):
            specs[name] = spec
    return specs


def _is_sequence(value: Any) -> bool:
    if isinstance(value, (str, bytes, Mapping)):
        return False
    return hasattr(value, "__len__") and hasattr(value, "__getitem__")


def _split_calls(
    label: str, n: int, arguments: dict[str, Any], args: tuple, kwargs: dict
) -> list[tuple[tuple, dict]]:
    lengths = {}
    for name, value in arguments.items():
        if not _is_sequence(value):
            raise TypeError(
                f"{label} uses dispatch='split': argument {name!r} ({type(value).__name__}) is not a sequence to split; "
                "make it a list, or declare the method with dispatch='broadcast' or a custom Dispatch"
            )
        lengths[name] = len(value)
    if len(set(lengths.values())) > 1:
        raise ValueError(f"{label} uses dispatch='split': the arguments' lengths differ ({lengths})")
    length = next(iter(lengths.values()), 0)
    bounds = [length * i // n for i in range(n + 1)]
    return [
        (
            tuple(a[bounds[i] : bounds[i + 1]] for a in args),
            {k: v[bounds[i] : bounds[i + 1]] for k, v in kwargs.items()},
        )
        for i in range(n)
    ]


def _scatter_calls(
    label: str, n: int, arguments: dict[str, Any], args: tuple, kwargs: dict
) -> list[tuple[tuple, dict]]:
    for name, value in arguments.items():
        if not isinstance(value, (list, tuple)) or len(value) != n:
            got = (
                f"a {type(value).__name__} of {len(value)}"
                if isinstance(value, (list, tuple))
                else type(value).__name__
            )
            raise ValueError(
                f"{label} uses dispatch='scatter': argument {name!r} must be a list of {n} (one per worker), got {got}"
            )
    return [(tuple(a[i] for a in args), {k: v[i] for k, v in kwargs.items()}) for i in range(n)]


def _join(label: str, results: list[Any]) -> Any:
    if all(r is None for r in results):
        return None
    if all(isinstance(r, (list, tuple)) for r in results):
        return [item for r in results for item in r]
    module = type(results[0]).__module__.split(".")[0]
    if module == "torch":
        import torch

        return torch.cat(list(results))
    if module == "numpy":
        import numpy

        return numpy.concatenate(list(results))
    kinds = sorted({type(r).__name__ for r in results})
    raise TypeError(
        f"{label} uses dispatch='split': cannot join results of type {', '.join(kinds)} (return lists, tuples, tensors or arrays, or use a custom Dispatch)"
    )


# ----------------------------------------------------------------------------------------- workers
@dataclass
class WorkerContext:
    """What a worker knows about its place in the group (sent to its process at start)."""

    group: str
    rank: int
    world_size: int
    env: dict[str, str]
    node_ip: str
    gpu_ids: list[str]
    role: str | None = None


class Worker:
    """Base class of a group's workers. Inside the worker's process, before ``__init__`` runs,
    torchrun's variables are in ``os.environ`` and these attributes are set."""

    _rlcore_context: WorkerContext | None = None
    _rlcore_colocated: dict[str, Worker] | None = None

    def _context(self) -> WorkerContext:
        if self._rlcore_context is None:
            raise RuntimeError(f"{type(self).__name__} was not started by a WorkerGroup: it has no rank")
        return self._rlcore_context

    @property
    def rank(self) -> int:
        return self._context().rank

    @property
    def world_size(self) -> int:
        return self._context().world_size

    @property
    def local_rank(self) -> int:
        """The rank among the group's workers on this node (``cuda:local_rank`` is its GPU)."""
        return int(self._context().env["LOCAL_RANK"])

    @property
    def local_world_size(self) -> int:
        return int(self._context().env["LOCAL_WORLD_SIZE"])

    @property
    def node_rank(self) -> int:
        return int(self._context().env["NODE_RANK"])

    @property
    def master_addr(self) -> str:
        """Where ``torch.distributed.init_process_group()`` meets (rank 0's node)."""
        return self._context().env["MASTER_ADDR"]

    @property
    def master_port(self) -> int:
        return int(self._context().env["MASTER_PORT"])

    @property
    def env(self) -> dict[str, str]:
        """The variables the group set in this process (torchrun's and the group's ``env``)."""
        return dict(self._context().env)

    @property
    def gpu_ids(self) -> list[str]:
        return list(self._context().gpu_ids)

    @property
    def role(self) -> str | None:
        """This worker's role name in a :func:`colocated` group, else None."""
        return self._context().role

    @property
    def colocated(self) -> dict[str, Worker]:
        """The other roles' workers in this process, by role name (empty outside :func:`colocated`)."""
        return {name: w for name, w in (self._rlcore_colocated or {}).items() if w is not self}


@dataclass(frozen=True)
class WorkerClass:
    """A worker class and the arguments its ``__init__`` gets in every worker (see :func:`with_args`)."""

    cls: type
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


def with_args(cls: type, *args: Any, **kwargs: Any) -> WorkerClass:
    """``cls`` to be built as ``cls(*args, **kwargs)`` in every worker of a group."""
    return WorkerClass(_check_worker_class(cls), args, kwargs)


@dataclass(frozen=True)
class Colocated:
    """Several roles sharing each worker's process (see :func:`colocated`)."""

    roles: dict[str, WorkerClass]


def colocated(**roles: type | WorkerClass) -> Colocated:
    """Roles fused into one process per worker: ``colocated(actor=ActorWorker, critic=with_args(CriticWorker, lr=1e-5))``.

    A group of it is called role by role (``group.actor.update(...)``); in each process the roles
    share the GPU and the memory, and each sees the others in ``self.colocated``.
    """
    if not roles:
        raise ValueError(
            "colocated() needs at least one role, e.g. colocated(actor=ActorWorker, critic=CriticWorker)"
        )
    fused = {}
    for name, worker in roles.items():
        if name.startswith("_") or name in _GROUP_ATTRIBUTES:
            raise ValueError(f"colocated(): the role name {name!r} is reserved; choose another")
        fused[name] = worker if isinstance(worker, WorkerClass) else with_args(worker)
    return Colocated(fused)


def _check_worker_class(cls: Any) -> type:
    if not (isinstance(cls, type) and issubclass(cls, Worker)):
        raise TypeError(f"a worker class must subclass rlcore_launcher_ray.group.Worker, got {cls!r}")
    return cls


@ray.remote(max_restarts=0, concurrency_groups={"control": 2})
class WorkerHost:
    """One worker's process. Calls run one at a time; the ``control`` methods answer while a call
    works (where the worker runs, how many lines it wrote)."""

    def __init__(self, label: str):
        self.label = label
        self.roles: dict[str, Worker] = {}
        self.out: LineCount | None = None
        self.err: LineCount | None = None

    def __repr__(self) -> str:  # Ray prefixes the worker's output lines with it: "(worker1 pid=...)"
        return self.label

    @ray.method(concurrency_group="control")
    def describe(self) -> dict[str, Any]:
        context = ray.get_runtime_context()
        return {
            "pid": os.getpid(),
            "node_id": context.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "gpu_ids": [str(g) for g in context.get_accelerator_ids().get("GPU", [])],
        }

    @ray.method(concurrency_group="control")
    def free_port(self, host: str) -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return sock.getsockname()[1]

    @ray.method(concurrency_group="control")
    def lines_written(self) -> dict[str, int]:
        """Complete lines written to stdout and stderr since the start (for :class:`OutputDrain`)."""
        return {
            "pid": os.getpid(),
            "out": self.out.lines if self.out else 0,
            "err": self.err.lines if self.err else 0,
        }

    def setup(self, context: WorkerContext, roles: dict[str | None, WorkerClass]) -> None:
        os.environ.update(
            context.env
        )  # before the workers import torch: CUDA_VISIBLE_DEVICES, the rendezvous
        for stream in (sys.stdout, sys.stderr):
            if hasattr(stream, "reconfigure"):
                stream.reconfigure(line_buffering=True)
        # Counted (for the drain) and marked, so the driver prints each line once (output.py).
        self.out, self.err = LineCount(sys.stdout), LineCount(sys.stderr)
        sys.stdout, sys.stderr = self.out, self.err
        shared: dict[str, Worker] = {}
        for role, spec in roles.items():
            worker = spec.cls.__new__(spec.cls)
            worker._rlcore_context = WorkerContext(**{**asdict(context), "role": role})
            worker._rlcore_colocated = shared
            worker.__init__(*spec.args, **spec.kwargs)
            self.roles[role] = worker
            if role is not None:
                shared[role] = worker

    def call(self, role: str | None, method: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self.roles[role], method)(*args, **kwargs)


# ------------------------------------------------------------------------------------ the resources
@dataclass
class WorkerInfo:
    """Where one worker runs."""

    rank: int
    pid: int
    node_id: str
    node_ip: str
    hostname: str
    gpu_ids: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def where(self) -> str:
        return f"pid {self.pid} on {self.hostname} ({self.node_ip}, node {self.node_id[:8]})"


class ResourcePool:
    """The resources of a group's workers, reserved as one Ray placement group.

    ``ResourcePool(workers=4, cpus_per_worker=2, gpus_per_worker=1, strategy="SPREAD")`` reserves one
    bundle per worker, placed by ``strategy`` (PACK, SPREAD, STRICT_PACK, STRICT_SPREAD).
    ``ResourcePool(workers_per_node=[8, 8], gpus_per_worker=1)`` reserves one bundle per node,
    holding that node's workers, on as many distinct nodes. ``resources`` adds custom Ray resources
    to every worker (``{"node_b": 0.5}``). :class:`WorkerGroup` reserves the pool when it starts
    and releases it when it shuts down (unless :meth:`reserve` was called before: then
    :meth:`release` is the caller's). One group uses a pool at a time; roles that should share the
    workers' processes go in one group with :func:`colocated`.
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        workers_per_node: list[int] | None = None,
        cpus_per_worker: float = 1.0,
        gpus_per_worker: float = 0.0,
        resources: Mapping[str, float] | None = None,
        strategy: str = "PACK",
        placement_timeout: float = 120.0,
    ):
        if (workers is None) == (workers_per_node is None):
            raise ValueError(
                "ResourcePool needs either workers=N or workers_per_node=[n0, n1, ...], not both"
            )
        if workers_per_node is not None:
            if not workers_per_node or any(not isinstance(n, int) or n < 1 for n in workers_per_node):
                raise ValueError(
                    f"ResourcePool(workers_per_node={workers_per_node!r}): expected a list of positive integers"
                )
            if strategy != "PACK":
                raise ValueError(
                    "ResourcePool(workers_per_node=...) places one bundle per node (STRICT_SPREAD); leave strategy out"
                )
        elif not isinstance(workers, int) or workers < 1:
            raise ValueError(f"ResourcePool(workers={workers!r}): expected a positive integer")
        if strategy not in STRATEGIES:
            raise ValueError(f"ResourcePool(strategy={strategy!r}): expected one of {', '.join(STRATEGIES)}")
        if (
            cpus_per_worker < 0
            or gpus_per_worker < 0
            or (cpus_per_worker == 0 and gpus_per_worker == 0 and not resources)
        ):
            raise ValueError(
                "ResourcePool: cpus_per_worker and gpus_per_worker must be >= 0, and a worker must reserve something"
            )
        self.workers_per_node = list(workers_per_node) if workers_per_node else None
        self.world_size = sum(workers_per_node) if workers_per_node else workers
        self.cpus_per_worker = float(cpus_per_worker)
        self.gpus_per_worker = float(gpus_per_worker)
        self.resources = dict(resources or {})
        self.strategy = "STRICT_SPREAD" if workers_per_node and len(workers_per_node) > 1 else strategy
        self.placement_timeout = placement_timeout
        self.placement_group = None

    def __repr__(self) -> str:
        size = (
            f"workers_per_node={self.workers_per_node}"
            if self.workers_per_node
            else f"workers={self.world_size}"
        )
        return f"ResourcePool({size}, {self.per_worker()}, {self.strategy})"

    def per_worker(self) -> dict[str, float]:
        """One worker's resources, as Ray names them."""
        need = {"CPU": self.cpus_per_worker, **self.resources}
        if self.gpus_per_worker:
            need["GPU"] = self.gpus_per_worker
        return {k: v for k, v in need.items() if v}

    def bundles(self) -> list[dict[str, float]]:
        counts = self.workers_per_node or [1] * self.world_size
        return [{k: v * n for k, v in self.per_worker().items()} for n in counts]

    def bundle_of(self, rank: int) -> int:
        if not self.workers_per_node:
            return rank
        total = 0
        for index, n in enumerate(self.workers_per_node):
            total += n
            if rank < total:
                return index
        raise IndexError(rank)

    def check_capacity(
        self, total: dict[str, float], nodes: list[dict[str, float]], noun: str = "worker"
    ) -> None:
        """Refuse at once what the cluster can never hold (instead of waiting on the placement group)."""
        n = self.world_size
        per = self.per_worker()
        names = {"CPU": "cpus_per_worker", "GPU": "gpus_per_worker"}
        problems = []
        for res in sorted(set(per) | {"CPU", "GPU"}, key=lambda r: (r not in names, r)):
            amount = n * per.get(res, 0)
            if amount > total.get(res, 0) + 1e-9:
                what = (
                    f"{names[res]} = {per.get(res, 0):g}"
                    if res in names
                    else f"resources[{res!r}] = {per[res]:g}"
                )
                size = (
                    f"workers_per_node = {self.workers_per_node}"
                    if self.workers_per_node
                    else f"workers = {n}"
                )
                problems.append(
                    f"{_plural(amount, res)} requested ({size} x {what}), the cluster has {total.get(res, 0):g}"
                )

        def holds(node: dict[str, float], need: dict[str, float]) -> bool:
            return all(node.get(r, 0) + 1e-9 >= v for r, v in need.items())

        if not problems:
            fits = [node for node in nodes if holds(node, per)]
            bundles = self.bundles()
            if not fits:
                problems.append(
                    f"no node can hold one {noun} ({_plural(per.get('CPU', 0), 'CPU')}, {_plural(per.get('GPU', 0), 'GPU')}"
                    + "".join(f", {v:g} {r}" for r, v in per.items() if r not in names)
                    + f"); the largest node has {max((nd.get('CPU', 0) for nd in nodes), default=0):g} CPUs, "
                    f"{max((nd.get('GPU', 0) for nd in nodes), default=0):g} GPUs"
                )
            elif self.strategy == "STRICT_PACK" and not any(
                holds(node, {r: n * v for r, v in per.items()}) for node in nodes
            ):
                problems.append(
                    f"placement_strategy = STRICT_PACK needs one node with {_plural(n * per.get('CPU', 0), 'CPU')} and "
                    f"{_plural(n * per.get('GPU', 0), 'GPU')}; no node is that large (use PACK)"
                )
            elif self.strategy == "STRICT_SPREAD" and not self.workers_per_node and len(fits) < n:
                problems.append(
                    f"placement_strategy = STRICT_SPREAD needs {n} nodes that each hold one {noun}; "
                    f"the cluster has {len(fits)} (use SPREAD)"
                )
            elif self.workers_per_node:
                free = list(nodes)
                for bundle in sorted(bundles, key=lambda b: -sum(b.values())):
                    home = next((node for node in free if holds(node, bundle)), None)
                    if home is None:
                        problems.append(
                            f"workers_per_node = {self.workers_per_node} needs {len(bundles)} distinct nodes "
                            f"holding {bundles}; the cluster's nodes are {nodes}"
                        )
                        break
                    free.remove(home)
        if problems:
            raise RlcoreError(f"the Ray cluster cannot hold the requested {noun}s: " + "; ".join(problems))

    def reserve(self, noun: str = "worker") -> None:
        """Reserve the bundles, or say why not (at once when the cluster is too small, else after
        ``placement_timeout`` seconds with what is free)."""
        if self.placement_group is not None:
            return
        nodes = [dict(node.get("Resources", {})) for node in ray.nodes() if node.get("Alive")]
        self.check_capacity(ray.cluster_resources(), nodes, noun)
        bundles = self.bundles()
        pg = placement_group(bundles, strategy=self.strategy, name="")
        try:
            ray.get(pg.ready(), timeout=self.placement_timeout)
        except GetTimeoutError:
            remove_placement_group(pg)
            free = {
                k: v
                for k, v in ray.available_resources().items()
                if k in ("CPU", "GPU") or k in self.resources
            }
            shown = (
                f"{len(bundles)} x {bundles[0]}" if all(b == bundles[0] for b in bundles) else str(bundles)
            )
            raise RlcoreError(
                f"the Ray cluster did not reserve {shown} ({self.strategy}) "
                f"within placement_timeout = {self.placement_timeout:g} s; free now: {free or 'nothing'}. "
                "Other jobs may hold the resources: wait, ask for less, or raise placement_timeout"
            ) from None
        self.placement_group = pg

    def release(self) -> None:
        if self.placement_group is not None:
            try:
                remove_placement_group(self.placement_group)
            except Exception:  # noqa: BLE001 - the cluster may already be gone
                pass
            self.placement_group = None


# ------------------------------------------------------------------------------- the torch variables
def torchrun_environment(
    infos: list[WorkerInfo], master_addr: str, master_port: int, *, local: bool
) -> list[dict[str, str]]:
    """torchrun's variables for every worker. Ranks follow bundle order; on each node the local
    ranks follow the GPU ids, and each worker sees all the group's GPUs of its node, so
    ``cuda:LOCAL_RANK`` is its own GPU. ``local``: every worker is on this host (gloo stays on ``lo``)."""
    world = len(infos)
    node_order: list[str] = []
    for info in infos:
        if info.node_id not in node_order:
            node_order.append(info.node_id)
    envs = []
    for info in infos:
        peers = [p for p in infos if p.node_id == info.node_id]
        if all(p.gpu_ids for p in peers):
            peers.sort(key=lambda p: [int(g) if g.isdigit() else g for g in p.gpu_ids])
        local_rank = [p.rank for p in peers].index(info.rank)
        env = {
            "RANK": str(info.rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(len(peers)),
            "NODE_RANK": str(node_order.index(info.node_id)),
            "GROUP_RANK": str(node_order.index(info.node_id)),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
        }
        gpus = [g for p in peers for g in p.gpu_ids]
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        if local and sys.platform.startswith("linux") and "GLOO_SOCKET_IFNAME" not in os.environ:
            env["GLOO_SOCKET_IFNAME"] = "lo"  # one host: keep gloo's traffic on loopback
        envs.append(env)
    return envs


def _driver_node() -> tuple[str | None, str | None]:
    """This process's Ray node id and IP (None through a Ray client connection, which has no node)."""
    try:
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - ray:// client mode
        return None, None


# -------------------------------------------------------------------------------------- failures
@dataclass
class Failure:
    rank: int
    info: WorkerInfo
    kind: str  # "died", "raised", "returned"
    error: BaseException | None = None
    value: Any = None

    def describe(self, noun: str) -> str:
        head = f"{noun} {self.rank} ({self.info.where()})"
        if self.kind == "died":
            return f"{head} died: {_first_line(self.error)}"
        if self.kind == "raised":
            return f"{head} raised {type(self.error).__name__}: {_first_line(self.error)}"
        return f"{head} returned {self.value!r}"


class WorkerFailure(RlcoreError):
    """A group call failed: a worker died, raised, or returned a value counted as a failure.

    ``failures`` lists them (rank, where it ran, what happened; ``error`` is what the worker raised);
    ``results`` holds the values of the workers that finished; ``stopped`` the ranks stopped after
    ``failure_grace``. When a worker died, or others were stopped, the group was shut down.
    """

    def __init__(
        self, message: str, failures: list[Failure], results: dict[int, Any], stopped: list[int], noun: str
    ):
        super().__init__(message)
        self.failures = failures
        self.results = results
        self.stopped = stopped
        self.noun = noun

    def details(self) -> str:
        """One clause per failure: ``rank 1 (pid 123 on host (10.0.0.2, node 5f0c...)) died: ...``."""
        return "; ".join(f.describe(self.noun) for f in self.failures)


def _first_line(exc: BaseException | None) -> str:
    text = str(exc or "").strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    # Ray's death messages put the reason ("The actor died unexpectedly...") after a header.
    if isinstance(exc, RayActorError):
        for line in lines:
            if "died" in line.lower() or "killed" in line.lower() or "exit" in line.lower():
                return line[:400].rstrip(".")
    return lines[0][:400].rstrip(".")


# ------------------------------------------------------------------------------------- the group
_GROUP_ATTRIBUTES = frozenset(
    {"pool", "name", "workers", "world_size", "roles", "shutdown", "kill", "call", "closed"}
)


class GroupCall:
    """A group call in flight: ``refs`` (Ray object refs, one per called worker in rank order) and
    :meth:`result`, which waits, supervises and gathers."""

    def __init__(
        self, group: WorkerGroup, label: str, refs: dict[Any, int], gather: Callable[[list[Any]], Any]
    ):
        self.group = group
        self.label = label
        self._refs = refs
        self._gather = gather

    @property
    def refs(self) -> list[Any]:
        return sorted(self._refs, key=self._refs.__getitem__)

    def result(
        self, timeout: float | None = None, *, failed: Callable[[Any], bool] | None = None, poll: float = 1.0
    ) -> Any:
        """Wait for every worker and return the gathered value.

        When a worker dies or raises, the others get the group's ``failure_grace`` seconds to
        finish (they may be waiting for it in a collective), those still running are then stopped,
        and :class:`WorkerFailure` is raised; a death or a stop shuts the group down.
        ``failed(value)`` marks returned values that count as failures for that purpose (a
        non-zero exit code): when every worker still finishes, the values come back as usual.
        ``timeout`` (seconds) raises :class:`TimeoutError` and leaves the workers running.
        """
        group = self.group
        pending = list(self._refs)
        results: dict[int, Any] = {}
        failures: list[Failure] = []
        stopped: list[int] = []
        grace_end = None
        give_up = None if timeout is None else time.monotonic() + timeout
        while pending:
            wait = poll if grace_end is None else max(0.0, min(poll, grace_end - time.monotonic()))
            if give_up is not None:
                wait = max(0.0, min(wait, give_up - time.monotonic()))
            done, pending = ray.wait(pending, num_returns=1, timeout=wait)
            for ref in done:
                rank = self._refs[ref]
                try:
                    value = ray.get(ref)
                except RayActorError as exc:
                    group._dead.add(rank)
                    failures.append(Failure(rank, group.workers[rank], "died", exc))
                except RayTaskError as exc:
                    cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else exc
                    failures.append(Failure(rank, group.workers[rank], "raised", cause))
                else:
                    results[rank] = value
                    if failed is not None and failed(value):
                        failures.append(Failure(rank, group.workers[rank], "returned", value=value))
            if failures and grace_end is None and pending:
                grace_end = time.monotonic() + (
                    group.failure_grace if group.failure_grace is not None else float("inf")
                )
            if grace_end is not None and pending and time.monotonic() >= grace_end:
                stopped = sorted(self._refs[r] for r in pending)
                noun = group.name
                _say(
                    f"stopping {noun}{'s' if len(stopped) > 1 else ''} {', '.join(map(str, stopped))} of group '{group.name}' after the failure above"
                )
                group.kill()
                break
            if pending and give_up is not None and time.monotonic() >= give_up:
                raise TimeoutError(
                    f"{self.label} did not finish within {timeout:g} s ({len(pending)} worker(s) still running)"
                )
        fatal = [f for f in failures if f.kind != "returned"]
        if fatal or stopped:
            if any(f.kind == "died" for f in failures) or stopped:
                group.shutdown()  # a rank is gone: release everything now
            failures.sort(key=lambda f: (f.kind != "died", f.rank))
            message = "; ".join(f.describe(group.name) for f in failures) or "failed"
            ending = " The group was shut down." if group.closed else ""
            raise WorkerFailure(f"{self.label}: {message}.{ending}", failures, results, stopped, group.name)
        return self._gather([results[r] for r in sorted(results)])


class GroupMethod:
    """``group.method(...)`` calls it on the workers and returns the gathered value;
    ``group.method.remote(...)`` returns a :class:`GroupCall` at once."""

    def __init__(self, group: WorkerGroup, role: str | None, cls: type, name: str, spec: MethodSpec):
        self.group, self.role, self.cls, self.name, self.spec = group, role, cls, name, spec
        self.label = f"{cls.__name__}.{name}"
        self.__doc__ = getattr(cls, name).__doc__

    def __repr__(self) -> str:
        return f"<group method {self.label} (dispatch={self.spec.dispatch!r}, execute={self.spec.execute!r})>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.remote(*args, **kwargs).result()

    def remote(self, *args: Any, **kwargs: Any) -> GroupCall:
        group = self.group
        group._check_open(self.label)
        n = group.world_size
        dispatch = self.spec.dispatch
        if isinstance(dispatch, Dispatch):
            calls = list(dispatch.split(n, *args, **kwargs))
            if len(calls) != n:
                raise ValueError(
                    f"{self.label}: the Dispatch's split returned {len(calls)} calls for {n} workers"
                )
            calls = [(tuple(a), dict(k)) for a, k in calls]
            gather = dispatch.gather
        else:
            try:
                bound = inspect.signature(getattr(self.cls, self.name)).bind(None, *args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{self.label}(): {exc}") from None
            arguments = {k: v for k, v in list(bound.arguments.items())[1:]}
            if dispatch == "split":
                calls = _split_calls(self.label, n, arguments, args, kwargs)
                gather = lambda results: _join(self.label, results)  # noqa: E731
            elif dispatch == "scatter":
                calls = _scatter_calls(self.label, n, arguments, args, kwargs)
                gather = list
            else:
                calls = [(args, kwargs)] * n
                gather = list
        if self.spec.execute == "rank_zero":
            calls = calls[:1]
            gather = lambda results: results[0]  # noqa: E731
        refs = {
            group._hosts[rank].call.remote(self.role, self.name, a, k): rank
            for rank, (a, k) in enumerate(calls)
        }
        return GroupCall(group, self.label, refs, gather)


class RoleView:
    """The group methods of one role of a :func:`colocated` group (``group.critic``)."""

    def __init__(self, group: WorkerGroup, role: str, spec: WorkerClass):
        self._methods = {
            name: GroupMethod(group, role, spec.cls, name, s) for name, s in _method_specs(spec.cls).items()
        }
        self._label = f"role {role!r} ({spec.cls.__name__})"

    def __getattr__(self, name: str) -> GroupMethod:
        methods = self.__dict__.get("_methods", {})
        if name in methods:
            return methods[name]
        raise AttributeError(
            f"{self._label} has no group method {name!r}; group methods: {', '.join(sorted(methods)) or 'none'} "
            "(decorate a method with @group_method to call it on the group)"
        )

    def __dir__(self) -> list[str]:
        return sorted(self._methods)


class WorkerGroup:
    """One Ray actor per worker of ``pool``, each holding a ``worker`` (a :class:`Worker` subclass,
    :func:`with_args`, or :func:`colocated` roles). Starting it reserves the pool, starts the
    actors, gives each torchrun's variables (and ``env``), then builds the workers there.

    ``name`` prefixes the workers' output lines (``(worker1 pid=...)``) and names them in errors;
    ``failure_grace`` is how long the others get after one fails in a call before they are stopped
    (None: wait for them). Use it as a context manager, or call :meth:`shutdown`.
    """

    def __init__(
        self,
        pool: ResourcePool,
        worker: type | WorkerClass | Colocated,
        *,
        name: str = "worker",
        env: Mapping[str, str] | None = None,
        failure_grace: float | None = 10.0,
        start_timeout: float | None = None,
    ):
        if not isinstance(pool, ResourcePool):
            raise TypeError(f"WorkerGroup(pool, ...) needs a ResourcePool, got {pool!r}")
        if not ray.is_initialized():
            raise RlcoreError(
                "connect to Ray before starting a WorkerGroup: ray.init(address=...) or, on this machine alone, "
                'ray.init(address="local", _node_ip_address="127.0.0.1")'
            )
        if isinstance(worker, Colocated):
            self.roles: dict[str | None, WorkerClass] = dict(worker.roles)
        else:
            self.roles = {None: worker if isinstance(worker, WorkerClass) else with_args(worker)}
        self.pool = pool
        self.name = name
        self.env = dict(env or {})
        self.failure_grace = failure_grace
        self.world_size = pool.world_size
        self.workers: list[WorkerInfo] = []
        self._hosts: list[Any] = []
        self._dead: set[int] = set()
        self._killed = False
        self.closed = False
        self._owns_pool = pool.placement_group is None
        self._lines: dict[tuple[str, bool], int] = {}
        self._output = OutputDrain()
        self._methods: dict[str, GroupMethod] = {}
        self._views: dict[str, RoleView] = {}
        start_timeout = start_timeout if start_timeout is not None else max(60.0, pool.placement_timeout)
        self._output.__enter__()
        try:
            self._start(start_timeout)
        except BaseException:
            self.shutdown()
            raise

    def _start(self, timeout: float) -> None:
        pool = self.pool
        pool.reserve(noun=self.name)
        per = pool.per_worker()
        for rank in range(self.world_size):
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=pool.placement_group,
                placement_group_bundle_index=pool.bundle_of(rank),
                placement_group_capture_child_tasks=True,
            )
            custom = {k: v for k, v in per.items() if k not in ("CPU", "GPU")}
            self._hosts.append(
                WorkerHost.options(
                    num_cpus=pool.cpus_per_worker,
                    num_gpus=pool.gpus_per_worker,
                    resources=custom or None,
                    scheduling_strategy=strategy,
                ).remote(f"{self.name}{rank}")
            )
        described = self._gather_start([h.describe.remote() for h in self._hosts], "start", timeout)
        self.workers = [WorkerInfo(rank=r, **d) for r, d in enumerate(described)]
        driver_node, driver_ip = _driver_node()
        nodes = {i.node_id for i in self.workers}
        # One host: every worker on the controller's node, or on nodes sharing its IP (several raylets on one machine).
        local = (nodes == {driver_node}) or (
            driver_ip is not None and {i.node_ip for i in self.workers} == {driver_ip}
        )
        master_addr = "127.0.0.1" if local else self.workers[0].node_ip
        master_port = ray.get(self._hosts[0].free_port.remote(master_addr), timeout=timeout)
        for info, variables in zip(
            self.workers, torchrun_environment(self.workers, master_addr, master_port, local=local)
        ):
            info.env = {**self.env, **variables}
        refs = {
            host.setup.remote(
                WorkerContext(self.name, info.rank, self.world_size, info.env, info.node_ip, info.gpu_ids),
                self.roles,
            ): info.rank
            for host, info in zip(self._hosts, self.workers)
        }
        names = " + ".join(spec.cls.__name__ for spec in self.roles.values())
        GroupCall(self, f"starting {names}", refs, list).result(timeout=timeout)
        for role, spec in self.roles.items():
            if role is None:
                self._methods = {
                    n: GroupMethod(self, None, spec.cls, n, s) for n, s in _method_specs(spec.cls).items()
                }
            else:
                self._views[role] = RoleView(self, role, spec)

    def _gather_start(self, refs: list, phase: str, timeout: float) -> list[Any]:
        try:
            return ray.get(refs, timeout=timeout)
        except GetTimeoutError:
            raise RlcoreError(f"the {self.name} actors did not {phase} within {timeout:g} s") from None
        except RayActorError as exc:
            raise RlcoreError(f"a {self.name} actor died while starting: {_first_line(exc)}") from None

    # -- calls
    def __getattr__(self, name: str) -> Any:
        views = self.__dict__.get("_views", {})
        methods = self.__dict__.get("_methods", {})
        if name in views:
            return views[name]
        if name in methods:
            return methods[name]
        if name.startswith("_"):
            raise AttributeError(name)
        if views:
            raise AttributeError(
                f"group '{self.__dict__.get('name')}' has roles {', '.join(sorted(views))}: call group.ROLE.{name}(...)"
            )
        raise AttributeError(
            f"group '{self.__dict__.get('name')}' has no group method {name!r}; group methods: "
            f"{', '.join(sorted(methods)) or 'none'} (decorate a method with @group_method to call it on the group)"
        )

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._methods) | set(self._views))

    def _check_open(self, label: str) -> None:
        if self.closed or self._killed:  # killed: stopped after a failure or by kill()
            raise RlcoreError(
                f"{label}: group '{self.name}' was shut down"
                + (f" (workers {sorted(self._dead)} died)" if self._dead else "")
            )

    # -- stopping
    def _count_lines(self, wait: float = 2.0) -> None:
        """Ask the live workers how many lines they wrote (they answer while busy)."""
        live = {h.lines_written.remote(): r for r, h in enumerate(self._hosts) if r not in self._dead}
        if not live:
            return
        done, _ = ray.wait(list(live), num_returns=len(live), timeout=wait)
        for ref in done:
            try:
                lines = ray.get(ref)
            except Exception:  # noqa: BLE001 - it died meanwhile
                continue
            self._lines[(str(lines["pid"]), False)] = lines["out"]
            self._lines[(str(lines["pid"]), True)] = lines["err"]

    def kill(self) -> None:
        """Stop every worker at once (their output so far still reaches this terminal)."""
        if not self._killed and self._hosts:
            self._count_lines()
        self._stop_hosts()

    def _stop_hosts(self) -> None:
        if self._killed:
            return
        self._killed = True
        for host in self._hosts:
            try:
                ray.kill(host, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass

    def shutdown(self) -> None:
        """Wait for the workers' last output lines, stop them, and release the pool (when the group
        reserved it). Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        if self._hosts and not self._killed:
            self._count_lines()
        self._output.wait(self._lines)  # the workers' last lines, before anyone disconnects
        self._stop_hosts()
        self._hosts = []
        self._output.__exit__()
        if self._owns_pool:
            self.pool.release()

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        roles = ", ".join(f"{r}={s.cls.__name__}" if r else s.cls.__name__ for r, s in self.roles.items())
        return f"<WorkerGroup '{self.name}' of {self.world_size} ({roles}) on {self.pool!r}>"
