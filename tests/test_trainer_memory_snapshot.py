"""CUDA memory snapshots: ``[trainer] memory_snapshot_steps`` (history recorded over chosen steps,
written at each one's end) and ``memory_snapshot_on_oom`` (recorded over the whole run, written
when a phase runs out of memory, and named in the error). On a CPU the torch functions are fakes
that record their calls; benchmarks/memory_snapshot_gpu.py checks the real ones on a GPU."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

from rlcore.cli import main
from rlcore.testing.runs import train_rows, write_run_manifest

MEMORY_VIZ = "https://pytorch.org/memory_viz"


# ---------------------------------------------------------------------------- the manifest keys


def test_the_keys_validate_and_a_bad_step_is_located(tmp_path, tiny_model, capsys):
    good = write_run_manifest(
        tmp_path, tiny_model, trainer={"memory_snapshot_steps": [1, 3], "memory_snapshot_on_oom": True}
    )
    assert main(["validate", str(good)]) == 0
    bad = write_run_manifest(tmp_path, tiny_model, trainer={"memory_snapshot_steps": [2, 0]})
    capsys.readouterr()
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().out + capsys.readouterr().err
    assert "manifest.toml:" in err and "[trainer.memory_snapshot_steps.1]" in err and "greater than 0" in err
    bad = write_run_manifest(tmp_path, tiny_model, trainer={"memory_snapshot_on_oom": "maybe"})
    assert main(["validate", str(bad)]) == 2
    assert "[trainer.memory_snapshot_on_oom]" in capsys.readouterr().out


def test_validating_the_keys_does_not_import_torch(tmp_path, tiny_model):
    manifest = write_run_manifest(
        tmp_path, tiny_model, trainer={"memory_snapshot_steps": [2], "memory_snapshot_on_oom": True}
    )
    code = (
        f"import sys; from rlcore.cli import main; assert main(['validate', {str(manifest)!r}]) == 0; "
        "assert 'torch' not in sys.modules, 'validate imported torch'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------- fakes of torch's functions


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda.is_available() is True, and the memory-history functions append to the list
    returned: ("record", kwargs), ("dump", path written, whether the final name existed then)."""
    import torch

    calls: list[tuple] = []

    def record(*args, **kwargs):
        calls.append(("record", dict(kwargs, **({"enabled": args[0]} if args else {}))))

    def dump(filename="dump_snapshot.pickle"):
        calls.append(("dump", filename))
        with open(filename, "wb") as f:
            pickle.dump({"segments": [], "device_traces": [[]]}, f)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", record)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", dump)
    return calls


@pytest.fixture
def messages():
    from loguru import logger

    seen: list[str] = []
    sink = logger.add(lambda m: seen.append(m.record["message"]), level="INFO")
    yield seen
    logger.remove(sink)


START = ("record", {"max_entries": 100_000})
STOP = ("record", {"enabled": None})


def test_a_chosen_step_is_recorded_and_written_atomically(tmp_path, fake_cuda, messages):
    from rlcore.trainer.phases import MemoryHistory

    history = MemoryHistory([2], False, tmp_path, cuda=True)
    with history.run():
        for step in (1, 2, 3):
            with history.step(step):
                fake_cuda.append(("body", step))
    target = tmp_path / "memory" / "step_000002.pickle"
    kinds = [c if c[0] != "dump" else ("dump",) for c in fake_cuda]
    assert kinds == [("body", 1), START, ("body", 2), ("dump",), STOP, ("body", 3)]
    written = fake_cuda[3][1]
    # Written under another name in the same directory, then renamed: never a half-written target.
    assert written != str(target) and os.path.dirname(written) == str(target.parent)
    assert not os.path.exists(written) and sorted(p.name for p in target.parent.iterdir()) == [target.name]
    assert "segments" in pickle.loads(target.read_bytes())
    assert any(str(target) in m and MEMORY_VIZ in m and "step 2" in m for m in messages)


def test_out_of_memory_in_a_recorded_step_writes_a_snapshot_and_names_it(tmp_path, fake_cuda):
    import torch

    from rlcore.trainer.phases import MemoryHistory, OutOfMemory, Timer

    history = MemoryHistory([2], False, tmp_path, cuda=True)
    with history.run():
        with history.step(1):
            pass
        with pytest.raises(OutOfMemory) as raised:
            with history.step(2):
                timer = Timer(history)
                with timer("step"), timer("update_actor"):
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    target = tmp_path / "memory" / "oom_step_000002.pickle"
    message = str(raised.value)
    assert "'update_actor' phase" in message and "micro_batch_tokens" in message  # as before
    assert str(target) in message and MEMORY_VIZ in message
    assert "segments" in pickle.loads(target.read_bytes())
    assert [c[0] for c in fake_cuda] == ["record", "dump", "record"] and fake_cuda[-1] == STOP
    assert not (tmp_path / "memory" / "step_000002.pickle").exists()  # a failed step writes no step snapshot
    assert not history.recording


