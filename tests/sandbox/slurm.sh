#!/usr/bin/env bash
# A real single-host Slurm (docs/design.md, "The simulated host"): munged, slurmctld and slurmd from
# Debian's packages (slurm-wlm 22.05), with private ports, config, state, log and munge socket, one node `gpupin`
# whose GPUs are gres on character devices made with mknod (195:N, the real driver's major) for the topology's
# cards, named by their minor numbers. Nothing system-wide is touched: no /dev node, no /etc/slurm, no systemd unit.
#
#   slurm.sh up       start it for $FAKEGPU_TOPOLOGY (installing slurmctld, slurmd, slurm-client and munge when
#                     missing); restart it when it runs with another topology; print SLURM_CONF=... on stdout
#   slurm.sh down     cancel its jobs, stop its daemons and step daemons by PID, remove its runtime directory
#   slurm.sh status   say whether it runs, and with which topology
#
# The node's tasks see the simulated cards as a real node's tasks see the driver: a TaskProlog (the node's, not
# the user's environment) exports LD_LIBRARY_PATH=build/fakegpu/lib and FAKEGPU_TOPOLOGY. Slurm itself sets
# CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS / SLURM_JOB_GPUS from gres.conf, whose File= lines are listed by minor
# number, as `File=/dev/nvidia[0-7]` is on a real node, unless the topology says otherwise: its optional "slurm"
# object may give gres.conf's lines ("gres_conf": a list; {dev} is the directory of the device files, {node} the
# node's name) and the node's Gres= in slurm.conf ("node_gres", default gpu:<number of cards>), so that a scenario
# can list File= records out of minor order, over several lines, with Type= and NodeName=; and "fake_gpus_conf",
# the lines of the fake_gpus.conf by which Slurm's gres/gpu plugin takes GPUs as if AutoDetect had found them
# (its own test hook, src/plugins/gres/gpu/gres_gpu.c), so that Slurm's AutoDetect merge runs without a GPU.
#
# Environment: FAKEGPU_TOPOLOGY (default: the mixed-4 scenario); GPUPIN_SANDBOX_NAME (one more instance beside the
# default one, at /run/gpupin-slurm-NAME); GPUPIN_SLURM_RUN (default /run/gpupin-slurm[-NAME]);
# GPUPIN_SLURM_CPUS (default 8: the node's CPUs as Slurm counts them, whatever the machine has).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SAY_AS=slurm
# shellcheck source=tests/sandbox/common.sh
. "$REPO/tests/sandbox/common.sh"
NAME=${GPUPIN_SANDBOX_NAME:-}
case "$NAME" in *[!a-z0-9-]*) echo "slurm: ERROR: GPUPIN_SANDBOX_NAME=$NAME: use a-z, 0-9 and -" >&2; exit 64 ;; esac
RUN=${GPUPIN_SLURM_RUN:-/run/gpupin-slurm${NAME:+-$NAME}}
CPUS=${GPUPIN_SLURM_CPUS:-8}
TOPOLOGY=$(realpath "${FAKEGPU_TOPOLOGY:-$REPO/tests/fakegpu/scenarios/mixed-4.json}")
FAKELIB=$REPO/build/fakegpu/lib
NODE=gpupin
CONF=$RUN/etc/slurm.conf
MUNGE_SOCK=$RUN/munge/munge.socket
PIDS=(slurmd slurmctld munged)

[ "$(id -u)" = 0 ] || die "the Slurm daemons need root (SlurmUser=root, mknod)"

config_line() { printf '%s %s %s\n' "$REPO" "$TOPOLOGY" "$(sha256sum <"$TOPOLOGY" | cut -c1-16)"; }
clients() { env SLURM_CONF="$CONF" "$@"; }

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The topology's cards as "MINOR BUSID" lines, by minor number (the fake NVML's default minor is the position in
# the file).
cards_by_minor() {
    python3 - "$TOPOLOGY" <<'EOF'
import json, sys
gpus = json.load(open(sys.argv[1]))["gpus"]
for minor, bus in sorted((g.get("minor_number", i), g["bus_id"]) for i, g in enumerate(gpus)):
    print(minor, bus)
EOF
}

