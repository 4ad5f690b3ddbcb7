"""A group of training ranks as Ray actors: reserve bundles, start one actor per rank with
torchrun's environment, run the same function on all of them, and supervise them.

Imported only after :func:`rlcore_launcher_ray.connect.import_ray` succeeded.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlcore.errors import RlcoreError
from rlcore.launching import run_driver_manifest
from rlcore.targets import load_target

from rlcore_launcher_ray.options import RayOptions
from rlcore_launcher_ray.output import LineCount, OutputDrain

TRAIN_TARGET = "rlcore_launcher_ray.workers:train_rank"


def _say(message: str) -> None:
    print(f"[rlcore ray] {message}", flush=True)


def train_rank(manifest_file: str, run_dir: str, resume: bool = False) -> int:
    """What each rank runs: the trainer's driver on the launcher's driver manifest."""
    return run_driver_manifest(manifest_file, run_dir, resume=resume)


def _resolve(target: str | Callable[..., Any]) -> Callable[..., Any]:
    if callable(target):
        return target
    return load_target(target)[0]


@ray.remote(max_restarts=0, max_concurrency=2)
class RankWorker:
    """One rank's process. ``max_concurrency=2`` lets :meth:`describe` answer while :meth:`run` works."""

    def __init__(self, rank: int):
        self.rank = rank

    def __repr__(self) -> str:  # Ray prefixes the actor's output lines with this: "(rank1 pid=...)"
        return f"rank{self.rank}"

    def describe(self) -> dict[str, Any]:
        context = ray.get_runtime_context()
        return {
            "pid": os.getpid(),
            "node_id": context.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "gpu_ids": [str(g) for g in context.get_accelerator_ids().get("GPU", [])],
        }

    def free_port(self, host: str) -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return sock.getsockname()[1]

    def run(self, target: str | Callable[..., Any], env: dict[str, str], kwargs: dict[str, Any]) -> tuple[Any, dict]:
        """``target(**kwargs)``'s result, and how many lines this rank wrote (for :class:`OutputDrain`)."""
        os.environ.update(env)  # before torch is imported: CUDA_VISIBLE_DEVICES and the rendezvous
        for stream in (sys.stdout, sys.stderr):
            if hasattr(stream, "reconfigure"):
                stream.reconfigure(line_buffering=True)
        out, err = LineCount(sys.stdout), LineCount(sys.stderr)
        sys.stdout, sys.stderr = out, err
        try:
            from loguru import logger

            logger.remove()
            logger.add(sys.stderr, level=os.environ.get("RLCORE_LOG_LEVEL", "INFO"), format="{time:HH:mm:ss} {level: <7} {message}")
        except ImportError:  # pragma: no cover - loguru is a dependency of rlcore
            pass
        result = _resolve(target)(**kwargs)
        return result, {"pid": os.getpid(), "out": out.lines, "err": err.lines}


@dataclass
class RankInfo:
    rank: int
    pid: int
    node_id: str
    node_ip: str
    hostname: str
    gpu_ids: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def where(self) -> str:
        return f"pid {self.pid} on {self.hostname} ({self.node_ip})"


class RankFailure(RlcoreError):
    """One or more ranks died or failed; the group was stopped."""


def _bundles(options: RayOptions) -> list[dict[str, float]]:
    bundle: dict[str, float] = {"CPU": float(options.cpus_per_worker)}
    if options.gpus_per_worker:
        bundle["GPU"] = float(options.gpus_per_worker)
    return [dict(bundle) for _ in range(options.workers)]


def _plural(n: float, word: str) -> str:
    n_text = f"{n:g}"
    return f"{n_text} {word}" if n == 1 else f"{n_text} {word}s"


