"""Renders the sbatch script of a run: SLURM options, a Ray cluster across the nodes, the driver.

The script is the whole plan of the job, readable on its own (``rlcore run --dry-run`` prints it):
the batch step runs on the allocation's first node, starts a Ray head there and a Ray worker on
every other node (each through ``srun --overlap``, bound to the node's address on the chosen
interface), waits until every node has joined, then runs the driver on the first node.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Sequence

from rlcore_launcher_slurm.options import SlurmOptions, time_limit_seconds

JOB_PREFIX = "rlcore-"
COMMENT = "rlcore"
LOG_PATTERN = "slurm-%j.log"

# Prints the IPv4 address of the interface named in argv[1], or of the default route.
_NODE_IP = r"""
import socket, sys
iface = sys.argv[1] if len(sys.argv) > 1 else ""
if iface:
    import fcntl, struct
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", iface[:15].encode()))
    except OSError as exc:
        sys.exit(f"no IPv4 address on interface {iface!r} of {socket.gethostname()}: {exc}")
    print(socket.inet_ntoa(packed[20:24]))
else:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.254.254.254", 1))
        print(s.getsockname()[0])
    except OSError:
        print(socket.gethostbyname(socket.gethostname()))
""".strip()

# Prints how many Ray nodes are alive at argv[1] (0 while the head is not reachable yet).
_RAY_NODES = r"""
import socket, sys
host, _, port = sys.argv[1].rpartition(":")
try:
    socket.create_connection((host, int(port)), timeout=2).close()
except OSError:
    print(0); sys.exit(0)
import ray
ray.init(address=sys.argv[1], _node_ip_address=host, logging_level="ERROR", log_to_driver=False)
print(sum(1 for n in ray.nodes() if n.get("Alive")))
""".strip()

# Runs the `ray` command line from the Python that runs rlcore.
_RAY_CLI = "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()"


def job_name(options: SlurmOptions, manifest: dict) -> str:
    """``rlcore-<job_name or run name>``: the prefix is how ``rlcore jobs`` recognises rlcore's jobs."""
    base = options.job_name or str(manifest.get("run", {}).get("name") or "run")
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in base)
    return JOB_PREFIX + safe


def log_file(run_dir: str | Path, job_id: str | None = None) -> Path:
    """The job's combined stdout/stderr; ``job_id`` None gives sbatch's ``%j`` pattern."""
    return Path(run_dir) / "launch" / LOG_PATTERN.replace("%j", job_id or "%j")


def _directive(option: str, value: object | None = None) -> str:
    if value is None:
        return f"#SBATCH {option}"
    text = str(value)
    if any(c.isspace() for c in text) or '"' in text:
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"#SBATCH {option}={text}"


def _q(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(str(a)) for a in argv)


