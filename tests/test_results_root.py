"""Hostile and broken inputs, third round (issue 31): one test per numbered case, each reading the message.

1 no data file runs code (CIFAR pickles)       2 names read from files stay inside their root
3 repeated config entries, at DAG build        4 unknown model, text positions, LoRA targets, results root
5 the dataset stage decodes and root-checks    6 unreadable checkpoints and resume states
7 concreteness norms are validated             8 captions longer than a bound stop at the dataset stage
9 one study per results folder (a lock)
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from compo.concreteness import NormsError, load_norms
from compo.config import ConfigError, validate_config
from compo.data import build_manifest
from compo.evaluate.files import BenchmarkError
from compo.io import read_table

REPO = Path(__file__).resolve().parents[1]
COCO = REPO / "tests" / "fixtures" / "raw" / "coco"


# --- 1. CIFAR pickles are read through a restricted unpickler -------------------------------------------


class _Payload:
    """Unpickling this runs a shell command (what a crafted data_batch_* holds)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.marker}",)


def _cifar10_with_payload(root: Path, marker: Path) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batch = {"data": np.zeros((2, 3072), np.uint8), "labels": [0, 1], "payload": _Payload(marker)}
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": ["cat", "dog"]}, protocol=2))
    return folder


@pytest.mark.parametrize("verify", [False, True])
def test_1_a_cifar_pickle_payload_never_runs(tmp_path: Path, verify: bool) -> None:
    from compo.evaluate.zeroshot import load_split

    marker = tmp_path / "MARKER"
    folder = _cifar10_with_payload(tmp_path / "bench", marker)
    spec = {"kind": "zeroshot", "source": "files", "format": "cifar10", "verify": verify}
    with pytest.raises(BenchmarkError) as caught:
        load_split(spec, tmp_path / "bench")
    assert not marker.exists()
    message = str(caught.value)
    assert str(folder / "test_batch") in message, message
    if verify:  # the released md5 fails first; the message does not send the user to verify: false
        assert "md5" in message and "verify: false" not in message and "verify" not in message.split("(")[0], message
    else:
        assert "posix.system" in message and "refused" in message, message


def test_1_the_restricted_unpickler_reads_what_cifar_files_hold(tmp_path: Path) -> None:
    """Python 2 era names (numpy.core.multiarray) and protocol 2 bytes are admitted; anything else is not."""
    from compo.evaluate.zeroshot import restricted_unpickle

    data = {"data": np.arange(6, dtype=np.uint8).reshape(2, 3), "labels": [1, 2], "batch_label": b"x",
            "filenames": ["a.png"], "scale": 1.5}
    path = tmp_path / "batch"
    raw = pickle.dumps(data, protocol=2).replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    path.write_bytes(raw)
    loaded = restricted_unpickle(path)
    assert np.array_equal(loaded["data"], data["data"]) and loaded["labels"] == [1, 2]
    assert loaded["batch_label"] == b"x" and loaded["filenames"] == ["a.png"]
    path.write_bytes(pickle.dumps({"a": Path("x")}))
    with pytest.raises(BenchmarkError, match=r"batch: refused: the pickle asks for pathlib\.PosixPath"):
        restricted_unpickle(path)


# --- 2. names read from files ----------------------------------------------------------------------------


