#!/usr/bin/env bash
# Run the embedded-default study end to end (synthetic world, tiny CLIP, CPU), then print the claims table
# and build the HTML report. Extra arguments go to snakemake, e.g.
# `bash scripts/study.sh results/eval/negclip/coco/seed0/sugarcrepe.json`.
# Prints one line per finished job; Snakemake's whole output goes to results/logs/study.log
# (COMPO_VERBOSE=1 or -v/--verbose as the first argument: print it all instead). `--quick` (first
# argument, or after -v): config/quick.yaml on top of the default, the controls only within ~15 minutes.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/setup-venv.sh"
cd "$repo"
verbose="${COMPO_VERBOSE:-0}"
if [ "${1:-}" = "-v" ] || [ "${1:-}" = "--verbose" ]; then
  verbose=1
  shift
fi
if [ "${1:-}" = "--quick" ]; then
  shift
  set -- --configfile config/config.yaml config/quick.yaml "$@"
fi
results="$(python -c 'import yaml; print(yaml.safe_load(open("config/config.yaml"))["results"])')"
mkdir -p "$results/logs"
full_log="$results/logs/study.log"
: > "$full_log"
snakemake_run() {
  if [ "$verbose" = 1 ]; then
    snakemake --workflow-profile workflow/profiles/local "$@" 2>&1 | tee -a "$full_log"
  else
    snakemake --workflow-profile workflow/profiles/local "$@" 2>&1 | python scripts/study_log.py "$full_log"
  fi
}
echo "[study] running (one line per finished job; Snakemake's full output: $full_log)"
started=$SECONDS
if ! snakemake_run "$@"; then
  echo "[study] failed after $((SECONDS - started)) s: the error is above; everything Snakemake printed is in $full_log" >&2
  exit 1
fi
echo "[study] done in $((SECONDS - started)) s"
if [ -f "$results/tables/claims.md" ]; then
  echo
  cat "$results/tables/claims.md"
  echo
fi
echo "[study] building the report"
report_started=$SECONDS
if ! snakemake --workflow-profile workflow/profiles/local "$@" --report "$results/report.html" >> "$full_log" 2>&1; then
  echo "[study] the report could not be built; see $full_log" >&2
  exit 1
fi
echo "[study] report: $repo/$results/report.html ($(du -h "$results/report.html" | cut -f1), built in $((SECONDS - report_started)) s)"
