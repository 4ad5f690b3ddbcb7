"""Renders the sbatch script of a run: SLURM options, the rendezvous, one training rank per task.

The script is the whole plan of the job, readable on its own (``rlcore run --dry-run`` prints it).
The batch step runs on the allocation's first node: it finds that node's address and a free port
(MASTER_ADDR, MASTER_PORT), then starts every rank with one ``srun`` (``ranks_per_node`` tasks on
each node). Each task sets torchrun's variables from SLURM's (RANK from SLURM_PROCID, LOCAL_RANK
from SLURM_LOCALID, WORLD_SIZE from SLURM_NTASKS) and runs the driver, which is then one rank of
the run (rlcore/trainer/distributed.py). SLURM tracks every rank: ``--kill-on-bad-exit`` ends the
step when one fails, and the rank's wrapper names it.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from rlcore_launcher_slurm.options import SlurmOptions, time_limit_seconds

JOB_PREFIX = "rlcore-"
COMMENT = "rlcore"
LOG_PATTERN = "slurm-%j.log"

# Prints the rendezvous "ADDRESS PORT": the IPv4 address of the interface named in argv[1] (or of
# the default route when it is empty), and argv[2] as the port, or a port free here when it is 0.
_RENDEZVOUS = r"""
import socket, sys
iface, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if iface:
    import fcntl, struct
    try:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", iface[:15].encode()))
    except OSError as exc:
        sys.exit(f"[rlcore] error: no IPv4 address on interface {iface!r} ([launcher] network_interface) of {socket.gethostname()}: {exc}")
    address = socket.inet_ntoa(packed[20:24])
else:
    try:
        s.connect(("10.254.254.254", 1))
        address = s.getsockname()[0]
    except OSError:
        address = socket.gethostbyname(socket.gethostname())
if not port:
    with socket.socket() as free:
        free.bind(("", 0))
        port = free.getsockname()[1]
print(address, port)
""".strip()

# What each task runs: torchrun's variables from SLURM's, then the driver as a child, so that a
# rank that fails is named in the job's log. USR1 is ignored here and in what the driver starts
# (reward workers, engine servers): srun hands a signal to every process of the step, and only the
# trainer, which installs its own handler, must act on it (rlcore/trainer/stopping.py). TERM is
# trapped so the wrapper outlives it; the driver gets SLURM's TERM itself. A rank that stopped for
# USR1 or TERM (128 + 10 or 15) exits 0 for srun, whose --kill-on-bad-exit would otherwise end the
# ranks still finishing the same stop, and leaves its status in RLCORE_STOPPED_FILE for the job.
_RANK = r"""
trap "" USR1
trap : TERM
export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS NODE_RANK=$SLURM_NODEID GROUP_RANK=$SLURM_NODEID
"$@"
status=$?
case "$status" in
    0) ;;
    138|143) echo "$status" > "$RLCORE_STOPPED_FILE"; status=0 ;;
    *) echo "[rlcore] error: rank $RANK (local rank $LOCAL_RANK on node $SLURMD_NODENAME) exited with status $status$( [ "$status" -gt 128 ] && echo " (signal $((status - 128)))")" >&2 ;;
