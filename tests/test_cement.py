"""Cement (seed 002 Eq. 2-5): margins, the 2N-way loss against a per-sample loop, gradient shares,
masking of missing negative images, the batch part and the recipe checks."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from helpers import embeddings
from PIL import Image, ImageDraw

from compo.batches import TrainingData, TrainingDataError
from compo.io import write_table
from compo.losses import check_recipe, get_loss
from compo.losses.cement import CementLoss, cement_terms, gradient_shares, margin_infonce, pair_margins
from compo.models import get_tokenizer, image_transform
from compo.shards import ShardWriter
from compo.train import train

MODEL = "compo-tiny-clip"
SETTINGS = {"threads": 1, "checkpoint_every": 2, "log_every": 1}
PAPER_MARGIN = {"kind": "fermi-dirac", "m_min": -2.0, "m_max": 2.0, "c_tilde": 4.0, "tau_m": 0.15}



# --- margins (Eq. 4) ---------------------------------------------------------------------------------


def test_margins_follow_eq4_and_the_ablations():
    c = torch.tensor([1.2, 3.9, 4.0, 4.1, 4.9, math.nan], dtype=torch.float64)

    def fermi_dirac(ci, sign):
        return (2 - -2) / (1 + math.exp(sign * (4.0 - ci) / 0.15)) + -2

    got = pair_margins(c, PAPER_MARGIN)
    torch.testing.assert_close(got[:5], torch.tensor([fermi_dirac(x, 1) for x in c[:5].tolist()], dtype=c.dtype))
    assert got[2].item() == pytest.approx(0.0) and got[5].item() == 0  # midpoint; unknown c -> 0
    assert -2 < got[0].item() < -1.99 and 1.99 < got[4].item() < 2  # bounded by [m_min, m_max]
    inverse = pair_margins(c, {**PAPER_MARGIN, "kind": "inverse"})
    torch.testing.assert_close(inverse[:5], torch.tensor([fermi_dirac(x, -1) for x in c[:5].tolist()],
                                                         dtype=c.dtype))
    assert inverse[5].item() == 0
    assert pair_margins(c, {"kind": "static", "value": 1.0}).tolist() == [1.0] * 6  # static ignores c
    assert pair_margins(c, {"kind": "none"}).tolist() == [0.0] * 6
    # extreme concreteness stays bounded (no overflow)
    assert pair_margins(torch.tensor([-100.0, 100.0]), PAPER_MARGIN).tolist() == [-2.0, 2.0]


# --- Eq. 5 against a loop over samples -------------------------------------------------------------


def _loop_cement(v, t, nv, nt, text_mask, image_mask, margin, scale):
    """Eq. 5 sample by sample: anchors 0..N-1, then the negatives that have an image; a sample's hard
    negative is its pair partner (logit + the pair's margin); a negative caption without an image is
    one more term in its anchor's v->t partition only. Returns v2t, t2v and per-row (pull, hard, easy)."""
    n = len(v)
    images, texts, margins, partner = list(v), list(t), list(margin), [None] * n
    for i in range(n):
        if image_mask[i]:
            partner[i] = len(images)
            partner.append(i)
            images.append(nv[i])
            texts.append(nt[i])
            margins.append(margin[i])
    samples = len(images)
    losses, shares = {"v2t": 0, "t2v": 0}, []
    for direction, queries, keys in (("v2t", images, texts), ("t2v", texts, images)):
        for a in range(samples):
            exps = {b: torch.exp(scale * queries[a] @ keys[b] + (margins[a] if b == partner[a] else 0))
                    for b in range(samples)}
            hard = partner[a]
            if direction == "v2t" and a < n and text_mask[a] and not image_mask[a]:
                hard = "text-only"
                exps[hard] = torch.exp(scale * queries[a] @ nt[a] + margin[a])
            z = sum(exps.values())
            losses[direction] = losses[direction] - torch.log(exps[a] / z)
            p = {b: (e / z).item() for b, e in exps.items()}
            shares.append((1 - p[a], p[hard] if hard is not None else 0.0,
                           sum(value for b, value in p.items() if b not in (a, hard))))
    return losses["v2t"] / samples, losses["t2v"] / samples, torch.tensor(shares, dtype=torch.float64)


def _case(n: int = 6):
    v, t = embeddings(n, 8, seed=0), embeddings(n, 8, seed=1)
    nv, nt = embeddings(n, 8, seed=2), embeddings(n, 8, seed=3)
    margin = torch.linspace(-1.5, 2.0, n, dtype=torch.float64)
    return v, t, nv, nt, margin


@pytest.mark.parametrize("layout", ["all pairs", "mixed"])
def test_cement_matches_loop_values_gradients_and_shares(layout):
    v, t, nv, nt, margin = _case()
    text_mask = torch.ones(6, dtype=torch.bool)
    image_mask = torch.ones(6, dtype=torch.bool)
    if layout == "mixed":
        text_mask[3] = False  # no negative at all
        image_mask[[1, 3, 4]] = False  # negatives 1 and 4: caption only
    scale = torch.tensor(5.0, dtype=torch.float64, requires_grad=True)
    got = cement_terms(v, t, nv, nt, text_mask, image_mask, margin, scale)
    v2t, t2v, shares = _loop_cement(v, t, nv, nt, text_mask, image_mask, margin, scale)
    torch.testing.assert_close(got["v2t"], v2t)
    torch.testing.assert_close(got["t2v"], t2v)
    inputs = [v, t, nv, nt, scale]
    expected = torch.autograd.grad(v2t + t2v, inputs, retain_graph=True)
    for g, r in zip(torch.autograd.grad(got["v2t"] + got["t2v"], inputs), expected, strict=True):
        torch.testing.assert_close(g, r)
    torch.testing.assert_close(torch.stack([got["pull"], got["hard_push"], got["easy_push"]], 1), shares)
    # Eq. 3 per row: positive pull = hard push + easy push
    torch.testing.assert_close(got["pull"], got["hard_push"] + got["easy_push"])
    rows = 6 + int(image_mask.sum())
    assert len(got["pull"]) == 2 * rows
    if layout == "mixed":
        grads = torch.autograd.grad(cement_terms(v, t, nv, nt, text_mask, image_mask, margin, scale)["v2t"],
                                    [nv, nt], allow_unused=True)
        assert torch.all(grads[0][~image_mask] == 0)  # a missing negative image is never a candidate
        assert torch.all(grads[1][~text_mask] == 0) and torch.all(grads[1][text_mask].abs().sum(-1) > 0)


def test_all_pairs_without_margin_is_plain_infonce_over_2n():
    v, t, nv, nt, margin = _case()
    mask = torch.ones(6, dtype=torch.bool)
    got = cement_terms(v, t, nv, nt, mask, mask, torch.zeros(6, dtype=torch.float64), torch.tensor(3.0))
    images, texts = torch.cat([v, nv]), torch.cat([t, nt])
    labels = torch.arange(12)
    torch.testing.assert_close(got["v2t"], F.cross_entropy(3.0 * images @ texts.T, labels))
    torch.testing.assert_close(got["t2v"], F.cross_entropy(3.0 * texts @ images.T, labels))
    # a larger margin moves push from the easy negatives to the hard one (zero-sum, Eq. 3)
    shifted = cement_terms(v, t, nv, nt, mask, mask, torch.full((6,), 2.0, dtype=torch.float64),
                           torch.tensor(3.0))
    assert shifted["hard_push"].mean() > got["hard_push"].mean()
    assert shifted["easy_push"].mean() < got["easy_push"].mean()


def test_eq2_gradients_are_the_margin_injected_probabilities():
    """dL/ds_ii = -(1 - p_ii)/R, dL/ds_ii' = p_ii'/R, dL/ds_ij = p_ij/R (R query rows, 2N with all pairs)."""
    n = 4
    logits = (4.0 * torch.randn(2 * n, 2 * n, dtype=torch.float64, generator=torch.Generator().manual_seed(5)))
    logits.requires_grad_()
    hard = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
    margin = torch.linspace(-2, 2, 2 * n, dtype=torch.float64)
    loss, p = margin_infonce(logits, hard, margin)
    (grad,) = torch.autograd.grad(loss, logits)
    rows = torch.arange(2 * n)
    torch.testing.assert_close(grad[rows, rows], -(1 - p[rows, rows]) / (2 * n))
    torch.testing.assert_close(grad[rows, hard], p[rows, hard] / (2 * n))
    off = torch.ones_like(grad, dtype=torch.bool)
    off[rows, rows] = False
    torch.testing.assert_close(grad[off], p[off] / (2 * n))
    # margin-injected: p_ii' is the softmax with s_ii' + m_i, not of the raw logits
    shifted = logits.detach().clone()
    shifted[rows, hard] += margin
    torch.testing.assert_close(p, shifted.softmax(-1))
    pull, hard_push, easy = gradient_shares(p, hard)
    # Eq. 3 read off the gradients themselves: |dL/ds_ii| = dL/ds_ii' + sum_easy dL/ds_ij (times R)
    torch.testing.assert_close(pull, -grad[rows, rows] * 2 * n)
    torch.testing.assert_close(hard_push, grad[rows, hard] * 2 * n)
    easy_grad = grad.clone()
    easy_grad[rows, rows] = 0
    easy_grad[rows, hard] = 0
    torch.testing.assert_close(easy, easy_grad.sum(-1) * 2 * n)
    torch.testing.assert_close(pull, hard_push + easy)


# --- data: a tiny manifest with negative images and concreteness -----------------------------------

# caption -> (negative image?, concreteness); c3 has no valid negative
LAYOUT = {"c0": (True, 4.8), "c1": (True, None), "c2": (False, 2.0), "c3": None, "c4": (True, 3.9),
          "c5": (False, 4.5), "c6": (True, 4.2), "c7": (False, None)}
COLOURS = ["red", "blue", "green", "yellow"]


def _draw(path: Path, colour: str, i: int) -> str:
    image = Image.new("RGB", (64, 64), "white")
    ImageDraw.Draw(image).rectangle([6 + i, 8, 52, 56 - i], fill=colour)
    image.save(path)
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory, write_manifest) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cement")
    rows, negatives = [], []
    for i, (cid, spec) in enumerate(LAYOUT.items()):
        colour, other = COLOURS[i % 4], COLOURS[(i + 1) % 4]
        rows.append({"image_id": f"i{i}", "image_path": _draw(root / f"img{i}.png", colour, i), "caption_id": cid,
                     "caption": f"a {colour} square number {i}", "dataset": "tiny"})
        valid = spec is not None
        has_image, concreteness = spec if valid else (False, None)
        negatives.append({
            "caption_id": cid, "slot": 0, "negative": f"a {other} square number {i}" if valid else None,
            "type": "replace", "keyword": f"{colour}|{other}" if valid else None, "concreteness": concreteness,
            "generator": "test", "valid": valid, "reason": "ok" if valid else "none", "truth": "false",
            "negative_image": _draw(root / f"neg{i}.png", other, i) if has_image else None})
    manifest = pd.DataFrame(rows)
    write_manifest(manifest, root / "manifest.parquet")
    write_table(pd.DataFrame(negatives), root / "negatives.parquet", "negatives")
    train({"model": MODEL, "init": "scratch", "dataset": "tiny", "train": {"steps": 0}}, None,
          str(root / "base"), seed=0, settings=SETTINGS)
    return {"root": root, "manifest": root / "manifest.parquet", "negatives": root / "negatives.parquet",
            "base": root / "base"}