def render(
    options: SlurmOptions,
    *,
    manifest: dict,
    run_dir: str | Path,
    driver: Sequence[str],
    python: str,
) -> str:
    """The sbatch script that runs ``driver`` (an argv) in an allocation described by ``options``."""
    run_dir = Path(run_dir)
    ray = options.uses_ray()
    lines = [
        "#!/bin/bash",
        f"# rlcore run {manifest.get('run', {}).get('name', '')!s}: rendered by rlcore-launcher-slurm.",
        "# Submit with: sbatch THIS_FILE (rlcore run does, and follows the job).",
        _directive("--job-name", job_name(options, manifest)),
        _directive("--comment", COMMENT),
        _directive("--nodes", options.nodes),
        _directive("--ntasks-per-node", 1),
    ]
    if options.cpus_per_task is not None:
        lines.append(_directive("--cpus-per-task", options.cpus_per_task))
    if options.gpus_per_node:
        lines.append(_directive("--gpus-per-node", options.gpus_per_node))
    if options.mem is not None:
        lines.append(_directive("--mem", options.mem))
    if options.partition:
        lines.append(_directive("--partition", options.partition))
    if options.account:
        lines.append(_directive("--account", options.account))
    if options.time:
        lines.append(_directive("--time", options.time))
    limit = time_limit_seconds(options.time)
    if options.stop_signal_s and (limit is None or options.stop_signal_s < limit):
        # Ahead of the time limit the batch shell gets SIGUSR1 and hands it to the driver, which
        # finishes its step and checkpoints (rlcore/trainer/stopping.py); `--resume` continues.
        lines.append(_directive("--signal", f"B:USR1@{options.stop_signal_s}"))
    elif options.stop_signal_s:
        lines.append(f"# No --signal: stop_signal_s = {options.stop_signal_s} is not below the time limit ({limit} s).")
    lines += [
        _directive("--output", log_file(run_dir)),
        _directive("--chdir", run_dir),
    ]
    lines += [f"#SBATCH {extra}" for extra in options.sbatch_extra]

    lines += ["", "set -euo pipefail", ""]
    if options.env:
        lines.append("# Environment from [launcher] env.")
        lines += [f"export {name}={shlex.quote(value)}" for name, value in options.env.items()]
        lines.append("")
    lines += [
        f"RLCORE_PYTHON={shlex.quote(python)}",
        f"RLCORE_RUN_DIR={shlex.quote(str(run_dir))}",
    ]
    if options.container:
        binds = [str(run_dir), *options.container_binds]
        wrap = ["apptainer", "exec"]
        if options.gpus_per_node:
            wrap.append("--nv")
        for bind in binds:
            wrap += ["--bind", bind]
        wrap.append(options.container)
        lines += [
            "# Every command of the job runs inside the container image.",
            "command -v apptainer >/dev/null || { echo '[rlcore] error: apptainer is not installed on' \"$(hostname)\"; exit 1; }",
            f"RLCORE_WRAP=({_q(wrap)})",
        ]
    else:
        lines.append("RLCORE_WRAP=()")
    lines += [
        'in_job() { "${RLCORE_WRAP[@]}" "$@"; }',
        'on_node() { local node=$1; shift; srun --nodes=1 --ntasks=1 --overlap -w "$node" "${RLCORE_WRAP[@]}" "$@"; }',
        "",
        'echo "[rlcore] job $SLURM_JOB_ID on $SLURM_JOB_NODELIST"',
        'mapfile -t RLCORE_NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        "",
    ]
    lines += _ray_section(options, ray)
    lines += [
        "# The driver runs here, in the batch step on the first node.",
        f"RLCORE_DRIVER=({_q(driver)})",
        'echo "[rlcore] driver on ${RLCORE_NODES[0]}: ${RLCORE_DRIVER[*]}"',
        "# In the background, so that a signal to this shell (SLURM's USR1 ahead of the time limit, its",
        "# TERM at the limit or on preemption) reaches the driver, which then checkpoints and stops.",
        "set +e",
        '"${RLCORE_WRAP[@]}" "${RLCORE_DRIVER[@]}" &',
        "RLCORE_DRIVER_PID=$!",
        'forward() { echo "[rlcore] $1 received: the driver finishes its step, writes a checkpoint and stops"; kill -s "$1" "$RLCORE_DRIVER_PID" 2>/dev/null; }',
        "trap 'forward USR1' USR1",
        "trap 'forward TERM' TERM",
        'while true; do',
        '  wait "$RLCORE_DRIVER_PID"; status=$?',
        '  if ! kill -0 "$RLCORE_DRIVER_PID" 2>/dev/null; then',
        '    wait "$RLCORE_DRIVER_PID" 2>/dev/null; reaped=$?; [ "$reaped" -ne 127 ] && status=$reaped',
        "    break",
        "  fi",
        "done",
        "set -e",
        'echo "[rlcore] driver exited with status $status"',
        'exit "$status"',
        "",
    ]
    return "\n".join(lines)


