"""Provenance that cannot drift (issue 43 item 2) and the version it names (issue 44 item 5): a checkpoint's
sha256 recorded when written and checked when loaded (model folders and the model cache), every evaluation
naming the bytes it scored and aggregation refusing a result of other bytes, the code that made a model
recorded, reported when it changed, and a resume under other code refused, naming what changed."""

from __future__ import annotations

import hashlib
import json
import shutil
import tomllib
from pathlib import Path

import pytest
import torch
from artifact_fixtures import build_tiny_open_clip
from PIL import Image

from compo import layout, provenance
from compo.artifacts import CACHE_ENV, MANIFEST, ArtifactMissing
from compo.evaluate import evaluate, evaluate_many
from compo.evaluate.sugarcrepe import SUBSETS
from compo.io import read_json
from compo.models import CheckpointError, create_model, load_model, save_checkpoint
from compo.prefetch import prefetch
from compo.provenance import ProvenanceError, code_sha256, stale_code_warning
from compo.stats import load_results

REPO = Path(__file__).resolve().parents[1]
MODEL = "compo-tiny-clip"


def _model_dir(folder: Path, seed: int = 0) -> Path:
    save_checkpoint(create_model(MODEL, "scratch", seed=seed), MODEL, folder)
    return folder


def _flip_a_byte(path: Path) -> None:
    """Change one byte inside the tensors' data (the middle of the file): torch loads it without a word, as
    it does not check the zip's CRC."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_model_json_records_the_checkpoint_the_version_and_the_code(tmp_path: Path) -> None:
    model_dir = _model_dir(tmp_path / "m")
    meta = json.loads((model_dir / "model.json").read_text())
    assert meta["checkpoint_sha256"] == hashlib.sha256((model_dir / "checkpoint.pt").read_bytes()).hexdigest()
    assert meta["compo_version"] == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert meta["code_sha256"] == code_sha256() and len(code_sha256()) == 64
    assert load_model(model_dir).checkpoint_sha256 == meta["checkpoint_sha256"]


def test_a_changed_checkpoint_is_refused_naming_it(tmp_path: Path) -> None:
    model_dir = _model_dir(tmp_path / "m")
    checkpoint = model_dir / "checkpoint.pt"
    _flip_a_byte(checkpoint)
    torch.load(checkpoint, weights_only=True)  # what made the change silent: torch reads the changed bytes
    with pytest.raises(CheckpointError) as caught:
        load_model(model_dir)
    message = str(caught.value)
    assert message.startswith(f"{checkpoint}: sha256 ") and f"recorded in {model_dir / 'model.json'}" in message
    assert "delete" in message and "weights_only" not in message

    meta = json.loads((model_dir / "model.json").read_text())
    del meta["checkpoint_sha256"]  # a folder written before hashes were recorded, or an edited model.json
    (model_dir / "model.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"model\.json: records no checkpoint_sha256 for .*checkpoint\.pt"):
        load_model(model_dir)


def test_wiseft_reads_only_the_recorded_bytes(tmp_path: Path) -> None:
    """WiSE-FT reads both checkpoints itself (not through load_model): a changed fine-tuned one is refused; the
    two model.json files differ in their hashes only, which is not a different architecture."""
    from compo.wiseft import interpolate

    base, finetuned = _model_dir(tmp_path / "base"), _model_dir(tmp_path / "ft", seed=1)
    interpolate(base, finetuned, 0.5, tmp_path / "half")
    _flip_a_byte(finetuned / "checkpoint.pt")
    with pytest.raises(CheckpointError, match=rf"^{finetuned / 'checkpoint.pt'}: sha256 "):
        interpolate(base, finetuned, 0.5, tmp_path / "again")
    assert not (tmp_path / "again").exists()


def test_the_model_cache_weights_are_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source, cache = tmp_path / "shared", tmp_path / "cache"
    build_tiny_open_clip(source / "compo-test" / "tiny-clip", MODEL, seed=3)
    config = {"bases": {"clip": {"model": MODEL, "init": "tiny", "hub": "compo-test/tiny-clip"}}}
    manifest = prefetch(config, cache, source_dir=source, log=lambda line: None)
    entry = manifest["artifacts"]["open_clip:compo-test/tiny-clip"]
    weights = cache / entry["path"]
    assert entry["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    monkeypatch.setenv(CACHE_ENV, str(cache))
    create_model(MODEL, "tiny", hub="compo-test/tiny-clip")  # the recorded bytes load

    _flip_a_byte(weights)
    with pytest.raises(CheckpointError) as caught:
        create_model(MODEL, "tiny", hub="compo-test/tiny-clip")
    assert str(caught.value).startswith(f"{weights}: sha256 ") and str(cache / MANIFEST) in str(caught.value)
    with pytest.raises(ArtifactMissing, match=r"no longer has the sha256 .* delete .* compo prefetch"):
        prefetch(config, cache, source_dir=source, log=lambda line: None)  # would keep the changed file: refused

    manifest = json.loads((cache / MANIFEST).read_text())  # a manifest written before hashes were recorded
    del manifest["artifacts"]["open_clip:compo-test/tiny-clip"]["sha256"]
    (cache / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="records no checkpoint_sha256"):
        create_model(MODEL, "tiny", hub="compo-test/tiny-clip")
    prefetch(config, cache, source_dir=source, log=lambda line: None)  # records the file's hash
    create_model(MODEL, "tiny", hub="compo-test/tiny-clip")


def _sugarcrepe(root: Path) -> None:
    Image.new("RGB", (32, 32), "red").save((root / "images").mkdir(parents=True) or root / "images" / "a.jpg")
    for subset in SUBSETS:
        item = {"filename": "a.jpg", "caption": "a red square", "negative_caption": "a blue square"}
        (root / f"{subset}.json").write_text(json.dumps({"0": item}))


def test_a_result_of_other_bytes_is_refused_by_aggregation(tmp_path: Path) -> None:
    model_dir = _model_dir(tmp_path / "models" / "negclip" / "coco" / "seed0")
    _sugarcrepe(tmp_path / "bench")
    out = tmp_path / "eval.json"
    evaluate(model_dir, "sugarcrepe", {"kind": "sugarcrepe", "source": "files"}, tmp_path / "bench", out,
             tmp_path / "pred.parquet", model_id="negclip/coco/seed0")
    record = read_json(out)
    scored = json.loads((model_dir / "model.json").read_text())["checkpoint_sha256"]
    assert record["checkpoint_sha256"] == scored and record["model_dir"] == str(model_dir)
    assert len(load_results([out])) == len(record["metrics"])

    _model_dir(model_dir, seed=1)  # the model rebuilt after it was scored (another seed: other weights)
    with pytest.raises(ProvenanceError) as caught:
        load_results([out])
    message = str(caught.value)
    assert message.startswith(f"{out}: scored checkpoint sha256 {scored}, but {model_dir / 'model.json'} records ")
    assert json.loads((model_dir / "model.json").read_text())["checkpoint_sha256"] in message


def test_a_result_is_checked_against_the_model_folder_beside_it_from_any_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded model_dir is relative to the evaluation's working directory; read from elsewhere (a script
    comparing several results folders), the check must still find this study's model, not another's or none."""
    study = tmp_path / "study"
    monkeypatch.chdir(study.mkdir() or study)
    model_dir = Path("results/models/negclip/coco/seed0")
    _model_dir(model_dir)
    _sugarcrepe(tmp_path / "bench")
    out = Path("results/eval/negclip/coco/seed0/sugarcrepe.json")
    evaluate(model_dir, "sugarcrepe", {"kind": "sugarcrepe", "source": "files"}, tmp_path / "bench", out,
             tmp_path / "pred.parquet", model_id="negclip/coco/seed0")
    assert read_json(out)["model_dir"] == "results/models/negclip/coco/seed0"  # relative, as Snakemake runs it

    elsewhere = tmp_path / "elsewhere"
    _model_dir(elsewhere / "results/models/negclip/coco/seed0", seed=1)  # another study's model, same id
    monkeypatch.chdir(elsewhere)
    assert len(load_results([study / out])) == len(read_json(study / out)["metrics"])
    assert layout.result_model_dir(study / out) == study / model_dir
    assert layout.result_model_dir(tmp_path / "eval.json") is None  # outside the layout: the recorded folder

    _model_dir(study / model_dir, seed=1)  # this study's model rebuilt after it was scored
    with pytest.raises(ProvenanceError, match=f"but {study / model_dir / 'model.json'} records "):
        load_results([study / out])


