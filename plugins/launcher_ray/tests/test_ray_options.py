"""The ray launcher without a cluster: manifest options, dry runs, rank layout, missing Ray."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest
from rlcore_launcher_ray.jobs import exit_code, job_entrypoint, job_request
from rlcore_launcher_ray.launcher import RayLauncher
from rlcore_launcher_ray.options import RayOptions

from rlcore.errors import RlcoreError
from rlcore.manifest.loader import load_manifest
from rlcore.testing import require_plugins, write_manifest
from rlcore.testing.runs import TINY_RUN, TINY_RUN_PLUGINS


def manifest_with(tmp_path, launcher: dict):
    return write_manifest(
        tmp_path, {**TINY_RUN, "model": {"path": "some/model"}, "launcher": {"name": "ray", **launcher}}
    )


def test_ray_manifest_options_validate(tmp_path):
    require_plugins(*TINY_RUN_PLUGINS)  # a valid manifest names their components
    path = manifest_with(
        tmp_path,
        {
            "workers": 4,
            "gpus_per_worker": 1,
            "placement_strategy": "SPREAD",
            "runtime_env": {"env_vars": {"NCCL_DEBUG": "INFO"}, "pip": ["emoji"]},
        },
    )
    options = load_manifest(path).component("launcher.name").options
    assert (options.workers, options.gpus_per_worker, options.placement_strategy) == (4, 1, "SPREAD")
    assert options.runtime_env.as_ray() == {"env_vars": {"NCCL_DEBUG": "INFO"}, "pip": ["emoji"]}


@pytest.mark.parametrize(
    "launcher, located",
    [
        ({"workers": 0}, "launcher.workers"),
        ({"gpus_per_worker": 2}, "launcher.gpus_per_worker"),
        ({"placement_strategy": "TIGHT"}, "launcher.placement_strategy"),
        ({"colocate": False}, "colocate = false"),
        ({"address": "http://head:8265"}, "set job = true"),
        ({"job": True, "address": "head:6379"}, "expected an address like"),
        ({"runtime_env": {"env_vars": {"RANK": "3"}}}, "set by the launcher for each rank"),
        ({"runtime_env": {"conda": "x"}}, "launcher.runtime_env.conda"),
        ({"nodes": 2}, "launcher.nodes"),
    ],
)
def test_ray_bad_manifest_options_are_located_errors(tmp_path, launcher, located):
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore", "validate", str(manifest_with(tmp_path, launcher))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert located in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_ray_validate_does_not_import_ray(tmp_path):
    require_plugins(*TINY_RUN_PLUGINS)
    path = manifest_with(tmp_path, {"workers": 2})
    code = (
        "import sys; from rlcore.cli import main; rc = main(['validate', sys.argv[1]]); "
        "print('RAY_IMPORTED' if 'ray' in sys.modules else 'RAY_NOT_IMPORTED'); sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "RAY_NOT_IMPORTED" in proc.stdout, proc.stdout + proc.stderr


def test_ray_dry_runs_say_what_would_happen(launch_request, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # a dry run needs no Ray
    assert RayLauncher(RayOptions(workers=3, gpus_per_worker=1)).launch(launch_request(dry_run=True)) == 0
    out = capsys.readouterr().out
    assert (
        "would start 3 rank(s) on a local Ray instance (127.0.0.1), each with 1 CPU(s) and 1 GPU(s) (PACK)"
        in out
    )
    job = RayOptions(job=True, address="http://head:8265", workers=2)
    request = launch_request(dry_run=True, resume=True)
    assert RayLauncher(job).launch(request) == 0
    out = capsys.readouterr().out
    assert "would submit a Ray job to http://head:8265: python -m rlcore run manifest.toml --run-dir " in out
    assert out.rstrip().endswith(f"--resume (working directory {request.run_dir}/launch/job)")


def test_ray_not_installed_says_how_to_install(launch_request, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(
        RlcoreError, match=r'needs Ray, which is not installed .*: pip install "ray\[default\]"'
    ):
        RayLauncher(RayOptions(workers=2)).launch(launch_request())
    monkeypatch.setitem(sys.modules, "ray.job_submission", None)
    monkeypatch.delitem(sys.modules, "ray")
    with pytest.raises(
        RlcoreError,
        match=r'needs the Ray Jobs client, which is not installed .*: pip install "ray\[default\]"',
    ):
        RayLauncher(RayOptions(job=True, address="http://127.0.0.1:8265")).launch(launch_request())


def test_ray_job_mode_needs_an_address(launch_request):
    with pytest.raises(RlcoreError, match=r"job = true needs the cluster\'s Jobs API address"):
        RayLauncher(RayOptions(job=True)).launch(launch_request())


def test_ray_job_mode_unreachable_address_fails_fast(launch_request):
    pytest.importorskip("ray.job_submission")
    import socket
    import time

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = f"http://127.0.0.1:{sock.getsockname()[1]}"
    started = time.monotonic()
    with pytest.raises(RlcoreError, match=rf"cannot reach the Ray Jobs API at {address} \("):
        RayLauncher(RayOptions(job=True, address=address, connect_timeout=3)).launch(launch_request())
    assert time.monotonic() - started < 5


def test_ray_job_runs_the_same_ranks_on_the_cluster(launch_request):
    options = RayOptions(
        job=True,
        address="http://head:8265",
        workers=4,
        gpus_per_worker=1,
        python="/opt/py/bin/python",
        runtime_env={"env_vars": {"A": "1"}},
    )
    request = job_request(
        options, launch_request(manifest={"run": {"name": "x"}, "launcher": {"name": "ray"}})
    )
    assert request.resolved_manifest["launcher"] == {"name": "ray", "workers": 4, "gpus_per_worker": 1}
    assert job_entrypoint(options, request).startswith(
        "/opt/py/bin/python -m rlcore run manifest.toml --run-dir "
    )
    # The launcher table written for the job validates as the ray launcher's options.
    assert RayOptions.model_validate(
        {k: v for k, v in request.resolved_manifest["launcher"].items() if k != "name"}
    )


@pytest.mark.parametrize(
    "status, driver_code, code",
    [
        ("SUCCEEDED", 0, 0),
        ("FAILED", None, 1),
        ("FAILED", 2, 2),
        ("FAILED", -9, 1),
        ("STOPPED", None, 130),
    ],
)
def test_ray_job_status_maps_to_exit_code(status, driver_code, code):
    assert exit_code(status, driver_code) == code


def test_ray_dry_run_through_the_cli(tmp_path):
    require_plugins(*TINY_RUN_PLUGINS)
    path = manifest_with(tmp_path, {"workers": 2, "address": "10.1.2.3:6379"})
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore", "run", str(path), "--dry-run", "--run-dir", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "would start 2 rank(s) on the Ray cluster at 10.1.2.3:6379" in proc.stdout
    assert not (tmp_path / "r").exists()  # nothing written by a dry run
    assert tomllib.loads(path.read_text())["launcher"]["workers"] == 2
