"""Fixtures for the ray launcher's tests: real Ray clusters on this host, on 127.0.0.1 only.

Each head (and the second node of ``ray_two_nodes``) is started with ``ray start --block`` in a
process group of its own, so the session stops exactly the processes it started (``ray stop``
would stop every Ray on the host).

Loopback only. Ray 2.x rewrites a loopback address ("127.0.0.1", "localhost") to the host's own
IP wherever it resolves one: in ``ray start --node-ip-address=127.0.0.1`` (the node then
registers and listens on that IP), in ``ray.init(address="127.0.0.1:P")`` and ``ray debug``
(both then dial the GCS at that IP). The rewrite asks ``services.get_node_ip_address()``, which
answers 127.0.0.1 when ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (Ray's single-host mode). So every
Ray process these tests start gets ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (``ray_env``), and so
does this process and its children for the session (``_ray_drivers_on_loopback``: the tests'
drivers, ``ray.init`` here and ``rlcore run`` subprocesses); each node's log must say
``Local node IP: 127.0.0.1``. Ray's dashboard head (started even with ``--include-dashboard=false``)
asks the cloud metadata address 169.254.169.254 which cloud it is on, usage stats or not, through
``requests``: ``ray_env`` sends that to a closed loopback port instead (refused at once; Ray then
says "unknown").
"""

from __future__ import annotations

import os
import re
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
RAY_BIN = str(Path(sys.executable).with_name("ray"))

# For every process that starts Ray or talks to it: keep Ray on 127.0.0.1 (module docstring), no
# token authentication (the note above _ray_drivers_on_loopback), no usage stats.
LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
}
# For every process that may start a Ray node: the dashboard head's cloud-metadata probe goes to a
# closed loopback port.
NO_METADATA_PROBE = {
    "HTTP_PROXY": "http://127.0.0.1:9",
    "http_proxy": "http://127.0.0.1:9",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}

# `ray start --address=...` for a second node, except that the CLI's refusal to add a node in
# single-host mode (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0) is lifted: the CLI alone sees
# ENABLE_RAY_CLUSTER = True, for that check; Ray's address resolution (ray._private.services)
# still reads the real constant, False, and keeps 127.0.0.1, as do the node's processes, which
# inherit the environment.
JOIN_ON_LOOPBACK = """
import sys, types
import ray._private.ray_constants as constants
import ray.scripts.scripts as cli
assert hasattr(cli, "ray_constants") and not constants.ENABLE_RAY_CLUSTER, "Ray's CLI changed: see conftest.py"
class CliConstants(types.ModuleType):
    ENABLE_RAY_CLUSTER = True
    def __getattr__(self, name):
        return getattr(constants, name)
cli.ray_constants = CliConstants("ray_constants")
sys.argv[0] = "ray"
sys.exit(cli.main())
"""


@dataclass
class Cluster:
    address: str  # GCS, for worker-group mode
    dashboard: str  # Jobs API, for job mode
    cpus: int


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ray_env() -> dict[str, str]:
    """The environment of the Ray nodes the fixtures start (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_DEBUG", "RLCORE_DEBUG_RANK")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return {**env, **LOOPBACK_ENV, **NO_METADATA_PROBE}


def start_node(argv: list[str], log_path: Path, timeout: float = 120) -> subprocess.Popen:
    """Start ``ray start --block ...`` (``argv``) in a process group of its own, its output to
    ``log_path``; return once it says "Ray runtime started" and that its IP is 127.0.0.1."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            argv, env=ray_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + timeout
        while "Ray runtime started" not in log_path.read_text():
            if proc.poll() is not None:
                raise RuntimeError(f"ray start exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"ray start did not come up within {timeout:g} s")
            time.sleep(0.5)
        if not re.search(r"Local node IP\S*: \S*127\.0\.0\.1\b", log_path.read_text()):
            raise RuntimeError("the node did not register as 127.0.0.1")
    except Exception as exc:
        _stop_group(proc)
        raise RuntimeError(f"{exc}; {log_path.name}:\n{log_path.read_text()[-3000:]}") from None
    return proc


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
def ray_cluster(_ray_drivers_on_loopback):
    """A one-node Ray head on 127.0.0.1 only (see the module docstring), with its dashboard
    (Jobs API) on 127.0.0.1 too."""
    pytest.importorskip("ray", reason='the ray launcher tests need Ray: pip install "ray[default]"')
    gcs, dash, client, agent = (free_port() for _ in range(4))
    temp_dir = tempfile.mkdtemp(prefix="rlray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    argv = [
        RAY_BIN,
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={gcs}",
        f"--num-cpus={RAY_CPUS}",
        "--num-gpus=0",
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dash}",
        f"--ray-client-server-port={client}",
        f"--dashboard-agent-listen-port={agent}",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]
    cluster = Cluster(address=f"127.0.0.1:{gcs}", dashboard=f"http://127.0.0.1:{dash}", cpus=RAY_CPUS)
    proc = None
    try:
        proc = start_node(argv, Path(temp_dir) / "ray-start.log")
        _wait_http(f"{cluster.dashboard}/api/version", proc, timeout=180)
    except Exception as exc:
        if proc is not None:
            _stop_group(proc)
        shutil.rmtree(temp_dir, ignore_errors=True)
        pytest.fail(f"the test Ray cluster did not start: {exc}")
    try:
        yield cluster
    finally:
        _stop_group(proc)
        shutil.rmtree(temp_dir, ignore_errors=True)