def check_capacity(options: RayOptions, total: dict[str, float], nodes: list[dict[str, float]]) -> None:
    """Refuse at once what the cluster can never hold (instead of waiting on the placement group)."""
    n = options.workers
    need = {"CPU": n * options.cpus_per_worker, "GPU": n * options.gpus_per_worker}
    per = {"CPU": options.cpus_per_worker, "GPU": options.gpus_per_worker}
    names = {"CPU": "cpus_per_worker", "GPU": "gpus_per_worker"}
    problems = []
    for res, amount in need.items():
        if amount > total.get(res, 0) + 1e-9:
            problems.append(
                f"{_plural(amount, res)} requested (workers = {n} x {names[res]} = {per[res]:g}), "
                f"the cluster has {total.get(res, 0):g}"
            )
    if not problems:
        fits = [node for node in nodes if all(node.get(r, 0) + 1e-9 >= per[r] for r in per if per[r])]
        if not fits:
            problems.append(
                f"no node can hold one rank ({_plural(per['CPU'], 'CPU')}, {_plural(per['GPU'], 'GPU')}); "
                f"the largest node has {max((nd.get('CPU', 0) for nd in nodes), default=0):g} CPUs, "
                f"{max((nd.get('GPU', 0) for nd in nodes), default=0):g} GPUs"
            )
        elif options.placement_strategy == "STRICT_PACK" and not any(
            all(node.get(r, 0) + 1e-9 >= need[r] for r in need if need[r]) for node in nodes
        ):
            problems.append(f"placement_strategy = STRICT_PACK needs one node with {_plural(need['CPU'], 'CPU')} and "
                            f"{_plural(need['GPU'], 'GPU')}; no node is that large (use PACK)")
        elif options.placement_strategy == "STRICT_SPREAD" and len(fits) < n:
            problems.append(f"placement_strategy = STRICT_SPREAD needs {n} nodes that each hold one rank; "
                            f"the cluster has {len(fits)} (use SPREAD)")
    if problems:
        raise RlcoreError("the Ray cluster cannot hold the requested ranks: " + "; ".join(problems))


def _node_resources() -> list[dict[str, float]]:
    return [dict(node.get("Resources", {})) for node in ray.nodes() if node.get("Alive")]


def rank_environment(infos: list[RankInfo], master_addr: str, master_port: int, *, local: bool) -> list[dict[str, str]]:
    """torchrun's variables for every rank. Ranks follow bundle order; on each node the local ranks
    follow the GPU ids, and each rank sees all the group's GPUs of its node, so
    ``cuda:LOCAL_RANK`` is its own GPU."""
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
            env["GLOO_SOCKET_IFNAME"] = "lo"  # one node: keep gloo's traffic on loopback
        envs.append(env)
    return envs


