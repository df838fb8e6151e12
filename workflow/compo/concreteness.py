"""Brysbaert et al. (2014) concreteness ratings of captions' keyword candidates (seed 002, section 2.2).

The norms are a tab-separated file with columns Word, Bigram, Conc.M, Conc.SD, Unknown, Total,
Percent_known, SUBTLEX, Dom_Pos (37,058 single words and 2,896 two-word expressions). The package ships
the rows the embedded default needs (`compo/resources/brysbaert2014_subset.tsv`, regenerated from the full
file by `compo/resources/make_norms_subset.py`); the full norms are read from a path or an http(s) URL given
in the config (`concreteness.norms`) and checked against `concreteness.sha256`.

Lookup of a caption's keyword candidates (token indices from the `parse` table): where two adjacent
candidates form a two-word expression of the norms ("coffee cup", "traffic light"; lemmas tried first,
then the words as written), the expression is one candidate starting at the first token and the second
token is consumed; otherwise the single token's lemma is tried, then its lower-cased word.

ConcretePlant's keyword choice (seed 002, section 2.2 and appendix A.1) is this module's: the
concreteness stage writes it per policy into the `concreteness` table, and the ConcretePlant generator
(`compo.negatives.concreteplant`) calls the same `choose_keywords` before it replaces the keyword. Per
caption:
1. Keyword candidates: tokens with POS in NOUN PROPN ADJ NUM ADP VERB, rated by `rate_candidates`.
2. ARO category. A category is enabled when the caption has an eligible candidate for it:
     relation   spatial or interaction structure: a phrase of the relation table ("in front of"), a
                preposition with a nominal object (dep pobj) where the preposition or that object is a
                relation-table word ("on the table", "to the left of": left), or a transitive verb with
                both a subject and a direct object (nsubj + dobj; "a dog chasing a cat": chasing)
     attribute  adjectival or numeric modifiers (ADJ, NUM) and state-like verb attributes (a VERB tagged
                VBN/VBG modifying a noun: amod/acl, "a parked car")
     object     nouns and proper nouns
   Relation is taken whenever enabled (relations are sparse). Otherwise attribute vs object is decided by
   deficit-based quota sampling (`QuotaBalancer`): each enabled class's deficit is its target count
   (target share x (assignments so far + 1)) minus its count so far; the larger deficit wins, ties are
   broken by the caption's RNG; a caption with only one enabled class takes it. The quotas are global:
   `choose_keywords` runs them over every caption of the dataset in table order, also when the
   negatives stage generates one shard (it passes the whole table), so a sharded run chooses exactly
   the keywords of the unsharded one. Captions with neither class nor a relation get no keyword.
3. Keyword sampling among the category's candidates, by policy:
     hc  top-k by rating, sampled from softmax(ratings / temperature)
     lc  top-k by negated rating, sampled from softmax(-ratings / temperature)
     wo  uniform over all the category's candidates (concreteness ignored; unrated ones included)
   hc and lc consider rated candidates only.
A caption's RNG (`compo.rng.caption_rng(seed, caption_id)`) is consumed in this order: quota tie-break,
keyword draw; the generator then continues with the same RNG for its replacement draws.
"""

from __future__ import annotations

import hashlib
import io
import logging
import math
import random
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from compo.io import read_table, write_table
from compo.parse import ParsedCaption
from compo.relations import relation_at, relation_table
from compo.rng import caption_rng

log = logging.getLogger(__name__)

SHIPPED_NORMS = Path(__file__).resolve().parent / "resources" / "brysbaert2014_subset.tsv"
POLICIES = ("hc", "lc", "wo")
CATEGORIES = ("relation", "attribute", "object")
NORMS_SCALE = (1.0, 5.0)  # Conc.M: 1 = abstract .. 5 = concrete
NORMS_COLUMNS = ["Word", "Bigram", "Conc.M", "Conc.SD", "Unknown", "Total", "Percent_known", "SUBTLEX",
                 "Dom_Pos"]


class NormsError(ValueError):
    """The concreteness norms cannot be read or fail their checksum."""


@dataclass(frozen=True)
class Norms:
    """Mean concreteness (Conc.M, 1 = abstract .. 5 = concrete) by lower-cased word or expression."""

    ratings: dict[str, float]
    source: str

    def rating(self, word: str) -> float | None:
        return self.ratings.get(" ".join(word.lower().split()))

    def __len__(self) -> int:
        return len(self.ratings)