def test_2_model_json_name_cannot_write_outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model_name of '../../escape/y' once made `register_model_config` write escape/y.json outside its
    temporary folder; now it is refused before anything is written, naming model.json."""
    from compo.models import create_model, load_model, save_checkpoint

    model_dir = tmp_path / "model"
    save_checkpoint(create_model("compo-tiny-clip"), "compo-tiny-clip", model_dir)
    meta = json.loads((model_dir / "model.json").read_text())
    meta["model_config"]["embed_dim"] = 64  # a config open_clip does not know yet: it gets registered
    meta["model_name"] = "../../escape/y"
    (model_dir / "model.json").write_text(json.dumps(meta))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    (tmp_path / "escape").mkdir()
    with pytest.raises(ValueError) as caught:
        load_model(model_dir)
    assert list((tmp_path / "escape").iterdir()) == []
    assert str(caught.value).startswith(f"{model_dir / 'model.json'}: model_name '../../escape/y' is not a name"), \
        caught.value


# --- 3. repeated entries are config errors ---------------------------------------------------------------


REPEATS = [
    ("study.seeds", lambda c: c["study"].update(seeds=[0, 1, 0])),
    ("study.methods", lambda c: c["study"]["methods"].append(c["study"]["methods"][0])),
    ("study.benchmarks", lambda c: c["study"]["benchmarks"].append(c["study"]["benchmarks"][-1])),
    ("study.datasets", lambda c: c["study"]["datasets"].append(c["study"]["datasets"][0])),
    ("wiseft.alphas", lambda c: c["wiseft"].update(alphas=[0.0, 0.5, 0.5, 1.0])),
    ("ablations.fsc-lora.seeds", lambda c: c["ablations"]["fsc-lora"].update(seeds=[2, 2])),
    ("ablations.fsc-lora.methods", lambda c: c["ablations"]["fsc-lora"].update(methods=["fsc-clip", "fsc-clip"])),
]


@pytest.mark.parametrize(("key", "mutate"), REPEATS, ids=[k for k, _ in REPEATS])
def test_3_a_repeated_entry_is_an_error_naming_the_key(config: dict, key: str, mutate) -> None:
    mutate(config)
    with pytest.raises(ConfigError, match=rf"^config key {key.replace('.', '[.]')}: .* is given twice"):
        validate_config(config)


# --- 4. known at DAG build -----------------------------------------------------------------------------


def test_4_unknown_base_model_is_a_config_error(config: dict) -> None:
    config["bases"]["clip"]["model"] = "compo-tiny-clipp"
    with pytest.raises(ConfigError) as caught:
        validate_config(config)
    message = str(caught.value)
    assert message.startswith("config key bases.clip.model: 'compo-tiny-clipp' is not an open_clip model config"), \
        message
    assert "compo-tiny-clip," in message and len(message) < 600  # a near name, not every model open_clip has


@pytest.mark.parametrize(("text", "key", "expected"), [
    ({"context_length": 50}, "context_length", "must exceed the 77 positions of compo-tiny-clip"),
    ({"context_length": 248, "keep_positions": 80}, "keep_positions", r"must be in \[0, 75\]"),
    ({"context_length": 248, "keep_positions": 20, "freeze_positions": 300}, "freeze_positions",
     "exceeds the 248 positions"),
])
def test_4_text_positions_out_of_range_are_config_errors(config: dict, text: dict, key: str, expected: str) -> None:
    config["methods"]["longclip"]["text"] = text
    with pytest.raises(ConfigError, match=rf"^config key methods\.longclip\.text\.{key}: .*{expected}"):
        validate_config(config)


def test_4_lora_targets_matching_no_weight_are_found_before_training(config: dict) -> None:
    from compo.config import check_before_compute

    config["methods"]["fsc-clip-lora"]["lora"]["targets"] = ["*attn.in_proj_weight", "visual.transformer.*"]
    validate_config(config)  # the cheap checks pass; this one reads the model's parameter names
    with pytest.raises(ConfigError, match=r"^config key methods\.fsc-clip-lora\.lora\.targets: 'visual\.transformer"
                                          r"\.\*' matches no weight matrix or square convolution kernel of "
                                          r"compo-tiny-clip"):
        check_before_compute(config)
    config["methods"]["fsc-clip-lora"]["lora"]["targets"] = ["*attn.in_proj_weight"]
    check_before_compute(config)


def test_4_weight_names_are_cached_so_the_next_dag_build_imports_no_torch(tmp_path: Path) -> None:
    # the LoRA target check too: its pattern matching (compo.lora_patterns) is torch-free (~2 s per dry run)
    code = ("import sys; from compo.architectures import weight_shapes; "
            "from compo.config import check_lora_targets, load_config; "
            "check_lora_targets(load_config('config/config.yaml')); "
            "print(len(weight_shapes('compo-tiny-clip')), 'torch' in sys.modules)")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    runs = [subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                           check=True).stdout for _ in range(2)]
    assert runs == ["120 True\n", "120 False\n"]
    assert len(list((tmp_path / "compo-study" / "weight-shapes").glob("compo-tiny-clip-*.json"))) == 1


def _read_only(path: Path) -> list[str]:
    """A command prefix under which `path` is read-only: a read-only bind mount in a private mount namespace
    (root writes through file modes) or, for other users, mode 0555."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        path.chmod(0o555)
        return []
    if shutil.which("unshare") is None:
        pytest.skip("running as root without unshare: cannot make a read-only folder")
    script = f"mount --bind {path} {path} && mount -o remount,bind,ro {path} && exec \"$@\""
    return ["unshare", "--mount", "sh", "-c", script, "sh"]