def _ray_section(options: SlurmOptions, ray: bool | None) -> list[str]:
    if ray is False:
        return ["# Ray: off ([launcher] ray = \"off\"); one node needs no cluster.", ""]
    iface = options.network_interface or ""
    start = ["--block", "--disable-usage-stats"]
    if options.cpus_per_task is not None:
        start.append(f"--num-cpus={options.cpus_per_task}")
    if options.gpus_per_node:
        start.append(f"--num-gpus={options.gpus_per_node}")
    port = str(options.ray_port) if options.ray_port else "$((20000 + SLURM_JOB_ID % 20000))"
    lines = [
        "# Ray: a head on the first node, a worker on every other node, each bound to the node's",
        "# address" + (f" on interface {iface}" if iface else " (first address toward the default route)") + ".",
    ]
    if ray is None:
        lines += [
            "# One node: Ray starts only when it is installed; without it the driver runs alone.",
            "if in_job \"$RLCORE_PYTHON\" -c 'import ray' 2>/dev/null; then RLCORE_USE_RAY=1; else RLCORE_USE_RAY=0;",
            '    echo "[rlcore] Ray is not installed: running the driver without a Ray cluster (one node needs none)"; fi',
        ]
    else:
        lines.append("RLCORE_USE_RAY=1")
    lines += [
        f"RLCORE_NODE_IP_PY={shlex.quote(_NODE_IP)}",
        f"RLCORE_RAY_NODES_PY={shlex.quote(_RAY_NODES)}",
        f"RLCORE_RAY=(\"$RLCORE_PYTHON\" -c {shlex.quote(_RAY_CLI)})",
        f"RLCORE_RAY_START=({_q(start)})",
        f"RLCORE_IFACE={shlex.quote(iface)}",
        f"RLCORE_RAY_TIMEOUT={int(options.ray_join_timeout)}",
        "RLCORE_RAY_PIDS=()",
        "",
        "node_ip() { on_node \"$1\" \"$RLCORE_PYTHON\" -c \"$RLCORE_NODE_IP_PY\" ${RLCORE_IFACE:+\"$RLCORE_IFACE\"}; }",
        "",
        "stop_ray() {",
        '    if [ ${#RLCORE_RAY_PIDS[@]} -gt 0 ]; then',
        '        kill "${RLCORE_RAY_PIDS[@]}" 2>/dev/null || true',
        '        wait "${RLCORE_RAY_PIDS[@]}" 2>/dev/null || true',
        "    fi",
        "}",
        "",
        "wait_for_ray() {  # until $1 nodes are alive, or fail clearly",
        "    local deadline=$((SECONDS + RLCORE_RAY_TIMEOUT)) alive pid",
        "    while true; do",
        '        for pid in "${RLCORE_RAY_PIDS[@]}"; do',
        '            if ! kill -0 "$pid" 2>/dev/null; then',
        '                echo "[rlcore] error: a Ray process exited while the cluster was starting (see its output above)"',
        "                exit 1",
        "            fi",
        "        done",
        '        alive=$(in_job "$RLCORE_PYTHON" -c "$RLCORE_RAY_NODES_PY" "$RAY_ADDRESS" 2>/dev/null | tail -n 1 || true)',
        '        [[ "$alive" =~ ^[0-9]+$ ]] || alive=0',
        '        if [ "$alive" -ge "$1" ]; then echo "[rlcore] Ray: $alive of $1 node(s) joined"; return 0; fi',
        '        if [ "$SECONDS" -ge "$deadline" ]; then',
        '            echo "[rlcore] error: only $alive of $1 node(s) joined the Ray cluster at $RAY_ADDRESS within ${RLCORE_RAY_TIMEOUT}s"',
        '            echo "[rlcore] check network_interface (the address each node binds) and the Ray output above"',
        "            exit 1",
        "        fi",
        "        sleep 2",
        "    done",
        "}",
        "",
        'if [ "$RLCORE_USE_RAY" = 1 ]; then',
        "    trap stop_ray EXIT",
        '    RLCORE_HEAD=${RLCORE_NODES[0]}',
        '    RLCORE_HEAD_IP=$(node_ip "$RLCORE_HEAD")',
        f"    RLCORE_RAY_PORT={port}",
        '    export RAY_ADDRESS="$RLCORE_HEAD_IP:$RLCORE_RAY_PORT"',
        '    echo "[rlcore] Ray head on $RLCORE_HEAD at $RAY_ADDRESS"',
        '    on_node "$RLCORE_HEAD" "${RLCORE_RAY[@]}" start --head --node-ip-address="$RLCORE_HEAD_IP" \\',
        '        --port="$RLCORE_RAY_PORT" --include-dashboard=false "${RLCORE_RAY_START[@]}" &',
        '    RLCORE_RAY_PIDS+=($!)',
        "    wait_for_ray 1",
        '    for node in "${RLCORE_NODES[@]:1}"; do',
        '        ip=$(node_ip "$node")',
        '        echo "[rlcore] Ray worker on $node at $ip"',
        '        on_node "$node" "${RLCORE_RAY[@]}" start --address="$RAY_ADDRESS" --node-ip-address="$ip" \\',
        '            "${RLCORE_RAY_START[@]}" &',
        '        RLCORE_RAY_PIDS+=($!)',
        "    done",
        '    if [ "${#RLCORE_NODES[@]}" -gt 1 ]; then wait_for_ray "${#RLCORE_NODES[@]}"; fi',
        "fi",
        "",
    ]
    return lines
