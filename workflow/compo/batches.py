"""Training data: a manifest (and optionally its hard negatives) turned into batches of tensors.

The order of captions is a pure function of (seed, epoch), so a run resumed at any step sees exactly
the batches an uninterrupted run sees. What a batch carries beyond images and token ids is decided by
the loss (`compo.losses.LossSpec.needs`): each need names a batch part, and every part is defined here
(`BATCH_PARTS`, section "batch parts"): `negatives` (the offline table's hard negatives, NegCLIP, DeGLA,
Cement), `cement_pairs` (their concreteness and images), `noun_phrases` (C2LIP), `online_negatives`
(FSC-CLIP) and `hard_images` (NegCLIP's nearest-neighbour images: more rows of images, captions and
negatives). What a part draws at random comes from the caption's own stream (`compo.rng.caption_rng`),
so it does not depend on the batch's other captions.

`batch_loader` is the torch DataLoader the trainer reads: its sampler (`StepSampler`) yields per step
the rows `epoch_order` assigns to it (this rank's slice under torchrun), and worker processes build the
batches (decode and transform images, tokenize, draw online negatives from per-caption streams), so a
batch is the same whichever process builds it and however many workers there are. A worker keeps the
decoded, transformed images it has built in memory up to a byte budget (the transform is fixed, so a
cached image is the image).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from PIL import Image, UnidentifiedImageError

from compo.accumulate import split_rows
from compo.caption_rows import CaptionRows
from compo.images import image_exists, image_source
from compo.io import contract_schema, read_table
from compo.losses import ONLINE_SPECS_KEY
from compo.parse import ROW_COLUMNS, ParsedCaption
from compo.rng import caption_rng
from compo.shards import split_member, stage
from compo.validation import split_holdout

log = logging.getLogger(__name__)


class TrainingDataError(ValueError):
    """The training data cannot be used; the message names the file and caption."""


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The permutation of the n captions used in `epoch` of a run seeded by `seed`."""
    generator = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0]))
    return torch.randperm(n, generator=generator)


def paired_order(order: torch.Tensor, partners: np.ndarray, batch_size: int) -> list[int]:
    """`order` (an epoch's permutation of the rows) with every pair of partners (`partners[r]`: the row of
    r's partner, -1 for none) in one batch of `batch_size`: a pair takes the place of whichever of its rows
    comes first in `order`, its two rows side by side, and a pair that a batch boundary would split moves
    whole into the next batch, the first row there without a partner taking its first row's place (into
    this batch when the next holds only pairs). The rows stay those of `order`, each once; only two
    neighbouring batches without an unpaired row between them could still split a pair."""
    rows: list[int] = []
    placed = np.zeros(len(partners), dtype=bool)
    for row in order.tolist():
        if placed[row]:
            continue
        partner = int(partners[row])
        rows.extend((row, partner) if partner >= 0 else (row,))
        placed[row] = True
        if partner >= 0:
            placed[partner] = True
    for boundary in range(batch_size, len(rows), batch_size):
        if partners[rows[boundary - 1]] != rows[boundary]:
            continue
        after = [j for j in range(boundary + 1, min(boundary + batch_size, len(rows))) if partners[rows[j]] < 0]
        before = [j for j in range(boundary - batch_size, boundary - 1) if partners[rows[j]] < 0]
        if after:  # the pair moves into the next batch
            rows[boundary - 1], rows[after[0]] = rows[after[0]], rows[boundary - 1]
        elif before:  # that batch holds only pairs: the pair moves back into this one
            rows[boundary], rows[before[-1]] = rows[before[-1]], rows[boundary]
    return rows


def shard_records(rows: pd.DataFrame) -> dict[str, tuple[int, str]]:
    """Shard path -> (bytes, sha256) as the dataset stage recorded them (manifest columns shard_bytes, shard_sha256;
    absent in a manifest of an older compo, or of images stored as files: then {})."""
    if not {"shard_bytes", "shard_sha256"} <= set(rows.columns):
        return {}
    first = rows.drop_duplicates("image_path").dropna(subset=["shard_sha256"])
    return {split_member(path)[0]: (int(size), sha) for path, size, sha in
            zip(first["image_path"], first["shard_bytes"], first["shard_sha256"], strict=True) if split_member(path)}


