"""rlcore.testing.launchers: the builtin ``local`` launcher passes the launcher kit (its dry run,
and a real launch that trains one step of a tiny model), and launchers broken in the ways that
would start or damage something on a dry run fail the kit with a message naming the rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlcore.testing import isolated_registry, require_plugins
from rlcore.testing.launchers import check_launch, check_launcher, kit_request


def test_local_passes_the_kit(tmp_path):
    printed = check_launcher(isolated_registry().get("launcher", "local"), directory=tmp_path)
    assert "in this process" in printed and str(tmp_path / "run") in printed


@pytest.mark.slow
def test_local_launches_a_tiny_run_for_real(tmp_path, tiny_model):
    from rlcore.testing.runs import TINY_RUN_PLUGINS, load_run_manifest, write_run_manifest

    require_plugins(*TINY_RUN_PLUGINS)
    path = write_run_manifest(tmp_path, tiny_model, trainer={"steps": 1})
    resolved = load_run_manifest(path)
    request = kit_request(tmp_path / "launch", resolved.resolved_dict(), dry_run=False)
    request.manifest_path, request.validated = str(path), resolved  # as `rlcore run` hands it over
    assert check_launch(isolated_registry().get("launcher", "local"), request) == 0
    rows = [json.loads(line) for line in (Path(request.run_dir) / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "critic/score/mean" in row] == [1]


# ----------------------------------------------------------------------------- broken launchers


class Silent:
    def launch(self, request):
        return 0


class ReturnsNothing:
    def launch(self, request):
        print("would run")


class ReturnsText:
    def launch(self, request):
        print("would run")
        return "0"


class IgnoresDryRun:
    def launch(self, request):
        run_dir = Path(request.run_dir)
        run_dir.mkdir(parents=True)
        (run_dir / "run.log").write_text("training...\n")
        print("training")
        return 0


class WritesBesideTheManifest:
    def launch(self, request):
        Path(request.manifest_path).with_name("job.sh").write_text("#!/bin/sh\n")
        print("would submit job.sh")
        return 0


class EditsTheManifest:
    def launch(self, request):
        request.resolved_manifest["launcher"] = {"name": "elsewhere"}
        print("would run elsewhere")
        return 0


class FailsTheDryRun:
    def launch(self, request):
        raise RuntimeError("no cluster to ask")


class NoLaunch:
    def run(self, request):
        return 0


class ChangesItsMind:
    def __init__(self):
        self.calls = 0

    def launch(self, request):
        self.calls += 1
        print(f"would run attempt {self.calls}")
        return 0


@pytest.mark.parametrize(
    "launcher, message",
    [
        (Silent(), "printed nothing"),
        (ReturnsNothing(), r"must return an exit code \(int\), got None"),
        (ReturnsText(), r"must return an exit code \(int\), got '0'"),
        (IgnoresDryRun(), "created the run directory"),
        (WritesBesideTheManifest(), "wrote files in a dry run"),
        (EditsTheManifest(), "changed the request"),
        (FailsTheDryRun(), "raised on a dry run: RuntimeError: no cluster to ask"),
        (NoLaunch(), r"needs launch\(request\)"),
        (ChangesItsMind(), "the same dry run twice said different things"),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, str) else "",
)
def test_broken_launchers_fail_the_kit_saying_why(launcher, message):
    with pytest.raises(AssertionError, match=message):
        check_launcher(launcher)


def test_a_dry_run_that_imports_something_heavy_fails(monkeypatch):
    import sys
    import types

    monkeypatch.delitem(sys.modules, "sky", raising=False)

    class ImportsSky:
        def launch(self, request):
            sys.modules["sky"] = types.ModuleType("sky")  # what `import sky` leaves behind
            print("would launch on the cloud")
            return 0

    with pytest.raises(AssertionError, match="imported sky for a dry run"):
        check_launcher(ImportsSky())
