"""Renders the SkyPilot task of a run: resources, the setup that installs rlcore and the run's
plugins, and the run script that starts the training ranks on every node.

The task is the whole plan, readable on its own (``rlcore run --dry-run`` prints its YAML; ``sky
launch`` takes it as it is). SkyPilot runs ``run`` once on each node with SKYPILOT_NODE_RANK,
SKYPILOT_NODE_IPS (one address a line, the head node first), SKYPILOT_NUM_NODES and
SKYPILOT_NUM_GPUS_PER_NODE set. The script writes the driver manifest on the node, takes the head
node's address as MASTER_ADDR, and starts ``ranks_per_node`` ranks with torchrun's variables
(RANK = NODE_RANK * ranks + LOCAL_RANK, WORLD_SIZE = nodes * ranks), each running the driver, which
is then one rank of the run (rlcore/trainer/distributed.py), as the SLURM launcher's srun tasks do.
A rank that fails is named, and the node's other ranks are stopped at once rather than left
waiting in a collective.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import tomli_w
import yaml

from rlcore.errors import UsageError
from rlcore.interfaces import LaunchRequest
from rlcore.launching import driver_command
from rlcore_launcher_skypilot.options import SkyPilotOptions

PREFIX = "rlcore-"
REMOTE_WORKDIR = "~/sky_workdir"  # where SkyPilot syncs workdir on every node
REMOTE_RUNS = "~/rlcore-runs"
MANIFEST_EOF = "RLCORE_MANIFEST_EOF"
# Stands for the node's home directory in the node's manifest; the run script puts $HOME in its
# place (rlcore expands "~" in [model] and [data] paths, but not in every path it reads).
HOME = "@RLCORE_HOME@"
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://")
# Placeholders in the driver's argv for what only the node knows.
_RUN_DIR, _MANIFEST, _PYTHON = "@RLCORE_RUN_DIR@", "@RLCORE_MANIFEST@", "@RLCORE_PYTHON@"

# One rank: the driver as a child, so that a rank that fails is named in the job's log.
RANK_SH = r"""
"$@"
status=$?
if [ "$status" -ne 0 ]; then
    echo "[rlcore] error: rank $RANK (local rank $LOCAL_RANK on node $NODE_RANK, $(hostname)) exited with status $status$( [ "$status" -gt 128 ] && echo " (signal $((status - 128)))")" >&2
