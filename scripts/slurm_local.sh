#!/usr/bin/env bash
# A real Slurm on this machine, for tests/slurm: `up` installs Debian's slurm-wlm and munge
# (when missing), writes a slurm.conf with two nodes n1 and n2 on this host and starts
# munged, slurmctld and one slurmd per node; `down` stops every daemon `up` started (by the
# pids it recorded); `env` prints the variables a client needs (SLURM_CONF).
#
#   bash scripts/slurm_local.sh up && eval "$(bash scripts/slurm_local.sh env)" && sinfo
#
# Facts this relies on (../shared/notes/real-slurm.md, Debian 12, slurm-wlm 22.05.8):
# - Installing the packages would start their daemons with the packaged configuration; a
#   temporary /usr/sbin/policy-rc.d that exits 101 keeps them from starting.
# - Several nodes on one host: NodeName=n1,n2 with NodeHostname=<this host>, each its own
#   Port=, started as `slurmd -N n1`, `slurmd -N n2`.
# - No accounting daemon: no sacct, so the tests read `scontrol show job` (MinJobAge keeps
#   a finished job there for an hour) and the jobcomp/filetxt file.
# - AuthInfo=cred_expire=10: a requeued job is held until its old credential expires
#   (BeginTime, 120 s by default); 10 s keeps a requeue case short, and so do scheduling
#   passes every 2 s (sched_interval, bf_interval: 60 s and 30 s by default), which start it
#   once it may run.
# - SlurmdTimeout=20: a node whose slurmd died is DOWN (the job NODE_FAIL) in under a minute.
# Everything lives under SLURM_LOCAL_DIR (default /tmp/dapo-slurm); ports 16817-16819.
set -euo pipefail

STATE="${SLURM_LOCAL_DIR:-/tmp/dapo-slurm}"
CONF="$STATE/slurm.conf"
CTLD_PORT=16817
NODES=(n1 n2)
NODE_PORTS=(16818 16819)

log() { printf '[slurm_local] %s\n' "$*" >&2; }

install_packages() {
    if command -v slurmctld >/dev/null && command -v munged >/dev/null; then return 0; fi
    [[ $(id -u) == 0 ]] || { log "installing slurm-wlm needs root"; exit 1; }
    local t0=$SECONDS had_policy=0
    [[ -e /usr/sbin/policy-rc.d ]] && had_policy=1
    if ((!had_policy)); then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
    fi
    # apt-get update only when the package is unknown (a fresh image has no lists).
    apt-cache show slurm-wlm >/dev/null 2>&1 || apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurm-wlm munge >"$STATE/apt.log" 2>&1 || { cat "$STATE/apt.log" >&2; exit 1; }
    ((had_policy)) || rm -f /usr/sbin/policy-rc.d
    log "installed slurm-wlm and munge in $((SECONDS - t0)) s"
}

write_conf() {
    local host cpus mem i
    host="$(hostname -s)"
    cpus="$(nproc)"
    # RealMemory in MB, a little under what the machine has (slurmd refuses a node that
    # declares more than it finds).
    mem=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 * 9 / 10))
    cat >"$CONF" <<EOF
ClusterName=dapo
SlurmctldHost=$host
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool-%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/jobcomp.txt
MinJobAge=3600
KillWait=30
SlurmdTimeout=20
ReturnToService=2
JobRequeue=0
EOF
    for i in "${!NODES[@]}"; do
        echo "NodeName=${NODES[$i]} NodeHostname=$host Port=${NODE_PORTS[$i]} CPUs=$cpus RealMemory=$mem State=UNKNOWN" >>"$CONF"
    done
    echo "PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP" >>"$CONF"
}

start_munge() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        return 0  # a munged is already answering (the system's): use it
    fi
    [[ -s /etc/munge/munge.key ]] || mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key 2>/dev/null || true
    chmod 600 /etc/munge/munge.key
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
    runuser -u munge -- /usr/sbin/munged
    # munged writes its pid file; record it as ours so `down` stops it.
    cp /run/munge/munged.pid "$STATE/munged.pid"
}

up() {
    mkdir -p "$STATE"
    install_packages
    if [[ -s "$STATE/slurmctld.pid" ]] && kill -0 "$(cat "$STATE/slurmctld.pid")" 2>/dev/null; then
        log "already up ($STATE)"
        return 0
    fi
    rm -rf "$STATE/ctld" "$STATE"/spool-* "$STATE"/*.log "$STATE/jobcomp.txt"
    mkdir -p "$STATE/ctld"
    write_conf
    start_munge
    export SLURM_CONF="$CONF"
    slurmctld -f "$CONF"
    local node
    for node in "${NODES[@]}"; do
        mkdir -p "$STATE/spool-$node"
        slurmd -f "$CONF" -N "$node"
    done
    # Ready when both nodes are idle (slurmd registered with slurmctld).
    local deadline=$((SECONDS + 60))
    while ((SECONDS < deadline)); do
        if [[ "$(sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$')" == "${#NODES[@]}" ]]; then
            log "up: ${NODES[*]} idle (SLURM_CONF=$CONF)"
            return 0
        fi
        sleep 0.5
    done
    sinfo -N -l >&2 || true
    tail -n 20 "$STATE/slurmctld.log" >&2 || true
    log "nodes not idle after 60 s"
    exit 1
}

stop_pidfile() {  # stop_pidfile FILE: TERM the daemon it names, KILL it after 10 s
    local file=$1 pid i
    [[ -s "$file" ]] || return 0
    pid="$(cat "$file")"
    if kill -TERM "$pid" 2>/dev/null; then
        for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$file"
}

down() {
    local node
    export SLURM_CONF="$CONF"
    # Jobs first (their steps outlive a stopped slurmd), then the daemons.
    if [[ -s "$STATE/slurmctld.pid" ]]; then
        scancel --full --signal=KILL --state=RUNNING "--user=$(id -un)" 2>/dev/null || true
    fi
    for node in "${NODES[@]}"; do stop_pidfile "$STATE/slurmd-$node.pid"; done
    stop_pidfile "$STATE/slurmctld.pid"
    stop_pidfile "$STATE/munged.pid"
    log "down"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    env) printf 'export SLURM_CONF=%q\n' "$CONF" ;;
    *) echo "usage: $0 up|down|env" >&2; exit 2 ;;
esac
