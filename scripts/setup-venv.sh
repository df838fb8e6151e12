#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment with every pinned dependency.
# Needs only python3.11 with venv and pip. Sourced by study.sh and test.sh; idempotent: it reinstalls
# only when pyproject.toml changed since the last install.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${COMPO_VENV:-$repo/.venv}"
stamp="$venv/.compo-installed"
want="$(sha256sum "$repo/pyproject.toml" | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ]; then
  if ! python3 -m venv "$venv" 2>/dev/null; then
    # Debian's python3 lacks ensurepip until python3-venv is installed
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv "$venv"
  fi
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[setup] installing pinned dependencies into $venv" >&2
  "$venv/bin/python" -m pip install -q --upgrade pip
  # the CPU build of torch first, so open_clip's torch requirement is already met (no CUDA wheels)
  "$venv/bin/python" -m pip install -q "torch==2.13.0"
  "$venv/bin/python" -m pip install -q -e "$repo[dev]"
  echo "$want" > "$stamp"
fi
# WordNet 3.0 laid out for NLTK under the venv: Debian's packages, or without root NLTK's downloader
PYTHON="$venv/bin/python" bash "$repo/scripts/install-wordnet.sh" "$venv/nltk_data"
export PATH="$venv/bin:$PATH"
