"""Start-up time of the light commands, side by side with a bare interpreter.

    python benchmarks/cli_startup.py [--repeat 5]

Prints the median wall time of `python -c pass`, `rlcore plugins` and `rlcore validate` (on the
starter manifest) and their ratio to the bare interpreter. Those two commands must not import torch.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _time(argv: list[str], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, check=False, capture_output=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        manifest = Path(tmp) / "starter.toml"
        subprocess.run(
            [sys.executable, "-m", "rlcore", "init", str(manifest)], check=True, capture_output=True
        )
        cases = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "python -c 'import torch'": [sys.executable, "-c", "import torch"],
            "rlcore plugins": [sys.executable, "-m", "rlcore", "plugins"],
            "rlcore validate": [sys.executable, "-m", "rlcore", "validate", str(manifest)],
        }
        base = None
        print(f"{'command':<28} {'median s':>9} {'x python':>9}")
        for name, argv in cases.items():
            seconds = _time(argv, args.repeat)
            base = base or seconds
            print(f"{name:<28} {seconds:>9.3f} {seconds / base:>9.1f}")


if __name__ == "__main__":
    main()
