"""Checkpoints record their files' sizes and SHA-256; resuming skips a damaged one (naming the bad
file) for the newest intact one; a full disk during a save keeps the previous checkpoint; pruning
never removes the last intact checkpoint; the driver says "intact" only when it is."""

from __future__ import annotations

import errno
import json
import os
import shutil

import pytest
import torch
from loguru import logger

from rlcore.checkpoint import CHECKSUMS_FILE, STATE_FILE, Checkpointer
from rlcore.errors import RlcoreError
from rlcore.testing.checkpoints import save_tiny_checkpoint as _save
from rlcore.testing.checkpoints import tiny_training_state as _parts


@pytest.fixture
def warnings():
    """The loguru warnings logged during the test, as text."""
    seen: list[str] = []
    sink = logger.add(lambda m: seen.append(str(m)), level="WARNING", format="{message}")
    yield seen
    logger.remove(sink)


def _truncate(path, keep: int = 10):
    with open(path, "r+b") as f:
        f.truncate(keep)


def test_save_records_size_and_sha256_of_every_file_before_the_state_file(tmp_path):
    checkpointer = Checkpointer(tmp_path, keep=3)
    path = _save(checkpointer, 1)
    files = json.loads((path / CHECKSUMS_FILE).read_text())["files"]
    assert set(files) == {
        "model/model.safetensors",
        "model/tokenizer.json",
        "optimizers-rank0.pt",
        "rng-rank0.pt",
        "schedulers.pt",
    }
    import hashlib

    for rel, digest in files.items():
        data = (path / rel).read_bytes()
        assert digest == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert not list(tmp_path.glob("checkpoints/.tmp-*")) and not list(path.glob(".*.tmp-*"))
    assert checkpointer.latest() == path


@pytest.mark.parametrize(
    "damage, bad",
    [
        ("truncate", "optimizers-rank0.pt"),
        ("truncate", "model/model.safetensors"),
        ("flip", "model/model.safetensors"),  # same size, other bytes: only the SHA-256 tells
        ("delete", "rng-rank0.pt"),
        ("state", STATE_FILE),
    ],
)
def test_resume_falls_back_past_a_damaged_checkpoint_naming_the_bad_file(tmp_path, warnings, damage, bad):
    checkpointer = Checkpointer(tmp_path, keep=3)
    first, second = _save(checkpointer, 1), _save(checkpointer, 2)
    target = second / bad
    if damage == "truncate":
        _truncate(target)
    elif damage == "flip":
        data = bytearray(target.read_bytes())
        data[-1] ^= 0xFF
        target.write_bytes(bytes(data))
    elif damage == "delete":
        target.unlink()
    else:
        target.write_text('{"step": 2, "da')
    assert checkpointer.latest() == first
    said = "\n".join(warnings)
    assert f"checkpoint {second} is damaged: {target}" in said
    assert "falling back to the previous intact checkpoint" in said and f"resuming from {first}" in said
    # What the trainer then loads from the fallback works.
    model, optimizer, scheduler = _parts(99)
    Checkpointer.restore(first, optimizers={"actor": optimizer}, schedulers={"actor": scheduler}, modules={})


def test_no_intact_checkpoint_left_is_a_located_error(tmp_path):
    checkpointer = Checkpointer(tmp_path, keep=3)
    first, second = _save(checkpointer, 1), _save(checkpointer, 2)
    _truncate(first / "optimizers-rank0.pt")
    _truncate(second / "model" / "model.safetensors")
    with pytest.raises(RlcoreError) as caught:
        checkpointer.latest()
    message = str(caught.value)
    assert f"no intact checkpoint to resume from in {tmp_path / 'checkpoints'}" in message
    assert (
        str(first / "optimizers-rank0.pt") in message
        and str(second / "model" / "model.safetensors") in message
    )
    assert checkpointer.latest_intact() is None
    # No checkpoint at all is not an error: the run starts from the beginning.
    assert Checkpointer(tmp_path / "empty").latest() is None