# The topology's own gres.conf (written over the default one) and fake_gpus.conf, and its node Gres= (printed;
# empty when it has none): its optional "slurm" object.
scenario_gres() {
    python3 - "$TOPOLOGY" "$RUN/dev" "$NODE" "$RUN/etc" <<'EOF'
import json, sys
topology, dev, node, etc = sys.argv[1:]
slurm = json.load(open(topology)).get("slurm") or {}
for key, name in (("gres_conf", "gres.conf"), ("fake_gpus_conf", "fake_gpus.conf")):
    if key in slurm:
        with open(f"{etc}/{name}", "w") as f:
            f.write("".join(line.format(dev=dev, node=node) + "\n" for line in slurm[key]))
print(slurm.get("node_gres", ""))
EOF
}

write_config() {
    local ctld_port=$1 slurmd_port=$2 minor bus n=0 gres
    mkdir -p "$RUN"/{etc,dev,state,spool,log,tmp}
    : >"$RUN/etc/gres.conf"
    while read -r minor bus; do
        mknod -m 0666 "$RUN/dev/nvidia$minor" c 195 "$minor"
        echo "NodeName=$NODE Name=gpu File=$RUN/dev/nvidia$minor  # $bus" >>"$RUN/etc/gres.conf"
        n=$((n + 1))
    done < <(cards_by_minor)
    gres=$(scenario_gres)
    gres=${gres:-gpu:$n}
    # The node's own environment for every task (a TaskProlog's `export` lines): where the "driver" is, and the
    # marker by which `down` finds what a killed slurmd or slurmstepd left behind.
    cat >"$RUN/etc/task_prolog.sh" <<EOF
#!/bin/sh
echo "export LD_LIBRARY_PATH=$FAKELIB\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
echo "export FAKEGPU_TOPOLOGY=$TOPOLOGY"
echo "export GPUPIN_SLURM_RUN=$RUN"
EOF
    chmod 0755 "$RUN/etc/task_prolog.sh"
    cat >"$CONF" <<EOF
# gpupin's test cluster: one node, private ports and directories (tests/sandbox/slurm.sh)
ClusterName=gpupin${NAME:+-$NAME}
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCK
StateSaveLocation=$RUN/state
SlurmdSpoolDir=$RUN/spool
SlurmctldPidFile=$RUN/slurmctld.own.pid
SlurmdPidFile=$RUN/slurmd.own.pid
SlurmctldLogFile=$RUN/log/slurmctld.log
SlurmdLogFile=$RUN/log/slurmd.log
DebugFlags=Gres
SlurmdDebug=verbose
TmpFS=$RUN/tmp
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog=$RUN/etc/task_prolog.sh
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SchedulerType=sched/builtin
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
PropagateResourceLimits=NONE
MailProg=/bin/true
MinJobAge=5
KillWait=2
InactiveLimit=0
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS Gres=$gres State=UNKNOWN
PartitionName=gpu Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
}

start_munge() {
    mkdir -p "$RUN/munge" && chmod 0700 "$RUN/munge"
    dd if=/dev/urandom of="$RUN/munge/munge.key" bs=1024 count=1 status=none
    chmod 0400 "$RUN/munge/munge.key"
    setsid munged --foreground --force --socket="$MUNGE_SOCK" --key-file="$RUN/munge/munge.key" \
        --pid-file="$RUN/munge/munged.own.pid" --log-file="$RUN/log/munged.log" \
        --seed-file="$RUN/munge/munged.seed" >>"$RUN/log/munged.out" 2>&1 </dev/null 9>&- &
    echo $! >"$RUN/munged.pid"
    wait_for sh -c "munge -n -S '$MUNGE_SOCK' | unmunge -S '$MUNGE_SOCK'" \
        || die "munged did not answer on $MUNGE_SOCK; see $RUN/log/munged.log"
}

