"""The launcher's training ranks: a :class:`~rlcore_launcher_ray.group.WorkerGroup` of
:class:`RankWorker`, each running the trainer's driver (or any target) with torchrun's environment,
supervised so that one failing rank stops the run.

Imported only after :func:`rlcore_launcher_ray.connect.import_ray` succeeded.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rlcore.errors import RlcoreError
from rlcore.launching import run_driver_manifest
from rlcore.targets import load_target
from rlcore_launcher_ray.group import (
    ResourcePool,
    Worker,
    WorkerFailure,
    WorkerGroup,
    WorkerInfo,
    group_method,
    torchrun_environment,
)
from rlcore_launcher_ray.options import RayOptions

TRAIN_TARGET = "rlcore_launcher_ray.workers:train_rank"
NOUN = "rank"  # the group's name: output lines read "(rank1 pid=...)", errors "rank 1 (pid ...)"

# The names the launcher's tests and callers know the ranks' layout by.
RankInfo = WorkerInfo
rank_environment = torchrun_environment


def train_rank(manifest_file: str, run_dir: str, resume: bool = False) -> int:
    """What each rank runs: the trainer's driver on the launcher's driver manifest."""
    return run_driver_manifest(manifest_file, run_dir, resume=resume)


def _resolve(target: str | Callable[..., Any]) -> Callable[..., Any]:
    if callable(target):
        return target
    return load_target(target)[0]


class RankWorker(Worker):
    """One training rank. The group set torchrun's variables before it was built."""

    @group_method(dispatch="broadcast")
    def run(self, target: str | Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        """``target(**kwargs)`` on every rank, each rank's result in rank order."""
        try:
            from loguru import logger

            logger.remove()
            logger.add(
                sys.stderr,
                level=os.environ.get("RLCORE_LOG_LEVEL", "INFO"),
                format="{time:HH:mm:ss} {level: <7} {message}",
            )
        except ImportError:  # pragma: no cover - loguru is a dependency of rlcore
            pass
        return _resolve(target)(**kwargs)


class RankFailure(RlcoreError):
    """One or more ranks died or failed; the group was stopped."""


def pool_for(options: RayOptions) -> ResourcePool:
    return ResourcePool(
        workers=options.workers,
        cpus_per_worker=options.cpus_per_worker,
        gpus_per_worker=options.gpus_per_worker,
        strategy=options.placement_strategy,
        placement_timeout=options.placement_timeout,
    )


def check_capacity(options: RayOptions, total: dict[str, float], nodes: list[dict[str, float]]) -> None:
    """Refuse at once what the cluster can never hold (instead of waiting on the placement group)."""
    pool_for(options).check_capacity(total, nodes, noun=NOUN)


def _failed_exit_code(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value != 0


class RankGroup:
    """Reserve, start, run, supervise and clean up the ranks of one run."""

    def __init__(self, options: RayOptions, *, extra_env: dict[str, str] | None = None):
        self.options = options
        self.extra_env = dict(extra_env or {})
        self.group: WorkerGroup | None = None
        self.infos: list[WorkerInfo] = []

    def start(self) -> list[WorkerInfo]:
        self.group = WorkerGroup(
            pool_for(self.options),
            RankWorker,
            name=NOUN,
            env=self.extra_env,
            failure_grace=self.options.failure_grace,
            start_timeout=max(60.0, self.options.placement_timeout),
        )
        self.infos = self.group.workers
        return self.infos

    def write_info(self, path: Path) -> None:
        """Which process is which rank (for `kill`, debuggers, people)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(i) for i in self.infos], indent=1), encoding="utf-8")
        tmp.replace(path)

    def run(
        self, target: str | Callable[..., Any], kwargs: dict[str, Any], *, poll: float = 1.0
    ) -> dict[int, Any]:
        """Run ``target(**kwargs)`` on every rank; return each rank's result.

        When a rank dies or raises, or returns a non-zero exit code, the others get ``failure_grace``
        seconds to end on their own (they usually fail fast in their next collective) and are then
        killed, so a failure never leaves the run hanging. Dead or raising ranks raise
        :class:`RankFailure` (an :class:`RlcoreError` raised by a rank is re-raised as it is).
        """
        assert self.group is not None, "start() first"
        try:
            values = self.group.run.remote(target, kwargs).result(failed=_failed_exit_code, poll=poll)
        except WorkerFailure as exc:
            fatal = [f for f in exc.failures if f.kind != "returned"]
            if not fatal:  # non-zero exit codes, and the ranks still running were stopped
                return dict(exc.results)
            raise self._failure(exc) from None
        return dict(enumerate(values))

    def _failure(self, exc: WorkerFailure) -> BaseException:
        died = [f for f in exc.failures if f.kind == "died"]
        for failure in sorted(exc.failures, key=lambda f: f.rank):
            if failure.kind == "raised" and isinstance(failure.error, RlcoreError) and not died:
                # The rank's own expected error (bad manifest, existing checkpoints): say it as it
                # is, with its exit code (2 for bad input).
                error = RlcoreError(f"rank {failure.rank}: {failure.error}")
                error.exit_code = failure.error.exit_code
                return error
        fatal = WorkerFailure(
            "", [f for f in exc.failures if f.kind != "returned"], exc.results, exc.stopped, NOUN
        )
        return RankFailure(fatal.details() + ". The other ranks were stopped.")

    def kill(self) -> None:
        if self.group is not None:
            self.group.kill()

    def close(self) -> None:
        if self.group is not None:
            self.group.shutdown()
