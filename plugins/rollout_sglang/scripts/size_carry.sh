#!/usr/bin/env bash
# Size the wheels that SGLang needs and the GPU machine lacks, before trying to carry them there.
# The GPU machine has no package index; everything must travel in calls of at most 61 MiB (see
# /work/shared/gpu/README.md). This downloads the whole Python 3.12 stack that `pip` resolves for
# sglang==VERSION (torch and the nvidia libraries at the exact versions that torch pins) from PyPI
# into a temporary folder, subtracts what the machine's image already has (gpu_machine_has.txt,
# by name and version), and prints the total, the wheel count, the number of 61 MiB transfers and the
# largest wheels, with and without torch's nvidia libraries. The folder is deleted at the end unless
# --keep is given. It needs the network and several GB of free space.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

usage() {
  cat <<USAGE
usage: size_carry.sh [--sglang VERSION] [--has FILE] [--assume FILE] [--glibc MINOR] [--chunk-mib N] [--top N]
                     [--keep DIR] [--from DIR] [--index-url URL] [-h|--help]

  --sglang VERSION   sglang release to size (default 0.5.23)
  --has FILE         what the GPU machine is known to have, one 'name==version' or 'name' a line
                     (default: gpu_machine_has.txt beside this script); may be given again
  --assume FILE      what it may also have, unverified (same format): adds rows that subtract it too,
                     e.g. torch211_nvidia.txt beside this script; may be given again
  --glibc MINOR      newest manylinux_2_MINOR tag accepted (default 35, as vllm.sh's list)
  --chunk-mib N      size of one transfer in MiB (default 61)
  --top N            how many of the largest wheels to list (default 15)
  --keep DIR         download into DIR and keep it (default: a temporary folder, deleted)
  --from DIR         do not download: size the wheels already in DIR (a folder from --keep)
  --index-url URL    package index (default https://pypi.org/simple; local pip configuration
                     and find-links are ignored, so that the figures are PyPI's)
USAGE
}

sglang=0.5.23; has=(); assume=(); glibc=35; chunk=61; top=15; keep=""; from=""
index=https://pypi.org/simple
need() { [[ $# -ge 2 && -n $2 ]] || { echo "size_carry.sh: $1 needs a value (see --help)" >&2; exit 2; }; }
int() { [[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "size_carry.sh: $1 expects a positive integer, got '$2'" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --sglang) need "$@"; sglang=$2; shift 2 ;;
    --has) need "$@"; has+=("$2"); shift 2 ;;
    --assume) need "$@"; assume+=("$2"); shift 2 ;;
    --glibc) need "$@"; int "$1" "$2"; glibc=$2; shift 2 ;;
    --chunk-mib) need "$@"; int "$1" "$2"; chunk=$2; shift 2 ;;
    --top) need "$@"; int "$1" "$2"; top=$2; shift 2 ;;
    --keep) need "$@"; keep=$2; shift 2 ;;
    --from) need "$@"; from=$2; shift 2 ;;
    --index-url) need "$@"; index=$2; shift 2 ;;
    *) echo "size_carry.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ ${#has[@]} -gt 0 ]] || has=("$here/gpu_machine_has.txt")
for f in "${has[@]}" "${assume[@]}"; do
  [[ -f $f ]] || { echo "size_carry.sh: file '$f' does not exist (--has / --assume)" >&2; exit 2; }
done
[[ -z $from || -d $from ]] || { echo "size_carry.sh: --from folder '$from' does not exist" >&2; exit 2; }

# pip must run on Python 3.12 itself: --python-version sets the wheel tags, but environment markers in
# the dependencies' metadata are evaluated against the interpreter that runs pip.
is312() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; }
py=${PYTHON:-}
if [[ -z $py ]]; then
  py=python3
  for c in python3.12 python3; do is312 "$c" && { py=$c; break; }; done
fi
is312 "$py" || echo "size_carry.sh: warning: $py is not Python 3.12 (set PYTHON=...); markers are evaluated for its version" >&2

if [[ -n $from ]]; then
  dir=$from
