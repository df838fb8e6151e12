"""Hard negative captions: the generator registry and the negatives stage.

Generators live one per module and register by config name (`negatives.<name>.generator`); see
`compo.negatives.base` for the shared contract. `generate_negatives` is the workflow stage: it writes K
slots per caption (the `negatives` contract) and a report CSV.

Truth labels come from the synthetic world's checker, `compo.world.caption_holds(scene, text)`:
"false" (the negative contradicts the image: a true negative), "true" (it still holds: an accidental
hard positive), "unknown" (no scene, or the checker cannot read the text).

Report (one row per group: "all", then each negative type):
  captions                         all: captions; type rows: captions with a valid negative of the type
  captions_without_valid_negative  all only: captions none of whose K slots could be filled
  slots, valid                     all: every slot and the valid ones; type rows: valid negatives of the type
  valid_rate                       all: valid / slots; type rows: the type's share of all valid negatives
  truth_false/true/unknown         counts over the row's valid negatives; false/true/unknown_rate: shares
  slots_<reason>                   all only: slots by reason (ok, exhausted, duplicate, ...)
  rejected_<reason>                all only: candidates the generator discarded, by reason
Quality rows follow: group "concreteness:[1,2)" .. "concreteness:[4,5]" and "concreteness:unrated"
(valid negatives by the mean rating of the changed keyword candidates), with the same truth columns; the
"all" row's captions_without_valid_negative / captions is the share of captions left without a negative.

Sharding (LLM generators; config key `shards`): shard i of N writes the i-th of N contiguous blocks of the
parse table. Every generator gets the whole table and the shard's rows (`sample_batch(..., rows)`), so
draws that depend on other captions (ConcretePlant's global ARO-category quotas, random-caption's pool)
are those of the unsharded run, and each caption draws from its own RNG: the gathered shards equal the
unsharded table. `gather_negatives` concatenates the shard tables in order and writes the report over
the whole.
Image negatives: with `images: true` (the world) `compo.negatives.images.render_negative_images` fills the
nullable `negative_image` column here (null where no scene edit realizes the negative); with an `images`
mapping (real data) the column stays null in this table and `compo.negatives.diffusion` (SDXL-Turbo
img2img, its own rule and environment) writes the table with images.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from compo.io import atomic_dir, read_table, write_table
from compo.negatives import concreteplant, llm, random_caption, released, rules, swap  # noqa: F401  (register the generators)
from compo.negatives.base import (
    GENERATORS,
    Negative,
    NegativeGenerator,
    Proposal,
    build_generator,
    caption_rng,
)
from compo.negatives.tables import (  # noqa: F401  (re-exported)
    CONCRETENESS_BINS,
    TRUTH_VALUES,
    combine_reports,
    negatives_report,
    shard_bounds,
)
from compo.parse import ParsedCaption
from compo.progress import progress

__all__ = ["GENERATORS", "Negative", "NegativeGenerator", "Proposal", "build_generator", "caption_rng",
           "combine_reports", "gather_negatives", "generate_negatives", "truth_label", "negatives_report",
           "CONCRETENESS_BINS"]

log = logging.getLogger(__name__)
NEGATIVES_COLUMNS = ["caption_id", "slot", "negative", "type", "keyword", "concreteness", "generator", "valid",
                     "reason", "truth", "negative_image"]


def truth_label(scene: dict[str, Any] | None, text: str) -> str:
    """The world's verdict on a negative: 'false', 'true' or 'unknown'."""
    if scene is None:
        return "unknown"
    from compo.world import caption_holds

    holds = caption_holds(scene, text)
    return "unknown" if holds is None else ("true" if holds else "false")


def _span_concreteness(spans: tuple[tuple[int, int], ...], candidate_tokens: list[int],
                       ratings: list[float]) -> float | None:
    """Mean rating of the keyword candidates starting inside the changed spans (None if none is rated)."""
    inside = [r for t, r in zip(candidate_tokens, ratings, strict=True)
              if not math.isnan(r) and any(s <= t < e for s, e in spans)]
    return sum(inside) / len(inside) if inside else None


def _scene(value: Any, manifest: str | Path, caption_id: str) -> dict[str, Any] | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError as error:
        raise ValueError(f"{manifest}: caption_id {caption_id!r}: scene is not JSON ({error})") from error


