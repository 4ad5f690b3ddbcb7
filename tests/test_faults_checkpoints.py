"""Checkpoints that cannot lie (issue 28, item 3): a deleted ``checksums.json`` is seen, a disk
that fills inside any serialiser gives the designed message, a lagging ``latest`` pointer does
not win over a newer intact checkpoint, and ``--resume --dry-run`` refuses what ``--resume``
would refuse."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest
from loguru import logger

from rlcore.checkpoint import CHECKSUMS_FILE, STATE_FILE, Checkpointer
from rlcore.testing.checkpoints import save_tiny_checkpoint as _save


@pytest.fixture
def warnings():
    seen: list[str] = []
    sink = logger.add(lambda m: seen.append(str(m)), level="WARNING", format="{message}")
    yield seen
    logger.remove(sink)


def _flip_last_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_deleted_checksums_file_is_damage_not_trust(tmp_path, warnings):
    checkpointer = Checkpointer(tmp_path, keep=3)
    first, second = _save(checkpointer, 1), _save(checkpointer, 2)
    (second / CHECKSUMS_FILE).unlink()
    _flip_last_byte(second / "optimizers-rank0.pt")  # what a missing listing would let through
    assert checkpointer.latest() == first
    said = "\n".join(warnings)
    assert f"checkpoint {second} is damaged: {second / CHECKSUMS_FILE} is missing" in said, said
    # An edited listing (recomputed to match flipped bytes) is seen through the state file's digest.
    listing = json.loads((first / CHECKSUMS_FILE).read_text())
    _flip_last_byte(first / "optimizers-rank0.pt")
    from rlcore.checkpoint import file_digest

    listing["files"]["optimizers-rank0.pt"] = file_digest(first / "optimizers-rank0.pt")
    (first / CHECKSUMS_FILE).write_text(json.dumps(listing))
    assert checkpointer.latest_intact() is None


def test_a_checkpoint_from_before_checksums_loads_with_a_warning(tmp_path, warnings):
    checkpointer = Checkpointer(tmp_path, keep=3)
    path = _save(checkpointer, 1)
    (path / CHECKSUMS_FILE).unlink()
    state = json.loads((path / STATE_FILE).read_text())
    state.pop("checksums_sha256", None)  # what the state file of an older rlcore lacks
    (path / STATE_FILE).write_text(json.dumps(state))
    assert checkpointer.latest() == path
    assert any("has no checksums.json" in w and "cannot be verified" in w for w in warnings), warnings


def test_a_lagging_latest_pointer_does_not_win(tmp_path, warnings):
    checkpointer = Checkpointer(tmp_path, keep=3)
    _save(checkpointer, 2)
    newest = _save(checkpointer, 4)
    (tmp_path / "checkpoints" / "latest").write_text("step_000002")  # what a full disk left
    assert checkpointer.latest() == newest
    said = "\n".join(warnings)
    assert "names step_000002, but step_000004 is newer and intact" in said, said


_FILL = textwrap.dedent("""
    import json, os, subprocess, sys
    root, levels = sys.argv[1], json.loads(sys.argv[2])
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", root], check=True)
    from rlcore.testing.checkpoints import save_tiny_checkpoint as save_tiny
    from rlcore.errors import RlcoreError
    from rlcore.checkpoint import Checkpointer
    checkpointer = Checkpointer(root, keep=1)
    first = save_tiny(checkpointer, 1, 256)
    out = []
    for free in levels:
        st = os.statvfs(root)
        filler = os.path.join(root, "filler")
        with open(filler, "wb") as f:
            f.write(b"x" * max(0, st.f_bavail * st.f_frsize - free))
        try:
            save_tiny(checkpointer, 2, 256)
            out.append({"free": free, "saved": True})
        except RlcoreError as exc:
            out.append({"free": free, "message": str(exc), "latest": str(checkpointer.latest()),
                        "left": sorted(os.listdir(os.path.join(root, "checkpoints")))})
        os.unlink(filler)
    print(json.dumps({"first": str(first), "results": out}))
""")


def test_a_disk_that_fills_in_any_serialiser_gives_the_designed_message(tmp_path):
    """A real full filesystem (a small tmpfs in a user namespace): safetensors and torch.save do
    not raise OSError on it, yet the message is the designed one and the previous checkpoint stays."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.skip("no unprivileged mount namespaces here")

    root = tmp_path / "disk"
    root.mkdir()
    levels = [0, 4096, 150_000, 300_000, 700_000, 1_000_000]
    proc = subprocess.run(
        ["unshare", "-rm", sys.executable, "-c", _FILL, str(root), json.dumps(levels)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    failed = [r for r in report["results"] if not r.get("saved")]
    assert len(failed) >= 4, report
    for result in failed:
        assert "no space left on device while writing checkpoint" in result["message"], result
        assert f"the previous checkpoint {report['first']} is kept" in result["message"], result
        assert result["latest"] == report["first"] and result["left"] == ["latest", "step_000001"], result
    where = " ".join(r["message"] for r in failed)
    assert "model" in where and "optimizers-rank0.pt" in where, where  # both serialisers were hit


def test_resume_dry_run_refuses_when_every_checkpoint_is_damaged(tmp_path, tiny_model):
    from rlcore.testing.runs import run_cli, write_run_manifest

    run_dir = tmp_path / "run"
    checkpointer = Checkpointer(run_dir, keep=3)
    for step in (1, 2):
        (_save(checkpointer, step) / "rng-rank0.pt").unlink()
    manifest = write_run_manifest(tmp_path, tiny_model)
    proc = run_cli("run", str(manifest), "--run-dir", str(run_dir), "--resume", "--dry-run")
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text
    assert "no intact checkpoint to resume from" in " ".join(text.split()), text
    assert "Traceback" not in text
