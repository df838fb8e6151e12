"""WiSE-FT weight interpolation between two real open_clip model directories."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
import yaml

from compo.models import create_model, load_model, save_checkpoint
from compo.wiseft import WiseFTError, interpolate

MODEL = "compo-tiny-clip"


def _model_dir(path: Path, model_name: str, seed: int) -> Path:
    model = create_model(model_name, "scratch", seed)
    with torch.no_grad():
        model.logit_scale.fill_(-0.0)  # a negative zero must survive the endpoints bit for bit
        for module in model.modules():  # as if trained: BatchNorm statistics and step counters moved
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.add_(seed)
                module.num_batches_tracked.fill_(7 * seed)
    save_checkpoint(model, model_name, path)
    (path / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "model_name": model_name}))
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("wiseft")
    return {"base": _model_dir(root / "base", MODEL, 0), "ft": _model_dir(root / "ft", MODEL, 1), "root": root}


def _state(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path / "checkpoint.pt", weights_only=True)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.int32) if tensor.is_floating_point() else tensor


@pytest.mark.parametrize(("alpha", "endpoint"), [(0.0, "base"), (1.0, "ft")])
def test_endpoints_are_bit_identical(dirs, tmp_path, alpha, endpoint):
    interpolate(dirs["base"], dirs["ft"], alpha, tmp_path / "out")
    got, want = _state(tmp_path / "out"), _state(dirs[endpoint])
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert torch.equal(_bits(got[name]), _bits(tensor)), name


def test_half_is_the_midpoint_and_a_normal_model_directory(dirs, tmp_path):
    out = tmp_path / "wiseft-clip-ft-a0.5" / "coco" / "seed0"
    interpolate(dirs["base"], dirs["ft"], 0.5, out)
    got, base, ft = _state(out), _state(dirs["base"]), _state(dirs["ft"])
    assert not torch.equal(base["text_projection"], ft["text_projection"])
    counters = [name for name in base if name.endswith("num_batches_tracked")]
    assert counters  # the default towers are CLIP's ResNets, with BatchNorm
    for name in base:
        if name in counters:  # a step counter is bookkeeping: the fine-tuned model's, not a midpoint
            assert got[name].item() == ft[name].item() == 7
        else:  # weights and running statistics alike
            torch.testing.assert_close(got[name], (base[name] + ft[name]) / 2)
    loaded = load_model(out)  # plain open_clip loading, as evaluation does
    assert loaded.model_name == MODEL
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["wiseft"] == {"alpha": 0.5, "base_dir": str(dirs["base"]), "finetuned_dir": str(dirs["ft"])}
    assert config["base_config"]["seed"] == 0 and config["finetuned_config"]["seed"] == 1
    with open(out / "losses.csv") as handle:
        assert list(csv.reader(handle)) == [["step", "epoch", "lr", "loss"]]
    with open(out / "timings.csv") as handle:
        assert list(csv.reader(handle)) == [["step", "data_seconds", "seconds"]]


def test_mismatched_architectures_name_both_directories(dirs, tmp_path):
    other = _model_dir(dirs["root"] / "sigmoid", "compo-tiny-sigmoid", 0)
    with pytest.raises(WiseFTError, match="different architectures") as error:
        interpolate(dirs["base"], other, 0.5, tmp_path / "out")
    assert str(dirs["base"]) in str(error.value) and str(other) in str(error.value)
    assert not (tmp_path / "out").exists()


def test_alpha_outside_the_unit_interval_is_refused(dirs, tmp_path):
    with pytest.raises(WiseFTError, match=r"alpha must lie in \[0, 1\]"):
        interpolate(dirs["base"], dirs["ft"], 1.5, tmp_path / "out")
