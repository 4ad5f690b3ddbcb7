"""scripts/compare_metrics.py: two runs' metrics value by value, wall-clock keys left out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compare_metrics.py"


def _write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _compare(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60
    )


ROWS = [
    {
        "step": 1,
        "actor/pg_loss": 0.125,
        "critic/score/mean": 0.5,
        "timing_s/step": 1.0,
        "perf/throughput": 9.0,
    },
    {"step": 1, "val/reward/mean": 0.25, "timing_s/val": 0.5},
]


def test_equal_runs_match_whatever_the_wall_clock_said(tmp_path):
    slower = [{**r, **{k: v * 3 for k, v in r.items() if k.startswith(("timing_s/", "perf/"))}} for r in ROWS]
    _write(tmp_path / "a" / "x" / "metrics.jsonl", ROWS)
    _write(tmp_path / "b" / "x" / "metrics.jsonl", slower)
    proc = _compare(tmp_path / "a", tmp_path / "b")
    assert proc.returncode == 0, proc.stdout
    assert "total: 2/2 rows and 5/5 values matched" in proc.stdout


def test_a_value_off_in_the_last_digit_or_a_missing_row_fails(tmp_path):
    before = _write(tmp_path / "before.jsonl", ROWS)
    off = _write(tmp_path / "off.jsonl", [{**ROWS[0], "actor/pg_loss": 0.12500000000000003}, ROWS[1]])
    proc = _compare(before, off)
    assert proc.returncode == 1
    assert "row 1 (step 1): actor/pg_loss 0.125 before, 0.12500000000000003 after" in proc.stdout
    assert "total: 1/2 rows and 4/5 values matched" in proc.stdout
    short = _write(tmp_path / "short.jsonl", ROWS[:1])
    proc = _compare(before, short)
    assert proc.returncode == 1 and "2 rows before, 1 after" in proc.stdout
    _write(tmp_path / "c" / "metrics.jsonl", ROWS)
    (tmp_path / "d").mkdir()
    proc = _compare(tmp_path / "c", tmp_path / "d")
    assert proc.returncode == 1 and "metrics.jsonl: missing after" in proc.stdout
