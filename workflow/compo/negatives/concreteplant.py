"""ConcretePlant (seed 002, section 2.2 and appendix A.1): concreteness-targeted keyword replacement.

Per caption, the keyword is chosen by `compo.concreteness.choose_keywords` (candidates rated with
Brysbaert's norms, an ARO category from global quotas, a keyword drawn by policy hc / lc / wo; see that
module), the same function the concreteness stage writes into its table; then it is replaced:
- backend `rules`: `compo.negatives.lexicon.keyword_edits` (WordNet or the relation table);
- backend `vllm` | `transformers`: an LLM with the appendix A.2 prompt (`compo.llm`), the completions
  validated and drawn by `compo.negatives.llm.run_requests`.
The negatives stage hands `sample_batch` the whole parse table with the rows of its shard: keywords are
chosen over every caption (the quotas are global), replacements made for the shard's rows only, so a
sharded run writes exactly the unsharded negatives. A caption's RNG is consumed by the keyword choice
first, then by the replacement draws.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import pandas as pd

from compo.concreteness import (
    CATEGORIES,
    POLICIES,
    KeywordChoice,
    Norms,
    QuotaBalancer,
    choose_keyword,
    choose_keywords,
    load_norms,
    rate_candidates,
)
from compo.llm import LLMSettings, concreteplant_requests
from compo.negatives.base import Negative, NegativeGenerator, Proposal, register
from compo.negatives.lexicon import apply_edit, keyword_edits
from compo.negatives.llm import run_requests
from compo.parse import ParsedCaption

BACKENDS = ("rules", "vllm", "transformers")


@register("concreteplant")
class ConcretePlant(NegativeGenerator):
    """D_hc / D_lc / D_wo negatives: one keyword per caption chosen by `policy`, then replaced.
    Registered as `concreteplant` (policy option) and `concreteplant-hc|lc|wo` (policy fixed)."""

    def __init__(self, policy: str = "hc", top_k: int = 3, temperature: float = 1.0, backend: str = "rules",
                 norms: str | None = None, sha256: str | None = None, max_per_word: int = 5,
                 vocabulary: str = "any", **llm_options: Any):
        if policy not in POLICIES:
            raise ValueError(f"policy {policy!r}: unknown (known: {', '.join(POLICIES)})")
        if int(top_k) < 1 or float(temperature) <= 0:
            raise ValueError(f"top_k {top_k} must be >= 1 and temperature {temperature} > 0")
        if backend not in BACKENDS:
            raise ValueError(f"backend {backend!r}: unknown (known: {', '.join(BACKENDS)})")
        if backend == "rules" and llm_options:
            raise ValueError(f"options {sorted(llm_options)} need an LLM backend (backend: vllm | transformers)")
        self.policy, self.top_k, self.temperature = policy, int(top_k), float(temperature)
        self.backend, self.max_per_word = backend, int(max_per_word)
        if backend != "rules" and vocabulary != "any":
            raise ValueError(f"vocabulary {vocabulary!r} restricts rule replacements (backend: rules)")
        self.set_vocabulary(vocabulary)
        self._norms_source = (norms, sha256)  # read when first needed: validating a config reads no data
        self._norms: Norms | None = None
        self.balancer = QuotaBalancer()
        self.llm = None
        if backend != "rules":
            self.llm = LLMSettings.from_options(backend=backend, **llm_options)

    @property
    def norms(self) -> Norms:
        if self._norms is None:
            self._norms = load_norms(*self._norms_source)
        return self._norms

    def choose(self, parsed: ParsedCaption, rng: random.Random) -> KeywordChoice | None:
        """The keyword of one caption drawn on its own (online use), the quotas running over this
        generator's calls; the negatives stage uses `sample_batch`, whose quotas run over the dataset."""
        if not parsed.tokens:
            return None
        rated = rate_candidates(parsed.tokens, parsed.lemmas, parsed.keyword_candidates, self.norms)
        return choose_keyword(parsed, rated, self.policy, self.balancer, rng, self.top_k, self.temperature)

    def sample(self, parsed: ParsedCaption, rng: random.Random, k: int) -> tuple[list[Negative], Proposal]:
        return self.replace(parsed, self.choose(parsed, rng), rng, k)

    def replace(self, parsed: ParsedCaption, choice: KeywordChoice | None, rng: random.Random,
                k: int) -> tuple[list[Negative], Proposal]:
        """Rule replacements of the chosen keyword, at most k drawn with the caption's RNG."""
        if self.llm is not None:
            requests = concreteplant_requests([parsed], [choice], self.policy)
            return run_requests(self.llm, [parsed], requests, [rng], k)[0]
        proposal = Proposal()
        if choice is None:
            proposal.rejected["no_keyword"] += 1
            return [], proposal
        offsets = parsed.token_offsets()
        seen = {parsed.caption}
        negatives = []
        for edit in keyword_edits(parsed, choice.token, self.max_per_word, choice.length, self.caption_words):
            text = apply_edit(parsed, edit, offsets)
            if text in seen:
                proposal.rejected["identical_to_caption" if text == parsed.caption else "duplicate"] += 1
                continue
            seen.add(text)
            old = parsed.caption[offsets[edit.start][0]:offsets[edit.end - 1][1]]
            negatives.append(Negative(text, choice.category, f"{old}|{edit.text}", ((edit.start, edit.end),)))
        if not negatives:
            proposal.rejected["no_replacement"] += 1
        proposal.by_type[choice.category] = negatives
        return rng.sample(negatives, min(k, len(negatives))), proposal

    def sample_batch(self, parsed: Sequence[ParsedCaption], rngs: Sequence[random.Random], k: int,
                     rows: Sequence[int] | None = None) -> list[tuple[list[Negative], Proposal]]:
        """Keywords chosen over every caption of `parsed` (global quotas), replaced for `rows` only; an
        LLM backend gets all of the rows' prompts in one batch."""
        rows = range(len(parsed)) if rows is None else rows
        choices = choose_keywords(parsed, self.norms, self.policy, rngs, self.top_k, self.temperature)
        if self.llm is None:
            return [self.replace(parsed[i], choices[i], rngs[i], k) for i in rows]
        kept = [parsed[i] for i in rows]
        requests = concreteplant_requests(kept, [choices[i] for i in rows], self.policy)
        return run_requests(self.llm, kept, requests, [rngs[i] for i in rows], k)