def _evaluated(root: Path) -> tuple[Path, Path]:
    """A model scored on SugarCrepe by the evaluation job's own code (`evaluate_many`, which writes the index):
    (its result JSON, its evaluation index), in the results layout."""
    model_dir = _model_dir(root / "results" / "models" / "negclip" / "coco" / "seed0")
    _sugarcrepe(root / "bench")
    folder = root / "results" / "eval" / "negclip" / "coco" / "seed0"
    job = {"spec": {"kind": "sugarcrepe", "source": "files"}, "dir": root / "bench", "out": folder / "sugarcrepe.json",
           "predictions": folder / "predictions" / "sugarcrepe.parquet"}
    evaluate_many(model_dir, {"sugarcrepe": job}, model_id="negclip/coco/seed0", index=folder / layout.EVAL_INDEX)
    return job["out"], folder / layout.EVAL_INDEX


def test_a_result_edited_after_its_index_is_refused_naming_it(tmp_path: Path) -> None:
    """Issue 59: the tables depend on a model's `_evaluated.json` alone (one DAG edge per model), so a result JSON
    edited after it was never re-aggregated, and entered the tables when anything else re-ran them. The index
    records each result's sha256; reading a result whose bytes differ is an error naming it and the index."""
    out, index = _evaluated(tmp_path)
    recorded = json.loads(index.read_text())[layout.INDEX_HASHES]
    assert recorded == {"sugarcrepe.json": hashlib.sha256(out.read_bytes()).hexdigest()}
    record = read_json(out)
    assert len(load_results([index])) == len(record["metrics"])  # as written: read
    record["metrics"]["overall"]["value"] = 0.99  # a better number, by hand
    out.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=rf"{out}: its bytes are not those {index} recorded .* edited or replaced "
                                         rf"after its evaluation; rerun it \(snakemake --forcerun {index}\)"):
        load_results([index])


