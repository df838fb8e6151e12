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
if [ $# -gt 0 ]; then
  exec pytest --durations=30 "$@"
fi
# The whole paper study on stand-ins (tests/test_whole_study.py: ~200 jobs, ~40 min of 2 cores) runs beside the
# rest of the suite (niced: the suite keeps the CPU it needs, SLURM polling and one-thread tests leave the rest); its
# report follows.
whole_dir=$(mktemp -d)
nice -n 5 pytest -m whole_study --basetemp="$whole_dir/tmp" tests/test_whole_study.py >"$whole_dir/log" 2>&1 &
whole_pid=$!
status=0
pytest --durations=30 -m "not whole_study" || status=$?
whole_status=0
wait "$whole_pid" || whole_status=$?
echo "[test] the whole paper study on stand-ins (tests/test_whole_study.py, run beside the suite):"
cat "$whole_dir/log"
[ "$status" -eq 0 ] && [ "$whole_status" -eq 0 ]
