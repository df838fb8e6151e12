"""One device setting (auto | cpu | cuda) and open_clip's precisions, as far as a CPU-only machine shows them:
the choice `auto` makes (with and without a GPU), errors naming the key, autocast dtypes, the scaler."""

from __future__ import annotations

import pytest
import torch

from compo import distributed
from compo.devices import (
    DeviceError,
    autocast,
    data_workers,
    eval_precision,
    grad_scaler,
    resolve_device,
)
from compo.models import create_model, load_model, save_checkpoint


@pytest.fixture
def two_gpus(monkeypatch):
    """What torch reports on a 2-GPU node (only the device choice is exercised: nothing is allocated)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_auto_is_the_cpu_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


def test_cuda_without_a_gpu_is_an_error_naming_the_key(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match=r"config key evaluate\.device: cuda, but torch .* sees no CUDA GPU"):
        resolve_device("cuda", "evaluate.device")


def test_unknown_device_names_the_key_and_the_choices():
    with pytest.raises(DeviceError, match=r"config key train\.device: 'gpu' is not a device \(expected one of "
                                          r"auto, cpu, cuda\)"):
        resolve_device("gpu", "train.device")


def test_auto_and_cuda_pick_the_gpu_of_this_process(two_gpus, monkeypatch):
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda", index=1) == torch.device("cuda", 1)
    assert resolve_device("cpu") == torch.device("cpu")  # cpu is honoured on a GPU node
    with pytest.raises(DeviceError, match="GPU 2 requested but 2 visible"):
        resolve_device("cuda", index=2)
    # under torchrun each rank trains on its LOCAL_RANK's GPU
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "localhost",
                        "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    assert distributed.device("auto") == torch.device("cuda", 1)
    assert distributed.device("cpu") == torch.device("cpu")


@pytest.fixture
def cudnn_attention_flag():
    """Restore torch's global cuDNN-attention switch after the test."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


def test_a_gpu_device_keeps_attention_off_cudnn_and_the_cpu_leaves_it(two_gpus, cudnn_attention_flag):
    # cuDNN's attention plans each new sequence length; the trimmed text tower changes length every batch
    torch.backends.cuda.enable_cudnn_sdp(True)
    resolve_device("cpu")
    assert torch.backends.cuda.cudnn_sdp_enabled()
    resolve_device("auto")
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    distributed.device("cuda")  # the trainer's path
    assert not torch.backends.cuda.cudnn_sdp_enabled()


def test_evaluation_precision_auto_is_amp_on_a_gpu_and_fp32_on_the_cpu():
    assert eval_precision("auto", torch.device("cuda", 0)) == "amp"
    assert eval_precision("auto", torch.device("cpu")) == "fp32"
    assert eval_precision("amp_bf16", torch.device("cpu")) == "amp_bf16"
    with pytest.raises(DeviceError, match="evaluate.precision: 'half'"):
        eval_precision("half", torch.device("cpu"))


def test_autocast_computes_matmuls_in_the_precision_and_fp32_not_at_all():
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    cpu = torch.device("cpu")
    with autocast(cpu, "fp32"):
        assert (a @ b).dtype == torch.float32
    with autocast(cpu, "amp_bf16"):
        assert (a @ b).dtype == torch.bfloat16
    with autocast(cpu, "amp"):
        assert (a @ b).dtype == torch.float16


def test_only_float16_amp_gets_a_gradient_scaler():
    cpu = torch.device("cpu")
    assert grad_scaler(cpu, "fp32") is None and grad_scaler(cpu, "amp_bf16") is None
    assert isinstance(grad_scaler(cpu, "amp"), torch.amp.GradScaler)


def test_data_workers_come_from_the_job_threads():
    # a GPU job: every core but the one feeding the GPU decodes; a CPU job: one decoder beside the compute
    assert [data_workers(n, torch.device("cuda", 0)) for n in (1, 2, 8)] == [1, 1, 7]
    assert [data_workers(n, torch.device("cpu")) for n in (1, 2, 8)] == [0, 1, 1]


def test_evaluation_encodes_under_the_precision_and_returns_float32(tmp_path):
    save_checkpoint(create_model("compo-tiny-clip", "scratch", 0), "compo-tiny-clip", tmp_path)
    from compo.models import encode_texts

    fp32 = load_model(tmp_path, device="auto", precision="auto")
    bf16 = load_model(tmp_path, device="cpu", precision="amp_bf16")
    assert fp32.device == torch.device("cpu") and fp32.precision == "fp32"
    texts = ["a red circle", "two blue squares near a tree"]
    exact, rounded = encode_texts(fp32, texts), encode_texts(bf16, texts)
    assert exact.dtype == rounded.dtype == torch.float32
    assert not torch.equal(exact, rounded)  # really computed in bfloat16 ...
    torch.testing.assert_close(rounded, exact, atol=0.05, rtol=0)  # ... to bfloat16's precision
    with pytest.raises(DeviceError, match="evaluate.device"):
        load_model(tmp_path, device="tpu")


def test_training_on_cuda_without_a_gpu_names_train_device(tmp_path, monkeypatch):
    from compo.train import train

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    recipe = {"model": "compo-tiny-clip", "init": "scratch", "dataset": "x",
              "train": {"steps": 0, "batch_size": 2, "lr": 1e-3, "warmup": 0, "weight_decay": 0.1}}
    with pytest.raises(DeviceError, match=r"config key train\.device: cuda"):
        train(recipe, None, str(tmp_path / "m"), seed=0, settings={"device": "cuda"})
    assert not (tmp_path / "m").exists()