else
  if [[ -n $keep ]]; then dir=$keep; mkdir -p "$dir"
  else dir=$(mktemp -d "${TMPDIR:-/tmp}/sglang-carry.XXXXXX"); trap 'rm -rf "$dir"' EXIT; fi
  # Every manylinux tag up to the machine's glibc: pip does not widen a manylinux_2_X --platform to older tags.
  plat=(--platform manylinux1_x86_64 --platform manylinux2010_x86_64 --platform manylinux2014_x86_64)
  for ((m = 5; m <= glibc; m++)); do plat+=(--platform "manylinux_2_${m}_x86_64"); done
  echo "downloading sglang==$sglang and its dependencies into $dir (several GB) ..." >&2
  env -u PIP_FIND_LINKS -u PIP_CONSTRAINT -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL PIP_CONFIG_FILE=/dev/null \
    "$py" -m pip download -q --no-cache-dir --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" --index-url "$index" -d "$dir" "sglang==$sglang"
fi

has_arg=$(IFS=,; echo "${has[*]}"); assume_arg=$(IFS=,; echo "${assume[*]:-}")
"$py" - "$dir" "$has_arg" "$assume_arg" "$chunk" "$top" "$sglang" <<'PY'
"""Sum the downloaded wheels, subtract the machine's packages, and print the carry's size."""
import math, re, sys, zipfile
from pathlib import Path
try:
    from packaging.requirements import Requirement
except ImportError:  # a bare interpreter: pip's own copy
    from pip._vendor.packaging.requirements import Requirement

folder, has_files, assume_files = Path(sys.argv[1]), sys.argv[2].split(","), [f for f in sys.argv[3].split(",") if f]
chunk_mib, top, sglang = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
chunk = chunk_mib * 2**20
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
base = lambda v: v.split("+", 1)[0]

wheels = {}
for f in sorted(folder.glob("*.whl")):
    name, version = f.name.split("-")[:2]
    wheels[norm(name)] = (version, f.stat().st_size, f)
if not wheels:
    sys.exit(f"size_carry.sh: no wheels in {folder}")

def read_list(files):
    """'name==version' lines give a version; a bare name means present at an unrecorded version."""
    known, unversioned = {}, set()
    for path in files:
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*(\S+))?", line)
            if not m:
                sys.exit(f"size_carry.sh: {path}:{n}: expected 'name==version' or 'name', got {line!r}")
            if m[2]:
                known[norm(m[1])] = base(m[2])
            else:
                unversioned.add(norm(m[1]))
    return known, unversioned

def requires(name, extras):
    """The requirements of a downloaded wheel that apply here (Linux x86_64, this Python) for these extras."""
    with zipfile.ZipFile(wheels[name][2]) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    for line in re.findall(r"^Requires-Dist: (.+)$", meta, re.M):
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (extras or {""})):
            yield req

# torch's own CUDA libraries: what torch requires among nvidia-* and cuda-toolkit (through its extras).
if "torch" not in wheels:
    sys.exit("size_carry.sh: no torch wheel among the downloads")
torch_version = wheels["torch"][0]
torch_nvidia, todo = set(), [("torch", set())]
while todo:
    name, extras = todo.pop()
    for req in requires(name, extras):
        dep = norm(req.name)
        if not (dep.startswith("nvidia-") or dep == "cuda-toolkit"):
            continue
        got = wheels.get(dep, (None,))[0]
        if got is None or not req.specifier.contains(got, prereleases=True):
            print(f"warning: {name} requires {req}, downloaded {dep} {got}", file=sys.stderr)
        if got is not None and (dep not in torch_nvidia or req.extras):
            torch_nvidia.add(dep)
            todo.append((dep, set(req.extras)))

# Every requirement among the downloads, with the extras that are asked of each wheel (to a fixed point).
asked = {n: set() for n in wheels}
while True:
    wanted = {n: set(e) for n, e in asked.items()}
    reqs = [req for n in wheels for req in requires(n, asked[n])]
    for req in reqs:
        if norm(req.name) in wanted:
            wanted[norm(req.name)] |= set(req.extras)
    if wanted == asked:
        break
    asked = wanted

def serves(name, version):
    """Whether the machine's copy (version None: unrecorded, assumed fine) meets every requirement on it."""
    return version is None or all(req.specifier.contains(version, prereleases=True)
                                  for req in reqs if norm(req.name) == name)