fi
exit "$status"
""".strip()


def run_name(request: LaunchRequest) -> str:
    return str(request.resolved_manifest.get("run", {}).get("name") or "run")


def cluster_name(options: SkyPilotOptions, request: LaunchRequest) -> str:
    """``cluster_name``, else ``rlcore-<run name>`` made a valid SkyPilot name (lower case, at most 63)."""
    if options.cluster_name:
        return options.cluster_name
    safe = re.sub(r"[^a-z0-9-]+", "-", run_name(request).lower()).strip("-") or "run"
    return (PREFIX + safe)[:63].rstrip("-")


def remote_run_dir(options: SkyPilotOptions, request: LaunchRequest) -> str:
    return options.remote_run_dir or f"{REMOTE_RUNS}/{run_name(request)}"


def _shell_path(path: str) -> str:
    """A node path as a double-quoted shell word: a leading ``~`` becomes ``$HOME``."""
    if path == "~" or path.startswith("~/"):
        return '"$HOME' + _dq(path[1:]) + '"'
    return '"' + _dq(path) + '"'


def _dq(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")


# ----------------------------------------------------------------------------- the node's manifest


def path_map(options: SkyPilotOptions) -> list[tuple[str, str]]:
    """(local directory, node directory) pairs: workdir, and file_mounts whose source is a local path."""
    pairs = []
    if options.workdir:
        pairs.append((str(Path(options.workdir).expanduser().resolve()), REMOTE_WORKDIR))
    for node_path, source in options.file_mounts.items():
        if isinstance(source, str) and not _URL.match(source):
            pairs.append((str(Path(source).expanduser().resolve()), node_path.rstrip("/") or "/"))
    return sorted(pairs, key=lambda pair: -len(pair[0]))  # the most specific first


def _rewrite(value: str, pairs: list[tuple[str, str]]) -> tuple[str, bool]:
    """``value`` with the first local directory of ``pairs`` it names replaced by the node's, and
    whether one was."""
    for local, node in pairs:
        # The local directory as a whole path component: at the start or after "NAME:" (python:...),
        # followed by "/", ":" (FILE.py:function) or the end.
        pattern = re.compile(r"(^|(?<=:))" + re.escape(local) + r"(?=/|:|$)")
        # A function, not a string, as the replacement: the node's path is taken literally (no \-escapes).
        rewritten, count = pattern.subn(lambda _m, node=node: node, value)
        if count:
            return rewritten, True
    return value, False


def _home(value: str) -> str:
    """``~`` at the start of a path (or after ``NAME:``) as :data:`HOME`."""
    return re.sub(r"(^|(?<=:))~(?=/|:|$)", HOME, value)


def _local_only(value: str) -> str | None:
    """The local path in ``value`` (a path, or ``NAME:PATH[:function]``) when it exists here only."""
    for candidate in (
        value,
        value.partition(":")[2],
        value.partition(":")[2].rpartition(":")[0],
        value.rpartition(":")[0],
    ):
        if candidate.startswith("/") and Path(candidate).exists():
            return candidate
    return None


def node_manifest(options: SkyPilotOptions, request: LaunchRequest) -> dict[str, Any]:
    """The driver manifest as the nodes read it: paths under workdir or a local file mount point at
    the nodes' copies, ``[run] output_dir`` is the node run directory's parent. A path that exists
    only on this machine is an error naming its key."""
    pairs = path_map(options)
    problems: list[str] = []

    def walk(node: Any, key: str) -> Any:
        if isinstance(node, dict):
            return {k: walk(v, f"{key}.{k}" if key else str(k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, f"{key}[{i}]") for i, v in enumerate(node)]
        if isinstance(node, str):
            rewritten, mapped = _rewrite(node, pairs)
            rewritten = _home(rewritten) if mapped else rewritten
            if not mapped and (local := _local_only(node)):
                problems.append(
                    f"{key} = {node!r}: {local} is on this machine only; put it under [launcher] workdir, mount it "
                    f"with [launcher] file_mounts, or name something the nodes can reach (a hub id, a bucket mount)"
                )
            return rewritten
        return node

    doc = dict(request.resolved_manifest)
    doc["run"] = {k: v for k, v in doc.get("run", {}).items() if k != "output_dir"}
    doc = walk(doc, "")
    doc["run"]["output_dir"] = _home(str(PurePosixPath(remote_run_dir(options, request)).parent))
    if problems:
        raise UsageError("\n  ".join(["the nodes cannot read what the manifest names:", *problems]))
    return doc


# ----------------------------------------------------------------------------- setup


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def run_distributions(plugins: dict[str, dict]) -> dict[str, str]:
    """distribution -> version of the plugins the run uses (the resolved manifest's ``[plugins]``),
    without rlcore itself and this launcher (the nodes run the ``local`` one)."""
    out: dict[str, str] = {}
    for role, entry in sorted(plugins.items()):
        dist = entry.get("distribution") or ""
        if (
            not dist
            or _normal(dist) in ("rlcore", "rlcore-launcher-skypilot")
            or role.startswith("launcher.")
        ):
            continue
        out[dist] = str(entry.get("version") or "")
    return out


def workdir_projects(workdir: str) -> dict[str, str]:
    """normalized distribution name -> its directory relative to ``workdir`` (``.`` for the root),
    from the pyproject.toml files at most two levels down."""
    root = Path(workdir).expanduser().resolve()
    found: dict[str, str] = {}
    for pyproject in [
        root / "pyproject.toml",
        *sorted(root.glob("*/pyproject.toml")),
        *sorted(root.glob("*/*/pyproject.toml")),
    ]:
        if not pyproject.is_file():
            continue
        try:
            name = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {}).get("name")
        except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError):
            continue
        if name:
            found.setdefault(_normal(name), str(pyproject.parent.relative_to(root)))
    return found


def setup_script(options: SkyPilotOptions, distributions: dict[str, str], rlcore_version: str) -> str:
    lines = ["set -euo pipefail", f"RLCORE_PYTHON={shlex.quote(options.python)}"]
    if options.workdir:
        lines.append(f"cd {_shell_path(REMOTE_WORKDIR)}")
    install: list[str] = []
    if options.install == "pip":
        lines.append(
            "# rlcore and the plugins the run uses, at the versions `rlcore run` found on the launching machine."
        )
        install = [f"rlcore[train]=={rlcore_version}"] + [
            f"{dist}=={version}" if version else dist for dist, version in distributions.items()
        ]
    elif options.install == "workdir":
        projects = workdir_projects(options.workdir)
        missing = [d for d in ["rlcore", *distributions] if _normal(d) not in projects]
        if missing:
            raise UsageError(
                f'install = "workdir": no pyproject.toml in workdir {options.workdir} names {", ".join(missing)} '
                f"(looked two levels down; found: {', '.join(sorted(projects)) or 'none'})"
            )
        lines.append("# rlcore and the plugins the run uses, from their sources in the synced workdir.")
        for dist in ["rlcore", *distributions]:
            where = projects[_normal(dist)]
            where = "." if where == "." else f"./{where}"
            install += ["-e", f"{where}[train]" if dist == "rlcore" else where]
    install += options.pip_extra
    if install:
        lines.append('"$RLCORE_PYTHON" -m pip install ' + " ".join(shlex.quote(x) for x in install))
    lines += list(options.setup_extra)
    lines.append('"$RLCORE_PYTHON" -m rlcore --version')
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- run


def _argv(argv: list[str]) -> str:
    words = {_RUN_DIR: '"$RLCORE_RUN_DIR"', _MANIFEST: '"$RLCORE_MANIFEST"', _PYTHON: '"$RLCORE_PYTHON"'}
    return " ".join(words.get(a, shlex.quote(a)) for a in argv)


def run_script(options: SkyPilotOptions, request: LaunchRequest, manifest: dict[str, Any], name: str) -> str:
    toml = tomli_w.dumps(manifest)
    if any(line.strip() == MANIFEST_EOF for line in toml.splitlines()):
        raise UsageError(
            f"the manifest holds a line {MANIFEST_EOF!r}, which ends the run script's copy of it"
        )
    driver = driver_command(dataclasses.replace(request, run_dir=_RUN_DIR), _MANIFEST, python=_PYTHON)
    ranks = str(options.ranks_per_node) if options.ranks_per_node else "${SKYPILOT_NUM_GPUS_PER_NODE:-0}"
    lines = [
        "set -uo pipefail",
        f"RLCORE_PYTHON={shlex.quote(options.python)}",
        f"RLCORE_RUN_DIR={_shell_path(remote_run_dir(options, request))}",
        f"RLCORE_MANIFEST={_shell_path(f'~/.rlcore/launch/{name}/manifest.toml')}",
        "# The driver manifest (written by rlcore run: overrides applied, paths as the nodes see them,",
        f"# [launcher] local), on each node, with the node's home directory in place of {HOME}.",
        'mkdir -p "$RLCORE_RUN_DIR" "$(dirname "$RLCORE_MANIFEST")"',
        f"cat > \"$RLCORE_MANIFEST\" <<'{MANIFEST_EOF}'",
        toml.rstrip("\n"),
        MANIFEST_EOF,
        f'RLCORE_TEXT=$(cat "$RLCORE_MANIFEST") && printf "%s\\n" "${{RLCORE_TEXT//{HOME}/"$HOME"}}" > "$RLCORE_MANIFEST"',
        "# The rendezvous: rank 0 listens on the head node (the first of SKYPILOT_NODE_IPS).",
        'MASTER_ADDR=$(printf "%s\\n" "$SKYPILOT_NODE_IPS" | head -n 1)',
        f"MASTER_PORT={options.master_port}",
        f"RLCORE_RANKS={ranks}",
        '[ "$RLCORE_RANKS" -ge 1 ] || RLCORE_RANKS=1',
        "NODE_RANK=$SKYPILOT_NODE_RANK GROUP_RANK=$SKYPILOT_NODE_RANK LOCAL_WORLD_SIZE=$RLCORE_RANKS",
        "WORLD_SIZE=$((SKYPILOT_NUM_NODES * RLCORE_RANKS))",
        "export MASTER_ADDR MASTER_PORT NODE_RANK GROUP_RANK LOCAL_WORLD_SIZE WORLD_SIZE",
        "# CPU threads per rank, unless [launcher] env sets them: one with several ranks on a node, as torchrun does.",
        '[ "$RLCORE_RANKS" -gt 1 ] && export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}',
        f"RLCORE_RANK_SH={shlex.quote(RANK_SH)}",
        f"RLCORE_DRIVER=({_argv(driver)})",
        "# A managed job that SkyPilot recovers after a preemption runs this script again with the same",
        "# SKYPILOT_TASK_ID: it continues from the checkpoints its first start wrote (a new job does not).",
        'RLCORE_TASK_FILE="$RLCORE_RUN_DIR/launch/skypilot-task-id"',
        'if [ "${RLCORE_DRIVER[-1]}" != --resume ] && [ -n "${SKYPILOT_TASK_ID:-}" ] && [ -f "$RLCORE_RUN_DIR/checkpoints/latest" ] \\',
        '    && [ "$(cat "$RLCORE_TASK_FILE" 2>/dev/null)" = "$SKYPILOT_TASK_ID" ]; then',
        '  echo "[rlcore] task $SKYPILOT_TASK_ID was recovered: resuming from $RLCORE_RUN_DIR/checkpoints"',
        "  RLCORE_DRIVER+=(--resume)",
        "fi",
        'if [ "$NODE_RANK" = 0 ] && [ -n "${SKYPILOT_TASK_ID:-}" ]; then',
        '  mkdir -p "$RLCORE_RUN_DIR/launch" && printf "%s\\n" "$SKYPILOT_TASK_ID" > "$RLCORE_TASK_FILE"',
        "fi",
        'echo "[rlcore] node $NODE_RANK of $SKYPILOT_NUM_NODES: $RLCORE_RANKS rank(s) of $WORLD_SIZE; rendezvous at $MASTER_ADDR:$MASTER_PORT"',
        "# One rank per process group, so that a failure stops all of a rank's processes.",
        "RLCORE_PIDS=()",
        "for ((i = 0; i < RLCORE_RANKS; i++)); do",
        '  RANK=$((NODE_RANK * RLCORE_RANKS + i)) LOCAL_RANK=$i setsid bash -c "$RLCORE_RANK_SH" rlcore-rank "${RLCORE_DRIVER[@]}" &',
        "  RLCORE_PIDS+=($!)",
        "done",
        "# The first rank to fail ends the node's others (they would wait in a collective until a timeout).",
        "status=0",
        'for _ in "${RLCORE_PIDS[@]}"; do',
        "  wait -n; code=$?",
        '  if [ "$code" -ne 0 ]; then',
        "    status=$code",
        '    echo "[rlcore] a rank failed: stopping the other ranks of node $NODE_RANK" >&2',
        '    for pid in "${RLCORE_PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done',
        "    for _ in $(seq 50); do",  # up to 5 s for the trainers to stop on TERM, then KILL
        '      alive=0; for pid in "${RLCORE_PIDS[@]}"; do kill -0 -- "-$pid" 2>/dev/null && alive=1; done',
        '      [ "$alive" -eq 0 ] && break; sleep 0.1',
        "    done",
        '    for pid in "${RLCORE_PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; done',
        "    break",
        "  fi",
        "done",
        "wait",
        'echo "[rlcore] node $NODE_RANK: ranks exited with status $status"',
        'if [ "$status" -ne 0 ] && [ -f "$RLCORE_RUN_DIR/checkpoints/latest" ]; then',
        '  echo "[rlcore] the latest checkpoint is $(cat "$RLCORE_RUN_DIR/checkpoints/latest"): rlcore run --resume continues from the last intact one"',
        "fi",
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- the task


def render(
    options: SkyPilotOptions, request: LaunchRequest, plugins: dict[str, dict], rlcore_version: str
) -> dict[str, Any]:
    """The SkyPilot task (the dict ``sky.Task.from_yaml_config`` takes) that runs ``request``."""
    name = cluster_name(options, request)
    resources: dict[str, Any] = {}
    for key in (
        "cloud",
        "region",
        "zone",
        "instance_type",
        "accelerators",
        "cpus",
        "memory",
        "disk_size",
        "image_id",
    ):
        value = getattr(options, key)
        if value is not None:
            resources[key] = value
    if options.use_spot:
        resources["use_spot"] = True
    task: dict[str, Any] = {"name": name, "num_nodes": options.nodes}
    if resources:
        task["resources"] = resources
    if options.workdir:
        task["workdir"] = str(Path(options.workdir).expanduser().resolve())
    if options.file_mounts:
        task["file_mounts"] = {
            node: (
                str(Path(src).expanduser().resolve()) if isinstance(src, str) and not _URL.match(src) else src
            )
            for node, src in options.file_mounts.items()
        }
    if options.env:
        task["envs"] = dict(options.env)
    task["setup"] = setup_script(options, run_distributions(plugins), rlcore_version)
    task["run"] = run_script(options, request, node_manifest(options, request), name)
    return task


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(task: dict[str, Any], header: str = "") -> str:
    body = yaml.dump(
        task, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=4096
    )
    return header + body
