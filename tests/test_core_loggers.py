"""The builtin metrics sinks write what they receive, and a resumed run never logs a step twice."""

from __future__ import annotations

import json

from rlcore.interfaces import BuildContext
from rlcore.testing import isolated_registry


def _sink(name, tmp_path, resume_step=None, **options):
    component = isolated_registry().get("metrics_sink", name)
    context = BuildContext(run_dir=str(tmp_path), resume_step=resume_step, total_steps=3)
    return component.build(options, context)


def test_jsonl_appends_and_truncates_on_resume(tmp_path):
    sink = _sink("jsonl", tmp_path)
    for step in (1, 2, 3):
        sink.log({"critic/score/mean": step / 10, "bad": float("nan")}, step)
    sink.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "cut by a cra')  # a line a crash cut short
    resumed = _sink("jsonl", tmp_path, resume_step=2)
    resumed.log({"critic/score/mean": 0.33}, 3)
    resumed.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["critic/score/mean"] == 0.33 and rows[0]["bad"] is None


def test_console_prints_steps_and_the_reward_curve(tmp_path, capsys):
    sink = _sink("console", tmp_path)
    for step, score in ((1, 0.1), (2, 0.5), (3, 0.9)):
        sink.log({"critic/score/mean": score, "actor/pg_loss": 0.01, "timing_s/step": 1.5}, step)
    sink.log({"val/reward/mean": 0.8, "val/x/pass@1": 0.75}, 3)
    sink.close()
    out = capsys.readouterr().out
    assert "step 3/3" in out and "score 0.9" in out
    assert "step 1: 0.100 -> step 3: 0.900" in out
    assert "validation reward" in out and "step 3: 0.800" in out
