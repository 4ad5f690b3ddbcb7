"""The ``skypilot`` launcher: render the task, launch it through SkyPilot's Python API, follow its
log, return an exit code for its final state. sky is imported only to launch."""

from __future__ import annotations

import importlib
from pathlib import Path

import rlcore
from rlcore.errors import RlcoreError, UsageError
from rlcore.interfaces import BuildContext, LaunchRequest
from rlcore.launching import write_driver_manifest
from rlcore_launcher_skypilot.options import SkyPilotOptions
from rlcore_launcher_skypilot.states import outcome, state_of_exit_code
from rlcore_launcher_skypilot.task import cluster_name, remote_run_dir, render, to_yaml

TASK_NAME = "skypilot.yaml"


def _say(message: str) -> None:
    print(f"[rlcore skypilot] {message}", flush=True)


def import_sky():
    try:
        return importlib.import_module("sky")
    except ImportError as exc:
        raise UsageError(f"the skypilot launcher needs SkyPilot: pip install skypilot ({exc})") from None


class SkyPilotLauncher:
    def __init__(self, options: SkyPilotOptions, plugins: dict[str, dict] | None = None):
        self.options = options
        self.plugins = (
            plugins or {}
        )  # role -> {name, distribution, version}: the resolved manifest's [plugins]

    def task(self, request: LaunchRequest) -> dict:
        return render(self.options, request, self.plugins, rlcore.__version__)

    def task_yaml(self, request: LaunchRequest) -> str:
        name = cluster_name(self.options, request)
        how = (
            f"sky jobs launch -n {name} THIS_FILE"
            if self.options.managed
            else f"sky launch -c {name} THIS_FILE"
        )
        header = (
            f"# rlcore run {request.resolved_manifest.get('run', {}).get('name', '')}: rendered by "
            f"rlcore-launcher-skypilot.\n# Launch with: {how} (rlcore run does, and follows the job).\n"
        )
        return to_yaml(self.task(request), header)

    def _warnings(self, request: LaunchRequest) -> None:
        run_dir = remote_run_dir(self.options, request)
        mounted = any(
            run_dir == node or run_dir.startswith(node.rstrip("/") + "/") for node in self.options.file_mounts
        )
        if self.options.nodes > 1 and not mounted:
            _say(
                f"warning: {self.options.nodes} nodes and the run directory {run_dir} is on no file mount: each node "
                "writes its ranks' part of every checkpoint to its own disk, and --resume needs them together. "
                "Put remote_run_dir under a bucket in file_mounts."
            )

    def launch(self, request: LaunchRequest) -> int:
        text = self.task_yaml(request)  # renders first: a bad manifest path is an error before anything else
        if request.dry_run:
            print(text, end="", flush=True)
            self._warnings(request)
            _say("dry run: nothing was launched")
            return 0
        self._warnings(request)
        manifest_file = write_driver_manifest(request)  # the driver manifest, as this machine sees it
        task_file = manifest_file.parent / TASK_NAME
        task_file.write_text(text, encoding="utf-8")
        sky = import_sky()
        task = sky.Task.from_yaml_config(self.task(request))
        name = cluster_name(self.options, request)
        if self.options.managed:
            return self._managed(sky, task, name, task_file)
        return self._cluster(sky, task, name, task_file)

    def _cluster(self, sky, task, name: str, task_file: Path) -> int:
        _say(f"launching {task_file} on cluster {name}")
        job_id, _handle = sky.stream_and_get(
            sky.launch(
                task,
                cluster_name=name,
                idle_minutes_to_autostop=self.options.idle_minutes_to_autostop,
                down=self.options.down,
            )
        )
        if job_id is None:
            raise RlcoreError(f"SkyPilot launched cluster {name} but started no job (see `sky queue {name}`)")
        _say(f"job {job_id} on cluster {name}; following its log (Ctrl-C cancels the job)")
        try:
            code = sky.tail_logs(name, job_id, follow=True)
        except KeyboardInterrupt:
            _say(f"interrupted: cancelling job {job_id} on {name} (sky cancel {name} {job_id})")
            sky.stream_and_get(sky.cancel(name, job_ids=[job_id]))
            return 130
        statuses = sky.stream_and_get(sky.job_status(name, [job_id])) or {}
        state = statuses.get(job_id) or state_of_exit_code(code)
        return self._finish(f"job {job_id} on cluster {name}", state, f"sky logs {name} {job_id}")

    def _managed(self, sky, task, name: str, task_file: Path) -> int:
        _say(f"launching {task_file} as managed job {name}")
        job_id, _handle = sky.stream_and_get(sky.jobs.launch(task, name=name))
        if isinstance(job_id, list):  # newer SkyPilot returns the ids of a job group
            job_id = job_id[0] if job_id else None
        if job_id is None:
            raise RlcoreError(
                f"SkyPilot accepted managed job {name} but returned no job id (see `sky jobs queue`)"
            )
        _say(f"managed job {job_id}; following its log (Ctrl-C cancels the job)")
        try:
            code = sky.jobs.tail_logs(job_id=job_id, follow=True)
        except KeyboardInterrupt:
            _say(f"interrupted: cancelling managed job {job_id} (sky jobs cancel {job_id})")
            sky.stream_and_get(sky.jobs.cancel(job_ids=[job_id]))
            return 130
        return self._finish(f"managed job {job_id}", state_of_exit_code(code), f"sky jobs logs {job_id}")

    def _finish(self, what: str, state, logs: str) -> int:
        result = outcome(state)
        name = str(getattr(state, "value", state))
        if result is None:
            raise RlcoreError(f"{what} ended in state {name}, which is not final: lost track of it ({logs})")
        code, meaning = result
        if code == 0:
            _say(f"{what} {name}")
        else:
            _say(f"error: {what} {name}: {meaning}; log: {logs}")
        return code


def build(options: SkyPilotOptions, context: BuildContext | None = None) -> SkyPilotLauncher:
    """``context`` is the run's :class:`BuildContext`; the resolved manifest's ``[plugins]`` table
    (each component's distribution and version) says what setup installs on the nodes."""
    plugins: dict[str, dict] = {}
    if context is not None:
        plugins = dict(context.manifest.get("plugins", {}))
    return SkyPilotLauncher(options, plugins)
