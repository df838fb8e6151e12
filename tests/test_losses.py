"""Losses against direct per-sample implementations of the paper equations (DeGLA Eq. 1-5)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from compo.losses import LOSSES, get_loss, needs_of, with_total
from compo.losses.clip import NegCLIPLoss, infonce_terms, negclip_terms


def _embeddings(*shape: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=generator, dtype=torch.float64), dim=-1).requires_grad_()


def _loop_infonce(v, t, scale):
    """Eq. 1-3 written per sample: -log exp(s v_i.t_i) / sum_j exp(s v_i.t_j), and the symmetric one."""
    n = len(v)

    def one_way(a, b):
        total = 0
        for i in range(n):
            denominator = sum(torch.exp(scale * a[i] @ b[j]) for j in range(n))
            total = total - torch.log(torch.exp(scale * a[i] @ b[i]) / denominator)
        return total / n

    return one_way(v, t), one_way(t, v)


def _loop_negclip(v, t, neg, mask, scale):
    """Eq. 4 per sample: the denominator sums, over every caption j of the batch, its positive and each of
    its valid hard negatives; Eq. 5's text->image term is Eq. 2."""
    n, k = mask.shape
    i2t = 0
    for i in range(n):
        denominator = 0
        for j in range(n):
            denominator = denominator + torch.exp(scale * v[i] @ t[j])
            for slot in range(k):
                if mask[j, slot]:
                    denominator = denominator + torch.exp(scale * v[i] @ neg[j, slot])
        i2t = i2t - torch.log(torch.exp(scale * v[i] @ t[i]) / denominator)
    _, t2i = _loop_infonce(v, t, scale)
    return i2t / n, t2i


def _grads(loss, inputs):
    return torch.autograd.grad(loss, inputs, retain_graph=True)


def test_infonce_matches_loop_values_and_gradients():
    v, t = _embeddings(6, 8, seed=0), _embeddings(6, 8, seed=1)
    scale = torch.tensor(7.5, dtype=torch.float64, requires_grad=True)
    i2t, t2i = infonce_terms(v, t, scale)
    ref_i2t, ref_t2i = _loop_infonce(v, t, scale)
    torch.testing.assert_close(i2t, ref_i2t)
    torch.testing.assert_close(t2i, ref_t2i)
    inputs = [v, t, scale]
    expected = _grads(0.5 * (ref_i2t + ref_t2i), inputs)
    for got, ref in zip(_grads(0.5 * (i2t + t2i), inputs), expected, strict=True):
        torch.testing.assert_close(got, ref)


@pytest.mark.parametrize("k", [1, 3])
def test_negclip_matches_loop_with_missing_negatives_masked(k):
    n, d = 5, 8
    v, t, neg = _embeddings(n, d, seed=2), _embeddings(n, d, seed=3), _embeddings(n, k, d, seed=4)
    mask = torch.ones(n, k, dtype=torch.bool)
    mask[1] = False  # a caption with no valid negative at all
    mask[3, -1] = False  # a caption with a missing last slot
    scale = torch.tensor(4.0, dtype=torch.float64, requires_grad=True)
    i2t, t2i = negclip_terms(v, t, neg, mask, scale)
    ref_i2t, ref_t2i = _loop_negclip(v, t, neg, mask, scale)
    torch.testing.assert_close(i2t, ref_i2t)
    torch.testing.assert_close(t2i, ref_t2i)
    inputs = [v, t, neg, scale]
    for got, ref in zip(_grads(i2t + t2i, inputs), _grads(ref_i2t + ref_t2i, inputs), strict=True):
        torch.testing.assert_close(got, ref)
    # a masked slot is not a (zero or any) fake negative: its embedding gets no gradient at all
    neg_grad = _grads(i2t, [neg])[0]
    assert torch.all(neg_grad[~mask] == 0) and torch.all(neg_grad[mask].abs().sum(-1) > 0)


def test_negclip_without_any_negative_is_infonce():
    v, t, neg = _embeddings(4, 8, seed=5), _embeddings(4, 8, seed=6), _embeddings(4, 2, 8, seed=7)
    scale = torch.tensor(10.0, dtype=torch.float64)
    got = negclip_terms(v, t, neg, torch.zeros(4, 2, dtype=torch.bool), scale)
    ref = infonce_terms(v, t, scale)
    torch.testing.assert_close(got, ref)
    # with negatives the image->text loss can only grow (more terms in every denominator)
    with_negatives = negclip_terms(v, t, neg, torch.ones(4, 2, dtype=torch.bool), scale)
    assert with_negatives[0] > ref[0] and math.isclose(with_negatives[1].item(), ref[1].item())


