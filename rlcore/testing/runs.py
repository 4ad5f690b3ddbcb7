"""Tiny training runs for end-to-end tests: a manifest around a tiny model, the CLI in a
subprocess, and the metrics a run leaves behind.

::

    from rlcore.testing.runs import run_cli, train_rows, write_run_manifest

    def test_two_steps(tiny_model, tmp_path):  # tiny_model: a fixture of rlcore's pytest plugin
        manifest = write_run_manifest(tmp_path, tiny_model, trainer={"steps": 2})
        proc = run_cli("run", str(manifest), "--run-dir", str(tmp_path / "run"), timeout=600)
        assert proc.returncode == 0, proc.stderr
        assert len(train_rows(tmp_path / "run")) == 2

:data:`TINY_RUN` names components of first-party plugins (the ``hf`` engine of rlcore-rollout-hf,
the ``gsm8k`` reward of rlcore-reward-rule, the ``grpo`` estimator of rlcore-algo-grpo): a test
that runs it needs those installed (``require_plugins(*TINY_RUN_PLUGINS)`` skips it otherwise),
or overrides those tables. Nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import tomli_w

# A CPU run of a few seconds: 4 prompts a step, 2 samples each, 6 response tokens, 2 steps.
# "MODEL" stands for the model directory that write_run_manifest fills in.
TINY_RUN: dict[str, Any] = {
    "run": {"name": "t", "seed": 3, "threads": 1},
    "model": {"path": "MODEL"},
    "data": {
        "train": "synthetic:addition?size=64&seed=0&split=train",
        "val": "synthetic:addition?size=8&seed=0&split=test",
        "prompts_per_step": 4,
        "max_prompt_tokens": 128,
        "max_response_tokens": 6,
    },
    "rollout": {"engine": "hf", "samples_per_prompt": 2},
    "reward": {"function": "gsm8k", "method": "numeric"},
    "algorithm": {"advantage": "grpo", "policy_loss": "ppo_clip"},
    "trainer": {"steps": 2, "lr": 1e-3, "loggers": ["jsonl"], "eval_before_train": False},
}

# The plugin packages whose components TINY_RUN names (see rlcore.testing.require_plugins).
TINY_RUN_PLUGINS = ("rlcore_rollout_hf", "rlcore_reward_rule", "rlcore_algo_grpo")


def deep_update(base: dict, top: dict) -> dict:
    """A copy of ``base`` with ``top`` merged in, table by table; a value of None removes the key."""
    out = json.loads(json.dumps(base))
    for key, value in top.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_update(out[key], value)
        else:
            out[key] = value
    return out


def write_run_manifest(directory: Path, model_dir: Path, **tables: dict) -> Path:
    """Write :data:`TINY_RUN`, updated with ``tables`` (see :func:`deep_update`) and its model path
    set to ``model_dir``, to ``directory/manifest.toml``; returns that path."""
    doc = deep_update(TINY_RUN, tables)
    if doc["model"]["path"] == "MODEL":
        doc["model"]["path"] = str(model_dir)
    path = Path(directory) / "manifest.toml"
    path.write_text(tomli_w.dumps(doc), encoding="utf-8")
    return path


def read_metrics(run_dir: Path) -> list[dict]:
    """Every row of a run's ``metrics.jsonl`` (written by the ``jsonl`` logger), in order."""
    return [
        json.loads(line)
        for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]


def train_rows(run_dir: Path) -> list[dict]:
    """The training steps' rows of ``metrics.jsonl`` (evaluation rows left out)."""
    return [m for m in read_metrics(run_dir) if "critic/score/mean" in m]


