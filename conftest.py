"""Session-wide set-up for every test in this repository (tests/ and plugins/*/tests/)."""

import fcntl
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

# Tests of these plugins drive a cluster that is one per machine (SLURM's daemons) or that binds
# ports and a session directory (Ray): they take turns, holding a file lock through each test's
# set-up, call and tear-down. So the suite can run in two pytest-xdist workers (the README's
# `-n 2`), and two test runs on one machine never share a cluster mid-test. (pytest-xdist's
# `--dist loadgroup` would keep them in one worker instead, but 3.8 does not group under pytest 9.)
SHARED_CLUSTERS = {"launcher_slurm": "slurm", "launcher_ray": "ray"}


def pytest_configure(config):
    # A shell starts background jobs with SIGINT ignored, and an ignored signal stays ignored in
    # Python and in every child process. Tests of Ctrl-C handling need it delivered.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def shared_cluster(item: pytest.Item) -> str | None:
    """The cluster a test drives (its plugin's, in SHARED_CLUSTERS), or None."""
    parts = item.path.parts
    if "plugins" not in parts:
        return None
    return next((name for plugin, name in SHARED_CLUSTERS.items() if plugin in parts), None)


@contextmanager
def cluster_turn(name: str):
    """Hold this machine's lock on the named cluster (released if the process dies)."""
    with open(Path(tempfile.gettempdir()) / f"rlcore-tests-{name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    name = shared_cluster(item)
    if name is None:
        return (yield)
    with cluster_turn(name):  # session fixtures (the SLURM set-up) start inside the first test's turn
        return (yield)
