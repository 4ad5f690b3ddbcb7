"""check_data_spec: the light check `rlcore validate` runs, without torch or datasets."""

from __future__ import annotations

import subprocess
import sys

from rlcore.data import check_data_spec


def test_files(tmp_path):
    (tmp_path / "a.parquet").write_bytes(b"")
    (tmp_path / "b.jsonl").write_text("")
    assert check_data_spec(str(tmp_path / "a.parquet")) is None
    assert check_data_spec("b.jsonl", base_dir=tmp_path) is None
    missing = check_data_spec(str(tmp_path / "c.parquet"))
    assert "does not exist" in missing and "c.parquet" in missing
    (tmp_path / "d.csv").write_text("x")
    bad = check_data_spec(str(tmp_path / "d.csv"))
    assert "unknown extension '.csv'" in bad and ".parquet" in bad and "synthetic:" in bad
    assert "expected" in check_data_spec("")


def test_synthetic():
    assert check_data_spec("synthetic:addition?size=10") is None
    assert "available: addition, arithmetic" in check_data_spec("synthetic:nope")


def test_importing_and_checking_loads_no_heavy_module(tmp_path):
    code = (
        "import sys; from rlcore.data import check_data_spec; "
        "check_data_spec('synthetic:addition?size=3'); check_data_spec('x.parquet'); "
        "import rlcore.data.cli, rlcore.data.gsm8k; "
        "print(sorted(m for m in ('torch', 'datasets', 'pyarrow', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
