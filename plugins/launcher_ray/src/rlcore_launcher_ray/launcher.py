"""The ``ray`` launcher: the training ranks as Ray actors driven from this process (worker-group
mode), or the whole run submitted as a Ray job (``job = true``)."""

from __future__ import annotations

import os
from pathlib import Path

from rlcore.errors import RlcoreError
from rlcore.interfaces import LaunchRequest
from rlcore.launching import driver_manifest_path, latest_checkpoint, write_driver_manifest
from rlcore_launcher_ray.connect import check_reachable, import_ray, resolve_address
from rlcore_launcher_ray.options import RayOptions

WORKERS_FILE = "workers.json"


def _say(message: str) -> None:
    print(f"[rlcore ray] {message}", flush=True)


def _resume_hint(run_dir: str | Path) -> str:
    latest = _latest_checkpoint(Path(run_dir))
    if latest is None:
        return f"No checkpoint was written in {run_dir} yet: rerun to start again."
    return f"The last checkpoint ({latest}) is intact: `rlcore run --resume` continues from it."


def _latest_checkpoint(run_dir: Path) -> Path | None:
    return latest_checkpoint(run_dir)


class RayLauncher:
    def __init__(self, options: RayOptions):
        self.options = options

    def launch(self, request: LaunchRequest) -> int:
        if self.options.job:
            from rlcore_launcher_ray.jobs import submit_and_follow

            return submit_and_follow(self.options, request)
        return self.run_workers(request)

    # ------------------------------------------------------------------ worker-group mode
    def run_workers(
        self, request: LaunchRequest, target: str | None = None, kwargs: dict | None = None
    ) -> int:
        """Start ``workers`` ranks on Ray and run the trainer (or ``target(**kwargs)``) on each."""
        options = self.options
        address = resolve_address(options.address)
        if request.dry_run:
            where = f"the Ray cluster at {address}" if address else "a local Ray instance (127.0.0.1)"
            _say(
                f"would start {options.workers} rank(s) on {where}, each with {options.cpus_per_worker:g} CPU(s) and "
                f"{options.gpus_per_worker} GPU(s) ({options.placement_strategy}), training "
                f"{driver_manifest_path(request)} into {request.run_dir}"
            )
            return 0
        ray = import_ray()
        from rlcore_launcher_ray.workers import TRAIN_TARGET, RankFailure, RankGroup

        if target is None:
            manifest_file = write_driver_manifest(request)
            target = TRAIN_TARGET
            kwargs = {
                "manifest_file": str(manifest_file),
                "run_dir": str(request.run_dir),
                "resume": request.resume,
            }
        owns_ray = self._connect(ray, address)
        group = RankGroup(options, extra_env=_forwarded_env())
        try:
            infos = group.start()
            group.write_info(Path(request.run_dir) / "launch" / WORKERS_FILE)
            master = infos[0].env
            _say(
                f"{len(infos)} rank(s) started; rendezvous {master['MASTER_ADDR']}:{master['MASTER_PORT']}; "
                + ", ".join(f"rank {i.rank}: {i.where()}" for i in infos)
            )
            try:
                results = group.run(target, kwargs or {})
            except RankFailure as exc:
                raise RankFailure(f"{exc} {_resume_hint(request.run_dir)}") from None
            except KeyboardInterrupt:
                group.kill()
                _say(f"interrupted: the ranks were stopped. {_resume_hint(request.run_dir)}")
                return 130
            self.results = results
            codes = {rank: (value if isinstance(value, int) else 0) for rank, value in results.items()}
            failed = {rank: code for rank, code in sorted(codes.items()) if code != 0}
            if failed:
                _say(
                    "failed: "
                    + ", ".join(f"rank {r} exited with {c}" for r, c in failed.items())
                    + f". {_resume_hint(request.run_dir)}"
                )
                return next(iter(failed.values()))
            return 0
        finally:
            group.close()
            if owns_ray:
                ray.shutdown()

    def _connect(self, ray, address: str | None) -> bool:
        """Connect to ``address`` or start a local instance; True when this call initialised Ray."""
        if ray.is_initialized():
            return False
        runtime_env = self.options.runtime_env.as_ray() or None
        if address:
            check_reachable(address, self.options.connect_timeout)
            _say(f"connecting to the Ray cluster at {address}")
            try:
                ray.init(
                    address=address, runtime_env=runtime_env, logging_level="WARNING", log_to_driver=True
                )
            except ConnectionError as exc:
                raise RlcoreError(f"cannot connect to the Ray cluster at {address}: {exc}") from None
        else:
            _say("starting a local Ray instance on 127.0.0.1")
            ray.init(
                address="local",  # never join another cluster found on this machine
                _node_ip_address="127.0.0.1",
                include_dashboard=self.options.include_dashboard,
                dashboard_host="127.0.0.1",
                runtime_env=runtime_env,
                logging_level="WARNING",
                log_to_driver=True,
            )
        return True


def _forwarded_env() -> dict[str, str]:
    """Settings of this process that the ranks should share (log level, thread count, debugger:
    docs/debugging.md)."""
    names = (
        "RLCORE_LOG_LEVEL",
        "OMP_NUM_THREADS",
        "RLCORE_DIST_TIMEOUT_S",
        "RAY_DEBUG",
        "RAY_DEBUG_POST_MORTEM",
        "RLCORE_DEBUG_RANK",
        "RLCORE_DEBUG_PORT",
        "RLCORE_DEBUG_DIR",
    )
    return {name: os.environ[name] for name in names if name in os.environ}


def build(options: RayOptions, context=None) -> RayLauncher:
    return RayLauncher(options)
