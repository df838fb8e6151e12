"""One device setting (auto | cpu | cuda) and open_clip's precisions, as far as a CPU-only machine shows them:
the choice `auto` makes (with and without a GPU), errors naming the key, autocast dtypes, the scaler."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from compo import distributed
from compo.devices import (
    DeviceError,
    autocast,
    available_cpus,
    data_workers,
    eval_precision,
    grad_scaler,
    rank_cpus,
    resolve_device,
)
from compo.models import create_model, load_model, save_checkpoint

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def two_gpus(monkeypatch):
    """What torch reports on a 2-GPU node (only the device choice is exercised: nothing is allocated)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_auto_is_the_cpu_without_a_gpu_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with caplog.at_level(logging.WARNING, logger="compo.devices"):
        assert resolve_device("auto", "train.device") == torch.device("cpu")
    assert [r.getMessage() for r in caplog.records] == [
        f"config key train.device: auto runs on the CPU: torch {torch.__version__} sees no CUDA GPU (CUDA build: "
        f"{torch.version.cuda or 'no'}, CUDA_VISIBLE_DEVICES='')"]
    caplog.clear()
    assert resolve_device("cpu") == torch.device("cpu")
    assert not caplog.records  # asked for: no warning


def test_cuda_without_a_gpu_is_an_error_naming_the_key(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match=r"config key evaluate\.device: cuda, but torch .* sees no CUDA GPU"):
        resolve_device("cuda", "evaluate.device")


@pytest.mark.parametrize("stage", ["train", "evaluate"])
def test_a_cuda_job_without_a_gpu_fails_at_its_start_naming_the_key_and_the_job(stage, tmp_path, monkeypatch,
                                                                                capsys):
    """paper.yaml's `device: cuda` on this CPU-only machine, as a job on a node whose allocation has no GPU:
    `compo <stage>` exits at once (before reading its inputs: none exist here) with one line naming the key,
    CUDA_VISIBLE_DEVICES and the SLURM job."""
    from compo.cli import main
    from compo.config import load_config

    assert load_config(REPO / "config" / "paper.yaml")[stage]["device"] == "cuda"
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    missing = str(tmp_path / "absent")
    if stage == "train":
        argv = ["train", "--recipe", json.dumps({"model": "ViT-B-32", "loss": "infonce"}),
                "--settings", json.dumps({"device": "cuda"}), "--manifest", missing, "--init-dir", missing,
                "--seed", "0", "--out", str(tmp_path / "model")]
    else:
        argv = ["evaluate", "--model-dir", missing, "--model-id", "m", "--benchmarks", "{}", "--device", "cuda",
                "--out-dir", str(tmp_path / "eval")]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 1
    assert (f"compo {stage}: DeviceError: config key {stage}.device: cuda, but torch" in err
            and "CUDA_VISIBLE_DEVICES='', SLURM job 4242 with GPUs none)" in err), err


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
    # a GPU job: every core but the one feeding the GPU decodes (one core: it decodes itself); a CPU job: one
    # decoder beside the compute
    assert [data_workers(n, torch.device("cuda", 0)) for n in (1, 2, 8)] == [0, 1, 7]
    assert [data_workers(n, torch.device("cpu")) for n in (1, 2, 8)] == [0, 1, 1]


def test_each_rank_decodes_with_its_share_of_the_cpus_the_job_has():
    """A 4-GPU job of 32 CPUs (the SLURM profile's 8 a GPU): each of its 4 ranks 8 CPUs, 7 decoding workers (28
    processes of 32, 4 feeding GPUs), where every rank took the job's 8 before (7 workers each: 28 on 8 cores). The
    CPUs the process may run on bound it (a cgroup of 16: 4 a rank); no threads given: all of them."""
    gpu = torch.device("cuda", 0)
    assert rank_cpus(32, 4, available=64) == 8 and data_workers(rank_cpus(32, 4, available=64), gpu) == 7
    assert rank_cpus(8, 4, available=64) == 2 and data_workers(rank_cpus(8, 4, available=64), gpu) == 1
    assert rank_cpus(32, 4, available=16) == 4 and data_workers(rank_cpus(32, 4, available=16), gpu) == 3
    assert rank_cpus(3, 4, available=16) == 1 and data_workers(rank_cpus(3, 4, available=16), gpu) == 0
    assert rank_cpus(None, 2, available=12) == 6 and rank_cpus(8, 1, available=12) == 8
    assert rank_cpus(None) == available_cpus() >= 1


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
