#!/usr/bin/env bash
# Bring up a real single-node SLURM cluster on localhost (munged, private MariaDB, slurmdbd, slurmctld,
# slurmd, one fake GPU) for the workflow's SLURM tests and CI. Debian 12, run as root; no systemd needed.
#
#   scripts/slurm/up.sh      # install if needed, configure, start what is not running, wait for the node
#   scripts/slurm/down.sh    # stop the daemons (state and accounting database are kept)
#   COMPO_TEST_SLURM=1 .venv/bin/pytest tests/test_slurm.py   # the dispatch test against this cluster
#
# Settings (ports, names, state dir /var/lib/compo-slurm) are in common.sh; configs are rendered from the
# *.in templates beside this script into /etc/slurm; daemon logs are in /var/lib/compo-slurm/log.
#
# Idempotent: with the cluster already up it only checks and exits 0.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$HERE/common.sh"

START=$EPOCHREALTIME
elapsed() { awk -v a="$START" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
[[ $(id -u) -eq 0 ]] || { echo "ERROR: up.sh must run as root (it installs packages and starts daemons)" >&2; exit 1; }

HOST=$(hostname -s)
PACKAGES=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server)

node_state() { sinfo -h -n "$HOST" -o '%T' 2>/dev/null | head -n1; }

all_running() {
    local d
    for d in "${DAEMONS[@]}"; do running_pid "$d" >/dev/null || return 1; done
}

render_to() {  # render_to TEMPLATE FILE: the template beside this script with this machine's values
    # The node line exactly as slurmd detects it (CPUs, sockets, cores, threads, memory).
    : "${NODE_LINE:=$(slurmd -C | head -n1)}"
    sed -e "s|@STATE@|$STATE|g" -e "s|@HOST@|$HOST|g" -e "s|@CLUSTER@|$COMPO_SLURM_CLUSTER|g" \
        -e "s|@PARTITION@|$COMPO_SLURM_PARTITION|g" \
        -e "s|@URGENT_PARTITION@|$COMPO_SLURM_URGENT_PARTITION|g" -e "s|@GPU_TYPE@|$COMPO_SLURM_GPU_TYPE|g" \
        -e "s|@DEF_MEM_PER_CPU@|$COMPO_SLURM_DEF_MEM_PER_CPU|g" -e "s|@CTLD_PORT@|$COMPO_SLURM_CTLD_PORT|g" \
        -e "s|@SLURMD_PORT@|$COMPO_SLURM_SLURMD_PORT|g" -e "s|@DBD_PORT@|$COMPO_SLURM_DBD_PORT|g" \
        -e "s|@DB_PORT@|$COMPO_SLURM_DB_PORT|g" -e "s|@DB_USER@|$COMPO_SLURM_DB_USER|g" \
        -e "s|@DB_PASS@|$COMPO_SLURM_DB_PASS|g" -e "s|@NODE_LINE@|$NODE_LINE|g" "$HERE/$1" > "$2"
}
CHANGED=()
render() {  # render TEMPLATE DEST MODE; DEST's name goes to CHANGED when its content differs
    render_to "$1" "$2.tmp"
    chmod "$3" "$2.tmp"
    cmp -s "$2.tmp" "$2" || CHANGED+=("${2##*/}")
    mv "$2.tmp" "$2"
}
# The running daemons read these; a template edited since they started (a partition added) means a restart.
config_current() {
    local f tmp rc=0
    tmp=$(mktemp)
    for f in slurm gres cgroup; do
        render_to "$f.conf.in" "$tmp"
        cmp -s "$tmp" "$SLURM_ETC/$f.conf" || { rc=1; break; }
    done
    rm -f "$tmp"
    return $rc
}

if command -v sinfo >/dev/null && all_running && [[ $(node_state) =~ ^(idle|mixed|allocated)$ ]] && config_current; then
    echo "SLURM cluster '$COMPO_SLURM_CLUSTER' already up (node $HOST $(node_state)); nothing to do."
    exit 0