def generate_negatives(manifest: str | Path, parse: str | Path, spec: dict[str, Any], seed: int,
                       out: str | Path, report: str | Path, concreteness: str | Path | None = None,
                       shard: int = 0, n_shards: int = 1, images_dir: str | Path | None = None) -> None:
    """Write K negative slots per caption of `parse` (the `negatives` table) and the report CSV.

    `spec` is the generator's config entry ({generator, k, images, ...options}); each caption draws from
    its own RNG seeded by (seed, caption_id). With a `concreteness` table, each negative gets the mean
    Brysbaert rating of the keyword candidates inside the changed spans (null when none is rated, e.g. an
    adverb swap: adverbs are not keyword candidates in seed 002's POS set). With `n_shards` > 1 only
    shard `shard`'s captions are written (module docstring). Image negatives (`images: true`) go to
    `images_dir` (default: `out` without its suffix); given, the folder is written even when empty. It
    appears complete, before the table, or not at all (compo.io.atomic_dir): a killed job leaves no part.
    """
    if "k" not in spec:
        raise ValueError("config key negatives.<name>.k: missing")
    k = int(spec["k"])
    generator = build_generator(spec)
    frame = read_table(manifest, "manifest").set_index("caption_id")
    parsed_table = read_table(parse, "parse")
    first, last = shard_bounds(len(parsed_table), shard, n_shards)
    everything = parsed_table.to_dict("records")
    records = everything[first:last]
    rated: dict[str, tuple[list[int], list[float]]] = {}
    if concreteness is not None:
        for row in read_table(concreteness, "concreteness").itertuples(index=False):
            rated[row.caption_id] = ([int(t) for t in row.candidate_tokens], [float(r) for r in row.ratings])
    for record in records:
        caption_id = record["caption_id"]
        if caption_id not in frame.index:
            raise ValueError(f"{parse}: caption_id {caption_id!r} is not in the manifest {manifest}")
        if concreteness is not None and caption_id not in rated:
            raise ValueError(f"{concreteness}: caption_id {caption_id!r} of {parse} has no concreteness row")

    # the generator sees the whole table (ConcretePlant's quotas and random-caption's pool are global)
    # and generates the shard's rows: a sharded run writes exactly the unsharded rows
    parsed = [ParsedCaption.from_row(record) for record in everything]
    generator.use_caption_words(token for caption in parsed for token in caption.tokens)  # vocabulary: captions
    rngs = [caption_rng(seed, record["caption_id"]) for record in everything]
    caption_ids = [record["caption_id"] for record in records]
    rows: Iterable[int] = range(first, last)
    if getattr(generator, "llm", None) is None:  # rule-based generators go caption by caption: a bar
        rows = progress(rows, desc=f"negatives {generator.name}", unit="caption")
    results = generator.sample_batch(parsed, rngs, k, rows=rows)
    rows: list[dict[str, Any]] = []
    rejected: Counter[str] = Counter()
    for caption_id, (drawn, proposal) in zip(caption_ids, results, strict=True):
        scene = _scene(frame.at[caption_id, "scene"], manifest, caption_id)
        rejected.update(proposal.rejected)
        for slot in range(k):
            if slot < len(drawn):
                negative = drawn[slot]
                rows.append({
                    "caption_id": caption_id, "slot": slot, "negative": negative.text, "type": negative.type,
                    "keyword": negative.keyword,
                    "concreteness": _span_concreteness(negative.token_spans, *rated[caption_id])
                    if concreteness is not None else None,
                    "generator": generator.name, "valid": True, "reason": "ok",
                    "truth": truth_label(scene, negative.text), "negative_image": None,
                })
            else:
                rows.append({
                    "caption_id": caption_id, "slot": slot, "negative": None, "type": "none", "keyword": None,
                    "concreteness": None, "generator": generator.name, "valid": False,
                    "reason": proposal.shortfall_reason(), "truth": "unknown", "negative_image": None,
                })

    table = _typed(pd.DataFrame(rows, columns=NEGATIVES_COLUMNS))
    if spec.get("images") is True or images_dir is not None:  # a mapping is SDXL-Turbo's later rule
        folder = Path(images_dir) if images_dir is not None else Path(out).with_suffix("")
        with atomic_dir(folder) as partial:
            if spec.get("images") is True:  # the world's exact re-render
                rendered = _render_images(table, frame.reset_index(), partial)
                # the rows name each image where it ends up, in `folder`
                table["negative_image"] = rendered.map(lambda p: None if p is None else str(folder / Path(p).name))
    write_table(table, out, "negatives")
    _write_report(table, rejected, report, generator.name)


def _typed(table: pd.DataFrame) -> pd.DataFrame:
    table = table.astype({"caption_id": str, "slot": "int64", "type": str, "concreteness": "float64",
                          "generator": str, "valid": bool, "reason": str, "truth": str})
    table["negative_image"] = table["negative_image"].astype(object)
    return table


def _render_images(table: pd.DataFrame, manifest: pd.DataFrame, out_dir: Path) -> pd.Series:
    """Exact image negatives: the world scene re-rendered so the negative caption holds."""
    from compo.negatives.images import render_negative_images

    return render_negative_images(table, manifest, out_dir)


def _write_report(table: pd.DataFrame, rejected: Counter[str], report: str | Path, name: str) -> None:
    summary = negatives_report(table, rejected)
    Path(report).parent.mkdir(parents=True, exist_ok=True)
    summary.to_csv(report, index=False)
    overall = summary.iloc[0]
    log.info("%s: %d captions, %d of %d slots valid, %d captions without a valid negative; truth of valid "
             "negatives: %d false, %d true (hard positives), %d unknown", name, overall["captions"],
             overall["valid"], overall["slots"], overall["captions_without_valid_negative"],
             overall["truth_false"], overall["truth_true"], overall["truth_unknown"])
    reasons = {c.removeprefix("rejected_"): int(overall[c]) for c in summary.columns
               if c.startswith("rejected_") and pd.notna(overall[c])}
    if reasons:
        log.info("%s: rejected candidates by reason: %s", name, reasons)


def gather_negatives(shards: list[str | Path], out: str | Path, report: str | Path,
                     rejected_counts: list[str | Path] | None = None) -> None:
    """Concatenate shard tables (in shard order) into one negatives table and write its report; shard
    reports (`rejected_counts`, the shards' report CSVs) contribute their rejected_<reason> counts."""
    tables = [read_table(path, "negatives") for path in shards]
    table = _typed(pd.concat(tables, ignore_index=True))
    duplicated = table.duplicated(["caption_id", "slot"])
    if duplicated.any():
        first = table["caption_id"][duplicated].iloc[0]
        raise ValueError(f"shards {list(map(str, shards))} overlap: caption {first!r}")
    rejected: Counter[str] = Counter()
    for path in rejected_counts or []:
        first = pd.read_csv(path).iloc[0]
        rejected.update({c.removeprefix("rejected_"): int(first[c]) for c in first.index
                         if c.startswith("rejected_") and pd.notna(first[c])})
    write_table(table, out, "negatives")
    _write_report(table, rejected, report, str(table["generator"].iloc[0]) if len(table) else "empty")
