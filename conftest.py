"""Session-wide set-up for every test in this repository (tests/ and plugins/*/tests/)."""

import signal

import pytest

# Tests that share a real cluster started once per session run in one pytest-xdist worker
# (`-n 2 --dist loadgroup`, as CI runs the suite): one SLURM cluster, Ray heads one at a time.
SHARED_CLUSTERS = ("launcher_slurm", "launcher_ray")


def pytest_configure(config):
    # A shell starts background jobs with SIGINT ignored, and an ignored signal stays ignored in
    # Python and in every child process. Tests of Ctrl-C handling need it delivered.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = item.path.parts
        for group in SHARED_CLUSTERS:
            if "plugins" in parts and group in parts:
                item.add_marker(pytest.mark.xdist_group(group))
