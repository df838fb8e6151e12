#!/usr/bin/env bash
# Install everything and run the checks and the test suite: ruff, snakefmt, `snakemake --lint`, unit tests, the
# end-to-end workflow test, and (as root) the SLURM tests on a real single-node cluster on localhost.
# COMPO_TEST_SLURM=0 skips the cluster; extra arguments go to pytest.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/setup-venv.sh"
cd "$repo"
if [ "${COMPO_TEST_SLURM:-auto}" = auto ]; then
  if [ "$(id -u)" -eq 0 ]; then
    bash scripts/slurm/up.sh
    export COMPO_TEST_SLURM=1
  else
    echo "[test] not root: the SLURM tests are skipped (scripts/slurm/up.sh needs root)" >&2
    export COMPO_TEST_SLURM=0
  fi
fi
# the report's browser test needs Debian's Chromium; without it that test skips and says why
bash scripts/install-chromium.sh || echo "[test] Chromium could not be installed: the browser test will skip" >&2
ruff check .
snakefmt --check workflow Snakefile
snakemake --lint --cores 1 >/dev/null || { snakemake --lint --cores 1; exit 1; }
# Four pytest processes and their jobs share the runner's 2 cores: an OpenMP thread that waits spinning burns a core
# another lane needs. Waiting threads sleep instead (tests/test_opcount.py's full model beside two busy processes:
# 70 CPU-s spinning, 54 sleeping; docs/ci-time.md).
export OMP_WAIT_POLICY=PASSIVE
if [ $# -gt 0 ]; then
  exec pytest --durations=30 "$@"
fi
# A lane's CPU seconds (user and system: it and every descendant it waited for; SLURM jobs run under slurmd, not
# counted), printed after it: on a CPU-bound runner the lanes share the cores, so CPU, not wall time, ranks their cost.
timed() {
  local name=$1 rc=0
  shift
  "$@" || rc=$?
  echo "[test] $name's CPU, user and system (first line the shell, second its descendants):"
  times  # a builtin: in a subshell ($(...), a pipe) it would count that subshell's children
  return "$rc"
}
# Three lanes run beside the rest of the suite, each its own pytest with its own log, reported after it: the whole
# paper study on stand-ins (tests/test_whole_study.py: ~200 jobs, as long as the suite: not niced), the fresh-venv
# installs (marker install: pip's downloads and unpacking more than CPU) and the SLURM cluster tests of
# tests/test_slurm.py (they mostly wait on the cluster's polling: the CPU does the rest's work meanwhile); those two
# are niced, so the CPU-bound lanes keep the CPU they need. test_workflow's SLURM test stays in the suite: it
# compares with the suite's local study.
lanes_dir=$(mktemp -d)
lanes=("whole_study" "install" "slurm")
declare -A lane_markers=([whole_study]="whole_study" [install]="install" [slurm]="slurm and not e2e")
declare -A lane_nice=([whole_study]=0 [install]=5 [slurm]=5)
pids=()
for lane in "${lanes[@]}"; do
  timed "lane $lane" nice -n "${lane_nice[$lane]}" pytest --durations=10 -p no:cacheprovider \
    -m "${lane_markers[$lane]}" --basetemp="$lanes_dir/$lane" >"$lanes_dir/$lane.log" 2>&1 &
  pids+=($!)
done
status=0
(timed suite pytest --durations=30 -m "not whole_study and not install and not (slurm and not e2e)") || status=$?
for i in "${!lanes[@]}"; do
  lane_status=0
  wait "${pids[$i]}" || lane_status=$?
  echo "[test] lane ${lanes[$i]} (run beside the suite), exit $lane_status:"
  cat "$lanes_dir/${lanes[$i]}.log"
  [ "$lane_status" -eq 0 ] || status=$lane_status
done
exit "$status"