def _fixed_policy(policy: str) -> type[ConcretePlant]:
    class Fixed(ConcretePlant):
        def __init__(self, **options: Any):
            if options.pop("policy", policy) != policy:
                raise ValueError(f"generator concreteplant-{policy} has policy {policy}; drop the policy key")
            super().__init__(policy=policy, **options)

    Fixed.__name__ = Fixed.__qualname__ = f"ConcretePlant{policy.upper()}"
    return register(f"concreteplant-{policy}")(Fixed)


for _policy in POLICIES:
    _fixed_policy(_policy)


def concreteplant_statistics(table: pd.DataFrame) -> pd.DataFrame:
    """Seed 002 Table 1's data statistics per policy from the extended concreteness table: captions with
    a keyword, mean and median c_i (the chosen keyword's rating), unique keywords, category shares."""
    rows = []
    for policy in POLICIES:
        if f"keyword_{policy}" not in table.columns:
            continue
        chosen = table[table[f"keyword_{policy}"].notna()]
        ratings = chosen[f"rating_{policy}"].dropna()
        categories = chosen[f"category_{policy}"].value_counts()
        rows.append({
            "policy": policy, "captions": len(table), "with_keyword": len(chosen),
            "mean_c": float(ratings.mean()) if len(ratings) else math.nan,
            "median_c": float(ratings.median()) if len(ratings) else math.nan,
            "unique_keywords": int(chosen[f"keyword_{policy}"].nunique()),
            **{f"share_{c}": (int(categories.get(c, 0)) / len(chosen) if len(chosen) else math.nan)
               for c in CATEGORIES},
        })
    return pd.DataFrame(rows)


def negative_pairs(negatives: pd.DataFrame, manifest: pd.DataFrame) -> pd.DataFrame:
    """(caption_id, image_path, caption, negative) of every valid negative: the pairs on which the base
    model's I2T / T2I accuracy of seed 002 Table 1 is computed (caption vs negative for the image)."""
    valid = negatives[negatives["valid"]][["caption_id", "slot", "negative", "type", "keyword"]]
    columns = manifest[["caption_id", "image_path", "caption"]]
    return valid.merge(columns, on="caption_id", how="left", validate="many_to_one")[
        ["caption_id", "slot", "image_path", "caption", "negative", "type", "keyword"]]