has, has_any = read_list(has_files)
extra, extra_any = read_list(assume_files)
def subtract(known, unversioned, lower):
    """Names left to carry: those the machine lacks at the downloaded version (lower: also those whose
    machine version, when recorded, meets every requirement on them)."""
    return {n for n, (v, _, _) in wheels.items() if known.get(n) != base(v)
            and not (lower and (n in known or n in unversioned) and serves(n, known.get(n)))}
carry = subtract(has, has_any, False)
lower = subtract(has, has_any, True)

def row(label, names):
    size = sum(wheels[n][1] for n in names)
    return f"| {label} | {size / 1e9:.2f} GB ({size / 2**20:,.0f} MiB) | {len(names)} | {math.ceil(size / chunk)} |"

print(f"## sglang=={sglang}: the wheels to carry to the GPU machine (Python 3.12, x86_64)\n")
print(f"| set | size | wheels | {chunk_mib} MiB transfers |\n|---|---|---|---|")
print(row(f"everything pip resolves for sglang=={sglang}", set(wheels)))
print(row("**carry**: minus what the machine has at the same version", carry))
print(row(f"carry without torch {torch_version}'s nvidia libraries", carry - torch_nvidia))
print(row("lower bound: also minus what the machine has at another version that meets the requirements, "
          "or at an unrecorded one", lower))
print(row(f"lower bound without torch {torch_version}'s nvidia libraries", lower - torch_nvidia))
if assume_files:
    assumed = carry & subtract({**has, **extra}, has_any | extra_any, False)
    print(row(f"carry, if the machine also has {' and '.join(Path(f).name for f in assume_files)} (unverified)",
              assumed))

same = sorted(set(wheels) - carry)
print(f"\nSubtracted (same name and version): {', '.join(same) or 'none'}.")
other = sorted(n for n in carry if n in has or n in has_any)
if other:
    print("On the machine at another or unrecorded version, so carried (a separate target folder shadows "
          "the machine's copy; * : the machine's version, if recorded, meets every requirement, so the lower bound "
          "drops it): " + ", ".join(f"{n} {wheels[n][0]} (machine: {has.get(n, '?')}){'*' if n not in lower else ''}"
                                   for n in other) + ".")
if assume_files:
    print("Also subtracted under --assume: " + (", ".join(sorted(carry - assumed)) or "none") + ".")
tn = sorted(torch_nvidia & carry, key=lambda n: -wheels[n][1])
print(f"\ntorch {torch_version}'s nvidia libraries, at the versions it requires: {len(tn)} wheels, "
      f"{sum(wheels[n][1] for n in tn) / 1e9:.2f} GB: "
      + ", ".join(f"{n} {wheels[n][0]} ({wheels[n][1] / 1e6:.0f} MB)" for n in tn) + ".")
rest = sorted((n for n in carry - torch_nvidia if n.startswith(("nvidia-", "cuda-"))), key=lambda n: -wheels[n][1])
if rest:
    print("Other nvidia/CUDA wheels, required by SGLang's own dependencies: "
          + ", ".join(f"{n} {wheels[n][0]} ({wheels[n][1] / 1e6:.0f} MB)" for n in rest) + ".")

print(f"\nThe {top} largest wheels to carry:\n\n| wheel | version | size |\n|---|---|---|")
for n in sorted(carry, key=lambda n: -wheels[n][1])[:top]:
    print(f"| {n} | {wheels[n][0]} | {wheels[n][1] / 1e6:.0f} MB |")

# What would stop the install whatever the size: a wheel for CUDA 12, or one needing a newer glibc.
cuda12 = sorted(n for n in carry if re.search(r"(^|-)cu12($|-)", n))
if cuda12:
    print(f"\nNamed for CUDA 12 (the machine's torch and driver are CUDA 13): {', '.join(cuda12)}.")
legacy = {"manylinux1": 5, "manylinux2010": 12, "manylinux2014": 17}
def glibc(filename):
    """The oldest glibc a wheel accepts: the lowest of its manylinux tags (0 for a pure wheel)."""
    found = [int(m) for m in re.findall(r"manylinux_2_(\d+)", filename)]
    found += [v for k, v in legacy.items() if k + "_" in filename]
    return min(found, default=0)
needs = {n: glibc(wheels[n][2].name) for n in carry}
newest = max(needs.values())
print(f"Newest glibc a wheel to carry needs: 2.{newest} ("
      + ", ".join(sorted(n for n, g in needs.items() if g == newest)) + ").")
PY
