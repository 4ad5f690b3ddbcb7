#!/usr/bin/env bash
# CI: install rlcore the way a user does, from wheels, never from this checkout.
#
# 1. Every distribution (the core and each plugins/<name>) is built as a wheel.
# 2. One `pip install` of the core and every plugin wheel, with their extras, is resolved in full
#    (--dry-run --ignore-installed: as into an empty environment): the pins (the SkyPilot launcher's
#    among them) must let pip resolve it without giving up; the versions it picks are printed.
# 3. A fresh venv gets the core and a chosen set of plugins from those wheels alone (third-party
#    dependencies from pip's configured index; the heavy ones shared from .ci/deps, see
#    .ci/shared_deps.sh), and outside the checkout runs `rlcore plugins`, `rlcore validate` of the
#    quickstart and one small training step of it.
#
#   .ci/wheels.sh                              # the quickstart's plugins
#   .ci/wheels.sh rollout_hf reward_rule ...   # another set (the quickstart needs these three and algo_grpo)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
python=${PYTHON:-python3}
pip=(--quiet --disable-pip-version-check --root-user-action=ignore)
unset PYTHONPATH
if [ $# -gt 0 ]; then chosen=("$@"); else chosen=(rollout_hf algo_grpo reward_rule); fi
work=$(mktemp -d "${TMPDIR:-/tmp}/rlcore-wheels.XXXXXX")
trap 'rm -rf "$work"' EXIT
started=$SECONDS
step() { echo "== [$((SECONDS - started)) s] $*"; }

deps=$(.ci/shared_deps.sh)
env=$work/venv
"$python" -m venv --without-pip "$env"
purelib=$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$deps" > "$purelib/rlcore_ci_shared_deps.pth"
venv_pip=("$env/bin/python" -m pip)

step "building every distribution as a wheel"
projects=(.)
for d in plugins/*/pyproject.toml; do projects+=("$(dirname "$d")"); done
# --no-deps: only these distributions; --no-build-isolation: their one build requirement,
# setuptools, comes from .ci/deps instead of a fresh download per wheel.
"${venv_pip[@]}" wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation --wheel-dir "$work/wheels" "${projects[@]}"
rm -rf build plugins/*/build  # setuptools' scratch directories, left in the checkout
wheel_of() {  # the wheel file of the distribution in directory $1
  local name
  name=$(sed -n 's/^name = "\(.*\)"/\1/p' "$1/pyproject.toml" | head -1 | tr - _)
  ls "$work/wheels/$name"-*.whl
}
core=$(wheel_of .)
ls "$work/wheels"

step "resolving one pip install of the core and every plugin (as into an empty environment)"
everything=("$core[train,test]")
for d in plugins/*/pyproject.toml; do
  dir=$(dirname "$d")
  wheel=$(wheel_of "$dir")
  if grep -q '^test = ' "$d"; then everything+=("$wheel[test]"); else everything+=("$wheel"); fi
done
if ! "${venv_pip[@]}" install "${pip[@]}" --dry-run --ignore-installed --report "$work/resolved.json" "${everything[@]}"; then
  echo "!! pip cannot resolve one install of rlcore and every plugin; pin what must be pinned" >&2
  exit 1
fi
"$env/bin/python" - "$work/resolved.json" <<'EOF'
import json, sys
picked = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
          for i in json.load(open(sys.argv[1]))["install"]}
shown = ["torch", "transformers", "huggingface-hub", "skypilot", "click", "ray", "vllm", "sglang"]
print("   " + ", ".join(f"{n} {picked[n]}" for n in shown if n in picked) + f" ({len(picked)} distributions)")
EOF

step "installing the core and ${chosen[*]} from the wheels into a fresh venv"
install=("$core[train]")
for name in "${chosen[@]}"; do
  [ -f "plugins/$name/pyproject.toml" ] || { echo "no plugin plugins/$name" >&2; exit 2; }
  install+=("$(wheel_of "plugins/$name")")
done
"${venv_pip[@]}" install "${pip[@]}" "${install[@]}"

# Outside the checkout, so nothing of it is importable; the installed rlcore must be the wheel's.
cd "$work"
cp "$repo/examples/quickstart.toml" "$work/quickstart.toml"
where=$("$env/bin/python" -c 'import rlcore, rlcore_rollout_hf; print(rlcore.__file__, rlcore_rollout_hf.__file__)')
case "$where" in
  *"$repo"*) echo "!! rlcore is imported from the checkout: $where" >&2; exit 1 ;;
esac
step "rlcore plugins"
"$env/bin/rlcore" plugins
"$env/bin/rlcore" plugins --json | "$env/bin/python" -c '
import json, sys
plugins = json.load(sys.stdin)["plugins"]
broken = [p["name"] for p in plugins if p["status"] != "ok"]
if broken:
    sys.exit(f"!! broken or disabled plugins: {broken}")
'
step "rlcore validate quickstart.toml"
"$env/bin/rlcore" validate quickstart.toml
step "one small training step of the quickstart"
# The quickstart's model and recipe, one step of 4 prompts x 2 samples, no checkpoint kept.
"$env/bin/rlcore" run quickstart.toml --run-dir "$work/run" --set trainer.steps=1 \
  --set data.prompts_per_step=4 --set rollout.samples_per_prompt=2 --set data.max_response_tokens=8 \
  --set data.val_max_prompts=4 --set trainer.eval_before_train=false --set 'trainer.loggers=["console", "jsonl"]' \
  --set loggers.console.plot=false
test -s "$work/run/metrics.jsonl" || { echo "!! the step wrote no metrics" >&2; exit 1; }
step "wheels: every distribution built, one install resolved, the core and ${chosen[*]} trained a step"
