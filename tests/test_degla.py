"""DeGLA (seed 000 Eq. 6-10): IGC, TGC and distill against per-sample loops, the EMA teacher, resume."""

from __future__ import annotations

import copy
import csv
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import embeddings, grads
from PIL import Image, ImageDraw

from compo.io import write_table
from compo.losses import check_recipe, get_loss
from compo.losses.clip import NegCLIPLoss
from compo.losses.degla import DeGLALoss, distill_term, ema_update, grounded_contrast, released_tgc_negatives
from compo.models import get_tokenizer
from compo.train import resume_dir, train

MODEL = "compo-tiny-clip"
SETTINGS = {"threads": 1, "checkpoint_every": 2, "log_every": 1}
PAPER_WEIGHTS = {"igc": 0.1, "tgc": 0.1, "distill": 0.005}



def _mask() -> torch.Tensor:
    mask = torch.ones(5, 3, dtype=torch.bool)
    mask[1] = False  # a caption with no valid negative: not in the IGC/TGC mean
    mask[3, 1:] = False  # a caption with one valid negative
    mask[4, 0] = False  # a missing first slot
    return mask


def _loop_grounded(anchor, positive, negatives, mask, scale):
    """Eq. 8 / 9 per sample: -log e^{s a_i.p_i} / (e^{s a_i.p_i} + sum_k e^{s a_i.n_ik}) over valid k,
    averaged over the captions that have a negative."""
    total, rows = 0, 0
    for i in range(len(anchor)):
        if not mask[i].any():
            continue
        numerator = torch.exp(scale * anchor[i] @ positive[i])
        denominator = numerator + sum(torch.exp(scale * anchor[i] @ negatives[i, k])
                                      for k in range(mask.shape[1]) if mask[i, k])
        total, rows = total - torch.log(numerator / denominator), rows + 1
    return total / rows


def _loop_distill(student, teacher, mask):
    """Eq. 7 per sample, summed over the batch."""
    (v, t, neg), (v_star, t_star, neg_star) = student, teacher
    total = 0
    for i in range(len(v)):
        total = total + torch.sum((v[i] - v_star[i]) ** 2) + torch.sum((t[i] - t_star[i]) ** 2)
        for k in range(mask.shape[1]):
            if mask[i, k]:
                total = total + torch.sum((neg[i, k] - neg_star[i, k]) ** 2)
    return total



def test_igc_matches_loop_values_gradients_and_masks_missing_negatives():
    v, t, neg = embeddings(5, 8, seed=0), embeddings(5, 8, seed=1), embeddings(5, 3, 8, seed=2)
    mask, scale = _mask(), torch.tensor(6.0, dtype=torch.float64, requires_grad=True)
    got, ref = grounded_contrast(v, t, neg, mask, scale), _loop_grounded(v, t, neg, mask, scale)
    torch.testing.assert_close(got, ref)
    for g, r in zip(grads(got, [v, t, neg, scale]), grads(ref, [v, t, neg, scale]), strict=True):
        torch.testing.assert_close(g, r)
    grad_v, grad_neg = grads(got, [v, neg])
    # only an image's OWN negatives enter its softmax; missing slots and caption 1 get no gradient
    assert torch.all(grad_neg[~mask] == 0) and torch.all(grad_neg[mask].abs().sum(-1) > 0)
    assert torch.all(grad_v[1] == 0)
    # the loss of caption 0 alone ignores every other caption's negatives
    alone = grounded_contrast(v[:1], t[:1], neg[:1], mask[:1], scale)
    torch.testing.assert_close(alone, _loop_grounded(v[:1], t[:1], neg[:1], mask[:1], scale))


def test_no_negative_at_all_gives_zero():
    v, t, neg = embeddings(3, 4, seed=3), embeddings(3, 4, seed=4), embeddings(3, 2, 4, seed=5)
    assert grounded_contrast(v, t, neg, torch.zeros(3, 2, dtype=torch.bool), torch.tensor(5.0)).item() == 0