fi

# ---- packages ------------------------------------------------------------------------------------------
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "Installing: ${missing[*]}"
    # Keep apt from starting the distribution's own daemons: we start private instances below.
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    mkdir -p "$STATE"
    apt_log=$STATE/apt-install.log
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${missing[@]}"; } > "$apt_log" 2>&1 ||
        { tail -n 30 "$apt_log" >&2; echo "ERROR: package installation failed (full log: $apt_log)" >&2; exit 1; }
fi

# ---- configuration from templates -----------------------------------------------------------------------
mkdir -p "$RUN" "$LOG" "$STATE/spool/ctld" "$STATE/spool/d" "$STATE/dev" "$SLURM_ETC"
# Slurm needs a character device behind a GPU's File=; a /dev/null clone (major 1, minor 3) is harmless.
[[ -c $STATE/dev/fakegpu0 ]] || { rm -f "$STATE/dev/fakegpu0"; mknod -m 666 "$STATE/dev/fakegpu0" c 1 3; }

NODE_LINE=$(slurmd -C | head -n1)
[[ $NODE_LINE == NodeName=* ]] || die "slurmd -C gave no node line: $NODE_LINE"

render slurm.conf.in "$SLURM_ETC/slurm.conf" 644
render gres.conf.in "$SLURM_ETC/gres.conf" 644
render cgroup.conf.in "$SLURM_ETC/cgroup.conf" 644
render slurmdbd.conf.in "$SLURM_ETC/slurmdbd.conf" 600   # slurmdbd refuses a world-readable file (password)
render my.cnf.in "$STATE/my.cnf" 644
if [[ " ${CHANGED[*]} " =~ \ (slurm|gres|cgroup)\.conf\  ]] && running_pid slurmctld >/dev/null; then
    # Restarted below with the new configuration (their state, queued jobs included, is kept).
    echo "Configuration changed (${CHANGED[*]}): restarting slurmd and slurmctld"
    stop slurmd && stop slurmctld || die "could not stop the SLURM daemons to apply the new configuration"
fi

wait_for() {  # wait_for DAEMON DESCRIPTION COMMAND...: until COMMAND succeeds; fail fast if DAEMON died
    local daemon=$1 what=$2; shift 2
    local start=$SECONDS
    # Each probe gets its own time limit: a half-started daemon can make a client hang forever.
    until timeout 10 "$@" >/dev/null 2>&1; do
        ((SECONDS - start < COMPO_SLURM_TIMEOUT)) || die "timed out after ${COMPO_SLURM_TIMEOUT}s waiting for $what"
        # Pid files appear once a daemon is initialised: after a grace period, no live pid means it died.
        if ((SECONDS - start > 15)) && ! running_pid "$daemon" >/dev/null; then
            die "$daemon exited while waiting for $what"
        fi
        sleep 0.5
    done
}

# ---- munge ----------------------------------------------------------------------------------------------
if ! running_pid munged >/dev/null; then
    if [[ ! -s /etc/munge/munge.key ]]; then
        mungekey --create --keyfile=/etc/munge/munge.key
        chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    runuser -u munge -- /usr/sbin/munged --force
fi
wait_for munged "munged" sh -c 'munge -n | unmunge'

# ---- private MariaDB ------------------------------------------------------------------------------------
DB_SOCKET=$RUN/mysqld.sock
if ! running_pid mariadbd >/dev/null; then
    if [[ ! -d $STATE/mysql/mysql ]]; then
        mkdir -p "$STATE/mysql"
        chown mysql:mysql "$STATE/mysql"
        mariadb-install-db --defaults-file="$STATE/my.cnf" --user=mysql --datadir="$STATE/mysql" \
            --auth-root-authentication-method=socket --skip-test-db > "$LOG/mariadb-install.log" 2>&1 || die "mariadb-install-db failed ($LOG/mariadb-install.log)"
    fi
    chown mysql:mysql "$RUN" "$LOG"
    touch "$LOG/mariadb.log" && chown mysql:mysql "$LOG/mariadb.log"
    # Own session, so that the end of this script's process group (a CI step) does not take it down.
    rm -f "$(pidfile_of mariadbd)"   # a stale one (other owner) would stop mariadbd writing its own
    setsid -f mariadbd --defaults-file="$STATE/my.cnf" >/dev/null 2>&1 < /dev/null