def _read_bytes(location: str) -> bytes:
    if location.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(location, timeout=60) as response:
                return response.read()
        except OSError as error:
            raise NormsError(f"concreteness norms {location}: download failed ({error})") from error
    path = Path(location)
    if not path.is_file():
        raise NormsError(f"concreteness norms {path}: file not found (config key concreteness.norms)")
    return path.read_bytes()


def parse_norms(data: bytes, source: str) -> dict[str, float]:
    """Word -> Conc.M from the bytes of a Brysbaert TSV (CRLF or LF). A rating outside the scale (1 to 5), a
    missing one ("", "nan") or a word rated twice with different ratings is an error naming the line (the
    released file has none; a mistake here would change which keyword ConcretePlant picks); a row repeated
    with the same rating is skipped and counted in the log."""
    try:
        # keep_default_na=False: "null", "nan" and "na" are English words in the norms, not missing values;
        # blank lines are kept (and skipped below) so that line numbers stay the file's
        frame = pd.read_csv(io.BytesIO(data), sep="\t", dtype=str, keep_default_na=False, skip_blank_lines=False)
    except (pd.errors.ParserError, UnicodeDecodeError) as error:
        raise NormsError(f"concreteness norms {source}: not a readable TSV ({error})") from error
    missing = [c for c in ("Word", "Conc.M") if c not in frame.columns]
    if missing:
        raise NormsError(f"concreteness norms {source}: missing columns {missing} (expected {NORMS_COLUMNS})")
    ratings: dict[str, float] = {}
    first_line: dict[str, int] = {}
    repeated = 0
    for line, row in enumerate(frame.itertuples(index=False), start=2):
        if all(field in ("", None) for field in row):
            continue  # a blank line
        word, value = row[frame.columns.get_loc("Word")], row[frame.columns.get_loc("Conc.M")]
        where = f"concreteness norms {source} line {line}"
        key = " ".join(str(word).lower().split())
        if not key:
            raise NormsError(f"{where}: the Word field is empty")
        try:
            rating = float(value)
        except (TypeError, ValueError):
            rating = math.nan
        if not math.isfinite(rating):
            raise NormsError(f"{where}: Conc.M {value!r} is not a rating (a number from 1 to 5)")
        if not NORMS_SCALE[0] <= rating <= NORMS_SCALE[1]:
            raise NormsError(f"{where}: Conc.M {rating} is outside Brysbaert's scale {NORMS_SCALE[0]:g} to "
                             f"{NORMS_SCALE[1]:g}")
        if key in ratings:
            if ratings[key] != rating:
                raise NormsError(f"{where}: {key!r} is rated again ({rating}; line {first_line[key]} gave "
                                 f"{ratings[key]})")
            repeated += 1
            continue
        ratings[key], first_line[key] = rating, line
    if repeated:
        log.warning("concreteness norms %s: %d repeated rows with the same rating skipped", source, repeated)
    return ratings


UNVERIFIED = "unverified"  # sha256 value that accepts downloaded norms without a checksum, explicitly


def checksum_required(location: str | Path | None, sha256: str | None) -> bool:
    """True when `location` is a URL and no checksum (nor the explicit opt-out UNVERIFIED) is given: the
    bytes of a download are only trusted against a known sha256."""
    return str(location).startswith(("http://", "https://")) and sha256 is None


def load_norms(path: str | Path | None = None, sha256: str | None = None) -> Norms:
    """The norms at `path` (file or http(s) URL), or the shipped subset when `path` is None.

    With `sha256`, the file's checksum must match; a mismatch or a missing file raises NormsError naming
    the location and the expected checksum. A URL needs a sha256 (or sha256 = UNVERIFIED, the opt-out).
    """
    if checksum_required(path, sha256):
        raise NormsError(f"concreteness norms {path}: a download needs its sha256 (config key "
                         f"concreteness.sha256), or sha256: {UNVERIFIED} to read it unchecked")
    if sha256 == UNVERIFIED:
        sha256 = None
    location = str(path) if path is not None else str(SHIPPED_NORMS)
    try:
        data = _read_bytes(location)
    except NormsError as error:
        raise NormsError(f"{error}; expected sha256 {sha256}") from error
    digest = hashlib.sha256(data).hexdigest()
    if sha256 is not None and digest != sha256.lower():
        raise NormsError(f"concreteness norms {location}: sha256 {digest} does not match the expected "
                         f"{sha256} (config key concreteness.sha256)")
    if sha256 is None and path is not None:
        log.warning("concreteness norms %s read without a checksum (sha256 %s)", location, digest)
    norms = Norms(parse_norms(data, location), location)
    log.info("read %d concreteness ratings from %s", len(norms), location)
    return norms