def test_tgc_anchors_student_caption_on_teacher_caption_and_its_own_negatives():
    t, t_star, neg = embeddings(5, 8, seed=6), embeddings(5, 8, seed=7), embeddings(5, 3, 8, seed=8)
    mask, scale = _mask(), torch.tensor(9.0, dtype=torch.float64)
    got, ref = grounded_contrast(t, t_star, neg, mask, scale), _loop_grounded(t, t_star, neg, mask, scale)
    torch.testing.assert_close(got, ref)
    for g, r in zip(grads(got, [t, neg]), grads(ref, [t, neg]), strict=True):
        torch.testing.assert_close(g, r)
    # correct pairing: permuting the negatives across captions (the released code's mis-pairing) changes it
    shifted = grounded_contrast(t, t_star, neg.roll(1, dims=0), mask, scale)
    assert not torch.isclose(shifted, got)


def test_tgc_pairing_released_takes_the_released_codes_columns(tiny):
    """`tgc_pairing: released`: DeGLA's get_text_local_loss over its caption-major negatives (row c*K + k is caption
    c's k-th) unmasks columns i, N+i, 2N+i, ... for caption i, as built here from the released code's own masks."""
    t, t_star, neg = embeddings(5, 8, seed=6), embeddings(5, 8, seed=7), embeddings(5, 3, 8, seed=8)
    mask, scale = _mask(), torch.tensor(9.0, dtype=torch.float64)
    n, k = mask.shape
    # the released masks: mask_0 the identity's -inf complement, tiled K times (`repeat`), over [gt | negatives]
    mask_0 = torch.full((n, n), float("-inf"), dtype=torch.float64).fill_diagonal_(0)
    flat = neg.reshape(n * k, -1)
    columns = mask_0.repeat(1, k) == 0  # [N, N*K]: which negative rows caption i contrasts with
    picked = torch.stack([flat[columns[i]] for i in range(n)])
    picked_mask = torch.stack([mask.reshape(-1)[columns[i]] for i in range(n)])
    ours, ours_mask = released_tgc_negatives(neg, mask)
    torch.testing.assert_close(ours, picked)
    assert torch.equal(ours_mask, picked_mask)
    assert not torch.equal(ours, neg)  # other captions' negatives, not caption i's own
    got = grounded_contrast(t, t_star, ours, ours_mask, scale)
    torch.testing.assert_close(got, _loop_grounded(t, t_star, picked, picked_mask, scale))
    # the module: `released` by default (the code behind the published numbers), `own` from the recipe
    assert get_loss("degla").build({"weights": PAPER_WEIGHTS, "ema": 0.5}).tgc_pairing == "released"
    loss = get_loss("degla").build({"weights": PAPER_WEIGHTS, "ema": 0.5})
    model, batch = _perturbed_setup(loss, tiny), _batch()
    with torch.no_grad():
        out = loss(model, batch)
        own = DeGLALoss(PAPER_WEIGHTS, ema=0.5, tgc_pairing="own")
        own.setup(model)
        own.teacher.load_state_dict(loss.teacher.state_dict())
        assert not torch.isclose(own(model, batch)["tgc"], out["tgc"])
    recipe = {"loss": "degla", "negatives": "swap", "k": 4, "ema": 0.5, "weights": dict(PAPER_WEIGHTS)}
    assert check_recipe({**recipe, "tgc_pairing": "own"}) == []
    assert check_recipe({**recipe, "tgc_pairing": "mine"})[0][0] == "tgc_pairing"


