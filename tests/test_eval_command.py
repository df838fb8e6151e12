"""`compo eval` (issue 58 item 2): checkpoints evaluated on named or given benchmarks without a config, its checks
before any work, and a base's local weights file as a rule input (missing: named at the DAG build; replaced: rerun)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from compo.artifacts import CACHE_ENV
from compo.checkpoint_eval import CSV_COLUMNS, benchmark_jobs, checkpoints
from compo.cli import main as cli_main
from compo.config import ConfigError, load_config
from compo.evaluate import evaluate_many
from compo.evaluate.files import BenchmarkError
from compo.inputs import input_status
from compo.io import read_json
from compo.layout import EVAL_INDEX, INDEX_HASHES, predictions_path
from compo.models import CheckpointError
from compo.provenance import file_sha256

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = "compo-tiny-clip"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny model's weights in the layouts `compo eval` reads, and files it must refuse."""
    from safetensors.torch import save_file

    from compo.models import open_clip

    folder = tmp_path_factory.mktemp("weights")
    torch.manual_seed(3)
    state = open_clip().create_model(MODEL).state_dict()
    torch.save(state, folder / "plain.pt")
    torch.save({"epoch": 2, "state_dict": {f"module.{k}": v for k, v in state.items()}}, folder / "epoch_2.pt")
    save_file({k: v.contiguous() for k, v in state.items()}, folder / "tiny.safetensors")
    (folder / "garbage.pt").write_bytes(b"not a checkpoint")
    (folder / "garbage.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    return {p.stem + p.suffix: p for p in folder.iterdir()}


def test_each_layout_opens_and_is_paired_with_its_model(weights: dict[str, Path]) -> None:
    found = checkpoints([MODEL] * 3, [str(weights["plain.pt"]), str(weights["epoch_2.pt"]),
                                      str(weights["tiny.safetensors"])])
    assert [c.name for c in found] == [f"{MODEL}-plain", f"{MODEL}-epoch_2", f"{MODEL}-tiny"]
    assert found[1].base == {"model": MODEL, "init": "released", "weights": str(weights["epoch_2.pt"]),
                             "format": "open_clip"}
    assert checkpoints([MODEL], [str(weights["plain.pt"])], ["longclip"], ["mine"])[0].base["format"] == "longclip"


@pytest.mark.parametrize(("file", "message"), [
    ("missing.pt", r"--pretrained \(of --model compo-tiny-clip\): .*missing\.pt: no such file"),
    ("garbage.pt", r"garbage\.pt: cannot be read as a checkpoint .*open_clip state dict"),
    ("garbage.safetensors", r"garbage\.safetensors: cannot be read as a safetensors file"),
])
def test_a_missing_or_unreadable_weights_file_is_named(weights: dict[str, Path], file: str, message: str) -> None:
    path = weights.get(file, next(iter(weights.values())).parent / file)
    with pytest.raises(CheckpointError, match=message):
        checkpoints([MODEL], [str(path)])


@pytest.mark.parametrize(("models", "pretrained", "extra", "message"), [
    ([MODEL, MODEL], ["plain.pt"], {}, "give each --model its --pretrained: 2 --model, 1 --pretrained"),
    ([], [], {}, "give each --model its --pretrained"),
    ([MODEL], ["plain.pt"], {"formats": ["clip"]}, "--format 'clip': expected one of open_clip, longclip"),
    ([MODEL, MODEL], ["plain.pt", "plain.pt"], {}, "two models would write OUT/compo-tiny-clip-plain"),
    ([MODEL], ["plain.pt"], {"names": ["a b"]}, "--name: 'a b' is not a name"),
    (["no-such-model"], ["plain.pt"], {}, "unknown open_clip model 'no-such-model'"),
    ([MODEL], ["laion2b"], {}, "--pretrained 'laion2b': no such weights file, nor an open_clip tag of compo-tiny"),
])
def test_bad_model_arguments_are_errors_naming_the_option(weights: dict[str, Path], models: list[str],
                                                          pretrained: list[str], extra: dict, message: str) -> None:
    given = [str(weights[p]) if p in weights else p for p in pretrained]
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        checkpoints(models, given, **extra)


def test_benchmarks_resolve_as_the_rules_do_and_unknown_ones_list_the_known(tmp_path: Path) -> None:
    config = load_config(REPO / "config" / "config.yaml", overrides={"results": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"--benchmarks nope: not a benchmark of the config \(known: sugarcrepe, "):
        benchmark_jobs(config, ["nope"], [])
    with pytest.raises(BenchmarkError, match=r"benchmark kind 'sugar' unknown \(known: .*sugarcrepe"):
        benchmark_jobs(config, [], ["sugar=/x"])
    with pytest.raises(ValueError, match="--benchmark-dir 'sugarcrepe': expected KIND=PATH"):
        benchmark_jobs(config, [], ["sugarcrepe"])
    with pytest.raises(BenchmarkError, match=rf"benchmark winoground: folder {tmp_path}/benchmarks/world/winoground "
                                             r"not found \(a world benchmark"):
        benchmark_jobs(config, ["winoground"], [])
    (tmp_path / "wino").mkdir()
    with pytest.raises(BenchmarkError, match=r"benchmark winoground: 1 of its files missing, first .*wino/"):
        benchmark_jobs(config, [], [f"winoground={tmp_path / 'wino'}"])
    with pytest.raises(ValueError, match="name benchmarks"):
        benchmark_jobs(config, [], [])


def test_nothing_is_written_when_a_check_fails(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        cli_main(["eval", "--model", MODEL, "--pretrained", str(tmp_path / "gone.pt"), "--benchmarks", "sugarcrepe",
                  "--out", str(tmp_path / "out")])
    assert "compo eval: CheckpointError: --pretrained (of --model compo-tiny-clip): " in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_local_weights_file_is_a_raw_input(tmp_path: Path) -> None:
    base = {"model": MODEL, "init": "released", "weights": str(tmp_path / "w.pt")}
    config = load_config(REPO / "config" / "config.yaml", overrides={"bases": {"mine": base}})
    assert [(item.key, word) for item, word in input_status(config) if item.key.startswith("bases.")] == [
        ("bases.mine.weights", "MISSING")]


@pytest.mark.slow
def test_compo_eval_writes_the_study_s_results_for_each_checkpoint(tmp_path: Path, tiny_world: dict,
                                                                  tiny_model_dir: Path) -> None:
    """A compo model folder's checkpoint.pt (a plain state dict) and the same weights in open_clip_train's layout,
    on named world benchmarks and one given as a folder: the records are those `compo evaluate` writes for the
    model folder (same metrics and checkpoint hash), and results.csv holds every metric of every record."""
    from compo.world import generate_benchmarks

    generate_benchmarks(tiny_world, seed=0, out_dir=tmp_path / "results" / "benchmarks" / "world")
    (tmp_path / "paths.yaml").write_text(yaml.safe_dump({"results": str(tmp_path / "results")}))
    state = torch.load(tiny_model_dir / "checkpoint.pt", weights_only=True)
    torch.save({"epoch": 1, "state_dict": {f"module.{k}": v for k, v in state.items()}}, tmp_path / "epoch_1.pt")
    given = tmp_path / "results" / "benchmarks" / "world" / "retrieval"
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "compo", "eval", "--model", MODEL, "--pretrained", str(tiny_model_dir / "checkpoint.pt"),
         "--model", MODEL, "--pretrained", str(tmp_path / "epoch_1.pt"), "--name", "folder", "--name", "train",
         "--benchmarks", "sugarcrepe", "zeroshot-shape", "--benchmark-dir", f"retrieval={given}",
         "--configfile", str(REPO / "config" / "config.yaml"), str(tmp_path / "paths.yaml"), "--out", str(out),
         "--threads", "1"], capture_output=True, text=True, check=False, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    print(run.stdout)
    names = ["sugarcrepe", "zeroshot-shape", "retrieval"]
    config = load_config(REPO / "config" / "config.yaml", tmp_path / "paths.yaml")
    jobs = {name: {"spec": spec, "dir": str(tmp_path / "results" / "benchmarks" / "world" / name),
                   "out": str(tmp_path / "study" / f"{name}.json"),
                   "predictions": predictions_path(tmp_path / "study" / f"{name}.json")}
            for name, spec in [(n, config["benchmarks"][n]) for n in names[:2]]
            + [("retrieval", {"kind": "retrieval", "source": "files", "path": str(given)})]}
    study = evaluate_many(tiny_model_dir, jobs, config["zeroshot_templates"], model_id="folder",
                          settings={"threads": 1})
    table = pd.read_csv(out / "results.csv")
    assert list(table.columns) == CSV_COLUMNS
    for name in ("folder", "train"):
        assert read_json(out / name / EVAL_INDEX) == {"model": name, "results": [f"{b}.json" for b in names],
                                                      INDEX_HASHES: {f"{b}.json": file_sha256(out / name / f"{b}.json")
                                                                     for b in names}}
        for expected in study:
            record = read_json(out / name / f"{expected['benchmark']}.json")
            assert record["metrics"] == expected["metrics"] and record["headline"] == expected["headline"]
            assert record["checkpoint_sha256"] == file_sha256(record["weights"])
            if name == "folder":  # the same bytes as the model folder's
                assert record["checkpoint_sha256"] == expected["checkpoint_sha256"]
            assert Path(predictions_path(out / name / f"{expected['benchmark']}.json")).is_file()
            rows = table[(table["model"] == name) & (table["benchmark"] == expected["benchmark"])]
            assert dict(zip(rows["metric"], rows["value"], strict=True)) == pytest.approx(
                {m: v["value"] for m, v in expected["metrics"].items()})
            headline = rows[rows["headline"]]
            assert list(headline["metric"]) == [expected["headline"]]
            assert any(line.split()[:3] == [name, expected["benchmark"], expected["headline"]]
                       for line in run.stdout.splitlines()), run.stdout


@pytest.mark.slow
def test_a_base_s_weights_file_is_a_rule_input(tmp_path: Path, run_snakemake) -> None:
    """Missing, the DAG build names bases.<name>.weights; replaced, the base's export reruns."""
    from compo.models import create_model

    weights = tmp_path / "mine.pt"
    torch.save(create_model(MODEL, "scratch", seed=0).state_dict(), weights)
    (tmp_path / "overlay.yaml").write_text(yaml.safe_dump({
        "results": "results", "bases": {"mine": {"model": MODEL, "init": "released", "weights": str(weights)}},
        "study": {"methods": [], "bases": ["mine"], "seeds": [0], "claims": [], "ablations": []},
        "wiseft": {"methods": []}}))
    target = "results/models/base-mine/released/seed0/checkpoint.pt"
    run = run_snakemake(tmp_path, target, configs=[tmp_path / "overlay.yaml"])
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Nothing to be done" in run_snakemake(tmp_path, "-n", target, configs=[tmp_path / "overlay.yaml"]).stdout
    time.sleep(0.05)
    weights.touch()
    dry = run_snakemake(tmp_path, "-n", target, configs=[tmp_path / "overlay.yaml"])
    assert f"reason: Updated input files: {weights}" in dry.stdout, dry.stdout[-2000:]
    weights.unlink()
    dry = run_snakemake(tmp_path, "-n", target, configs=[tmp_path / "overlay.yaml"])
    assert dry.returncode != 0 and f"bases.mine.weights: {weights}" in dry.stdout + dry.stderr



def test_a_tag_missing_from_the_model_cache_is_named_before_any_work(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from compo.checkpoint_eval import check_weights_resolve

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    found = checkpoints(["ViT-B-32"], ["openai"])
    assert found[0].base == {"model": "ViT-B-32", "init": "openai", "format": "open_clip"}
    with pytest.raises(ValueError, match=r"--pretrained openai \(of --model ViT-B-32\): open_clip:.* is not in the "
                                         r"model cache .*: run compo prefetch"):
        check_weights_resolve(found)


def test_compo_evaluate_names_a_benchmark_entry_without_spec(tmp_path: Path, capsys) -> None:
    """`KeyError: 'spec'` from compo evaluate."""
    from compo.cli import main

    with pytest.raises(SystemExit):
        main(["evaluate", "--model-dir", str(tmp_path), "--model-id", "m/d/seed0", "--out-dir", str(tmp_path),
              "--benchmarks", json.dumps({"sugarcrepe": {"dir": "benchmarks/sugarcrepe"}})])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--benchmarks: entry 'sugarcrepe' should be {\"spec\": {...}, \"dir\"" in err[0], err
    with pytest.raises(SystemExit):
        main(["evaluate", "--model-dir", str(tmp_path), "--model-id", "m/d/seed0", "--out-dir", str(tmp_path),
              "--benchmarks", "5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--benchmarks: expected a JSON object {name: " in err[0] and err[0].endswith("got 5"), err