def test_a_result_without_its_checkpoint_hash_is_refused_in_the_tables(tmp_path: Path) -> None:
    """Issue 59: a result with its checkpoint hash removed (and its value edited) entered the tables with a warning.
    Now refused, naming the file, by the tables (load_results) and the claims (their reader is the same check)."""
    out, _ = _evaluated(tmp_path)
    record = read_json(out)
    del record["checkpoint_sha256"]
    record["metrics"]["overall"]["value"] = 0.99
    out.write_text(json.dumps(record))
    with pytest.raises(ProvenanceError, match=rf"{out}: records no checkpoint_sha256 \(the sha256 of the model "
                                              r"bytes it scored, got None\).* the tables take no such result"):
        load_results([out])


def test_a_code_change_is_reported_and_names_the_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "compo"
    shutil.copytree(provenance.PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))
    for cached in (provenance.code_files, provenance.code_sha256):
        monkeypatch.setattr(provenance, cached.__name__, cached.__wrapped__)  # uncached: the copy is edited
    monkeypatch.setattr(provenance, "PACKAGE_DIR", package)
    before, files = provenance.code_sha256(), provenance.code_files()
    assert before == code_sha256()  # contents and relative paths only: the copy has the checkout's hash
    models = tmp_path / "results" / "models"
    for model, code in (("negclip/coco/seed0", before), ("clip/coco/seed0", before)):
        (models / model).mkdir(parents=True)
        (models / model / "model.json").write_text(json.dumps({"code_sha256": code, "compo_version": "0.1.0"}))
    assert stale_code_warning(models) is None

    loss = package / "losses" / "clip.py"
    loss.write_text(loss.read_text() + "\n# a changed loss\n")
    assert provenance.code_sha256() != before
    assert provenance.changed_code_files(files) == ["losses/clip.py"]
    note = stale_code_warning(models)
    assert note is not None and note.startswith(f"compo-study: 2 model folder(s) under {models} were built by")
    assert f"  {models / 'negclip' / 'coco' / 'seed0'} (compo 0.1.0)" in note.splitlines()
    assert "snakemake --forcerun pretrain train" in note
    # the package's data files count as its code: a changed resource or model config is a change too
    relations = package / "resources" / "aro_symmetric_relations.txt"
    relations.write_text(relations.read_text() + "beside\n")
    assert provenance.changed_code_files(files) == ["losses/clip.py", "resources/aro_symmetric_relations.txt"]