def test_a_full_disk_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    checkpointer = Checkpointer(tmp_path, keep=1)
    first = _save(checkpointer, 1)
    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):
        if str(f).endswith("optimizers-rank0.pt"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(RlcoreError) as caught:
        _save(checkpointer, 2)
    message = str(caught.value)
    assert (
        f"no space left on device while writing checkpoint {tmp_path / 'checkpoints' / 'step_000002'}"
        in message
    )
    assert f"the previous checkpoint {first} is kept" in message
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_000001"]
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_000001"
    assert checkpointer.latest() == first


def test_a_full_disk_while_writing_the_checksums_or_state_file(tmp_path, monkeypatch):
    import rlcore.checkpoint as module

    checkpointer = Checkpointer(tmp_path, keep=2)
    first = _save(checkpointer, 1)
    real_write = module.write_atomic_text

    def full_disk(path, text):
        if path.name == CHECKSUMS_FILE:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_write(path, text)

    monkeypatch.setattr(module, "write_atomic_text", full_disk)
    with pytest.raises(RlcoreError, match="no space left on device while writing checkpoint .*step_000002"):
        _save(checkpointer, 2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_000001"]
    assert checkpointer.latest() == first


def test_pruning_never_removes_the_last_intact_checkpoint(tmp_path):
    """A run resumed from step 1 past a damaged step 3; with keep_checkpoints = 1 its save of step 2
    must stay (the damaged, newer step 3 used to be kept in its place)."""
    checkpointer = Checkpointer(tmp_path, keep=3)
    for step in (1, 2, 3):
        _save(checkpointer, step)
    shutil.rmtree(tmp_path / "checkpoints" / "step_000002")
    _truncate(tmp_path / "checkpoints" / "step_000003" / "optimizers-rank0.pt")
    assert checkpointer.latest().name == "step_000001"
    checkpointer = Checkpointer(tmp_path, keep=1)
    saved = _save(checkpointer, 2)
    assert saved.exists() and checkpointer.latest() == saved
    assert not (tmp_path / "checkpoints" / "step_000001").exists()  # older than keep: pruned
    # Ordinary pruning still keeps the newest `keep`.
    checkpointer = Checkpointer(tmp_path / "b", keep=2)
    for step in (1, 2, 3, 4):
        _save(checkpointer, step)
    assert [p.name for p in checkpointer.complete()] == ["step_000003", "step_000004"]


def _driver_message(tmp_path, tiny_model, monkeypatch, capsys, prepare):
    """Run the driver on a run directory prepared by ``prepare`` with a trainer that fails at
    once; returns what it printed on stderr."""
    from rlcore.manifest.loader import load_manifest
    from rlcore.testing.runs import write_run_manifest
    from rlcore.trainer import driver, rl

    class FailingTrainer:
        def __init__(self, *args, **kwargs):
            pass

        def setup(self):
            raise RuntimeError("boom")

    monkeypatch.setattr(rl, "RLTrainer", FailingTrainer)
    tmp_path.mkdir(parents=True, exist_ok=True)
    run_dir = tmp_path / "run"
    prepare(Checkpointer(run_dir, keep=3))
    manifest = load_manifest(write_run_manifest(tmp_path, tiny_model))
    assert driver.run_driver(manifest, run_dir, resume=True) == 1
    return capsys.readouterr().err


def test_the_driver_says_intact_only_when_true(tmp_path, tiny_model, monkeypatch, capsys):
    def damaged_latest(checkpointer):
        _save(checkpointer, 1)
        _truncate(_save(checkpointer, 2) / "optimizers-rank0.pt")

    err = _driver_message(tmp_path / "a", tiny_model, monkeypatch, capsys, damaged_latest)
    run_dir = tmp_path / "a" / "run"
    assert "The last intact checkpoint is " + str(run_dir / "checkpoints" / "step_000001") in err, err
    assert "The last checkpoint is intact" not in err

    def all_damaged(checkpointer):
        _truncate(_save(checkpointer, 1) / "model" / "model.safetensors")

    err = _driver_message(tmp_path / "b", tiny_model, monkeypatch, capsys, all_damaged)
    assert "No checkpoint in " in err and "is intact" in err and "cannot continue" in err, err
    assert "The last checkpoint is intact" not in err

    err = _driver_message(tmp_path / "c", tiny_model, monkeypatch, capsys, lambda c: None)
    assert "No checkpoint was written in" in err, err


@pytest.mark.slow
def test_rlcore_run_resume_past_a_truncated_checkpoint_and_without_any_intact_one(tmp_path, tiny_model):
    from rlcore.testing.runs import run_cli, train_rows, write_run_manifest

    manifest = write_run_manifest(
        tmp_path, tiny_model, trainer={"steps": 2, "save_every": 1, "keep_checkpoints": 2}, data={"val": None}
    )
    run_dir = tmp_path / "run"
    first = run_cli("run", str(manifest), "--run-dir", str(run_dir), timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    checkpoints = run_dir / "checkpoints"
    bad = checkpoints / "step_000002" / "optimizers-rank0.pt"
    _truncate(bad)

    resumed = run_cli(
        "run", str(manifest), "--run-dir", str(run_dir), "--resume", "--set", "trainer.steps=3", timeout=600
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    said = " ".join(resumed.stderr.split())
    assert f"checkpoint {checkpoints / 'step_000002'} is damaged: {bad} has 10 bytes" in said, resumed.stderr
    assert f"resuming from {checkpoints / 'step_000001'}, the newest intact checkpoint" in said
    assert [r["step"] for r in train_rows(run_dir)] == [1, 2, 3]
    assert [p.name for p in Checkpointer(run_dir).complete()] == ["step_000002", "step_000003"]

    for checkpoint in Checkpointer(run_dir).complete():
        _truncate(checkpoint / "model" / "model.safetensors")
    failed = run_cli(
        "run", str(manifest), "--run-dir", str(run_dir), "--resume", "--set", "trainer.steps=4", timeout=600
    )
    assert failed.returncode == 1, failed.stdout + failed.stderr
    said = " ".join(failed.stdout.split())
    assert f"error: no intact checkpoint to resume from in {checkpoints}: step_000003: " in said, (
        failed.stdout
    )
    assert str(checkpoints / "step_000002" / "model" / "model.safetensors") in said
    assert "Traceback" not in failed.stdout + failed.stderr
