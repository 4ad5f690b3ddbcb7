"""CUDA memory snapshots on a real GPU (``[trainer] memory_snapshot_steps`` and
``memory_snapshot_on_oom``): a check, no figures to meet. CUDA only; exits 1 without it.

    python benchmarks/memory_snapshot_gpu.py [--out DIR] [--no-oom]

1. ``rlcore run`` (a subprocess) of a 2-step tiny run (a random 2-layer Llama with SmolLM2's
   tokenizer, rlcore.testing's TINY_RUN) on CUDA with ``memory_snapshot_steps = [2]``: checks that
   ``RUN_DIR/memory/step_000002.pickle`` is the only snapshot, that it loads with ``pickle.load``
   and holds ``segments`` (and the allocator events of ``device_traces``), and prints its size.
2. Unless ``--no-oom``: the same run in this process with ``memory_snapshot_on_oom = true`` and an
   actor update that asks the CUDA allocator for 1 PiB: checks that the run fails with rlcore's
   out-of-memory error, that ``memory/oom_step_000001.pickle`` loads, and that the error names it.

Open the files in https://pytorch.org/memory_viz to see them.
"""

from __future__ import annotations

import argparse
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path


def fail(message: str) -> None:
    sys.exit(f"memory_snapshot_gpu.py: FAILED: {message}")


def load_snapshot(path: Path) -> dict:
    if not path.is_file():
        fail(f"no snapshot at {path}")
    with path.open("rb") as f:
        snapshot = pickle.load(f)
    if not isinstance(snapshot, dict) or "segments" not in snapshot:
        fail(
            f"{path} holds no 'segments' (keys: {sorted(snapshot) if isinstance(snapshot, dict) else type(snapshot)})"
        )
    events = sum(len(trace) for trace in snapshot.get("device_traces", []))
    print(
        f"  {path}: {path.stat().st_size / 2**20:.2f} MiB, {len(snapshot['segments'])} segments, "
        f"{events} allocator events"
    )
    return snapshot


def step_snapshot(out: Path, model: Path) -> None:
    from rlcore.testing.runs import write_run_manifest

    directory = out / "steps"
    directory.mkdir(parents=True, exist_ok=True)
    manifest = write_run_manifest(
        directory, model, run={"device": "cuda"}, trainer={"steps": 2, "memory_snapshot_steps": [2]}
    )
    run_dir = directory / "run"
    print(f"1. rlcore run {manifest} (memory_snapshot_steps = [2])", flush=True)
    proc = subprocess.run([sys.executable, "-m", "rlcore", "run", str(manifest), "--run-dir", str(run_dir)])
    if proc.returncode != 0:
        fail(f"rlcore run exited {proc.returncode}")
    names = sorted(p.name for p in (run_dir / "memory").iterdir()) if (run_dir / "memory").is_dir() else []
    if names != ["step_000002.pickle"]:
        fail(f"{run_dir / 'memory'} holds {names}, not just step_000002.pickle")
    snapshot = load_snapshot(run_dir / "memory" / "step_000002.pickle")
    if not snapshot["segments"]:
        fail("the step snapshot has no segments: nothing was allocated on the GPU?")
    if "memory_viz" not in (run_dir / "run.log").read_text():
        fail("run.log does not name the snapshot with the memory_viz address")


def oom_snapshot(out: Path, model: Path) -> None:
    import torch

    from rlcore.cli import main
    from rlcore.testing.runs import write_run_manifest
    from rlcore.trainer import rl
    from rlcore.trainer.phases import OutOfMemory

    def update_actor(*args, **kwargs):
        torch.empty(2**50, dtype=torch.uint8, device="cuda")  # 1 PiB: the allocator refuses
        raise AssertionError("a 1 PiB allocation succeeded")

    directory = out / "oom"
    directory.mkdir(parents=True, exist_ok=True)
    manifest = write_run_manifest(
        directory, model, run={"device": "cuda"}, trainer={"steps": 2, "memory_snapshot_on_oom": True}
    )
    run_dir = directory / "run"
    print(f"2. rlcore run {manifest} (memory_snapshot_on_oom = true; the update asks for 1 PiB)", flush=True)
    rl.RLTrainer.update_actor = update_actor
    try:
        main(["--debug", "run", str(manifest), "--run-dir", str(run_dir)])
    except OutOfMemory as exc:
        message = str(exc)
    else:
        fail("the run did not fail with rlcore's out-of-memory error")
    target = run_dir / "memory" / "oom_step_000001.pickle"
    print(f"  the error: {message}")
    if str(target) not in message:
        fail(f"the out-of-memory error does not name {target}")
    load_snapshot(target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=None, help="where the model and runs go (default: a temporary directory)"
    )
    parser.add_argument("--no-oom", action="store_true", help="skip the out-of-memory check")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit(
            "memory_snapshot_gpu.py: needs a CUDA device, and torch.cuda.is_available() is False here "
            f"(torch {torch.__version__}); run it on a GPU machine"
        )
    from rlcore.testing.models import make_tiny_model

    out = (args.out or Path(tempfile.mkdtemp(prefix="memory-snapshot-"))).resolve()
    model = make_tiny_model(out / "tiny-model")
    print(f"on {torch.cuda.get_device_name()}, torch {torch.__version__}; outputs in {out}")
    step_snapshot(out, model)
    if not args.no_oom:
        oom_snapshot(out, model)
    print("OK: the snapshots were written, load and hold 'segments'")


if __name__ == "__main__":
    main()