class WorkerGroup:
    """Reserve, start, run, supervise and clean up the ranks of one run."""

    def __init__(self, options: RayOptions, *, extra_env: dict[str, str] | None = None):
        self.options = options
        self.extra_env = dict(extra_env or {})
        self.pg = None
        self.actors: list[Any] = []
        self.infos: list[RankInfo] = []
        self.output = OutputDrain()
        self.lines_written: dict[tuple[str, bool], int] = {}

    # -- start
    def start(self) -> list[RankInfo]:
        options = self.options
        self.output.__enter__()
        check_capacity(options, ray.cluster_resources(), _node_resources())
        bundles = _bundles(options)
        self.pg = placement_group(bundles, strategy=options.placement_strategy, name="")
        try:
            ray.get(self.pg.ready(), timeout=options.placement_timeout)
        except GetTimeoutError:
            free = {k: v for k, v in ray.available_resources().items() if k in ("CPU", "GPU")}
            raise RlcoreError(
                f"the Ray cluster did not reserve {options.workers} x {bundles[0]} ({options.placement_strategy}) "
                f"within placement_timeout = {options.placement_timeout:g} s; free now: {free or 'nothing'}. "
                "Other jobs may hold the resources: wait, ask for less, or raise placement_timeout"
            ) from None
        for rank in range(options.workers):
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=rank, placement_group_capture_child_tasks=True
            )
            self.actors.append(
                RankWorker.options(
                    num_cpus=options.cpus_per_worker, num_gpus=options.gpus_per_worker, scheduling_strategy=strategy
                ).remote(rank)
            )
        described = self._gather([actor.describe.remote() for actor in self.actors], "start")
        self.infos = [RankInfo(rank=r, **d) for r, d in enumerate(described)]
        one_node = len({i.node_id for i in self.infos}) == 1
        local = one_node and self.infos[0].node_id == _driver_node_id()
        master_addr = "127.0.0.1" if local else self.infos[0].node_ip
        master_port = ray.get(self.actors[0].free_port.remote(master_addr))
        for info, env in zip(self.infos, rank_environment(self.infos, master_addr, master_port, local=local)):
            info.env = {**self.extra_env, **env}
        return self.infos

    def _gather(self, refs: list, phase: str) -> list[Any]:
        try:
            return ray.get(refs, timeout=max(60.0, self.options.placement_timeout))
        except GetTimeoutError:
            raise RlcoreError(f"the rank actors did not {phase} within {max(60.0, self.options.placement_timeout):g} s") from None
        except RayActorError as exc:
            raise RlcoreError(f"a rank actor died while starting: {exc}") from None

    def write_info(self, path: Path) -> None:
        """Which process is which rank (for `kill`, debuggers, people)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(i) for i in self.infos], indent=1), encoding="utf-8")
        tmp.replace(path)

    # -- run
    def run(self, target: str | Callable[..., Any], kwargs: dict[str, Any], *, poll: float = 1.0) -> dict[int, Any]:
        """Run ``target(**kwargs)`` on every rank; return each rank's result.

        When a rank dies or raises, or returns a non-zero exit code, the others get ``failure_grace``
        seconds to end on their own (they usually fail fast in their next collective) and are then
        killed, so a failure never leaves the run hanging. Dead or raising ranks raise
        :class:`RankFailure` (an :class:`RlcoreError` raised by a rank is re-raised as it is).
        """
        refs = {actor.run.remote(target, info.env, kwargs): info.rank for actor, info in zip(self.actors, self.infos)}
        pending = list(refs)
        results: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}
        deadline = None
        while pending:
            timeout = poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic()))
            done, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            for ref in done:
                rank = refs[ref]
                try:
                    results[rank], lines = ray.get(ref)
                except (RayActorError, RayTaskError) as exc:
                    errors[rank] = exc
                else:
                    self.lines_written[(str(lines["pid"]), False)] = lines["out"]
                    self.lines_written[(str(lines["pid"]), True)] = lines["err"]
            failed = bool(errors) or any(isinstance(v, int) and v != 0 for v in results.values())
            if failed and deadline is None and pending:
                deadline = time.monotonic() + self.options.failure_grace
            if deadline is not None and time.monotonic() >= deadline and pending:
                stopped = sorted(refs[r] for r in pending)
                _say(f"stopping rank{'s' if len(stopped) > 1 else ''} {', '.join(map(str, stopped))} after the failure above")
                self.kill()
                break
        self.output.wait(self.lines_written)  # the ranks' last lines, before anyone disconnects
        if errors:
            raise self._failure(errors, results)
        return results

    def _failure(self, errors: dict[int, BaseException], results: dict[int, Any]) -> BaseException:
        died = {r: e for r, e in errors.items() if isinstance(e, RayActorError)}
        raised = {r: e for r, e in errors.items() if not isinstance(e, RayActorError)}
        for rank, exc in sorted(raised.items()):
            cause = getattr(exc, "cause", None)
            if isinstance(cause, RlcoreError) and not died:
                # The rank's own expected error (bad manifest, existing checkpoints): say it as it
                # is, with its exit code (2 for bad input).
                error = RlcoreError(f"rank {rank}: {cause}")
                error.exit_code = cause.exit_code
                return error
        parts = []
        for rank, exc in sorted(died.items()):
            parts.append(f"rank {rank} ({self.infos[rank].where()}) died: {_first_line(exc)}")
        for rank, exc in sorted(raised.items()):
            cause = getattr(exc, "cause", None) or exc
            parts.append(f"rank {rank} ({self.infos[rank].where()}) raised {type(cause).__name__}: {_first_line(cause)}")
        return RankFailure("; ".join(parts) + ". The other ranks were stopped.")

    # -- stop
    def kill(self) -> None:
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass

    def close(self) -> None:
        self.kill()
        self.actors = []
        self.output.__exit__()
        if self.pg is not None:
            try:
                remove_placement_group(self.pg)
            except Exception:  # noqa: BLE001 - the cluster may already be gone
                pass
            self.pg = None


def _driver_node_id() -> str | None:
    """This process's Ray node (None through a Ray client connection, which has none)."""
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - ray:// client mode
        return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    # Ray's death messages put the reason ("The actor died unexpectedly...") after a header.
    for line in lines:
        if "died" in line.lower() or "killed" in line.lower() or "exit" in line.lower():
            return line[:400].rstrip(".")
    return lines[0][:400].rstrip(".")