fi
wait_for mariadbd "MariaDB on port $COMPO_SLURM_DB_PORT" mariadb --connect-timeout=2 --socket="$DB_SOCKET" -e 'SELECT 1'
mariadb --connect-timeout=5 --socket="$DB_SOCKET" <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS '$COMPO_SLURM_DB_USER'@'127.0.0.1' IDENTIFIED BY '$COMPO_SLURM_DB_PASS';
CREATE USER IF NOT EXISTS '$COMPO_SLURM_DB_USER'@'localhost' IDENTIFIED BY '$COMPO_SLURM_DB_PASS';
GRANT ALL ON slurm_acct_db.* TO '$COMPO_SLURM_DB_USER'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO '$COMPO_SLURM_DB_USER'@'localhost';
SQL

# ---- slurmdbd and the accounting entities the Snakemake plugin checks -----------------------------------
running_pid slurmdbd >/dev/null || slurmdbd
wait_for slurmdbd "slurmdbd on port $COMPO_SLURM_DBD_PORT" sacctmgr -n list cluster
ensure() {  # ensure LIST-COMMAND... -- ADD-COMMAND...: add an entity only when listing shows none
    local list=() add=()
    while [[ $1 != -- ]]; do list+=("$1"); shift; done; shift; add=("$@")
    [[ -n $(sacctmgr -n -P "${list[@]}" 2>/dev/null) ]] || sacctmgr -i "${add[@]}" >/dev/null
}
ensure list cluster "$COMPO_SLURM_CLUSTER" format=cluster -- add cluster "$COMPO_SLURM_CLUSTER"
ensure list account "$COMPO_SLURM_ACCOUNT" format=account -- \
    add account "$COMPO_SLURM_ACCOUNT" cluster="$COMPO_SLURM_CLUSTER" description="compo-study tests"
for user in root ${SUDO_USER:-}; do
    ensure list assoc user="$user" account="$COMPO_SLURM_ACCOUNT" format=user -- \
        add user "$user" account="$COMPO_SLURM_ACCOUNT" defaultaccount="$COMPO_SLURM_ACCOUNT" \
        cluster="$COMPO_SLURM_CLUSTER"
done

# ---- slurmctld and slurmd -------------------------------------------------------------------------------
running_pid slurmctld >/dev/null || slurmctld
wait_for slurmctld "slurmctld on port $COMPO_SLURM_CTLD_PORT" scontrol ping
running_pid slurmd >/dev/null || slurmd
node_usable() { [[ $(node_state) =~ ^(idle|mixed|allocated)$ ]]; }
deadline=$((SECONDS + COMPO_SLURM_TIMEOUT))
until node_usable; do
    state=$(node_state)
    # A node left DOWN/DRAINED by an earlier unclean stop is put back in service once slurmd is registered.
    if [[ $state =~ ^(down|drained|draining)$ ]]; then
        scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
    fi
    ((SECONDS < deadline)) || die "node $HOST not idle after ${COMPO_SLURM_TIMEOUT}s (state: ${state:-unknown})"
    sleep 0.5
done
for d in "${DAEMONS[@]}"; do running_pid "$d" >/dev/null || die "$d is not running"; done

echo "SLURM cluster '$COMPO_SLURM_CLUSTER' up in $(elapsed) s: partition $COMPO_SLURM_PARTITION," \
     "account $COMPO_SLURM_ACCOUNT, node $HOST $(node_state) with gres $(sinfo -h -n "$HOST" -o '%G')"