@dataclass
class CandidateRatings:
    candidates: list[str]
    candidate_tokens: list[int]
    ratings: list[float]  # NaN where the norms lack the candidate


def rate_candidates(tokens: Sequence[str], lemmas: Sequence[str], candidates: Sequence[int],
                    norms: Norms) -> CandidateRatings:
    """Look up each keyword candidate (two-word expressions first; see module docstring)."""
    is_candidate = set(candidates)
    result = CandidateRatings([], [], [])
    skip = -1
    for i in candidates:
        if i <= skip:
            continue
        found: tuple[str, float] | None = None
        if i + 1 in is_candidate:
            for pair in (f"{lemmas[i]} {lemmas[i + 1]}", f"{tokens[i]} {tokens[i + 1]}"):
                rating = norms.rating(pair)
                if rating is not None:
                    found, skip = (pair.lower(), rating), i + 1
                    break
        if found is None:
            for word in (lemmas[i], tokens[i]):
                rating = norms.rating(word)
                if rating is not None:
                    found = (word.lower(), rating)
                    break
        word, rating = found if found is not None else (lemmas[i].lower(), math.nan)
        result.candidates.append(word)
        result.candidate_tokens.append(i)
        result.ratings.append(rating)
    return result


@dataclass
class QuotaBalancer:
    """Deficit-based quota sampling between attribute and object (module docstring, step 2)."""

    targets: dict[str, float] = field(default_factory=lambda: {"attribute": 0.5, "object": 0.5})
    counts: dict[str, int] = field(default_factory=lambda: {"attribute": 0, "object": 0})

    def choose(self, enabled: Sequence[str], rng: random.Random) -> str | None:
        options = [c for c in self.targets if c in enabled]
        if not options:
            return None
        total = sum(self.counts.values()) + 1
        deficits = {c: self.targets[c] * total - self.counts[c] for c in options}
        best = max(deficits.values())
        tied = [c for c in options if math.isclose(deficits[c], best)]
        choice = tied[rng.randrange(len(tied))] if len(tied) > 1 else tied[0]
        self.counts[choice] += 1
        return choice


def _children(heads: Sequence[int]) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in heads]
    for i, h in enumerate(heads):
        if h != i:
            out[h].append(i)
    return out


def category_tokens(parsed: ParsedCaption) -> dict[str, set[int]]:
    """Token indices that can carry each ARO category's keyword (module docstring, step 2)."""
    children = _children(parsed.heads)
    table = relation_table()
    words = [t.lower() for t in parsed.tokens]
    relation: set[int] = set()
    for i, pos in enumerate(parsed.pos):
        phrase = relation_at(parsed.tokens, i)
        if phrase is not None and phrase[0] > 1:
            relation.add(i)
        if pos == "ADP":
            objects = [c for c in children[i] if parsed.deps[c] == "pobj"]
            if objects and (words[i],) in table:
                relation.add(i)
            relation.update(o for o in objects if (words[o],) in table and parsed.pos[o] in ("NOUN", "ADJ"))
        if pos == "VERB":
            deps = {parsed.deps[c] for c in children[i]}
            if "nsubj" in deps and "dobj" in deps:
                relation.add(i)
    attribute = {i for i, p in enumerate(parsed.pos) if p in ("ADJ", "NUM") and i not in relation}
    attribute |= {i for i, p in enumerate(parsed.pos)
                  if p == "VERB" and parsed.tags[i] in ("VBN", "VBG") and parsed.deps[i] in ("amod", "acl")
                  and parsed.pos[parsed.heads[i]] in ("NOUN", "PROPN") and i not in relation}
    obj = {i for i, p in enumerate(parsed.pos) if p in ("NOUN", "PROPN") and i not in relation}
    return {"relation": relation, "attribute": attribute, "object": obj}