def test_resuming_under_other_code_is_refused_naming_the_change(tmp_path: Path) -> None:
    from compo.train import RESUME_KEYS, Inputs, Run, Settings, TrainingError, resume, resume_dir, store_resume_state

    out = tmp_path / "run"
    files = dict(provenance.code_files())
    files["losses/clip.py"] = "0" * 64  # saved while the CLIP loss read otherwise
    state = {key: None for key in RESUME_KEYS} | {"identity": {"code": "1" * 64}, "code_files": files}
    store_resume_state(state, out)
    run = Run({}, 0, out, Inputs(), Settings(), torch.nn.Linear(1, 1), MODEL, identity={"code": code_sha256()})
    with pytest.raises(TrainingError) as caught:
        resume(run)
    message = str(caught.value)
    assert message.startswith(f"{resume_dir(out) / 'state.pt'}: saved under other code (compo code sha256 {'1' * 64}")
    assert "changed: losses/clip.py under workflow/compo" in message and f"delete {resume_dir(out)}" in message
    assert (resume_dir(out) / "state.pt").exists()  # kept: the user decides


def test_the_modes_that_delete_or_touch_outputs_are_recognised() -> None:
    from compo.profiles import destructive_options

    assert destructive_options(["--delete-all", "--cores", "1"]) == ["--delete-all-output"]  # argparse prefix
    assert destructive_options(["-Ft"]) == ["--touch"] and destructive_options(["--cm", "a.txt"]) == [
        "--cleanup-metadata"]
    assert destructive_options(["--delete-temp-output"]) == ["--delete-temp-output"]
    assert destructive_options(["-n", "--delete-all-output"]) == [] and destructive_options(["--cores", "2"]) == []


@pytest.mark.slow
def test_a_second_checkout_cannot_delete_a_running_studys_outputs(tmp_path: Path, run_snakemake) -> None:
    """Two working directories on one results folder (an absolute `results`): while the study of the first
    holds the lock, `--delete-all-output` from the second is refused and deletes nothing (and reports a model
    folder built by other code); once that study ends, the same command deletes."""
    import subprocess
    import sys

    results, first, second = tmp_path / "shared-results", tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    overlay = tmp_path / "results.yaml"
    overlay.write_text(f"results: {results}\n")
    output = results / "models" / "negclip" / "coco" / "seed0" / "model.json"  # an output of the workflow
    output.parent.mkdir(parents=True)
    output.write_text(json.dumps({"code_sha256": "0" * 64, "compo_version": "0.0.9"}))
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from compo.results_root import StudyLock; "
                               "StudyLock(sys.argv[1]).acquire(); print('held', flush=True); sys.stdin.read()",
                               str(results)], cwd=first, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        run = run_snakemake(second, "--delete-all-output", configs=[overlay])
        assert run.returncode != 0 and output.exists()
        assert f"compo-study: --delete-all-output refused: {results}: another study is running" in run.stderr
        assert f"in {first}" in run.stderr and f"pid {holder.pid}" in run.stderr
        assert "compo-study: 1 model folder(s)" in run.stderr and f"{output.parent} (compo 0.0.9)" in run.stderr
    finally:
        holder.communicate("")
    run = run_snakemake(second, "--delete-all-output", configs=[overlay])
    assert run.returncode == 0, run.stderr[-2000:]
    assert not output.exists() and not (results / ".compo-study.lock").exists()