def _training_data(data, model) -> TrainingData:
    training = TrainingData(data["manifest"], get_tokenizer(MODEL), image_transform(model),
                            get_loss("cement").needs, negatives=data["negatives"], k=1)
    return training


def test_batch_part_reads_concreteness_and_packs_negative_images(data, tiny):
    batch = _training_data(data, tiny).batch(list(range(8)))
    assert batch["negative_mask"][:, 0].tolist() == [spec is not None for spec in LAYOUT.values()]
    assert batch["negative_image_mask"][:, 0].tolist() == [bool(spec and spec[0]) for spec in LAYOUT.values()]
    concreteness = batch["negative_concreteness"][:, 0].tolist()
    assert [None if math.isnan(c) else round(c, 3) for c in concreteness] == [
        spec[1] if spec else None for spec in LAYOUT.values()]
    assert batch["negative_images"].shape == (4, 3, 64, 64)
    expected = image_transform(tiny)(Image.open(data["root"] / "neg4.png").convert("RGB"))
    torch.testing.assert_close(batch["negative_images"][2], expected)  # c0, c1, c4, c6 in row order


def test_negative_images_from_a_tar_shard_give_the_same_batch(data, tiny, tmp_path):
    """SDXL-Turbo's default format: the negatives table names members of a tar shard (compo.shards); the
    batch holds the same pixels as from the PNG files."""
    table = pd.read_parquet(data["negatives"])
    with ShardWriter(tmp_path / "images" / "0.tar") as shard:
        table["negative_image"] = [None if pd.isna(path) else shard.add(Path(path).name, Path(path).read_bytes())
                                   for path in table["negative_image"]]
    write_table(table, tmp_path / "negatives.parquet", "negatives")
    assert table["negative_image"].str.contains(r"\.tar#neg\d\.png$").sum() == 4
    from_files = _training_data(data, tiny).batch(list(range(8)))
    from_tar = _training_data({**data, "negatives": tmp_path / "negatives.parquet"}, tiny).batch(list(range(8)))
    assert from_files.keys() == from_tar.keys()
    for key, value in from_files.items():
        torch.testing.assert_close(from_tar[key], value, rtol=0, atol=0, equal_nan=True, msg=key)