# Cement: the negatives table's nullable column with the PNG path of an image the negative caption is true of
NEGATIVE_IMAGE_COLUMN = "negative_image"


class HardNegative(NamedTuple):
    """One usable row of a negatives table: its text, the changed keyword's concreteness (NaN when
    unknown) and the PNG path of an image it is true of (Cement's image negative; None when absent)."""

    text: str
    concreteness: float
    image: str | None


def read_negatives(path: str | Path, caption_ids: Sequence[str], *, drop_true: bool = False
                   ) -> dict[str, list[HardNegative]]:
    """Every usable negative per caption id, in slot order (the negatives contract table): valid, with
    a text and, when `drop_true`, not proven true of the caption's own image by the world's truth
    checker (truth 'true'; such a 'negative' is a mislabelled positive). Dropped rows are counted."""
    table = read_table(path, "negatives")
    valid = table[table["valid"] & table["negative"].notna()]
    proven_true = valid["truth"] == "true"
    if drop_true:
        valid = valid[~proven_true]
    valid = valid.sort_values(["caption_id", "slot"], kind="stable")
    known = set(caption_ids)
    unknown = set(valid["caption_id"]) - known
    if unknown and len(unknown) == valid["caption_id"].nunique():
        raise TrainingDataError(f"{path}: none of its caption_ids is in the training manifest "
                                f"(e.g. {sorted(unknown)[0]!r}); negatives from another dataset?")
    negatives: dict[str, list[HardNegative]] = {}
    for row in valid[valid["caption_id"].isin(known)].itertuples(index=False):
        concreteness = math.nan if pd.isna(row.concreteness) else float(row.concreteness)
        image = getattr(row, NEGATIVE_IMAGE_COLUMN)
        negatives.setdefault(row.caption_id, []).append(
            HardNegative(str(row.negative), concreteness, None if pd.isna(image) else str(image)))
    log.info("%s: %d of %d captions have at least one usable negative; %d valid negatives %s as true of "
             "their own image; %d negative rows ignored (caption not in the manifest)", path, len(negatives),
             len(known), int(proven_true.sum()), "dropped" if drop_true else "kept although labelled",
             int(valid["caption_id"].isin(unknown).sum()))
    return negatives


# A batch part builds extra batch entries for the captions `rows` of one step:
# part(data, rows, batch, step) -> {name: tensor}. `batch` holds the entries built so far (images, texts).
# `rows.index` are the captions' manifest rows. Under torchrun `rows` is this rank's slice of the global
# batch, so what a part draws at random must come from per-caption streams (`caption_rng`).
BatchPart = Callable[["TrainingData", pd.DataFrame, dict[str, torch.Tensor], int], dict[str, torch.Tensor]]
BATCH_PARTS: dict[str, BatchPart] = {}


def batch_part(name: str) -> Callable[[BatchPart], BatchPart]:
    """Register a batch part under the need `name` (see LossSpec.needs)."""

    def register(part: BatchPart) -> BatchPart:
        if name in BATCH_PARTS:
            raise ValueError(f"batch part {name!r} registered twice")
        BATCH_PARTS[name] = part
        return part

    return register


