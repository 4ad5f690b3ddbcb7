"""scripts/size_carry.sh, offline: its argument checks, and its sums on a folder of tiny made-up wheels
(--from), so that the subtraction, the nvidia split and the transfer count are checked without a download."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "size_carry.sh"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
MIB = 2**20


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)


def wheel(
    folder: Path,
    name: str,
    version: str,
    size: int,
    requires: tuple[str, ...] = (),
    tag: str = "py3-none-any",
):
    """A wheel file of about `size` bytes whose METADATA lists `requires`."""
    path = folder / f"{name}-{version}-{tag}.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta)
        z.writestr("pad.bin", b"\0" * size)
    return path


def test_help_and_bad_arguments():
    ok = run("--help")
    assert ok.returncode == 0 and "--sglang VERSION" in ok.stdout and "--from DIR" in ok.stdout
    for args, message in [
        (["--top", "x"], "--top expects a positive integer, got 'x'"),
        (["--bogus"], "unknown argument '--bogus'"),
        (["--sglang"], "--sglang needs a value"),
        (["--has", "/nonexistent/has.txt"], "'/nonexistent/has.txt' does not exist"),
        (["--from", "/nonexistent/dir"], "--from folder '/nonexistent/dir' does not exist"),
    ]:
        bad = run(*args)
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr


def test_sums_subtraction_and_transfers(tmp_path):
    wheels = tmp_path / "w"
    wheels.mkdir()
    wheel(
        wheels, "sglang", "0.5.23", 10 * MIB, ("torch==2.14.1", "numpy"), "cp312-cp312-manylinux_2_34_x86_64"
    )
    wheel(
        wheels,
        "torch",
        "2.14.1",
        100 * MIB,
        (
            "nvidia-cudnn-cu13==9.24.0.43; platform_system == 'Linux'",
            "cuda-toolkit[cublas]==13.0.3",
            "sympy>=1.13",
            "pyyaml; extra == 'pyyaml'",
        ),
        "cp312-cp312-manylinux_2_28_x86_64",
    )
    wheel(
        wheels,
        "nvidia_cudnn_cu13",
        "9.24.0.43",
        50 * MIB,
        ("nvidia-cublas",),
        "py3-none-manylinux_2_27_x86_64",
    )
    wheel(
        wheels,
        "cuda_toolkit",
        "13.0.3.0",
        1,
        ("nvidia-cublas==13.1.1.3.*; extra == 'cublas'", "nvidia-npp; extra == 'npp'"),
    )
    wheel(wheels, "nvidia_cublas", "13.1.1.3", 40 * MIB, (), "py3-none-manylinux_2_27_x86_64")
    wheel(wheels, "nvidia_cutlass_dsl_libs_cu12", "4.8.0", 5 * MIB)
    wheel(wheels, "numpy", "2.3.5", 8 * MIB, (), "cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64")
    wheel(wheels, "sympy", "1.14.0", 3 * MIB)
    has = tmp_path / "has.txt"
    has.write_text("# the machine\nsympy==1.14.0\nnumpy   # version not recorded\ntorch==2.11.0+cu130\n")
    assume = tmp_path / "assume.txt"
    assume.write_text("nvidia-cublas==13.1.1.3\n")

    out = run(
        "--from", str(wheels), "--has", str(has), "--assume", str(assume), "--chunk-mib", "61", "--top", "3"
    )
    assert out.returncode == 0, out.stderr
    rows = {
        line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:]
        for line in out.stdout.splitlines()
        if line.startswith("| ")
    }
    total = lambda mib: pytest.approx(mib * MIB, rel=0.01)

    def size(label):
        text = next(v for k, v in rows.items() if k.startswith(label))
        mib = float(text[0].split("(")[1].split()[0].replace(",", ""))
        return mib * MIB, int(text[1]), int(text[2].rstrip(" |"))

    assert size("everything")[1] == 8
    everything = 10 + 100 + 50 + 40 + 5 + 8 + 3
    assert size("everything")[0] == total(everything)
    # sympy matches by version; torch 2.14.1 is not the machine's 2.11.0; numpy's version is not known.
    assert size("**carry**")[:2] == (total(everything - 3), 7)
    assert size("**carry**")[2] == -(-(everything - 3) * MIB // (61 * MIB))
    # torch's nvidia libraries: cudnn directly, cublas through cuda-toolkit[cublas], and cuda-toolkit itself;
    # not cutlass-dsl, which torch does not require.
    assert size("carry without torch")[:2] == (total(everything - 3 - 50 - 40), 4)
    # The lower bound drops numpy (version unrecorded) but keeps torch: sglang pins 2.14.1, the machine has 2.11.0.
    assert size("lower bound:")[:2] == (total(everything - 3 - 8), 6)
    assert size("carry, if the machine also has assume.txt")[:2] == (total(everything - 3 - 40), 6)
    assert "Subtracted (same name and version): sympy." in out.stdout
    assert "numpy 2.3.5 (machine: ?)*" in out.stdout
    assert "torch 2.14.1 (machine: 2.11.0)." in out.stdout
    assert (
        "Named for CUDA 12 (the machine's torch and driver are CUDA 13): nvidia-cutlass-dsl-libs-cu12."
        in out.stdout
    )
    assert "Newest glibc a wheel to carry needs: 2.34 (sglang)." in out.stdout
    table = out.stdout.split("largest wheels to carry:")[1].splitlines()
    largest = [
        line.split(" | ")[0].lstrip("| ")
        for line in table
        if line.startswith("| ") and not line.startswith("| wheel")
    ]
    assert largest == ["torch", "nvidia-cudnn-cu13", "nvidia-cublas"]


def test_torch_pin_mismatch_is_reported(tmp_path):
    wheel(tmp_path, "torch", "2.14.1", 1, ("nvidia-nccl-cu13==2.30.7",))
    wheel(tmp_path, "nvidia_nccl_cu13", "2.32.3", 1)
    out = run("--from", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "torch requires nvidia-nccl-cu13==2.30.7, downloaded nvidia-nccl-cu13 2.32.3" in out.stderr