def test_missing_negative_image_names_file_and_caption(data, tiny, tmp_path):
    table = pd.read_parquet(data["negatives"])
    table.loc[table["caption_id"] == "c4", "negative_image"] = str(tmp_path / "gone.png")
    broken = tmp_path / "negatives.parquet"
    write_table(table, broken, "negatives")
    training = _training_data({**data, "negatives": broken}, tiny)
    with pytest.raises(TrainingDataError, match=r"caption_id 'c4'.*gone\.png"):
        training.batch([4])


def test_module_equals_the_equation_on_the_models_embeddings_and_logs_stats(data, tiny):
    tiny.eval()  # BatchNorm on running statistics: the features do not depend on how the loss batches forwards
    batch = _training_data(data, tiny).batch(list(range(8)))
    out = CementLoss(PAPER_MARGIN)(tiny, batch)
    text_mask, image_mask = batch["negative_mask"][:, 0], batch["negative_image_mask"][:, 0]
    with torch.no_grad():
        v = tiny.encode_image(batch["images"], normalize=True)
        t = tiny.encode_text(batch["texts"], normalize=True)
        nt = tiny.encode_text(batch["negatives"][:, 0], normalize=True)
        nv = torch.zeros_like(v)
        nv[image_mask] = tiny.encode_image(batch["negative_images"], normalize=True)
        margin = pair_margins(batch["negative_concreteness"][:, 0], PAPER_MARGIN)
        v2t, t2v, shares = _loop_cement(v.double(), t.double(), nv.double(), nt.double(), text_mask, image_mask,
                                        margin.double(), tiny.logit_scale.exp().double())
    close = dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out["v2t"].double(), v2t, **close)
    torch.testing.assert_close(out["t2v"].double(), t2v, **close)
    torch.testing.assert_close(out["loss"], out["v2t"] + out["t2v"])
    means = shares.mean(0).float()
    torch.testing.assert_close(torch.stack([out["stat_pull"], out["stat_hard_push"], out["stat_easy_push"]]),
                               means, **close)
    assert out["stat_negatives"].item() == 7 and out["stat_negative_images"].item() == 4
    assert out["stat_null_concreteness"].item() == 2  # c1, c7 (c3 has no negative)
    static = CementLoss({"kind": "static", "value": 1.0})(tiny, batch)
    assert static["stat_null_concreteness"].item() == 0 and static["stat_margin"].item() == pytest.approx(1.0)


