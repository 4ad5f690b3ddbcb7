"""The ``skypilot`` launcher passes rlcore's launcher kit (rlcore.testing.launchers): a dry run returns 0,
says what it would do, and starts, writes and imports nothing heavy."""

from __future__ import annotations

from rlcore.testing.launchers import check_launcher
from rlcore.testing.runs import discover_registry


def test_the_skypilot_launcher_passes_the_kit(tmp_path):
    printed = check_launcher(discover_registry().get("launcher", "skypilot"), {}, directory=tmp_path)
    assert "sky launch" in printed and "dry run: nothing was launched" in printed  # the task it would launch