start_slurm() {
    # GPUPIN_SLURM_RUN marks slurmd's environment, which every slurmstepd inherits: `down` finds them by it.
    local envs=(env -i "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" "HOME=/root"
                "SLURM_CONF=$CONF" "GPUPIN_SLURM_RUN=$RUN")
    setsid "${envs[@]}" slurmctld -D -i -f "$CONF" >>"$RUN/log/slurmctld.out" 2>&1 </dev/null 9>&- &
    echo $! >"$RUN/slurmctld.pid"
    wait_for clients scontrol ping || die "slurmctld did not answer; see $RUN/log/slurmctld.log"
    setsid "${envs[@]}" slurmd -D -N "$NODE" -f "$CONF" >>"$RUN/log/slurmd.out" 2>&1 </dev/null 9>&- &
    echo $! >"$RUN/slurmd.pid"
    node_idle() { [ "$(clients sinfo -h -n "$NODE" -o %T)" = idle ]; }
    wait_for node_idle || die "node $NODE did not come up idle ($(clients sinfo -h -n "$NODE" -o '%T %E' \
        2>&1)); see $RUN/log/slurmd.log"
}

leftovers() {
    # Our slurmstepd processes and their tasks (and nothing else): those whose environment carries this instance's
    # marker (slurmd's environment, which every slurmstepd inherits; the TaskProlog's, which every task gets).
    local p
    for p in /proc/[0-9]*; do
        tr '\0' '\n' 2>/dev/null <"$p/environ" | grep -qxF "GPUPIN_SLURM_RUN=$RUN" && echo "${p#/proc/}"
    done
    return 0
}

do_down() {
    local name pid
    if alive "$RUN/slurmctld.pid"; then
        clients scancel --full --quiet --partition=gpu 2>/dev/null || true
    fi
    # Each takes 1.5 to 2 s to stop: signal them all, then wait for each.
    for name in "${PIDS[@]}"; do
        if alive "$RUN/$name.pid"; then kill -TERM "$(cat "$RUN/$name.pid")" 2>/dev/null || true; fi
    done
    for name in "${PIDS[@]}"; do stop_pid "$RUN/$name.pid" "$name"; done
    for pid in $(leftovers); do kill -KILL "$pid" 2>/dev/null || true; done
    rm -rf "$RUN"
}

do_up() {
    ensure_packages slurmctld:/usr/sbin/slurmctld slurmd:/usr/sbin/slurmd slurm-client:/usr/bin/srun \
        munge:/usr/sbin/munged
    [ -d "$FAKELIB" ] || die "$FAKELIB is missing: run 'make fakegpu' first"
    [ -f "$TOPOLOGY" ] || die "no topology file $TOPOLOGY"
    exec 9>"$RUN.lock"
    flock 9
    if alive "$RUN/slurmd.pid" && clients scontrol ping >/dev/null 2>&1; then
        if [ "$(cat "$RUN/config" 2>/dev/null)" = "$(config_line)" ]; then
            echo "SLURM_CONF=$CONF"
            return 0
        fi
        say "restarting: it runs with another topology or checkout ($(cat "$RUN/config" 2>/dev/null))"
    elif [ -d "$RUN" ]; then
        say "cleaning up a stale cluster left by a killed run"
    fi
    do_down
    local t0=$SECONDS
    write_config "$(free_port)" "$(free_port)"
    start_munge
    start_slurm
    config_line >"$RUN/config"
    say "up in $((SECONDS - t0)) s: node $NODE, topology $TOPOLOGY"
    echo "SLURM_CONF=$CONF"
}

case "${1:-}" in
    up) do_up ;;
    down) do_down; say "down" ;;
    status)
        if alive "$RUN/slurmd.pid"; then echo "running: SLURM_CONF=$CONF ($(cat "$RUN/config"))"
        else echo "not running"; exit 1; fi ;;
    *) echo "usage: $0 up|down|status" >&2; exit 64 ;;
esac
