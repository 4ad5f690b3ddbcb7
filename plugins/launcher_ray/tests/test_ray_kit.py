"""The ``ray`` launcher passes rlcore's launcher kit (rlcore.testing.launchers): a dry run returns 0,
says what it would do, and starts, writes and imports nothing heavy."""

from __future__ import annotations

from rlcore.testing.launchers import check_launcher
from rlcore.testing.runs import discover_registry


def test_the_ray_launcher_passes_the_kit(tmp_path):
    printed = check_launcher(discover_registry().get("launcher", "ray"), {}, directory=tmp_path)
    assert str(tmp_path / "run") in printed