def test_on_oom_records_the_whole_run(tmp_path, fake_cuda):
    import torch

    from rlcore.trainer.phases import MemoryHistory, OutOfMemory, Timer

    history = MemoryHistory([1], True, tmp_path, cuda=True, rank=1)
    with pytest.raises(OutOfMemory, match=r"oom_step_000002\.rank1\.pickle"):
        with history.run():
            assert fake_cuda == [START]  # from the start of the run
            for step in (1, 2):
                with history.step(step):
                    assert history.recording
                    with Timer(history).phase("gen"):
                        if step == 2:
                            raise torch.OutOfMemoryError("CUDA out of memory")
    names = sorted(p.name for p in (tmp_path / "memory").iterdir())
    assert names == ["oom_step_000002.rank1.pickle", "step_000001.rank1.pickle"]
    # One start: step 1's snapshot does not stop the run's recording; the end of the run does.
    assert [c[0] for c in fake_cuda] == ["record", "dump", "dump", "record"] and fake_cuda[-1] == STOP


def test_without_recording_the_out_of_memory_error_names_no_snapshot(tmp_path, fake_cuda):
    import torch

    from rlcore.trainer.phases import MemoryHistory, OutOfMemory, Timer

    for history in (
        MemoryHistory([2], False, tmp_path, cuda=True),
        MemoryHistory([1], True, tmp_path, cuda=False),
    ):
        with history.run(), history.step(1):
            with pytest.raises(OutOfMemory) as raised, Timer(history)("gen"):
                raise torch.OutOfMemoryError("CUDA out of memory")
        assert "pickle" not in str(raised.value) and MEMORY_VIZ not in str(raised.value)
    assert fake_cuda == [] and not (tmp_path / "memory").exists()


# ---------------------------------------------------------------------------- in a run


@pytest.mark.slow
def test_a_cpu_run_warns_once_and_completes(tmp_path, tiny_model):
    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        trainer={"steps": 2, "memory_snapshot_steps": [1, 2], "memory_snapshot_on_oom": True},
    )
    run = tmp_path / "run"
    assert main(["run", str(manifest), "--run-dir", str(run)]) == 0
    assert len(train_rows(run)) == 2
    log = (run / "run.log").read_text()
    assert log.count("no CUDA memory history is recorded") == 1
    assert "WARNING" in next(line for line in log.splitlines() if "no CUDA memory history" in line)
    assert not (run / "memory").exists()


@pytest.mark.slow
def test_the_trainer_records_the_chosen_step_and_names_the_oom_snapshot(
    tmp_path, tiny_model, fake_cuda, monkeypatch
):
    """The trainer's wiring, on a CPU: MemoryHistory told there is CUDA, torch's functions faked."""
    import torch

    from rlcore.trainer import phases, rl
    from rlcore.trainer.phases import OutOfMemory

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the run itself stays on the CPU
    monkeypatch.setattr(rl, "MemoryHistory", lambda *a, cuda, **k: phases.MemoryHistory(*a, cuda=True, **k))
    manifest = write_run_manifest(tmp_path, tiny_model, trainer={"steps": 2, "memory_snapshot_steps": [2]})
    run = tmp_path / "run"
    assert main(["run", str(manifest), "--run-dir", str(run)]) == 0
    assert [c[0] for c in fake_cuda] == ["record", "dump", "record"]
    assert fake_cuda[0] == START and fake_cuda[-1] == STOP
    assert sorted(p.name for p in (run / "memory").iterdir()) == ["step_000002.pickle"]

    # An out-of-memory error in step 1's update, with the whole run recorded.
    fake_cuda.clear()

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")

    monkeypatch.setattr(rl.RLTrainer, "update_actor", out_of_memory)
    manifest = write_run_manifest(tmp_path, tiny_model, trainer={"steps": 2, "memory_snapshot_on_oom": True})
    run = tmp_path / "oom"
    with pytest.raises(OutOfMemory) as raised:
        main(["--debug", "run", str(manifest), "--run-dir", str(run)])
    target = run / "memory" / "oom_step_000001.pickle"
    assert "'update_actor' phase" in str(raised.value) and str(target) in str(raised.value)
    assert (
        target.exists()
        and [c[0] for c in fake_cuda] == ["record", "dump", "record"]
        and fake_cuda[-1] == STOP
    )