def run_cli(
    *args: str, env: dict | None = None, cwd: str | Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    """Run ``python -m rlcore *args`` in a subprocess (text output captured), with ``env`` added
    to this process's environment; returns the CompletedProcess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "rlcore", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=timeout,
    )


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    """Poll ``predicate()`` until it returns something true (returned) or ``timeout`` seconds pass
    (an AssertionError naming ``what``)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def process_gone(pid: int) -> bool:
    """The process ``pid`` no longer exists (reaped); for :func:`wait_for`."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it exists, owned by someone else
        return False
    return False


# ----------------------------------------------------------------------------- in process
# What plugin tests reached into rlcore's internals for: load a manifest as `rlcore validate` does,
# run a command in this process, score trajectories as the trainer does. These stay stable across
# releases of one plugin-API version (docs/architecture.md); the internals behind them may not.


def discover_registry():
    """The registry of every installed plugin, as ``rlcore`` commands see it."""
    from rlcore.registry import Registry

    return Registry.discover()


def registry_with(plugin, name: str, distribution: str):
    """rlcore's builtins and ``plugin`` (a module or object with hook implementations) alone, as
    if ``distribution`` had registered it under ``name``: a plugin's tests see its own
    components whatever else is installed."""
    from rlcore.registry import Registry

    registry = Registry.discover(external=False, disabled=())
    registry.register(plugin, name=name, distribution=distribution)
    return registry


def read_data_spec(spec, registry=None, *, role: str = "train") -> tuple[list[dict], str]:
    """The rows a ``[data] train``/``val`` spec gives (a file, or a data source such as
    ``NAME:ARGS?key=value``) and the name a run reports it by."""
    from rlcore.data.prompts import read_source

    return read_source(spec, role=role, registry=registry)


def prompts_of_spec(tokenizer, spec, registry=None) -> list:
    """The rows of a data spec as prompts an agent loop receives, made by the trainer's own
    :func:`rlcore.data.prompts.load_prompts` (chat template with the generation prompt, data
    source, ground truth, extra info), with no length limit."""
    import sys

    from rlcore.data.prompts import load_prompts

    return list(load_prompts(spec, registry=registry, tokenizer=tokenizer, max_prompt_tokens=sys.maxsize))


def check_data_spec(spec, registry=None) -> str | None:
    """What ``rlcore validate`` says about a data spec, or None when it is fine (no torch)."""
    from rlcore.data.prompts import check_data_spec as check

    return check(spec, registry=registry)


def load_run_manifest(
    path: str | Path,
    overrides: list[str] | tuple[str, ...] = (),
    registry=None,
    environ: dict[str, str] | None = None,
):
    """``path`` validated as ``rlcore validate`` does (``overrides``: ``--set TABLE.KEY=VALUE``
    items; ``registry``: default every installed plugin; ``environ``: the ``RLCORE_*`` variables
    to read, default this process's); the resolved manifest: ``.core`` (the core tables),
    ``.component(role)``, ``.raw``. Raises :class:`rlcore.errors.ManifestError` with located problems."""
    from rlcore.manifest.loader import load_manifest

    kwargs = {} if environ is None else {"environ": environ}
    return load_manifest(Path(path), list(overrides), registry=registry, **kwargs)


def run_in_process(*args) -> int:
    """Run ``rlcore ARGS`` in this process (``run_in_process("run", "m.toml", "--run-dir", d)``, or
    one list of them); its exit code. Expected failures return 2 with the message on stderr, as
    the command does."""
    from rlcore.cli import main

    argv = list(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else list(args)
    return main([str(a) for a in argv])


def score_trajectories(
    reward,
    trajectories: list,
    tokenizer,
    *,
    timeout_s: float = 10.0,
    workers: int = 2,
    batch_timeout_s: float = 600.0,
) -> tuple[list[float], dict[str, float]]:
    """Score ``trajectories`` with a built reward function as the trainer does (per-item rewards
    in time-limited worker processes, a batched reward in this process): the scores, in order, and
    the reward metrics (``reward/*``)."""
    from rlcore.trainer.scoring import Scorer

    scorer = Scorer(reward, timeout_s, workers, batch_timeout_s)
    try:
        return scorer.score(trajectories, tokenizer)
    finally:
        scorer.close()