@dataclass
class TwoNodes:
    address: str  # the head's GCS
    resources: tuple[str, str] = ("node_a", "node_b")  # one custom resource per node, to tell them apart


@pytest.fixture(scope="session")
def ray_two_nodes(_ray_drivers_on_loopback):
    """A Ray head and a second raylet (a worker node) on this host, both registered as
    127.0.0.1, with 2 CPUs and a resource of their own each (``node_a``, ``node_b``): a two-node
    cluster on loopback only, like ``ray_cluster`` (see the module docstring). In single-host mode
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, which keeps Ray on 127.0.0.1) ``ray start`` refuses
    to add a node; the second node is started through ``JOIN_ON_LOOPBACK``, which lifts that
    refusal alone. (Without single-host mode the second node would register and dial the GCS at
    the host's own IP.) The two raylets share ``--temp-dir`` and so one session directory: both
    log monitors publish every worker's lines (test_ray_two_nodes.py checks that the driver prints
    each once). Each ``ray start --block`` runs in a process group of its own, stopped at
    the end (the worker node first)."""
    pytest.importorskip("ray", reason='the ray launcher tests need Ray: pip install "ray[default]"')
    temp_dir = tempfile.mkdtemp(prefix="rl2n", dir="/tmp")
    gcs = free_port()
    common = [
        "--block",
        "--node-ip-address=127.0.0.1",
        "--num-cpus=2",
        "--num-gpus=0",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]
    # Two raylets on one host: each gets its own agent ports and worker-port range (Ray's defaults would collide).
    head = [
        RAY_BIN,
        "start",
        "--head",
        f"--port={gcs}",
        '--resources={"node_a": 1}',
        "--include-dashboard=false",
        f"--ray-client-server-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        "--min-worker-port=20000",
        "--max-worker-port=20499",
        *common,
    ]
    worker = [
        sys.executable,
        "-c",
        JOIN_ON_LOOPBACK,
        "start",
        f"--address=127.0.0.1:{gcs}",
        '--resources={"node_b": 1}',
        f"--dashboard-agent-listen-port={free_port()}",
        "--min-worker-port=20500",
        "--max-worker-port=20999",
        *common,
    ]
    procs: list[subprocess.Popen] = []
    try:
        procs.append(start_node(head, Path(temp_dir) / "head.log"))
        procs.append(start_node(worker, Path(temp_dir) / "worker.log"))
        _wait_nodes(f"127.0.0.1:{gcs}", 2, procs, timeout=120)
    except Exception as exc:
        for proc in reversed(procs):
            _stop_group(proc)
        shutil.rmtree(temp_dir, ignore_errors=True)
        pytest.fail(f"the two-node test Ray cluster did not start: {exc}")
    try:
        yield TwoNodes(address=f"127.0.0.1:{gcs}")
    finally:
        for proc in reversed(procs):
            _stop_group(proc)
        shutil.rmtree(temp_dir, ignore_errors=True)


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
        out = subprocess.run(
            [sys.executable, "-c", script, address], capture_output=True, text=True, timeout=60, env=ray_env()
        )
        seen = out.stdout.strip() or out.stderr[-500:]
        if seen == str(count):
            return
        time.sleep(1)
    raise TimeoutError(
        f"the cluster at {address} did not list {count} nodes within {timeout:g} s (last: {seen})"
    )


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
def _ray_drivers_on_loopback():
    """This process (``ray.init`` in the tests, the launcher) and the processes it starts
    (``rlcore run``, scripts) talk to Ray on 127.0.0.1 only, without a token and without usage
    stats (``LOOPBACK_ENV``, see the module docstring and the note below); and a Ray instance
    started from here (the launcher's local instance: its dashboard head inherits this
    environment) sends no cloud-metadata probe (``NO_METADATA_PROBE``). Ray read
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER when the test modules imported it: its constant is set here
    too. Undone at the end of the session."""
    settings = {**LOOPBACK_ENV, **NO_METADATA_PROBE}
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        from ray._private import ray_constants
    except ImportError:
        ray_constants = None
    if ray_constants is not None:
        saved_constant = ray_constants.ENABLE_RAY_CLUSTER
        ray_constants.ENABLE_RAY_CLUSTER = False
    yield
    if ray_constants is not None:
        ray_constants.ENABLE_RAY_CLUSTER = saved_constant
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


# Why RAY_AUTH_MODE=disabled (set by _ray_drivers_on_loopback, and for the nodes by ray_env): Ray
# >= 2.5x turns token authentication on for a new local cluster and writes a token to
# ~/.ray/auth_token, which every later Ray on the host then picks up. The tests' clusters are
# loopback-only and short-lived: they say explicitly that they run without a token, so they never
# write that file nor depend on one left by someone else.


@pytest.fixture
def launch_request(tmp_path):
    """``launch_request(manifest=None, run_dir=None, dry_run=False, resume=False)`` -> a LaunchRequest."""

    def make(
        manifest: dict | None = None, run_dir: Path | None = None, dry_run: bool = False, resume: bool = False
    ):
        return LaunchRequest(
            manifest_path=str(tmp_path / "manifest.toml"),
            resolved_manifest=manifest if manifest is not None else {"run": {"name": "ray-test"}},
            run_dir=str(run_dir or tmp_path / "run"),
            resume=resume,
            dry_run=dry_run,
        )

    return make