esac
exit "$status"
""".strip()


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
    """The sbatch script that runs ``driver`` (an argv) as every rank of an allocation described by ``options``."""
    run_dir = Path(run_dir)
    ranks = options.ranks()
    lines = [
        "#!/bin/bash",
        f"# rlcore run {manifest.get('run', {}).get('name', '')!s}: rendered by rlcore-launcher-slurm.",
        "# Submit with: sbatch THIS_FILE (rlcore run does, and follows the job).",
        _directive("--job-name", job_name(options, manifest)),
        _directive("--comment", COMMENT),
        _directive("--nodes", options.nodes),
        _directive("--ntasks-per-node", ranks),
        # A node failure ends the job (NODE_FAIL) rather than requeueing it, which would rerun this
        # script from the start, without --resume: `rlcore run --resume` continues instead.
        _directive("--no-requeue"),
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
        # Ahead of the time limit the batch shell gets SIGUSR1 and hands it to the ranks, which
        # finish their step and checkpoint (rlcore/trainer/stopping.py); `--resume` continues.
        lines.append(_directive("--signal", f"B:USR1@{options.stop_signal_s}"))
    elif options.stop_signal_s:
        lines.append(
            f"# No --signal: stop_signal_s = {options.stop_signal_s} is not below the time limit ({limit} s)."
        )
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
        "",
        'echo "[rlcore] job $SLURM_JOB_ID on $SLURM_JOB_NODELIST"',
        'mapfile -t RLCORE_NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        "",
    ]
    lines += _rendezvous_section(options)
    srun = ["srun", "--kill-on-bad-exit=1", f"--nodes={options.nodes}", f"--ntasks-per-node={ranks}"]
    if options.cpus_per_task is not None:
        srun.append(f"--cpus-per-task={options.cpus_per_task}")
    threads = options.cpus_per_task or (1 if ranks > 1 else None)
    lines += [
        "# Each task is one rank: torchrun's variables from SLURM's, then the driver.",
        f"RLCORE_RANK_SH={shlex.quote(_RANK)}",
        f"RLCORE_DRIVER=({_q(driver)})",
        f"export LOCAL_WORLD_SIZE={ranks}",
        'export RLCORE_STOPPED_FILE="$RLCORE_RUN_DIR/launch/job-$SLURM_JOB_ID.stopped"',
        'rm -f "$RLCORE_STOPPED_FILE"',
    ]
    if threads:
        lines += [
            f"# CPU threads per rank, unless [launcher] env sets them: {'cpus_per_task' if options.cpus_per_task else 'one, as torchrun does with several ranks on a node'}.",
            f"export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-{threads}}}",
        ]
    lines += [
        f"RLCORE_SRUN=({_q(srun)})",
        f'echo "[rlcore] {options.nodes * ranks} rank(s), {ranks} on each of ${{#RLCORE_NODES[@]}} node(s): ${{RLCORE_DRIVER[*]}}"',
        "# In the background, so that this shell can hand SLURM's USR1 (ahead of the time limit) to",
        "# srun, which passes it to every rank; the ranks agree at the end of the step, all write the",
        "# checkpoint and stop. TERM is not handed on: SLURM sends it to every process of the job itself",
        "# (time limit, preemption, scancel), and srun takes a TERM of its own as an order to kill the ranks.",
        "set +e",
        '"${RLCORE_SRUN[@]}" "${RLCORE_WRAP[@]}" bash -c "$RLCORE_RANK_SH" rlcore-rank "${RLCORE_DRIVER[@]}" &',
        "RLCORE_SRUN_PID=$!",
        'trap \'echo "[rlcore] USR1 received: every rank finishes its step, writes a checkpoint and stops"; kill -s USR1 "$RLCORE_SRUN_PID" 2>/dev/null\' USR1',
        "trap 'echo \"[rlcore] TERM received: every rank got it too; they finish the step and checkpoint if SLURM gives them the time (KillWait)\"' TERM",
        "while true; do",
        '  wait "$RLCORE_SRUN_PID"; status=$?',
        '  if ! kill -0 "$RLCORE_SRUN_PID" 2>/dev/null; then',
        '    wait "$RLCORE_SRUN_PID" 2>/dev/null; reaped=$?; [ "$reaped" -ne 127 ] && status=$reaped',
        "    break",
        "  fi",
        "done",
        "set -e",
        "# Ranks that stopped for a signal (with a checkpoint) exited 0 for srun; the job exits with their status.",
        'if [ "$status" -eq 0 ] && [ -f "$RLCORE_STOPPED_FILE" ]; then status=$(cat "$RLCORE_STOPPED_FILE"); fi',
        'rm -f "$RLCORE_STOPPED_FILE"',
        'echo "[rlcore] ranks exited with status $status"',
        'if [ "$status" -ne 0 ] && [ -f "$RLCORE_RUN_DIR/checkpoints/latest" ]; then',
        '  echo "[rlcore] the latest checkpoint is $(cat "$RLCORE_RUN_DIR/checkpoints/latest"): rlcore run --resume continues from the last intact one"',
        "fi",
        'exit "$status"',
        "",
    ]
    return "\n".join(lines)


def _rendezvous_section(options: SlurmOptions) -> list[str]:
    iface = options.network_interface or ""
    where = f"on interface {iface}" if iface else "toward the default route"
    port = "the one set by [launcher] master_port" if options.master_port else "a free one"
    lines = [
        f"# The rendezvous: rank 0 listens on the first node (this one), at its address {where}, on {port}.",
        f"RLCORE_RENDEZVOUS_PY={shlex.quote(_RENDEZVOUS)}",
        f'RLCORE_RENDEZVOUS=$(in_job "$RLCORE_PYTHON" -c "$RLCORE_RENDEZVOUS_PY" {shlex.quote(iface)} {options.master_port or 0})',
        'read -r MASTER_ADDR MASTER_PORT <<< "$RLCORE_RENDEZVOUS"',
        "export MASTER_ADDR MASTER_PORT",
    ]
    if iface:
        lines += [
            f"# gloo and NCCL connect the ranks over {iface} too.",
            f"export GLOO_SOCKET_IFNAME=${{GLOO_SOCKET_IFNAME:-{iface}}} NCCL_SOCKET_IFNAME=${{NCCL_SOCKET_IFNAME:-{iface}}}",
        ]
    lines += ['echo "[rlcore] rendezvous at $MASTER_ADDR:$MASTER_PORT on ${RLCORE_NODES[0]}"', ""]
    return lines
