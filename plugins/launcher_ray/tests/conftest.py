"""Fixtures for the ray launcher's tests: one real Ray cluster on loopback for the session.

The head is started with ``ray start --head --block`` in a process group of its own, so the
session stops exactly the processes it started (``ray stop`` would stop every Ray on the host).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlcore.interfaces import LaunchRequest

RAY_CPUS = 4


@dataclass
class Cluster:
    address: str  # GCS, for worker-group mode
    dashboard: str  # Jobs API, for job mode
    cpus: int


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except urllib.error.HTTPError as exc:  # the dashboard answers, but refuses
            raise RuntimeError(f"{url} answered {exc.code} {exc.reason}") from None
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout:g} s")


@pytest.fixture(scope="session")
def ray_cluster():
    pytest.importorskip("ray", reason='the ray launcher tests need Ray: pip install "ray[default]"')
    gcs, dash, client, agent = (free_port() for _ in range(4))
    temp_dir = tempfile.mkdtemp(prefix="rlray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["RAY_AUTH_MODE"] = "disabled"  # see _ray_auth_disabled
    ray_bin = str(Path(sys.executable).with_name("ray"))
    argv = [
        ray_bin, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={gcs}", f"--num-cpus={RAY_CPUS}",
        "--num-gpus=0", "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
        f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}", f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]
    log = open(Path(temp_dir) / "ray-start.log", "w")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    cluster = Cluster(address=f"127.0.0.1:{gcs}", dashboard=f"http://127.0.0.1:{dash}", cpus=RAY_CPUS)
    try:
        _wait_http(f"{cluster.dashboard}/api/version", proc, timeout=180)
        yield cluster
    except Exception as exc:
        log.flush()
        pytest.fail(f"the test Ray cluster did not start: {exc}\n{(Path(temp_dir) / 'ray-start.log').read_text()[-3000:]}")
    finally:
        _stop_group(proc)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


@dataclass
class TwoNodes:
    address: str  # the head's GCS
    resources: tuple[str, str] = ("node_a", "node_b")  # one custom resource per node, to tell them apart


@pytest.fixture(scope="session")
def ray_two_nodes():
    """A Ray head and a second raylet (a worker node) on this host, both registered as
    127.0.0.1, with 2 CPUs and a resource of their own each (``node_a``, ``node_b``): a two-node
    cluster on loopback. Each ``ray start --block`` runs in a process group of its own, stopped at
    the end (the worker node first)."""
    pytest.importorskip("ray", reason='the ray launcher tests need Ray: pip install "ray[default]"')
    temp_dir = tempfile.mkdtemp(prefix="rl2n", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["RAY_AUTH_MODE"] = "disabled"
    ray_bin = str(Path(sys.executable).with_name("ray"))
    gcs = free_port()
    common = ["--block", "--node-ip-address=127.0.0.1", "--num-cpus=2", "--num-gpus=0", f"--temp-dir={temp_dir}",
              "--disable-usage-stats"]
    # Two raylets on one host: each gets its own agent ports and worker-port range (Ray's defaults would collide).
    head = [ray_bin, "start", "--head", f"--port={gcs}", '--resources={"node_a": 1}', "--include-dashboard=false",
            f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
            "--min-worker-port=20000", "--max-worker-port=20499", *common]
    worker = [ray_bin, "start", f"--address=127.0.0.1:{gcs}", '--resources={"node_b": 1}',
              f"--dashboard-agent-listen-port={free_port()}", "--min-worker-port=20500", "--max-worker-port=20999", *common]
    logs = {name: open(Path(temp_dir) / f"{name}.log", "w") for name in ("head", "worker")}
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen(head, env=env, stdout=logs["head"], stderr=subprocess.STDOUT, start_new_session=True))
        _wait_port("127.0.0.1", gcs, procs[0], timeout=120)
        procs.append(subprocess.Popen(worker, env=env, stdout=logs["worker"], stderr=subprocess.STDOUT, start_new_session=True))
        _wait_nodes(f"127.0.0.1:{gcs}", 2, procs, timeout=120)
        yield TwoNodes(address=f"127.0.0.1:{gcs}")
    except Exception as exc:
        for log in logs.values():
            log.flush()
        tails = "\n".join(f"--- {n}.log\n" + (Path(temp_dir) / f"{n}.log").read_text()[-2000:] for n in logs)
        pytest.fail(f"the two-node test Ray cluster did not start: {exc}\n{tails}")
    finally:
        for proc in reversed(procs):
            _stop_group(proc)
        for log in logs.values():
            log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _wait_port(host: str, port: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{host}:{port} did not answer within {timeout:g} s")


def _wait_nodes(address: str, count: int, procs: list[subprocess.Popen], timeout: float) -> None:
    """Until ``ray status`` lists ``count`` nodes (asked in a subprocess: this one stays unconnected)."""
    script = (
        "import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
        "print(sum(1 for n in ray.nodes() if n['Alive']))"
    )
    deadline = time.monotonic() + timeout
    seen = "nothing"
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"ray start exited with {proc.returncode}")
        out = subprocess.run([sys.executable, "-c", script, address], capture_output=True, text=True, timeout=60)
        seen = out.stdout.strip() or out.stderr[-500:]
        if seen == str(count):
            return
        time.sleep(1)
    raise TimeoutError(f"the cluster at {address} did not list {count} nodes within {timeout:g} s (last: {seen})")


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the head's process group (ray start --block then stops its own processes), then SIGKILL what is left."""
    pgid = proc.pid
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()  # reap the head: a zombie still counts as a member of the group
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.3)


@pytest.fixture(autouse=True)
def _no_ambient_ray(monkeypatch):
    """Tests say where Ray is; an address in the environment must not redirect them."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


@pytest.fixture(scope="session", autouse=True)
def _ray_auth_disabled():
    """Ray >= 2.5x turns token authentication on for a new local cluster and writes a token to
    ~/.ray/auth_token, which every later Ray on the host then picks up. The tests' clusters are
    loopback-only and short-lived: say explicitly that they run without a token, so they never
    write that file nor depend on one left by someone else."""
    old = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    yield
    if old is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = old


@pytest.fixture
def launch_request(tmp_path):
    """``launch_request(manifest=None, run_dir=None, dry_run=False, resume=False)`` -> a LaunchRequest."""

    def make(manifest: dict | None = None, run_dir: Path | None = None, dry_run: bool = False, resume: bool = False):
        return LaunchRequest(
            manifest_path=str(tmp_path / "manifest.toml"),
            resolved_manifest=manifest if manifest is not None else {"run": {"name": "ray-test"}},
            run_dir=str(run_dir or tmp_path / "run"),
            resume=resume,
            dry_run=dry_run,
        )

    return make