def test_distill_matches_loop_sum_and_skips_missing_negatives():
    student = (embeddings(5, 8, seed=9), embeddings(5, 8, seed=10), embeddings(5, 3, 8, seed=11))
    teacher = tuple(x.detach() for x in (embeddings(5, 8, seed=12), embeddings(5, 8, seed=13),
                                         embeddings(5, 3, 8, seed=14)))
    mask = _mask()
    got, ref = distill_term(student, teacher, mask), _loop_distill(student, teacher, mask)
    torch.testing.assert_close(got, ref)
    for g, r in zip(grads(got, list(student)), grads(ref, list(student)), strict=True):
        torch.testing.assert_close(g, r)
    assert torch.all(grads(got, [student[2]])[0][~mask] == 0)
    # a batch sum: doubling the batch doubles the term
    doubled = distill_term(tuple(torch.cat([x, x]) for x in student), tuple(torch.cat([x, x]) for x in teacher),
                           torch.cat([mask, mask]))
    torch.testing.assert_close(doubled, 2 * got)


# --- the module on the real tiny open_clip model ----------------------------------------------------


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tokenizer = get_tokenizer(MODEL)
    captions = ["a red circle on grass", "two blue squares", "a small green star", "a yellow cube by a car"]
    negatives = [["a blue circle on grass", "a red square on grass"], ["two red squares", "x"],
                 ["a big green star", "a small red star"], ["x", "x"]]
    mask = torch.tensor([[True, True], [True, False], [False, True], [False, False]])
    return {"images": torch.randn(4, 3, 64, 64, generator=generator), "texts": tokenizer(captions),
            "negatives": torch.stack([tokenizer(n) for n in negatives]), "negative_mask": mask}


def _perturbed_setup(loss: DeGLALoss, tiny: torch.nn.Module):
    """A copy of the model, with the teacher set up and then moved apart from the student by one EMA update."""
    model = copy.deepcopy(tiny)
    loss.setup(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    loss.after_optimizer_step(model)
    return model


@pytest.mark.parametrize("tgc_pairing", ["released", "own"])
@pytest.mark.parametrize("tgc_scale", [10.0, "learned"])
def test_module_terms_equal_the_equations_on_the_modelsembeddings(tiny, tgc_scale, tgc_pairing):
    torch.manual_seed(0)
    loss = DeGLALoss(PAPER_WEIGHTS, ema=0.5, tgc_scale=tgc_scale, tgc_pairing=tgc_pairing)
    model = _perturbed_setup(loss, tiny)
    batch = _batch()
    out = loss(model, batch)
    assert set(out) == {"i2t", "t2i", "igc", "tgc", "distill", "stat_negatives", "loss"}
    mask, scale = batch["negative_mask"], model.logit_scale.exp()

    def encode(m):
        v = m.encode_image(batch["images"], normalize=True)
        t = m.encode_text(batch["texts"], normalize=True)
        neg = m.encode_text(batch["negatives"].flatten(0, 1), normalize=True).view(4, 2, -1)
        return v, t, neg

    with torch.no_grad():
        (v, t, neg), (v_s, t_s, neg_s) = encode(model), encode(loss.teacher)
    close = dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out["igc"], 0.1 * _loop_grounded(v, t, neg, mask, scale), **close)
    # TGC at the released code's fixed 10.0 (default) or the learned scale (the paper's Eq. 9 reading)
    # over the released code's columns (default) or each caption's own negatives (Eq. 9)
    tgc_scale = scale if tgc_scale == "learned" else torch.tensor(10.0)
    tgc_neg, tgc_mask = released_tgc_negatives(neg, mask) if tgc_pairing == "released" else (neg, mask)
    torch.testing.assert_close(out["tgc"], 0.1 * _loop_grounded(t, t_s, tgc_neg, tgc_mask, tgc_scale), **close)
    if not torch.isclose(scale, torch.tensor(10.0)):  # the two readings differ on this model
        other = scale if tgc_scale is not scale else torch.tensor(10.0)
        assert not torch.isclose(out["tgc"], 0.1 * _loop_grounded(t, t_s, tgc_neg, tgc_mask, other))
    torch.testing.assert_close(out["distill"], 0.005 * _loop_distill((v, t, neg), (v_s, t_s, neg_s), mask), **close)
    assert out["distill"] > 0 and out["stat_negatives"].item() == 4
    base = NegCLIPLoss()(model, batch)
    torch.testing.assert_close(out["i2t"] + out["t2i"], base["loss"])

    out["loss"].backward()
    assert all(p.grad is None and not p.requires_grad for p in loss.teacher.parameters())
    assert model.logit_scale.grad is not None
    teacher_ids = {id(p) for p in loss.teacher.parameters()}
    assert not any(id(p) in teacher_ids for _, p in loss.trainable_parameters(model))