@dataclass(frozen=True)
class KeywordChoice:
    category: str
    token: int          # first token of the keyword
    length: int         # tokens (2 for a two-word expression)
    keyword: str        # lemma or expression as rated
    rating: float       # NaN when unrated (wo only)


def softmax_top_k(scores: Sequence[float], top_k: int, temperature: float) -> list[tuple[int, float]]:
    """(index, probability) of the top_k highest scores, probabilities softmax(score / temperature);
    ties at the cut are broken by position (earlier first)."""
    ranked = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:top_k]
    top = max(scores[i] for i in ranked)
    weights = [math.exp((scores[i] - top) / temperature) for i in ranked]
    total = sum(weights)
    return [(i, w / total) for i, w in zip(ranked, weights, strict=True)]


def _draw(options: Sequence[tuple[int, float]], rng: random.Random) -> int:
    u, cumulative = rng.random(), 0.0
    for index, probability in options:
        cumulative += probability
        if u < cumulative:
            return index
    return options[-1][0]


def choose_keyword(parsed: ParsedCaption, rated: CandidateRatings, policy: str, balancer: QuotaBalancer,
                   rng: random.Random, top_k: int = 3, temperature: float = 1.0) -> KeywordChoice | None:
    """The keyword ConcretePlant perturbs in this caption under `policy` (None: no eligible keyword)."""
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r}: unknown (known: {', '.join(POLICIES)})")
    tokens = category_tokens(parsed)
    eligible: dict[str, list[int]] = {}
    for category in CATEGORIES:
        eligible[category] = [j for j, t in enumerate(rated.candidate_tokens) if t in tokens[category]
                              and (policy == "wo" or not math.isnan(rated.ratings[j]))]
    if eligible["relation"]:
        category = "relation"
    else:
        category = balancer.choose([c for c in ("attribute", "object") if eligible[c]], rng)
        if category is None:
            return None
    pool = eligible[category]
    if policy == "wo":
        j = pool[rng.randrange(len(pool))]
    else:
        sign = 1.0 if policy == "hc" else -1.0
        options = softmax_top_k([sign * rated.ratings[j] for j in pool], top_k, temperature)
        j = pool[_draw(options, rng)]
    return KeywordChoice(category, rated.candidate_tokens[j], len(rated.candidates[j].split()),
                         rated.candidates[j], rated.ratings[j])


def choose_keywords(parsed: Sequence[ParsedCaption], norms: Norms, policy: str, rngs: Sequence[random.Random],
                    top_k: int = 3, temperature: float = 1.0) -> list[KeywordChoice | None]:
    """ConcretePlant's keyword of every caption of a dataset, in table order, with one set of global
    ARO-category quotas (module docstring); each caption draws from its own RNG in `rngs`. A caption
    without tokens gets None and leaves its RNG untouched."""
    balancer = QuotaBalancer()
    choices: list[KeywordChoice | None] = []
    for caption, rng in zip(parsed, rngs, strict=True):
        if not caption.tokens:
            choices.append(None)
            continue
        rated = rate_candidates(caption.tokens, caption.lemmas, caption.keyword_candidates, norms)
        choices.append(choose_keyword(caption, rated, policy, balancer, rng, top_k, temperature))
    return choices


