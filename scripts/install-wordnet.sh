#!/usr/bin/env bash
# Lay out Princeton WordNet 3.0 where NLTK reads it ($NLTK_DATA/corpora/wordnet/), one of two ways:
# - Debian's wordnet-base + wordnet-sense-index (in /usr/share/wordnet, or WORDNET_DIR): copied, with the
#   `lexnames` file Debian does not ship (the 45 lexicographer file names of WordNet 3.0, written below);
#   as root, the packages are installed first when missing;
# - without root and without those packages (a cluster's login node): NLTK's own downloader into the target,
#   from NLTK's data host or the index NLTK_INDEX_URL names (a mirror); PYTHON: the interpreter with nltk
#   (default: python).
# Usage: scripts/install-wordnet.sh [NLTK_DATA]   (default: $NLTK_DATA, else <repo>/.venv/nltk_data)
# Idempotent; the code finds the result through NLTK_DATA or the default path (compo.negatives.wordnet).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${1:-${NLTK_DATA:-${COMPO_VENV:-$repo/.venv}/nltk_data}}"
src="${WORDNET_DIR:-/usr/share/wordnet}"
if [ ! -f "$src/data.noun" ] || [ ! -f "$src/index.sense" ]; then
  if [ "$(id -u)" -ne 0 ] || [ -n "${NLTK_INDEX_URL:-}" ]; then
    "${PYTHON:-python}" -m nltk.downloader ${NLTK_INDEX_URL:+-u "$NLTK_INDEX_URL"} -d "$target" wordnet
    if [ -f "$target/corpora/wordnet.zip" ]; then
      "${PYTHON:-python}" -m zipfile -e "$target/corpora/wordnet.zip" "$target/corpora"
    fi
    test -f "$target/corpora/wordnet/data.noun" \
      || { echo "install-wordnet: NLTK's downloader laid out no WordNet under $target" >&2; exit 1; }
    echo "install-wordnet: WordNet 3.0 laid out under $target/corpora/wordnet (NLTK's downloader)" >&2
    exit 0
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends wordnet-base wordnet-sense-index >/dev/null \
    || { apt-get update -qq && apt-get install -y -qq --no-install-recommends wordnet-base wordnet-sense-index >/dev/null; }
fi
dest="$target/corpora/wordnet"
mkdir -p "$dest"
for f in data.adj data.adv data.noun data.verb index.adj index.adv index.noun index.verb \
         adj.exc adv.exc noun.exc verb.exc cntlist.rev index.sense; do
  if [ -f "$src/$f" ]; then cp -f "$src/$f" "$dest/$f"; fi
done
# WordNet 3.0 lexnames: file number, name, syntactic category (1 noun, 2 verb, 3 adj, 4 adv)
i=0
: > "$dest/lexnames"
for entry in adj.all:3 adj.pert:3 adv.all:4 noun.Tops:1 noun.act:1 noun.animal:1 noun.artifact:1 \
    noun.attribute:1 noun.body:1 noun.cognition:1 noun.communication:1 noun.event:1 noun.feeling:1 \
    noun.food:1 noun.group:1 noun.location:1 noun.motive:1 noun.object:1 noun.person:1 \
    noun.phenomenon:1 noun.plant:1 noun.possession:1 noun.process:1 noun.quantity:1 noun.relation:1 \
    noun.shape:1 noun.state:1 noun.substance:1 noun.time:1 verb.body:2 verb.change:2 verb.cognition:2 \
    verb.communication:2 verb.competition:2 verb.consumption:2 verb.contact:2 verb.creation:2 \
    verb.emotion:2 verb.motion:2 verb.perception:2 verb.possession:2 verb.social:2 verb.stative:2 \
    verb.weather:2 adj.ppl:3; do
  printf '%02d\t%s\t%s\n' "$i" "${entry%%:*}" "${entry##*:}" >> "$dest/lexnames"
  i=$((i + 1))
done
echo "install-wordnet: WordNet 3.0 laid out under $dest" >&2
