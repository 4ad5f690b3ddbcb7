#!/usr/bin/env bash
# Install and start a small real SLURM cluster on this host, for rlcore's SLURM tests.
#
# Idempotent; needs root (and apt, when SLURM is not installed yet). Two slurmd daemons run on
# this one host as two nodes, rlcore1 and rlcore2 (distinct ports and spool directories), so that
# multi-node jobs really span two nodes; RLCORE_SLURM_NODES=1 starts one node only. All traffic
# stays on 127.0.0.1. There is no accounting database: sacct is unavailable and finished jobs stay
# visible to `scontrol show job` for MinJobAge seconds instead.
#
#   bash .ci/slurm/setup.sh          # start (or restart with a new config) the cluster
#   bash .ci/slurm/setup.sh stop     # stop the daemons started here
set -euo pipefail

NODES="${RLCORE_SLURM_NODES:-2}"
CONF_DIR=/etc/slurm
STATE=/var/spool/slurmctld
LOGS=/var/log/slurm
START=$(date +%s)

log() { echo "[slurm-setup] $*"; }

stop_daemons() {
    # Stop only SLURM/munge daemons, by the pid files they wrote.
    for pidfile in /run/slurmctld.pid /run/slurmd-*.pid /run/munge/munged.pid; do
        [ -f "$pidfile" ] || continue
        pid=$(cat "$pidfile" 2>/dev/null || true)
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        fi
        rm -f "$pidfile"
    done
}

if [ "${1:-}" = "stop" ]; then
    stop_daemons
    log "stopped"
    exit 0
fi

if [ "$(id -u)" != 0 ]; then
    echo "[slurm-setup] must run as root" >&2
    exit 1
fi
case "$NODES" in 1|2) ;; *) echo "[slurm-setup] RLCORE_SLURM_NODES must be 1 or 2" >&2; exit 1;; esac

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
        || ! command -v sbatch >/dev/null; then
    log "installing slurm-wlm and munge with apt"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
fi

# ---------------------------------------------------------------- munge
if [ ! -s /etc/munge/munge.key ]; then
    log "creating a munge key"
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
chown -R munge:munge /etc/munge && chmod 700 /etc/munge && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/lib/munge /var/log/munge
chown munge:munge /run/munge /var/lib/munge /var/log/munge
chmod 755 /run/munge

# ---------------------------------------------------------------- slurm.conf
# This host's real CPU count and memory, as slurmd measures them.
read -r CPUS MEM < <(slurmd -C | awk '
    /^NodeName/ { for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } }
    END { print v["CPUs"], v["RealMemory"] }')
# Leave a little room under the measured memory so the node is never drained for "low memory".
MEM=$(( MEM * 95 / 100 ))
HOST=$(hostname)

mkdir -p "$CONF_DIR" "$STATE" "$LOGS" /var/spool/slurmd
NODE_LINES=""
NODE_NAMES=""
for i in $(seq 1 "$NODES"); do
    NODE_LINES+="NodeName=rlcore$i NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((6817 + i)) CPUs=$CPUS RealMemory=$MEM State=UNKNOWN"$'\n'
    NODE_NAMES+="${NODE_NAMES:+,}rlcore$i"
    mkdir -p "/var/spool/slurmd/rlcore$i"
done

NEW_CONF=$(cat <<CONF
# Written by rlcore's .ci/slurm/setup.sh: a test cluster on one host.
ClusterName=rlcore
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=6817
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
# Reject at submission a job that can never run (as most clusters do), instead of queueing it.
EnforcePartLimits=ALL
# Finished jobs stay visible to scontrol for an hour (there is no sacct here).
MinJobAge=3600
KillWait=2
OverTimeLimit=0
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
MessageTimeout=10
SlurmctldDebug=info
SlurmdDebug=info
$NODE_LINES
PartitionName=debug Nodes=$NODE_NAMES Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
)

CHANGED=1
if [ -f "$CONF_DIR/slurm.conf" ] && [ "$(cat "$CONF_DIR/slurm.conf")" = "$NEW_CONF" ]; then
    CHANGED=0
fi
printf '%s\n' "$NEW_CONF" > "$CONF_DIR/slurm.conf"
# No cgroups are used (proctrack/linuxproc, task/none); an empty cgroup.conf keeps slurmd quiet.
[ -f "$CONF_DIR/cgroup.conf" ] || echo "CgroupPlugin=autodetect" > "$CONF_DIR/cgroup.conf"

running() { [ -f "$1" ] && kill -0 "$(cat "$1" 2>/dev/null)" 2>/dev/null; }

if [ "$CHANGED" = 1 ]; then
    log "configuration changed: restarting the daemons"
    stop_daemons
    # A fresh configuration starts from a clean controller state (-c below).
    CLEAN=-c
else
    CLEAN=""
fi

if ! running /run/munge/munged.pid; then
    log "starting munged"
    runuser -u munge -- /usr/sbin/munged --force
fi
for _ in $(seq 50); do munge -n </dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
munge -n </dev/null | unmunge >/dev/null || { echo "[slurm-setup] munge does not work" >&2; exit 1; }

if ! running /run/slurmctld.pid; then
    log "starting slurmctld"
    slurmctld ${CLEAN:--R} -i
fi
for i in $(seq 1 "$NODES"); do
    if ! running "/run/slurmd-rlcore$i.pid"; then
        log "starting slurmd rlcore$i"
        slurmd -N "rlcore$i"
    fi
done

# Wait until every node is idle (the controller may have restarted while nodes were down).
for _ in $(seq 120); do
    idle=$(sinfo -h -N -p debug -t idle -o '%N' 2>/dev/null | sort -u | wc -l)
    [ "$idle" -ge "$NODES" ] && break
    scontrol update NodeName="$NODE_NAMES" State=RESUME >/dev/null 2>&1 || true
    sleep 0.5
done
idle=$(sinfo -h -N -p debug -t idle -o '%N' 2>/dev/null | sort -u | wc -l)
if [ "$idle" -lt "$NODES" ]; then
    echo "[slurm-setup] the nodes did not become idle:" >&2
    sinfo -N -l >&2 || true
    tail -n 20 "$LOGS"/slurmctld.log "$LOGS"/slurmd-*.log >&2 || true
    exit 1
fi
sinfo -N
log "ready: $NODES node(s), $CPUS CPUs and ${MEM} MB each, partition debug, in $(( $(date +%s) - START )) s"