def score_parse(parse: str | Path, out: str | Path, norms: str | Path | Norms | None = None,
                sha256: str | None = None, seed: int = 0, top_k: int = 3, temperature: float = 1.0) -> None:
    """Write the `concreteness` table: every keyword candidate of every parsed caption, rated, and the
    keyword ConcretePlant perturbs under each policy (`choose_keywords`, with the RNG streams the
    negatives stage gives the captions, so both stages pick the same keyword).

    `norms` is a loaded Norms, a path/URL (checked against `sha256`), or None for the shipped subset.
    """
    parsed = read_table(parse, "parse")
    table = norms if isinstance(norms, Norms) else load_norms(norms, sha256)
    rows, missing = [], Counter()
    for row in parsed.itertuples(index=False):
        candidates = [int(i) for i in row.keyword_candidates]
        rated = rate_candidates(list(row.tokens), list(row.lemmas), candidates, table)
        known = [r for r in rated.ratings if not math.isnan(r)]
        missing.update(c for c, r in zip(rated.candidates, rated.ratings, strict=True) if math.isnan(r))
        rows.append({
            "caption_id": row.caption_id,
            "candidates": rated.candidates,
            "candidate_tokens": rated.candidate_tokens,
            "ratings": rated.ratings,
            "n_rated": len(known),
            "mean_rating": sum(known) / len(known) if known else None,
        })
    captions = [ParsedCaption.from_row(record) for record in parsed.to_dict("records")]
    for policy in POLICIES:
        rngs = [caption_rng(seed, caption_id) for caption_id in parsed["caption_id"]]
        choices = choose_keywords(captions, table, policy, rngs, top_k, temperature)
        for record, choice in zip(rows, choices, strict=True):
            record[f"keyword_{policy}"] = None if choice is None else choice.keyword
            record[f"rating_{policy}"] = None if choice is None or math.isnan(choice.rating) else choice.rating
            record[f"category_{policy}"] = None if choice is None else choice.category
    policy_columns = [f"{c}_{p}" for p in POLICIES for c in ("keyword", "rating", "category")]
    frame = pd.DataFrame(rows, columns=["caption_id", "candidates", "candidate_tokens", "ratings", "n_rated",
                                        "mean_rating", *policy_columns])
    frame = frame.astype({"caption_id": str, "n_rated": "int64", "mean_rating": "float64",
                          **{f"rating_{p}": "float64" for p in POLICIES}})
    write_table(frame, out, "concreteness")
    n_candidates = sum(len(c) for c in frame["candidates"])
    log.info("rated %d keyword candidates of %d captions with %s; %d candidates (%d distinct) not in norms",
             n_candidates, len(frame), table.source, sum(missing.values()), len(missing))
    if missing:
        common = ", ".join(f"{w} ({n})" for w, n in missing.most_common(20))
        log.info("most frequent unrated candidates: %s", common)


def dataset_attributes(manifest: pd.DataFrame, parsed: pd.DataFrame, norms: Norms, dataset: str) -> pd.DataFrame:
    """Seed 004's data attributes of one training dataset, as a one-row table.

    images               distinct image_id of the manifest
    captions             rows of the manifest
    mean_caption_words   mean words per caption (the parse's n_words: tokens other than punctuation)
    vocabulary_coverage  share of the reference vocabulary the captions use: |V_data & V_ref| / |V_ref|,
                         V_data the lower-cased lemmas and words of the captions, V_ref the single words of
                         the concreteness norms in use (the full Brysbaert list, ~37k words, or the shipped
                         subset, i.e. the world's vocabulary). Seed 004 compares datasets by the share of a
                         common vocabulary they cover; the norms are that common reference here.
    vocabulary_size      distinct lower-cased lemmas of the captions
    mean_yngve           mean over captions of the caption's mean Yngve depth (`compo.parse`)
    """
    reference = {w for w in norms.ratings if " " not in w}
    used: set[str] = set()
    lemmas: set[str] = set()
    for tokens, lemma_list, pos in zip(parsed["tokens"], parsed["lemmas"], parsed["pos"], strict=True):
        for token, lemma, tag in zip(tokens, lemma_list, pos, strict=True):
            if tag in ("PUNCT", "SPACE", "NUM") or not token.strip():
                continue
            lemmas.add(lemma.lower())
            used |= {lemma.lower(), token.lower()}
    return pd.DataFrame([{
        "dataset": dataset,
        "images": int(manifest["image_id"].nunique()),
        "captions": len(manifest),
        "mean_caption_words": float(parsed["n_words"].mean()) if len(parsed) else math.nan,
        "vocabulary_coverage": len(used & reference) / len(reference) if reference else math.nan,
        "vocabulary_size": len(lemmas),
        "reference_vocabulary": len(reference),
        "mean_yngve": float(parsed["yngve_mean"].mean()) if len(parsed) else math.nan,
        "norms": norms.source,
    }])


def write_dataset_attributes(manifest: str | Path, parse: str | Path, out: str | Path, dataset: str,
                             norms: str | Path | None = None, sha256: str | None = None) -> None:
    """The `dataset_attributes` row of one dataset as a CSV (results/tables/datasets/{dataset}.csv)."""
    table = dataset_attributes(read_table(manifest, "manifest"), read_table(parse, "parse"),
                               load_norms(norms, sha256), dataset)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out, index=False)
    log.info("dataset attributes of %s: %s", dataset, table.iloc[0].to_dict())
