#!/usr/bin/env bash
# Stop the localhost SLURM cluster started by up.sh: slurmd, slurmctld, slurmdbd, MariaDB, munged, in that
# order, each by the pid in its own pid file (nothing else is signalled). State and accounting are kept;
# /etc/slurm/slurm.conf is removed (see the end).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$HERE/common.sh"
[[ $(id -u) -eq 0 ]] || { echo "ERROR: down.sh must run as root" >&2; exit 1; }

status=0
for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
    stop "${DAEMONS[i]}" || status=1
done
# Every Snakemake start runs `scontrol show config` (the slurm plugin probes MinJobAge at import); with
# slurm.conf present but no controller that takes ~10 s, with no slurm.conf it fails at once. up.sh renders
# the file again from its template.
if ((status == 0)); then rm -f "$SLURM_ETC/slurm.conf"; fi
exit $status