class TrainingData:
    """Captions of a manifest with their images, token ids and the extra parts the loss needs.

    parse / concreteness: the dataset's parse and concreteness tables (rows by caption_id in
    `self.parsed` / `self.concreteness`, `compo.caption_rows.CaptionRows`: memory-mapped, read a caption at a
    time; None when not given), for parts such as noun phrases or online negatives; of the parse table only the
    columns the needs read (PARSE_COLUMNS_OF). tables_dir: the node-local folder of this user's where their
    memory-mapped copies are made (the ranks of a job pass the same one and share them; None: a temporary one).
    """

    def __init__(
        self,
        manifest: str | Path,
        tokenizer: Callable[[list[str]], torch.Tensor],
        transform: Callable[[Image.Image], torch.Tensor],
        needs: frozenset[str] = frozenset(),
        negatives: str | Path | None = None,
        k: int | None = None,
        *,
        recipe: dict | None = None,
        seed: int = 0,
        parse: str | Path | None = None,
        concreteness: str | Path | None = None,
        cache_bytes: int = 0,
        text_width_multiple: int | None = None,
        stage_dir: str | Path | None = None,
        holdout: int = 0,
        tables_dir: str | Path | None = None,
    ) -> None:
        self.manifest = Path(manifest)
        self.negatives_path = Path(negatives) if negatives is not None else None
        self.recipe = recipe or {}
        self.seed = seed
        parse_columns = [c for need in sorted(needs) for c in PARSE_COLUMNS_OF.get(need, ())]
        self.parsed = None if parse is None else CaptionRows(parse, "parse", parse_columns, tables_dir)
        self.concreteness = None if concreteness is None else \
            CaptionRows(concreteness, "concreteness", contract_schema("concreteness").names, tables_dir)
        self.rows: pd.DataFrame = read_table(manifest, "manifest").reset_index(drop=True)
        if self.rows.empty:
            raise TrainingDataError(f"{manifest}: the manifest has no captions")
        # validation's held-out images (recipe train.val_holdout, compo.validation): out before any batch is drawn
        self.held_out = self.rows.iloc[:0]
        if holdout:
            self.rows, self.held_out = split_holdout(self.rows, holdout, seed, manifest)
            log.info("%s: %d images (%d captions) held out of training for validation; %d captions train",
                     manifest, holdout, len(self.held_out), len(self.rows))
        if stage_dir is not None:  # read the tar shards from node-local copies (train.stage_shards)
            staged = stage(self.rows["image_path"].drop_duplicates(), stage_dir, shard_records(self.rows))
            self.rows["image_path"] = [staged.get(p, p) for p in self.rows["image_path"]]
            log.info("%s: staged the shards of %d images to %s", manifest, len(staged), stage_dir)
        self.tokenizer = tokenizer
        self.transform = transform
        self.needs = needs
        self.cache_bytes = cache_bytes  # decoded images kept per process, at most this many bytes
        self.text_width_multiple = text_width_multiple  # cut token ids to a multiple of this (cut_token_width)
        self._cache: dict[str, torch.Tensor] = {}
        self._cached_bytes = 0
        self.part_state: dict[str, Any] = {}  # what a batch part reads once per process (tables, generators)
        self.image_neighbours: dict[str, list[str]] = {}  # hard_images: image path -> its nearest images
        self._check_images_exist()
        self.k = 0
        self.negatives: dict[str, list[HardNegative]] = {}
        if "negatives" in needs:
            if negatives is None:
                raise TrainingDataError("the loss needs hard negatives but no negatives table was given")
            self.negatives = read_negatives(negatives, self.rows["caption_id"].tolist(),
                                            drop_true=bool(self.recipe.get("drop_true_negatives")))
            self.k = k or max((len(v) for v in self.negatives.values()), default=0)
        unknown_needs = needs - {"negatives"} - set(BATCH_PARTS)
        if unknown_needs:
            raise TrainingDataError(f"batch parts {sorted(unknown_needs)} are not defined in compo.batches "
                                    f"(defined: negatives, {', '.join(sorted(BATCH_PARTS))})")

    def __len__(self) -> int:
        return len(self.rows)

    def twin_partners(self) -> np.ndarray | None:
        """Per row, the row of its binding twin's caption (manifest column `binding_twin`, written by the world
        with `world.binding_twins`), -1 for none; None when no row names one. A twin outside this manifest
        (a `limit` cut the pair) leaves its row unpaired, counted in the log."""
        if "binding_twin" not in self.rows.columns or self.rows["binding_twin"].isna().all():
            return None
        row_of = {caption_id: row for row, caption_id in enumerate(self.rows["caption_id"])}
        partners = np.array([row_of.get(t, -1) if isinstance(t, str) else -1 for t in self.rows["binding_twin"]])
        for row, partner in enumerate(partners):
            if partner >= 0 and partners[partner] != row:
                raise TrainingDataError(f"{self.manifest}: caption_id {self.rows['caption_id'][row]!r} names "
                                        f"{self.rows['caption_id'][partner]!r} as its binding twin, which does "
                                        "not name it back")
        paired, named = int((partners >= 0).sum()), int(self.rows["binding_twin"].notna().sum())
        log.info("%s: %d binding-twin pairs, each kept in one batch; %d captions name a twin outside the "
                 "manifest (left unpaired)", self.manifest, paired // 2, named - paired)
        return partners

    def _check_images_exist(self) -> None:
        # Fail before training starts rather than at the batch that first meets a missing file.
        first = self.rows.drop_duplicates("image_path")
        missing = first[[not image_exists(p) for p in first["image_path"]]]
        if len(missing):
            row = missing.iloc[0]
            raise TrainingDataError(f"{self.manifest}: caption_id {row['caption_id']!r}: image file "
                                    f"{row['image_path']} not found ({len(missing)} missing images in all)")

    def image(self, path: str, where: str) -> torch.Tensor:
        """The transformed image at `path` (from this process's cache when it holds it); `where` names
        the table and caption in the error a file that cannot be read raises."""
        cached = self._cache.get(path)
        if cached is not None:
            return cached
        try:
            with Image.open(image_source(path)) as image:  # a file, or a member of a tar shard (compo.shards)
                tensor = self.transform(image.convert("RGB"))
        except Image.DecompressionBombError as error:
            raise TrainingDataError(f"{where}: image {path} has more pixels than PIL's decompression limit "
                                    f"(2 x Image.MAX_IMAGE_PIXELS = {2 * Image.MAX_IMAGE_PIXELS:,}); not decoded"
                                    ) from error
        except (OSError, UnidentifiedImageError, ValueError) as error:
            raise TrainingDataError(f"{where}: cannot read image {path} ({error})") from error
        size = tensor.numel() * tensor.element_size()
        if self._cached_bytes + size <= self.cache_bytes:
            self._cache[path] = tensor
            self._cached_bytes += size
        return tensor

    def _image(self, row: pd.Series) -> torch.Tensor:
        return self.image(row["image_path"], f"{self.manifest}: caption_id {row['caption_id']!r}")

    def image_paths(self) -> list[str]:
        """The manifest's distinct images, in order of first appearance."""
        return self.rows["image_path"].drop_duplicates().tolist()

    @torch.no_grad()
    def find_image_neighbours(self, encode: Callable[[torch.Tensor], torch.Tensor], n: int,
                              batch_size: int = 256, workers: int = 0) -> None:
        """Set `image_neighbours`: each distinct image's n nearest other images by the cosine similarity of
        `encode`'s embeddings (NegCLIP finds them with the CLIP model it starts from), `workers` DataLoader
        processes decoding the images (a real training set holds ~10^5 JPEGs)."""
        paths = self.image_paths()
        if len(paths) <= n:
            raise TrainingDataError(f"{self.manifest}: {len(paths)} distinct images; hard_images: {n} needs "
                                    f"more than {n}")
        images = torch.utils.data.DataLoader(_ImagesAt(self, paths, f"{self.manifest}: hard_images"),
                                             batch_size=batch_size, num_workers=workers)
        embeddings = torch.cat([F.normalize(encode(chunk).float(), dim=-1) for chunk in images])
        nearest = nearest_rows(embeddings, n).cpu()  # on the model's device: M x M similarities in chunks
        self.image_neighbours = {path: [paths[j] for j in nearest[i].tolist()] for i, path in enumerate(paths)}

    def batch(self, indices: Sequence[int], step: int = 0) -> dict[str, torch.Tensor]:
        """Tensors for the captions at row `indices` (see the batch keys in `compo.losses`)."""
        rows = self.rows.iloc[list(indices)]
        out = {
            "images": torch.stack([self._image(row) for _, row in rows.iterrows()]),
            "texts": self.tokenizer(rows["caption"].tolist()),
        }
        if "negatives" in self.needs:
            out.update(self._negatives(rows, step, context=out["texts"].shape[1]))
        for need in sorted(self.needs - {"negatives", "hard_images"}):
            out.update(BATCH_PARTS[need](self, rows, out, step))
        if "hard_images" in self.needs:  # more rows, each with its caption (and negatives): after the B drawn
            extra = hard_images(self, rows, out, step)
            out |= {key: torch.cat([out[key], rows_]) for key, rows_ in extra.items()}
        if self.text_width_multiple:
            cut_token_width(out, self.text_width_multiple)
        return out

    def step_negatives(self, caption_id: str, row: int, step: int) -> list[HardNegative]:
        """The caption's (manifest row `row`) hard negatives at `step`: all of them when it has at most
        k, else k drawn afresh every step from its stream (kept in slot order), as NegCLIP draws one of
        a caption's negatives each time it loads it."""
        entries = self.negatives.get(caption_id, [])
        if len(entries) <= self.k:
            return entries
        chosen = caption_rng(self.seed, step=step, row=row).sample(range(len(entries)), self.k)
        return [entries[i] for i in sorted(chosen)]

    def _negatives(self, rows: pd.DataFrame, step: int, context: int) -> dict[str, torch.Tensor]:
        tokens = torch.zeros(len(rows), self.k, context, dtype=torch.long)
        mask = torch.zeros(len(rows), self.k, dtype=torch.bool)
        for position, (row, caption_id) in enumerate(zip(rows.index, rows["caption_id"], strict=True)):
            texts = [negative.text for negative in self.step_negatives(caption_id, row, step)]
            if texts:
                tokens[position, : len(texts)] = self.tokenizer(texts)
                mask[position, : len(texts)] = True
        return {"negatives": tokens, "negative_mask": mask}


# The batch entries that hold token ids [..., L] (every text the model encodes), in one context width.
TOKEN_KEYS = ("texts", "negatives", "phrases")


def cut_token_width(batch: dict[str, torch.Tensor], multiple: int) -> None:
    """Cut every token-id entry of `batch` (TOKEN_KEYS) to one width: its longest text rounded up to a
    multiple of `multiple`, at most the context. A causal text tower's output at a text's end token does
    not depend on the padding after it, so the cut changes no value; the width is read here, on the CPU
    (in the DataLoader worker), so the model never reads it back from a GPU, and batches take a few widths
    only (compo.models.set_static_shapes)."""
    present = [key for key in TOKEN_KEYS if key in batch]
    context = batch["texts"].shape[-1]
    # a text ends at its end token, the largest id (where CLIP's argmax pooling reads it)
    longest = max(int(batch[key].argmax(-1).max()) + 1 if batch[key].numel() else 0 for key in present)
    width = min(context, -(-max(longest, 1) // multiple) * multiple)
    for key in present:
        batch[key] = batch[key][..., :width].contiguous()


# --- batch parts ------------------------------------------------------------------------------------------

MAX_PHRASES_PER_CAPTION = 8  # C2LIP: at most this many noun phrases per caption (in caption order) are encoded
# The parse table's columns each batch part reads (TrainingData keeps only those of its needs)
PARSE_COLUMNS_OF: dict[str, tuple[str, ...]] = {"noun_phrases": ("noun_phrases",), "online_negatives": ROW_COLUMNS}


@batch_part("cement_pairs")
def cement_pairs(data: TrainingData, rows: pd.DataFrame, batch: dict[str, torch.Tensor],
                 step: int) -> dict[str, torch.Tensor]:
    """negative_concreteness [B, K] (NaN where unknown or no negative), negative_image_mask [B, K] and
    negative_images [M, 3, H, W]: the M negatives that have an image, in mask (row-major) order."""
    path = data.negatives_path  # set whenever the "negatives" need is (TrainingData checks that)
    concreteness = torch.full((len(rows), data.k), math.nan)
    image_mask = torch.zeros(len(rows), data.k, dtype=torch.bool)
    images = []
    for position, (row, caption_id) in enumerate(zip(rows.index, rows["caption_id"], strict=True)):
        # the same draw as the batch's "negatives" (a pure function of caption, row and step)
        for slot, negative in enumerate(data.step_negatives(caption_id, row, step)):
            concreteness[position, slot] = negative.concreteness
            if negative.image is not None:
                image_mask[position, slot] = True
                images.append(data.image(negative.image, f"{path}: caption_id {caption_id!r}: negative image"))
    shape = batch["images"].shape[1:]
    return {"negative_concreteness": concreteness, "negative_image_mask": image_mask,
            "negative_images": torch.stack(images) if images else torch.zeros(0, *shape)}


def caption_phrases(data: TrainingData, caption_id: str) -> list[str]:
    """The (at most MAX_PHRASES_PER_CAPTION) noun phrases of a caption, from the parse table."""
    if not data.parsed:
        raise TrainingDataError("the loss needs noun phrases but no parse table was given (--parse)")
    row = data.parsed.get(caption_id)
    if row is None:
        raise TrainingDataError(f"{data.manifest}: caption_id {caption_id!r} is not in the parse table")
    phrases = [str(p) for p in row["noun_phrases"] if str(p).strip()]
    return phrases[:MAX_PHRASES_PER_CAPTION]


@batch_part("noun_phrases")
def noun_phrase_part(
    data: TrainingData, rows: pd.DataFrame, batch: dict[str, torch.Tensor], step: int
) -> dict[str, torch.Tensor]:
    """batch["phrases"] [M, L] token ids of every noun phrase of the batch's captions, and
    batch["phrase_owner"] [M] long: the batch row (caption) each phrase comes from."""
    texts, owner = [], []
    for position, caption_id in enumerate(rows["caption_id"]):
        phrases = caption_phrases(data, caption_id)
        texts += phrases
        owner += [position] * len(phrases)
    context = batch["texts"].shape[1]
    tokens = data.tokenizer(texts) if texts else torch.zeros(0, context, dtype=torch.long)
    return {"phrases": tokens, "phrase_owner": torch.tensor(owner, dtype=torch.long)}


class OnlineNegatives:
    """The generators of a recipe's `online_negatives`; the captions' parses are read from the parse table as a
    batch draws (none kept: a per-caption cache would grow to the whole table in every worker)."""

    def __init__(self, data: TrainingData) -> None:
        from compo.negatives import build_generator  # the registry of every generator, offline and online

        names = data.recipe.get("online_negatives") or []
        specs = data.recipe.get(ONLINE_SPECS_KEY) or {}
        missing = [name for name in names if name not in specs]
        if not names or missing:
            raise ValueError(f"recipe {data.recipe.get('name')!r}: online_negatives {names} need their config "
                             f"entries under {ONLINE_SPECS_KEY!r} (missing: {missing}); resolve the recipe with "
                             "compo.config.resolve_method")
        if not data.parsed:
            raise ValueError(f"{data.manifest}: online negatives need the dataset's parse table (--parse)")
        self.generators = [build_generator(specs[name], where=f"negatives.{name}") for name in names]
        if any(g.restrict_to_caption_words for g in self.generators):  # vocabulary: captions, the training set's
            # read a chunk of the table at a time: the vocabulary is held, the tokens of every caption are not
            words = {token for chunk in data.parsed.column_chunks("tokens") for tokens in chunk for token in tokens}
            for generator in self.generators:
                generator.use_caption_words(words)
        self.k = int(data.recipe.get("k") or 1)
        self.data = data

    def parsed(self, caption_id: str) -> ParsedCaption:
        row = self.data.parsed.get(caption_id)
        if row is None:
            raise ValueError(f"caption_id {caption_id!r} of {self.data.manifest} has no row in the parse table")
        return ParsedCaption.from_row(row)

    def draw(self, caption_ids: list[str], rows: list[int], step: int) -> list[list[str | None]]:
        """Per caption, per generator in recipe order, k slots: a negative text or None (unfilled).
        Each draw is the generator's own `generate` (the offline stage's code) with the caption's stream
        at this step (`caption_rng(seed, step=, row=)`, `rows`: the captions' manifest rows), so the same
        step gives the same draws, also on a resumed run and on any slice of the batch."""
        out = []
        for caption_id, row in zip(caption_ids, rows, strict=True):
            rng = caption_rng(self.data.seed, step=step, row=row)
            texts: list[str | None] = []
            for generator in self.generators:
                drawn = [negative.text for negative in generator.generate(self.parsed(caption_id), rng, self.k)]
                texts += drawn + [None] * (self.k - len(drawn))
            out.append(texts)
        return out


@batch_part("online_negatives")
def online_negatives(data: TrainingData, rows: pd.DataFrame, batch: dict[str, torch.Tensor], step: int
                     ) -> dict[str, torch.Tensor]:
    """batch["negatives"] [B, K, L] and batch["negative_mask"] [B, K], K = k * len(online_negatives);
    slots in generator order, k each; an unfilled slot is masked."""
    if "online_negatives" not in data.part_state:
        data.part_state["online_negatives"] = OnlineNegatives(data)
    source = data.part_state["online_negatives"]
    drawn = source.draw(rows["caption_id"].tolist(), rows.index.tolist(), step)
    slots = source.k * len(source.generators)
    context = batch["texts"].shape[1]
    tokens = torch.zeros(len(drawn), slots, context, dtype=batch["texts"].dtype)
    mask = torch.zeros(len(drawn), slots, dtype=torch.bool)
    texts = [(row, slot, text) for row, caption in enumerate(drawn) for slot, text in enumerate(caption)
             if text is not None]
    if texts:
        rows_idx, slots_idx, strings = zip(*texts, strict=True)
        tokens[list(rows_idx), list(slots_idx)] = data.tokenizer(list(strings)).to(tokens.dtype)
        mask[list(rows_idx), list(slots_idx)] = True
    return {"negatives": tokens, "negative_mask": mask}


# NegCLIP's hard images (Yuksekgonul et al. 2023; the released trainer, vinid/neg_clip): every caption brings
# one more image into the batch, drawn each step from its image's `hard_images` nearest neighbours (recipe key
# hard_images: N), with a caption of that image and, when the loss has hard negatives, that caption's negatives.
# hard_images: random draws any other image instead: the same extra rows without hardness (the negative control).
HARD_IMAGE_STREAM = 2  # caption_rng stream of the draw, apart from the caption's negatives' (stream 1)


def nearest_rows(embeddings: torch.Tensor, n: int, chunk: int = 1024) -> torch.Tensor:
    """[M, n]: each row's n most similar other rows (dot product of the [M, D] rows, most similar first),
    in chunks of `chunk` rows so memory stays chunk x M."""
    out = []
    for start in range(0, len(embeddings), chunk):
        similarity = embeddings[start:start + chunk] @ embeddings.T
        own = torch.arange(start, start + len(similarity))
        similarity[torch.arange(len(similarity)), own] = -torch.inf  # an image is not its own neighbour
        out.append(similarity.topk(n, dim=1).indices)
    return torch.cat(out)


@batch_part("hard_images")
def hard_images(data: TrainingData, rows: pd.DataFrame, batch: dict[str, torch.Tensor], step: int
                ) -> dict[str, torch.Tensor]:
    """B more rows of the batch keys: images [B, 3, H, W] (each row's hard image), texts [B, L] (a caption of
    each) and, with the negatives need, negatives [B, K, L] / negative_mask [B, K] (that caption's negatives
    at this step); `TrainingData.batch` appends them after the B rows drawn."""
    setting = data.recipe.get("hard_images")
    if "image_rows" not in data.part_state:  # image path -> its manifest rows, once per process
        by_image: dict[str, list[int]] = {}
        for row, path in enumerate(data.rows["image_path"]):
            by_image.setdefault(path, []).append(row)
        data.part_state["image_rows"] = by_image, list(by_image)
    by_image, paths = data.part_state["image_rows"]
    if setting != "random" and not data.image_neighbours:
        raise TrainingDataError(f"{data.manifest}: hard_images: {setting!r} needs the images' neighbours "
                                "(TrainingData.find_image_neighbours) before the first batch")
    chosen_rows = []
    for row, path in zip(rows.index, rows["image_path"], strict=True):
        rng = caption_rng(data.seed, step=step, row=row, stream=HARD_IMAGE_STREAM)
        if setting == "random":
            other = paths[rng.randrange(len(paths) - 1)]
            image = paths[-1] if other == path else other  # uniform over the other images
        else:
            image = rng.choice(data.image_neighbours[path])
        chosen_rows.append(rng.choice(by_image[image]))
    chosen = data.rows.iloc[chosen_rows]
    where = f"{data.manifest}: hard_images"
    out = {"images": torch.stack([data.image(p, where) for p in chosen["image_path"]]),
           "texts": data.tokenizer(chosen["caption"].tolist())}
    if "negatives" in data.needs:
        out.update(data._negatives(chosen, step, context=batch["texts"].shape[1]))
    return out


# --- the DataLoader ---------------------------------------------------------------------------------------


class _ImagesAt(torch.utils.data.Dataset):
    """The transformed images at `paths`, in order (the nearest-image search's DataLoader)."""

    def __init__(self, data: TrainingData, paths: Sequence[str], where: str) -> None:
        self.data, self.paths, self.where = data, paths, where

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data.image(self.paths[index], self.where)


class StepSampler(torch.utils.data.Sampler):
    """(step, rows) for the steps [start, stop): the rows of global batch `step` (its position in
    `epoch_order` of its epoch, rearranged by `paired_order` when the manifest pairs binding twins; the last
    partial batch of an epoch is dropped, as open_clip does) that this rank trains on
    (`compo.distributed.local_rows`)."""

    def __init__(self, n: int, batch_size: int, seed: int, start: int, stop: int,
                 partners: np.ndarray | None = None) -> None:
        self.n, self.batch_size, self.seed, self.start, self.stop = n, batch_size, seed, start, stop
        self.steps_per_epoch = n // batch_size
        self.partners = partners  # binding twins: each pair in one batch (paired_order); None: no pairs

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def __iter__(self) -> Iterator[tuple[int, list[int]]]:
        from compo.distributed import local_rows

        order_epoch, order = -1, torch.empty(0, dtype=torch.long)
        for step in range(self.start, self.stop):
            epoch, position = divmod(step, self.steps_per_epoch)
            if epoch != order_epoch:
                order_epoch, order = epoch, epoch_order(self.n, self.seed, epoch)
                if self.partners is not None:
                    order = torch.tensor(paired_order(order, self.partners, self.batch_size))
            yield step, local_rows(order[position * self.batch_size : (position + 1) * self.batch_size].tolist())


class StepBatches(torch.utils.data.Dataset):
    """The batch of a (step, rows) item of `StepSampler` as `parts` micro-batches of equal size (gradient
    accumulation, `compo.accumulate`), each built by `TrainingData.batch` from its rows."""

    def __init__(self, data: TrainingData, parts: int = 1) -> None:
        self.data, self.parts = data, parts

    def __getitem__(self, item: tuple[int, list[int]]) -> tuple[int, list[dict[str, torch.Tensor]]]:
        step, rows = item
        return step, [self.data.batch(part, step) for part in split_rows(rows, self.parts)]


def batch_loader(data: TrainingData, batch_size: int, seed: int, start: int, stop: int, workers: int = 0,
                 pin_memory: bool = False, parts: int = 1) -> torch.utils.data.DataLoader:
    """The DataLoader of steps [start, stop): (step, [micro-batch, ...]) in step order, `parts` micro-batches
    per step; `workers` processes build batches ahead (0: built in this process when asked for), kept alive
    for the whole run."""
    return torch.utils.data.DataLoader(
        StepBatches(data, parts), batch_size=None,
        sampler=StepSampler(len(data), batch_size, seed, start, stop, data.twin_partners()),
        num_workers=workers, pin_memory=pin_memory, persistent_workers=workers > 0)
