"""Failures must never vanish: each one reaches the console and the run's own log, with an exit
code that says the run failed (issue 28, item 2)."""

from __future__ import annotations

import json

import pytest

from rlcore.testing.runs import run_cli, write_run_manifest


@pytest.mark.slow
def test_an_expected_error_that_ends_a_run_is_written_to_run_log(tmp_path, tiny_model):
    data = tmp_path / "rows.jsonl"
    data.write_text(
        "\n".join(
            json.dumps({"prompt": [{"role": "user", "content": f"q{i}"}], "data_source": "x"})
            for i in range(4)
        )
    )
    manifest = write_run_manifest(tmp_path, tiny_model, data={"train": str(data), "val": None})
    proc = run_cli("run", str(manifest), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    console = proc.stdout + proc.stderr
    assert console.count("row 0 has no") == 1, console  # said once on the console, not twice
    log = (tmp_path / "run" / "run.log").read_text()
    assert "the run failed" in log and "ground_truth" in log and "rows.jsonl" in log, log
    assert "this process: rank 0 of 1, host " in log, log


@pytest.mark.slow
@pytest.mark.parametrize("max_staleness", [0, 1])
def test_a_split_engine_dying_after_the_last_batch_fails_the_run(tmp_path, tiny_model, max_staleness):
    """The engine process exits right after answering the run's last generate call. The death
    was dropped (the background thread's error, or a dead process found at close): the run said
    'run finished' and exited 0."""
    from rlcore.testing.faults import env

    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        rollout={"placement": "split", "max_staleness": max_staleness},
        data={"val": None},
        trainer={"steps": 2},
    )
    proc = run_cli(
        "run",
        str(manifest),
        "--run-dir",
        str(tmp_path / "run"),
        env=env("engine_generate@2=exit"),
        timeout=300,
    )
    text = proc.stdout + proc.stderr
    assert "rlcore fault injection: engine_generate@2=exit" in text, text
    assert proc.returncode == 1, text
    assert "rollout engine's process" in text and "Traceback" not in text, text
    log = (tmp_path / "run" / "run.log").read_text()
    assert "run finished" not in log and "the run failed" in log and "rollout engine's process" in log, log
    assert (
        len([line for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if line.strip()])
        == 2
    )
