"""Helpers for end-to-end training tests: tiny manifests around a tiny random model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tomli_w

BASE: dict[str, Any] = {
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
    "reward": {"function": "gsm8k", "method": "flexible"},
    "algorithm": {"advantage": "grpo", "policy_loss": "ppo_clip"},
    "trainer": {"steps": 2, "lr": 1e-3, "loggers": ["jsonl"], "eval_before_train": False},
}


def deep_update(base: dict, top: dict) -> dict:
    out = json.loads(json.dumps(base))
    for key, value in top.items():
        if value is None:
            out.pop(key, None)  # None removes a key of the base manifest
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_update(out[key], value)
        else:
            out[key] = value
    return out


def write_manifest(directory: Path, model_dir: Path, **tables: dict) -> Path:
    doc = deep_update(BASE, tables)
    if doc["model"]["path"] == "MODEL":
        doc["model"]["path"] = str(model_dir)
    path = Path(directory) / "manifest.toml"
    path.write_text(tomli_w.dumps(doc), encoding="utf-8")
    return path


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def train_rows(run_dir: Path) -> list[dict]:
    return [m for m in read_metrics(run_dir) if "critic/score/mean" in m]
