#!/usr/bin/env bash
# CI: every plugin alone. For each plugins/<name>/, a fresh virtual environment holds the bare core
# (pip install -e .) and that one plugin (with its [test] extra when it declares one), and runs the
# plugin's own tests there. In .venv every plugin is installed, so a plugin that needs another
# plugin distribution without declaring it passes; here it fails (or its test skips, saying so).
#
# Heavy third-party packages (torch, transformers, ...) come from .ci/deps (.ci/shared_deps.sh), never
# rlcore nor a plugin, and each venv sees them through a .pth file; pip installs into the venv
# whatever else the core and the plugin declare.
#
#   .ci/plugins_alone.sh                  # every plugin
#   .ci/plugins_alone.sh agent algo_ppo   # some of them
#
# Tests that need a GPU, vLLM, SGLang or a SLURM cluster skip as they do in the main suite
# (RLCORE_REQUIRE_SLURM=1, set by .ci/run, makes the SLURM ones fail instead).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
python=${PYTHON:-python3}
pip=(--quiet --disable-pip-version-check --root-user-action=ignore)
unset PYTHONPATH
venvs=$(mktemp -d "${TMPDIR:-/tmp}/rlcore-plugins-alone.XXXXXX")
trap 'rm -rf "$venvs"' EXIT

started=$SECONDS
deps=$(.ci/shared_deps.sh)

if [ $# -gt 0 ]; then names=("$@"); else names=(); for d in plugins/*/pyproject.toml; do names+=("$(basename "$(dirname "$d")")"); done; fi
summary=()
failed=0
for name in "${names[@]}"; do
  dir=plugins/$name
  [ -f "$dir/pyproject.toml" ] || { echo "no plugin $dir" >&2; exit 2; }
  t0=$SECONDS
  echo "== $name"
  env=$venvs/$name
  "$python" -m venv --without-pip "$env"
  purelib=$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$deps" > "$purelib/rlcore_ci_shared_deps.pth"
  project=$dir
  grep -q '^test = ' "$dir/pyproject.toml" && project="$dir[test]"
  installed=1
  "$env/bin/python" -m pip install "${pip[@]}" --no-build-isolation -e . -e "$project" || installed=0
  # The venv must hold this plugin and no other: a declared dependency could pull one in.
  own=$(sed -n 's/^name = "\(.*\)"/\1/p' "$dir/pyproject.toml" | head -1)
  others=$("$env/bin/python" - "$own" <<'EOF'
import sys
from importlib.metadata import distributions
names = {d.metadata["Name"].lower().replace("_", "-") for d in distributions()}
print(" ".join(sorted(n for n in names if n.startswith("rlcore-") and n != sys.argv[1])))
EOF
)
  t1=$SECONDS
  if [ "$installed" = 0 ]; then
    echo "!! $name: pip could not install the core and the plugin"
    rc=3
  elif [ -n "$others" ]; then
    echo "!! $name: other plugin distributions are installed with it: $others"
    rc=1
  elif [ ! -d "$dir/tests" ]; then
    rc=5
  else
    # -P: the working directory is not put on sys.path (only what is installed is importable).
    set +e
    "$env/bin/python" -P -m pytest -q -rfEs --durations=5 "$dir/tests"
    rc=$?
    set -e
  fi
  case $rc in
    0) verdict=passed ;;
    5) verdict="no tests collected" ;;  # not a failure: a plugin may ship without tests
    *) verdict="FAILED (exit $rc)"; failed=1 ;;
  esac
  summary+=("$(printf '%-16s %-22s install %3d s, tests %3d s' "$name" "$verdict" $((t1 - t0)) $((SECONDS - t1)))")
  rm -rf "$env"
done
echo "== every plugin alone, $((SECONDS - started)) s in all"
printf '%s\n' "${summary[@]}"
exit $failed