def test_ema_update_formula_after_steps(tiny):
    alpha = 0.9
    loss = DeGLALoss(PAPER_WEIGHTS, ema=alpha)
    model = copy.deepcopy(tiny)
    loss.setup(model)
    expected = {n: p.detach().double() for n, p in model.named_parameters()}
    generator = torch.Generator().manual_seed(0)
    for _ in range(2):  # an optimizer step (any change of the student), then the hook
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=generator))
        loss.after_optimizer_step(model)
        for name, p in model.named_parameters():
            expected[name] = alpha * expected[name] + (1 - alpha) * p.detach().double()
    teacher = dict(loss.teacher.named_parameters())
    assert teacher.keys() == expected.keys()
    for name, value in expected.items():  # float32 rounding only
        assert (teacher[name].detach().double() - value).abs().max() < 1e-6, name
    assert not torch.equal(teacher["text_projection"], model.text_projection)
    # the teacher is in the loss module's state (what resume checkpoints carry)
    assert any(key.startswith("teacher.") for key in loss.state_dict())


def test_ema_update_is_the_convex_combination():
    student, teacher = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    before = [p.detach().clone() for p in teacher.parameters()]
    ema_update(teacher, student, 0.75)
    for now, old, s in zip(teacher.parameters(), before, student.parameters(), strict=True):
        torch.testing.assert_close(now.detach(), 0.75 * old + 0.25 * s.detach())


@pytest.mark.parametrize(("weights", "terms", "teacher"), [
    ({"igc": 0, "tgc": 0, "distill": 0}, set(), False),  # CN only
    ({"igc": 0.1, "tgc": 0, "distill": 0}, {"igc"}, False),
    ({"igc": 0, "tgc": 0.1, "distill": 0}, {"tgc"}, True),
    ({"igc": 0, "tgc": 0, "distill": 0.005}, {"distill"}, True),
])
def test_zero_weight_skips_the_term_and_the_teacher(weights, terms, teacher, tiny):
    loss = DeGLALoss(weights, ema=0.99)
    model = tiny
    loss.setup(model)
    out = loss(model, _batch())
    assert set(out) - {"i2t", "t2i", "stat_negatives", "loss"} == terms
    assert (loss.teacher is not None) == teacher and (len(loss.state_dict()) > 0) == teacher
    if not terms:  # CN only is NegCLIP
        torch.testing.assert_close(out["loss"], NegCLIPLoss()(model, _batch())["loss"])


def test_recipe_validation_names_the_key():
    base = {"loss": "degla", "negatives": "swap", "k": 4, "ema": 0.9996, "weights": dict(PAPER_WEIGHTS)}
    assert check_recipe(base) == []
    assert check_recipe({**base, "weights": {"igc": 0.1, "tgc": 0.1}}) == [
        ("weights.distill", "loss degla requires weights.distill")]
    assert check_recipe({**base, "ema": None}) == [
        ("ema", "loss degla needs the EMA teacher's alpha (ema) when weights.tgc or weights.distill > 0")]
    assert check_recipe({**base, "ema": None, "weights": {"igc": 0.1, "tgc": 0, "distill": 0}}) == []
    assert check_recipe({**base, "weights": {**PAPER_WEIGHTS, "itc": 1}})[0][0] == "weights.itc"
    assert check_recipe({**base, "tgc_scale": "learned"}) == check_recipe({**base, "tgc_scale": 10}) == []
    assert check_recipe({**base, "tgc_scale": "fixed"})[0][0] == "tgc_scale"
    assert check_recipe({**base, "tgc_scale": 0})[0][0] == "tgc_scale"
    assert get_loss("degla").build({**base, "tgc_scale": "learned"}).tgc_scale == "learned"
    assert get_loss("degla").build(base).tgc_scale == 10.0  # the released code's default
    assert get_loss("degla").needs == {"negatives"}