def test_recipe_validation_names_the_key():
    base = {"loss": "cement", "negatives": "swap", "k": 1, "margin": dict(PAPER_MARGIN)}
    assert check_recipe(base) == []
    assert check_recipe({**base, "margin": {**PAPER_MARGIN, "m_min": 3.0}}) == [
        ("margin.m_min", "m_min 3.0 is above m_max 2.0")]
    assert check_recipe({**base, "margin": {**PAPER_MARGIN, "tau_m": 0}}) == [
        ("margin.tau_m", "0 is less than or equal to the minimum of 0")]
    assert check_recipe({**base, "margin": {"kind": "static"}}) == [
        ("margin.value", "margin kind static reads value")]
    assert check_recipe({**base, "margin": {"kind": "fermi-dirac", "m_min": -2}})[0][0] == "margin.m_max"
    assert check_recipe({**base, "margin": {"kind": "none"}}) == []
    assert check_recipe({**base, "k": 4})[0][0] == "k"
    assert check_recipe({**base, "margin": None}) == [("margin", "loss cement requires margin")]


def test_trains_end_to_end_with_gradient_share_columns(data, tmp_path):
    torch.set_num_threads(1)
    recipe = {"name": "slipform", "base": "clip", "loss": "cement", "negatives": "hc", "k": 1,
              "margin": dict(PAPER_MARGIN),
              "train": {"steps": 2, "batch_size": 4, "lr": 1e-4, "warmup": 1, "weight_decay": 0.1}}
    train(recipe, str(data["manifest"]), str(tmp_path), seed=0, negatives=str(data["negatives"]),
          init_dir=str(data["base"]), settings=SETTINGS)
    with open(tmp_path / "losses.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2
    for row in rows:
        pull, hard, easy = (float(row[k]) for k in ("stat_pull", "stat_hard_push", "stat_easy_push"))
        assert pull == pytest.approx(hard + easy, rel=1e-5) and 0 < hard < pull
        assert float(row["loss"]) == pytest.approx(float(row["v2t"]) + float(row["t2v"]), rel=1e-5)
