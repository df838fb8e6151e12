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
  # torch and torchvision first, as pyproject.toml pins them, and from PyTorch's CPU index: its +cpu builds sort
  # above PyPI's Linux wheels (CUDA builds, whose torchvision ops do not load beside a CPU torch), so open_clip's
  # requirements are met without CUDA wheels. Where that index cannot be reached pip warns and takes PyPI's
  # builds, and compo.compat keeps `import open_clip` working.
  mapfile -t torch_pins < <("$venv/bin/python" -c '
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    dependencies = tomllib.load(f)["project"]["dependencies"]
print("\n".join(d for d in dependencies if d.split("==")[0] in ("torch", "torchvision")))' "$repo/pyproject.toml")
  # asked only when it answers within 5 s: a closed network that drops the connection would otherwise hold
  # each request for pip's timeout and retries
  cpu_index=()
  if "$venv/bin/python" -c 'import socket; socket.create_connection(("download.pytorch.org", 443), timeout=5)' \
      2>/dev/null; then
    cpu_index=(--extra-index-url https://download.pytorch.org/whl/cpu)
  else
    echo "[setup] download.pytorch.org not reachable: torch and torchvision from the package index" >&2
  fi
  "$venv/bin/python" -m pip install -q "${cpu_index[@]}" "${torch_pins[@]}"
  "$venv/bin/python" -m pip install -q -e "$repo[dev]"
  echo "$want" > "$stamp"
fi
# WordNet 3.0 laid out for NLTK under the venv: Debian's packages, or without root NLTK's downloader
PYTHON="$venv/bin/python" bash "$repo/scripts/install-wordnet.sh" "$venv/nltk_data"
export PATH="$venv/bin:$PATH"