def test_4_a_read_only_results_root_fails_the_dry_run(tmp_path: Path, repo: Path) -> None:
    results = tmp_path / "ro" / "results"
    prefix = _read_only(tmp_path / "ro")
    (tmp_path / "overlay.yaml").write_text(yaml.safe_dump({"results": str(results)}))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    command = [*prefix, str(Path(sys.executable).parent / "snakemake"), "-s", str(repo / "Snakefile"), "-n",
               "--directory", str(tmp_path), "--configfile", str(repo / "config" / "config.yaml"),
               str(tmp_path / "overlay.yaml"), "--cores", "1", f"{results}/world/eval/manifest.parquet"]
    run = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    assert run.returncode != 0
    first = run.stderr.strip().splitlines()[0]
    assert first.startswith(f"compo-study: config key results: {results} cannot be written"), run.stderr[-2000:]


# --- 5. the dataset stage opens every image and applies the image-root check -----------------------------


def test_5_broken_and_outside_images_are_skipped_with_a_count(tmp_path: Path, caplog) -> None:
    root = tmp_path / "coco"
    shutil.copytree(COCO, root)
    karpathy = json.loads((root / "dataset_coco.json").read_text())
    train = [image for image in karpathy["images"] if image["split"] == "train"]
    kept_before = _kept(tmp_path, root, "before")
    assert kept_before == 5
    # one image truncated, one listed through "../" outside the image root (the file exists there)
    truncated = root / train[0]["filepath"] / train[0]["filename"]
    truncated.write_bytes(truncated.read_bytes()[:200])
    outside = tmp_path / "outside.jpg"
    shutil.copy(root / train[1]["filepath"] / train[1]["filename"], outside)
    train[1]["filepath"], train[1]["filename"] = "..", "outside.jpg"
    (root / "dataset_coco.json").write_text(json.dumps(karpathy))
    with caplog.at_level("WARNING", logger="compo.data"):
        frame, report = _build(tmp_path, root, "after")
    assert report["images_corrupt"] == 1 and report["images_outside_root"] == 1
    assert report["images_kept"] == kept_before - 2
    assert str(truncated) not in set(frame["image_path"]) and str(outside) not in set(frame["image_path"])
    assert "1 images_corrupt, e.g." in caplog.text and "1 images_outside_root, e.g." in caplog.text


