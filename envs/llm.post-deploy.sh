#!/usr/bin/env bash
# Snakemake runs this once inside the conda env it has just created (a copy of this file, so self-contained):
# WordNet 3.0 for NLTK under $CONDA_PREFIX/nltk_data, where compo.negatives.lexicon looks (sys.prefix), fetched
# by NLTK's own downloader on the host that creates the envs (the login node). NLTK_INDEX_URL: another index
# (a mirror). compo is not installed: every rule runs `python -m compo` from the checkout (Snakefile).
set -euo pipefail
data="${CONDA_PREFIX:?not inside a conda env}/nltk_data"
python -m nltk.downloader ${NLTK_INDEX_URL:+-u "$NLTK_INDEX_URL"} -d "$data" wordnet
if [ -f "$data/corpora/wordnet.zip" ]; then python -m zipfile -e "$data/corpora/wordnet.zip" "$data/corpora"; fi
test -f "$data/corpora/wordnet/data.noun"