def test_total_sums_terms_but_not_statistics():
    terms = with_total({"a": torch.tensor(1.0), "b": torch.tensor(2.5), "stat_n": torch.tensor(100.0)})
    assert terms["loss"].item() == 3.5


class _TinyTextImageModel(torch.nn.Module):
    """Stand-in encoders for checking the module's plumbing (which tokens go where), not the equation."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 6)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(5.0)))

    def encode_image(self, images, normalize=True):
        return F.normalize(images.flatten(1)[:, :6], dim=-1)

    def encode_text(self, tokens, normalize=True):
        return F.normalize(self.embed(tokens).mean(1), dim=-1)


def test_negclip_module_encodes_only_valid_negatives_with_the_models_logit_scale():
    torch.manual_seed(0)
    model = _TinyTextImageModel()
    batch = {
        "images": torch.randn(3, 3, 2, 2),
        "texts": torch.randint(1, 50, (3, 5)),
        "negatives": torch.randint(1, 50, (3, 2, 5)),
        "negative_mask": torch.tensor([[True, False], [False, False], [True, True]]),
    }
    out = NegCLIPLoss()(model, batch)
    v = model.encode_image(batch["images"])
    t = model.encode_text(batch["texts"])
    neg = model.encode_text(batch["negatives"].flatten(0, 1)).view(3, 2, -1)
    i2t, t2i = _loop_negclip(v.double(), t.double(), neg.double(), batch["negative_mask"], 5.0)
    torch.testing.assert_close(out["loss"].double(), 0.5 * (i2t + t2i))
    assert out["stat_negatives"].item() == 3
    assert set(out) == {"i2t", "t2i", "stat_negatives", "loss"}
    out["loss"].backward()
    assert model.logit_scale.grad is not None and model.logit_scale.grad != 0


def test_negclip_hard_image_rows_are_scored_as_rows_of_their_own():
    """NegCLIP's trainer: the B hard-image rows (image, its caption, that caption's negatives) join the B rows;
    its 2B images score 2B captions plus every negative, by the per-sample loop of the equation."""
    torch.manual_seed(1)
    model = _TinyTextImageModel()
    batch = {
        "images": torch.randn(2, 3, 2, 2), "texts": torch.randint(1, 50, (2, 5)),
        "negatives": torch.randint(1, 50, (2, 1, 5)), "negative_mask": torch.tensor([[True], [False]]),
        "hard_images": torch.randn(2, 3, 2, 2), "hard_image_texts": torch.randint(1, 50, (2, 5)),
        "hard_image_negatives": torch.randint(1, 50, (2, 1, 5)),
        "hard_image_negative_mask": torch.tensor([[True], [True]]),
    }
    out = NegCLIPLoss()(model, batch)
    v = model.encode_image(torch.cat([batch["images"], batch["hard_images"]]))
    t = model.encode_text(torch.cat([batch["texts"], batch["hard_image_texts"]]))
    negatives = torch.cat([batch["negatives"], batch["hard_image_negatives"]])
    mask = torch.cat([batch["negative_mask"], batch["hard_image_negative_mask"]])
    neg = model.encode_text(negatives.flatten(0, 1)).view(4, 1, -1)
    i2t, t2i = _loop_negclip(v.double(), t.double(), neg.double(), mask, 5.0)
    torch.testing.assert_close(out["loss"].double(), 0.5 * (i2t + t2i))
    assert out["stat_negatives"].item() == 3
    without = NegCLIPLoss()(model, {k: batch[k] for k in ("images", "texts", "negatives", "negative_mask")})
    assert not torch.isclose(without["loss"], out["loss"])


def test_registry_contract():
    assert get_loss("negclip").needs == {"negatives"} and get_loss("infonce").needs == set()
    assert set(LOSSES) >= {"infonce", "negclip"}
    with pytest.raises(ValueError, match="unknown loss 'nope'"):
        get_loss("nope")


def test_every_need_of_the_registry_is_a_batch_part_of_compo_batches():
    """The registry names the batch parts; compo.batches is where each is built (one home, no drift)."""
    from compo.batches import BATCH_PARTS

    needs = set().union(*(spec.needs for spec in LOSSES.values()))
    assert needs == {"negatives", "cement_pairs", "noun_phrases", "online_negatives"}
    # "negatives": TrainingData reads the offline table; "hard_images": a recipe's, not a loss's (needs_of)
    assert needs - {"negatives"} | {"hard_images"} == set(BATCH_PARTS)
    assert needs_of({"loss": "negclip", "hard_images": 3}) == {"negatives", "hard_images"}
    assert needs_of({"loss": "negclip"}) == {"negatives"}