def test_5_a_world_image_that_does_not_decode_is_skipped_too(tmp_path: Path, write_manifest) -> None:
    rows = []
    for i in range(3):
        Image.new("RGB", (16, 16), "red").save(tmp_path / f"{i}.png")
        rows.append({"image_id": f"w{i}", "image_path": str(tmp_path / f"{i}.png"), "caption_id": f"w{i}-s0",
                     "caption": "a red square", "dataset": "finetune", "caption_kind": "short"})
    (tmp_path / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    world = write_manifest(rows, tmp_path / "world.parquet")
    build_manifest("coco", {"source": "world", "split": "finetune"}, out=tmp_path / "m.parquet",
                   world_manifest=world, report=tmp_path / "r.csv")
    assert read_table(tmp_path / "m.parquet", "manifest")["image_id"].tolist() == ["w0", "w2"]
    assert pd.read_csv(tmp_path / "r.csv").iloc[0]["images_corrupt"] == 1


def _build(tmp_path: Path, root: Path, name: str, **spec) -> tuple[pd.DataFrame, dict]:
    out, report = tmp_path / f"{name}.parquet", tmp_path / f"{name}.csv"
    build_manifest(name, {"source": "coco", "path": str(root / "dataset_coco.json"), "image_root": str(root),
                          "split": "train+restval+val+test", **spec}, out=out, report=report)
    return read_table(out, "manifest"), pd.read_csv(report).iloc[0].to_dict()


def _kept(tmp_path: Path, root: Path, name: str) -> int:
    return int(_build(tmp_path, root, name)[1]["images_kept"])


# --- 6. unreadable checkpoints and resume states ----------------------------------------------------------


BASE_RECIPE = {"model": "compo-tiny-clip", "init": "scratch", "dataset": "tiny",
               "train": {"steps": 4, "batch_size": 4, "lr": 1e-3, "warmup": 1, "weight_decay": 0.1}}


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_6_an_unreadable_checkpoint_is_named_with_what_to_do(tmp_path: Path, damage: str) -> None:
    from compo.models import create_model, load_model, save_checkpoint

    model_dir = tmp_path / "model"
    save_checkpoint(create_model("compo-tiny-clip"), "compo-tiny-clip", model_dir)
    checkpoint = model_dir / "checkpoint.pt"
    data = checkpoint.read_bytes()
    checkpoint.write_bytes(b"not a checkpoint" * 10 if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(Exception) as caught:  # noqa: PT011 - the message is what is tested
        load_model(model_dir)
    message = str(caught.value)
    assert message.startswith(f"{checkpoint}: cannot be read as a checkpoint"), message
    assert f"delete {model_dir} and rerun" in message and "weights_only=False" not in message, message


def test_6_a_corrupt_resume_state_is_set_aside_and_training_starts_over(tiny_training: dict, tmp_path: Path,
                                                                       caplog) -> None:
    from compo.train import resume_dir, train

    settings = {"threads": 1, "checkpoint_every": 2}
    out = tmp_path / "model"

    def crash(step: int) -> None:
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(BASE_RECIPE, tiny_training["manifest"], str(out), seed=0, settings=settings, on_step=crash)
    state = resume_dir(out) / "state.pt"
    truncated = state.read_bytes()[:1000]
    state.write_bytes(truncated)
    with caplog.at_level("WARNING", logger="compo.train"):
        train(BASE_RECIPE, tiny_training["manifest"], str(out), seed=0, settings=settings)
    aside = sorted(out.parent.glob(f".{out.name}.resume.unreadable*"))
    assert len(aside) == 1 and (aside[0] / "state.pt").read_bytes() == truncated
    assert f"{state}: its bytes are not those saved" in caplog.text and f"set aside as {aside[0]}" in caplog.text, (
        caplog.text)
    assert "starting over from step 0" in caplog.text
    assert len(pd.read_csv(out / "losses.csv")) == 4


# --- 7. concreteness norms --------------------------------------------------------------------------------


NORMS_HEADER = "Word\tBigram\tConc.M\tConc.SD\tUnknown\tTotal\tPercent_known\tSUBTLEX\tDom_Pos\n"


@pytest.mark.parametrize(("rows", "expected"), [
    (["apple\t0\t4.9\t0.3\t0\t30\t1\t100\tNoun", "idea\t0\t99\t1\t0\t30\t1\t100\tNoun"],
     r"line 3: Conc\.M 99\.0 is outside Brysbaert's scale 1 to 5"),
    (["apple\t0\t4.9\t0.3\t0\t30\t1\t100\tNoun", "idea\t0\t-7\t1\t0\t30\t1\t100\tNoun"],
     r"line 3: Conc\.M -7\.0 is outside Brysbaert's scale 1 to 5"),
    (["apple\t0\t4.9\t0.3\t0\t30\t1\t100\tNoun", "Apple\t0\t2.1\t1\t0\t30\t1\t100\tNoun"],
     r"line 3: 'apple' is rated again \(2\.1; line 2 gave 4\.9\)"),
    (["apple\t0\tnan\t0.3\t0\t30\t1\t100\tNoun"], r"line 2: Conc\.M 'nan' is not a rating"),
    (["apple\t0\t\t0.3\t0\t30\t1\t100\tNoun"], r"line 2: Conc\.M '' is not a rating"),
])
def test_7_norms_out_of_range_repeated_or_missing_are_errors_naming_file_and_line(tmp_path: Path, rows: list[str],
                                                                                 expected: str) -> None:
    norms = tmp_path / "norms.tsv"
    norms.write_text(NORMS_HEADER + "\n".join(rows) + "\n")
    with pytest.raises(NormsError, match=rf"^concreteness norms {norms} {expected}"):
        load_norms(norms)


def test_7_a_word_repeated_with_the_same_rating_is_counted_not_an_error(tmp_path: Path, caplog) -> None:
    norms = tmp_path / "norms.tsv"
    row = "apple\t0\t4.9\t0.3\t0\t30\t1\t100\tNoun\n"
    norms.write_text(NORMS_HEADER + row + row)
    with caplog.at_level("WARNING", logger="compo.concreteness"):
        assert load_norms(norms).ratings == {"apple": 4.9}
    assert "1 repeated rows with the same rating skipped" in caplog.text


# --- 8. a caption longer than the bound stops at the dataset stage ----------------------------------------


def test_8_a_caption_beyond_the_bound_is_skipped_with_a_count_before_any_generator(tmp_path: Path, caplog) -> None:
    root = tmp_path / "coco"
    shutil.copytree(COCO, root)
    karpathy = json.loads((root / "dataset_coco.json").read_text())
    image = next(image for image in karpathy["images"] if image["split"] == "train")
    image["sentences"][0]["raw"] = "a red cube left of a blue sphere " * 3100  # ~100,000 characters
    (root / "dataset_coco.json").write_text(json.dumps(karpathy))
    with caplog.at_level("WARNING", logger="compo.data"):
        frame, report = _build(tmp_path, root, "long")
    assert report["captions_too_long"] == 1
    assert frame["caption"].str.len().max() <= 10_000
    assert "1 captions_too_long, e.g." in caplog.text
    frame, report = _build(tmp_path, root, "lifted", max_caption_chars=200_000)
    assert report["captions_too_long"] == 0 and frame["caption"].str.len().max() > 99_000


def test_8_the_bound_is_a_config_key(config: dict) -> None:
    config["datasets"]["coco"]["max_caption_chars"] = 0
    with pytest.raises(ConfigError, match=r"^config key datasets\.coco\.max_caption_chars: "):
        validate_config(config)


# --- 9. one study per results folder ----------------------------------------------------------------------


def test_9_a_second_study_on_the_same_results_is_refused_naming_the_first(tmp_path: Path) -> None:
    from compo.io import current_umask
    from compo.results_root import StudyLock, StudyLockError

    results = tmp_path / "results"
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from compo.results_root import StudyLock; "
                               "StudyLock(sys.argv[1]).acquire(); print('held', flush=True); sys.stdin.read()",
                               str(results)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(StudyLockError) as caught:
        StudyLock(results).acquire()
    message = str(caught.value)
    assert message.startswith(f"{results}: another study is running on these results (host "
                              f"{socket.gethostname()}, pid {holder.pid}, started "), message
    assert f"delete {results / '.compo-study.lock'}" in message
    assert (results / ".compo-study.lock").stat().st_mode & 0o044 == 0o044 & ~current_umask()  # others can read
    holder.communicate("")  # the first study ends: its lock goes with it
    assert not (results / ".compo-study.lock").exists()
    lock = StudyLock(results).acquire()
    assert json.loads((results / ".compo-study.lock").read_text())["pid"] == os.getpid()
    lock.release()
    assert not (results / ".compo-study.lock").exists()


def test_9_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path: Path, caplog) -> None:
    from compo.results_root import StudyLock

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    (tmp_path / ".compo-study.lock").write_text(json.dumps(
        {"host": socket.gethostname(), "pid": int(dead.stdout), "started": "2025-01-01T00:00:00"}))
    with caplog.at_level("WARNING", logger="compo.results_root"):
        lock = StudyLock(tmp_path).acquire()
    assert f"stale lock of pid {int(dead.stdout)}" in caplog.text
    assert json.loads((tmp_path / ".compo-study.lock").read_text())["pid"] == os.getpid()
    lock.release()


@pytest.mark.slow
def test_9_snakemake_refuses_a_results_folder_another_checkout_is_running_on(tmp_path: Path, run_snakemake) -> None:
    """Two working directories (two checkouts) with the same absolute results folder: while the first
    study's lock is held (by this live process), the second is refused before any job runs."""
    results = tmp_path / "shared-results"
    results.mkdir()
    lock = {"host": socket.gethostname(), "pid": os.getpid(), "started": "2025-01-01T00:00:00"}
    (results / ".compo-study.lock").write_text(json.dumps(lock))
    (tmp_path / "overlay.yaml").write_text(yaml.safe_dump({"results": str(results), "world": {
        "splits": {"pretrain": 4, "finetune": 4, "long": 2, "eval": 4}}}))
    second = tmp_path / "checkout2"
    second.mkdir()
    run = run_snakemake(second, f"{results}/world/eval/manifest.parquet", configs=[tmp_path / "overlay.yaml"])
    assert run.returncode != 0
    assert f"{results}: another study is running on these results (host {socket.gethostname()}, pid " \
           f"{os.getpid()}, started 2025-01-01T00:00:00)" in run.stderr, run.stderr[-2000:]
    assert not (results / "world").exists()
    (results / ".compo-study.lock").unlink()
    run = run_snakemake(second, f"{results}/world/eval/manifest.parquet", configs=[tmp_path / "overlay.yaml"])
    assert run.returncode == 0, run.stderr[-2000:]
    assert not (results / ".compo-study.lock").exists()  # released on exit
