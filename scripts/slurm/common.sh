# Shared settings for up.sh / down.sh (sourced, not run). Every value can be overridden from the environment.
# shellcheck shell=bash disable=SC2034  # the variables are used by the scripts that source this file
COMPO_SLURM_STATE=${COMPO_SLURM_STATE:-/var/lib/compo-slurm}   # datadirs, logs, pid files, spool
COMPO_SLURM_CLUSTER=${COMPO_SLURM_CLUSTER:-compo}
COMPO_SLURM_PARTITION=${COMPO_SLURM_PARTITION:-main}            # workflow/profiles/slurm-test uses this name
COMPO_SLURM_URGENT_PARTITION=${COMPO_SLURM_URGENT_PARTITION:-urgent}  # higher PriorityTier: preempts main's jobs
COMPO_SLURM_ACCOUNT=${COMPO_SLURM_ACCOUNT:-compo}               # ... and this account
COMPO_SLURM_GPU_TYPE=${COMPO_SLURM_GPU_TYPE:-fake}
COMPO_SLURM_DEF_MEM_PER_CPU=${COMPO_SLURM_DEF_MEM_PER_CPU:-1024}
COMPO_SLURM_CTLD_PORT=${COMPO_SLURM_CTLD_PORT:-6817}
COMPO_SLURM_SLURMD_PORT=${COMPO_SLURM_SLURMD_PORT:-6818}
COMPO_SLURM_DBD_PORT=${COMPO_SLURM_DBD_PORT:-6819}
COMPO_SLURM_DB_PORT=${COMPO_SLURM_DB_PORT:-3307}                # not 3306: stays clear of a system MariaDB
COMPO_SLURM_DB_USER=slurm
COMPO_SLURM_DB_PASS=compo-slurm-local                            # loopback-only throwaway database
COMPO_SLURM_TIMEOUT=${COMPO_SLURM_TIMEOUT:-90}                  # seconds to wait for each daemon / the node

SLURM_ETC=/etc/slurm
STATE=$COMPO_SLURM_STATE
RUN=$STATE/run
LOG=$STATE/log

# Daemons in start order; down.sh stops them in reverse.
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)

pidfile_of() {
    case $1 in
        munged) echo /run/munge/munged.pid ;;
        *) echo "$RUN/$1.pid" ;;
    esac
}

# True while process PID exists and has not exited. An exited daemon whose parent never reaps it (there is
# no init process here) lingers as a zombie: that counts as exited.
alive() {
    local state
    state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -n $state && $state != Z ]]
}

# The pid of a daemon we started, if it is still alive (and really is that program), else nothing.
running_pid() {
    local pidfile pid
    pidfile=$(pidfile_of "$1")
    pid=$(tr -d '[:space:]' 2>/dev/null < "$pidfile")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$1" ]] && alive "$pid" || return 1
    echo "$pid"
}

# Stop a daemon we started (TERM, by the pid in its own pid file; nothing else is signalled) and wait for it.
stop() {
    local name=$1 pid
    pid=$(running_pid "$name") || { echo "$name: not running"; return 0; }
    kill -TERM "$pid"
    for _ in $(seq 1 $((COMPO_SLURM_TIMEOUT * 5))); do
        alive "$pid" || { echo "$name: stopped (pid $pid)"; return 0; }
        sleep 0.2
    done
    echo "ERROR: $name (pid $pid) did not stop within ${COMPO_SLURM_TIMEOUT}s" >&2
    return 1
}

log_tails() {
    local f
    for f in "$LOG"/*.log /var/log/munge/munged.log; do
        [[ -f $f ]] || continue
        echo "---- last lines of $f" >&2
        tail -n 25 "$f" >&2
    done
}

die() {
    echo "ERROR: $*" >&2
    log_tails
    exit 1
}