# --- through the trainer: resume restores the teacher ----------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory, write_manifest) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("degla")
    colours, rows, negatives = ["red", "blue", "green", "yellow"], [], []
    for i in range(8):
        colour, other = colours[i % 4], colours[(i + 1) % 4]
        image = Image.new("RGB", (64, 64), "white")
        ImageDraw.Draw(image).ellipse([8 + i, 10, 50, 54 - i], fill=colour)
        image.save(root / f"img{i}.png")
        cid = f"c{i}"
        rows.append({"image_id": f"i{i}", "image_path": str(root / f"img{i}.png"), "caption_id": cid,
                     "caption": f"a {colour} circle number {i}", "dataset": "tiny"})
        for slot, text in enumerate([f"a {other} circle number {i}", f"a {colour} square number {i}"]):
            valid = not (i == 5 or (slot == 1 and i % 2))  # c5: no negative; odd captions: one
            negatives.append({"caption_id": cid, "slot": slot, "negative": text if valid else None, "type": "t",
                              "keyword": None, "concreteness": None, "generator": "test", "valid": valid,
                              "reason": "ok" if valid else "none", "truth": "unknown", "negative_image": None})
    manifest = pd.DataFrame(rows)
    write_manifest(manifest, root / "manifest.parquet")
    write_table(pd.DataFrame(negatives), root / "negatives.parquet", "negatives")
    train({"model": MODEL, "init": "scratch", "dataset": "tiny", "train": {"steps": 0}}, None,
          str(root / "base"), seed=0, settings=SETTINGS)
    return {"manifest": root / "manifest.parquet", "negatives": root / "negatives.parquet", "base": root / "base"}


def _recipe() -> dict:
    # a fast-moving teacher (alpha 0.5) so a teacher rebuilt from the student on resume would show
    return {"name": "degla", "base": "clip", "loss": "degla", "negatives": "swap", "k": 2, "ema": 0.5,
            "weights": {"igc": 0.1, "tgc": 0.1, "distill": 0.5},
            "train": {"steps": 4, "batch_size": 4, "lr": 1e-3, "warmup": 1, "weight_decay": 0.1}}


def _losses(path: Path) -> list[dict[str, str]]:
    with open(path / "losses.csv") as handle:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(handle)]


def test_resumed_run_restores_the_teacher(data, tmp_path):
    torch.set_num_threads(1)
    args = dict(manifest=str(data["manifest"]), seed=1, negatives=str(data["negatives"]),
                init_dir=str(data["base"]), settings=SETTINGS)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(_recipe(), out_dir=str(straight), **args)

    def crash(step: int) -> None:
        if step == 3:
            raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError, match="simulated crash"):
        train(_recipe(), out_dir=str(resumed), on_step=crash, **args)
    state = torch.load(resume_dir(resumed) / "state.pt", weights_only=True)
    assert state["step"] == 2 and any(k.startswith("teacher.") for k in state["loss_module"])
    train(_recipe(), out_dir=str(resumed), **args)

    a, b = (torch.load(p / "checkpoint.pt", weights_only=True) for p in (straight, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    rows = _losses(straight)
    assert rows == _losses(resumed)
    assert list(rows[0])[3:] == ["i2t", "t2i", "igc", "tgc", "distill", "stat_negatives", "loss"]
    assert float(rows[0]["distill"]) < 1e-9 and all(float(r["distill"]) > 0 for r in rows[1:])
    assert all(math.isfinite(float(r["loss"])) for r in rows)
