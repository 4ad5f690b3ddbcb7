"""Failures must never vanish: each one reaches the console and the run's own log, with an exit
code that says the run failed (issue 28, item 2)."""

from __future__ import annotations

import json

import pytest

from rlcore.testing.runs import run_cli, write_run_manifest


@pytest.mark.slow
def test_an_expected_error_that_ends_a_run_is_written_to_run_log(tmp_path, tiny_model):
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": [{"role": "user", "content": f"q{i}"}], "data_source": "x"})
                              for i in range(4)))
    manifest = write_run_manifest(tmp_path, tiny_model, data={"train": str(data), "val": None})
    proc = run_cli("run", str(manifest), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    console = proc.stdout + proc.stderr
    assert console.count("row 0 has no") == 1, console  # said once on the console, not twice
    log = (tmp_path / "run" / "run.log").read_text()
    assert "the run failed" in log and "ground_truth" in log and "rows.jsonl" in log, log
    assert "this process: rank 0 of 1, host " in log, log
