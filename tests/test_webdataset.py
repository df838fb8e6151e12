"""Webdataset tar shards as a training source (issue 44, item 3): read in img2dataset's and FSC-CLIP's
released layouts, the same manifest and the same training as img2dataset's `files` layout of the same
samples, skips counted, containment kept, shards staged to a node-local folder; and written by a job that
makes images (issue 42, item 6): members byte-equal, the shard renamed into place only when complete."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import webdataset as wds
from PIL import Image, ImageDraw

from compo import shards
from compo.batches import TrainingData, shard_records
from compo.data import RawDataError, build_manifest, raw_paths
from compo.images import CORRUPT_IMAGE, MISSING_IMAGE, OUTSIDE_ROOT, OutsideRoot, image_source, item_path, open_image
from compo.inputs import missing_inputs
from compo.io import read_table
from compo.shards import (
    ShardError,
    ShardWriter,
    expand_braces,
    member_index,
    member_path,
    open_member,
    split_member,
    stage,
)
from compo.train import train

MODEL = "compo-tiny-clip"
SETTINGS = {"threads": 1, "checkpoint_every": 2, "log_every": 1}
COLOURS = ["red", "blue", "green", "yellow", "purple"]
PER_SHARD = 5


def _jpeg(i: int) -> bytes:
    image, i = Image.new("RGB", (48, 48), "white"), i % 16  # 16 distinct boxes
    ImageDraw.Draw(image).rectangle([6 + i, 8, 40, 40 - i], fill=COLOURS[i % len(COLOURS)])
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def _samples(n: int = 2 * PER_SHARD) -> list[dict]:
    """img2dataset's samples: key = 5-digit shard + 4-digit index, the caption in .txt, metadata in .json."""
    out = []
    for i in range(n):
        shard, index = divmod(i, PER_SHARD)
        key = f"{shard:05d}{index:04d}"
        caption = f"a {COLOURS[i % len(COLOURS)]} box number {i}"
        out.append({"key": key, "shard": f"{shard:05d}", "jpg": _jpeg(i), "txt": caption,
                    "json": {"key": key, "url": f"https://example.org/{i}.jpg", "caption": caption,
                             "status": "success", "coca_captions_in_json": f"coca says box {i}"}})
    return out


def _write_webdataset(folder: Path, samples: list[dict], fields=("jpg", "txt", "json")) -> Path:
    """Shards as img2dataset's --output_format webdataset writes them (with webdataset's TarWriter), and the
    <shard>_stats.json and <shard>.parquet it writes beside them."""
    folder.mkdir(parents=True, exist_ok=True)
    for shard in sorted({s["shard"] for s in samples}):
        mine = [s for s in samples if s["shard"] == shard]
        with wds.TarWriter(str(folder / f"{shard}.tar")) as sink:
            for s in mine:
                sink.write({"__key__": s["key"], **{f: (json.dumps(s[f]).encode() if f == "json" else s[f])
                                                    for f in fields if f in s}})
        (folder / f"{shard}_stats.json").write_text(json.dumps({"successes": len(mine)}))
        pd.DataFrame({"key": [s["key"] for s in mine], "caption": [s["txt"] for s in mine],
                      "url": [s["json"]["url"] for s in mine], "status": "success"}).to_parquet(
            folder / f"{shard}.parquet")
    return folder


def _write_files(folder: Path, samples: list[dict]) -> Path:
    """The same samples in img2dataset's `files` layout: <shard>/<key>.jpg/.txt/.json and <shard>.parquet."""
    for shard in sorted({s["shard"] for s in samples}):
        mine = [s for s in samples if s["shard"] == shard]
        (folder / shard).mkdir(parents=True)
        for s in mine:
            (folder / shard / f"{s['key']}.jpg").write_bytes(s["jpg"])
            (folder / shard / f"{s['key']}.txt").write_text(s["txt"])
            (folder / shard / f"{s['key']}.json").write_text(json.dumps(s["json"]))
        pd.DataFrame({"key": [s["key"] for s in mine], "caption": [s["txt"] for s in mine],
                      "url": [s["json"]["url"] for s in mine], "status": "success"}).to_parquet(
            folder / f"{shard}.parquet")
    return folder


def _build(tmp_path: Path, spec: dict, name: str) -> tuple[pd.DataFrame, dict]:
    out, report = tmp_path / f"{name}.parquet", tmp_path / f"{name}.csv"
    build_manifest("tiny", spec, out=out, report=report)  # one dataset name: manifests compare equal
    return read_table(out, "manifest"), pd.read_csv(report).to_dict("records")[0]


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("layouts")
    samples = _samples()
    files = _write_files(root / "files", samples)
    shards = _write_webdataset(root / "wds", samples)
    files_manifest, _ = _build(root, {"source": "cc3m", "path": str(files)}, "files")
    wds_manifest, report = _build(root, {"source": "webdataset", "path": str(shards)}, "shards")
    return {"root": root, "files": root / "files.parquet", "shards": root / "shards.parquet", "report": report,
            "files_frame": files_manifest, "shards_frame": wds_manifest, "folder": shards}


def test_img2dataset_shards_give_the_files_layouts_manifest(layouts):
    files, shards = layouts["files_frame"], layouts["shards_frame"]
    assert len(shards) == 2 * PER_SHARD and layouts["report"]["images_kept"] == 2 * PER_SHARD
    other = [c for c in files.columns if c != "image_path"]
    pd.testing.assert_frame_equal(files[other], shards[other])
    # each image is named inside its shard, and its bytes are the files layout's file
    assert shards["image_path"][0] == f"{layouts['folder']}/00000.tar#000000000.jpg"
    assert shards["image_path"][PER_SHARD] == f"{layouts['folder']}/00001.tar#000010000.jpg"
    for file, member in zip(files["image_path"], shards["image_path"], strict=True):
        assert image_source(member).read() == Path(file).read_bytes()
        assert open_image(Path(member)).tobytes() == open_image(Path(file)).tobytes()  # evaluation's opener
    assert not list(layouts["folder"].glob("*.jpg"))  # no per-image file exists


def _add_failed_download(folder: Path) -> None:
    """img2dataset lists a failed download in its shard's parquet (no image written): a dead link."""
    parquet = folder / "00000.parquet"
    table = pd.read_parquet(parquet)
    failed = {"key": "000000099", "caption": "a lost box", "url": "https://example.org/lost.jpg",
              "status": "failed_to_download"}
    pd.concat([table, pd.DataFrame([failed])], ignore_index=True).to_parquet(parquet)


@pytest.mark.parametrize("source", ["cc3m", "laion-coco"])
def test_the_web_reader_recognises_img2datasets_webdataset_output(tmp_path, source):
    """cc3m / laion-coco pointed at img2dataset's `--output_format webdataset` folder (no `source: webdataset`):
    the same manifest and report as its `files` layout of the same download, the images read inside the
    shards (counted as images_in_shards); a failed download is a missing image in both."""
    samples = _samples()
    files, shards = _write_files(tmp_path / "files", samples), _write_webdataset(tmp_path / "wds", samples)
    for folder in (files, shards):
        _add_failed_download(folder)
    from_files, files_report = _build(tmp_path, {"source": source, "path": str(files)}, "files")
    from_shards, report = _build(tmp_path, {"source": source, "path": str(shards)}, "shards")
    other = [c for c in from_files.columns if c != "image_path"]
    pd.testing.assert_frame_equal(from_files[other], from_shards[other])
    assert from_shards["image_path"].tolist() == [f"{shards}/{s['shard']}.tar#{s['key']}.jpg" for s in samples]
    assert report["images_in_shards"] == report["images_kept"] == len(samples)
    assert files_report["images_in_shards"] == 0
    assert report["images_missing_file"] == files_report["images_missing_file"] == 1
    assert {k: v for k, v in report.items() if k not in ("images_in_shards", "raw_path")} == \
        {k: v for k, v in files_report.items() if k not in ("images_in_shards", "raw_path")}
    # CC3M's TSV (caption, url) with image_root the shards folder: url -> key from the parquets -> member
    table = tmp_path / "Train_GCC-training.tsv"
    table.write_text("".join(f"{s['txt']}\t{s['json']['url']}\n" for s in samples)
                     + "a lost box\thttps://example.org/lost.jpg\n")
    from_table, table_report = _build(tmp_path, {"source": source, "path": str(table), "image_root": str(shards)},
                                      "table")
    assert from_table["image_path"].tolist() == from_shards["image_path"].tolist()
    assert table_report["images_in_shards"] == len(samples) and table_report["images_missing_file"] == 1


def test_shards_without_parquet_files_are_read_sample_by_sample(tmp_path, layouts):
    """A folder of shards alone (img2dataset's tars copied without their parquets, FSC-CLIP's release): the
    web reader reads each sample's <key>.txt caption, giving source webdataset's manifest."""
    folder = _write_webdataset(tmp_path / "wds", _samples())
    for parquet in folder.glob("*.parquet"):
        parquet.unlink()
    frame, report = _build(tmp_path, {"source": "laion-coco", "path": str(folder)}, "bare")
    expected = layouts["shards_frame"].assign(image_path=lambda f: f["image_path"].str.replace(
        str(layouts["folder"]), str(folder)))
    # the shards were written again (webdataset's TarWriter stores the time): their own sha256 is recorded
    pd.testing.assert_frame_equal(frame.drop(columns="shard_sha256"), expected.drop(columns="shard_sha256"))
    assert report["images_in_shards"] == report["images_kept"] == 2 * PER_SHARD


def test_fsc_clip_released_layout_reads_its_caption_key(tmp_path):
    """FSC-CLIP's 100K subsets: --caption-key coca_captions (CC3M) reads <folder>/coca_captions/<json key>.txt
    (its coca_captions.tar.gz), a key present in the .json is read from there; `caption` (LAION-COCO) is .txt."""
    samples = _samples()
    folder = _write_webdataset(tmp_path / "cc3m" / "train_subset_100K", samples)
    (folder / "coca_captions").mkdir()
    for s in samples[:-1]:  # the last sample has no CoCa caption: counted, not kept
        (folder / "coca_captions" / f"{s['key']}.txt").write_text(f"coca: a box {s['key']}\nsecond line")
    brace = str(folder / "{00000..00001}.tar")  # FSC-CLIP's _wrap_together
    coca, report = _build(tmp_path, {"source": "webdataset", "path": brace, "caption_key": "coca_captions"}, "a")
    assert coca["caption"].tolist() == [f"coca: a box {s['key']}" for s in samples[:-1]]
    assert report["images_no_caption"] == 1
    in_json, _ = _build(tmp_path, {"source": "webdataset", "path": brace, "caption_key": "coca_captions_in_json"},
                        "b")
    assert in_json["caption"].tolist() == [f"coca says box {i}" for i in range(len(samples))]
    laion, _ = _build(tmp_path, {"source": "webdataset", "path": brace, "caption_key": "caption"}, "c")
    assert laion["caption"].tolist() == [s["txt"] for s in samples]
    with pytest.raises(RawDataError, match=r"00000\.tar: key 000000000: caption_key 'nowhere' is neither"):
        _build(tmp_path, {"source": "webdataset", "path": brace, "caption_key": "nowhere"}, "d")


def test_bad_samples_are_skipped_with_a_count(tmp_path):
    samples = _samples()
    samples[1]["jpg"] = samples[1]["jpg"][:200]               # truncated: does not decode
    del samples[2]["jpg"]                                     # the download failed: no image member
    samples[3]["txt"] = "\u200b \u200e"                       # a caption without text
    samples[7]["key"] = samples[0]["key"]                     # a key given twice (in another shard)
    folder = tmp_path / "wds"
    _write_webdataset(folder, samples)
    frame, report = _build(tmp_path, {"source": "webdataset", "path": str(folder / "*.tar")}, "bad")
    assert report["records_read"] == 10 and report["records_repeated"] == 1
    assert report["images_corrupt"] == 1 and report["images_missing_file"] == 1
    assert report["captions_no_text"] == 1 and report["images_no_caption"] == 1
    assert report["images_kept"] == 6
    assert frame["image_id"].tolist() == [samples[i]["key"] for i in (0, 4, 5, 6, 8, 9)]
    assert open_image(str(folder / "00000.tar#000000001.jpg")) == CORRUPT_IMAGE
    assert open_image(str(folder / "00000.tar#000000002.jpg")) == MISSING_IMAGE


def test_a_member_path_keeps_the_containment_rule(tmp_path, layouts):
    root = tmp_path / "root"
    root.mkdir()
    (root / "link.tar").symlink_to(layouts["folder"] / "00000.tar")  # a shard linked from outside the root
    assert isinstance(item_path(root, "../wds/00000.tar#000000000.jpg"), OutsideRoot)
    assert isinstance(item_path(root, "link.tar#000000000.jpg"), OutsideRoot)
    assert open_image(item_path(root, "link.tar#000000000.jpg")) == OUTSIDE_ROOT
    inside = item_path(layouts["folder"], "00000.tar#000000000.jpg")
    assert split_member(inside) == (str(layouts["folder"] / "00000.tar"), "000000000.jpg")
    with pytest.raises(RawDataError, match=f"images_outside_root={PER_SHARD}, .*images_kept=0"):
        _build(tmp_path, {"source": "webdataset", "path": str(root / "link.tar"), "image_root": str(root)}, "out")


def test_brace_lists(layouts):
    folder = layouts["folder"]
    assert raw_paths(f"{folder}/{{00000..00001}}.tar") == [folder / "00000.tar", folder / "00001.tar"]
    config = {"datasets": {"wds": {"source": "webdataset", "path": f"{folder}/{{00000..00002}}.tar"}}}
    assert [item.path for item in missing_inputs(config)] == [f"{folder}/{{00000..00002}}.tar"]  # 00002 is not there
    with pytest.raises(RawDataError, match=r"path: \{5\.\.x\}\.tar: expected a range"):
        raw_paths("{5..x}.tar")
    assert expand_braces("s/{00008..00011}.tar") == ["s/00008.tar", "s/00009.tar", "s/00010.tar", "s/00011.tar"]
    assert expand_braces("{a,b}/{0..1}.tar") == ["a/0.tar", "a/1.tar", "b/0.tar", "b/1.tar"]


@pytest.mark.slow  # three tiny training runs: ~25 s on the shared 2-core machine
def test_training_on_shards_equals_training_on_files(layouts, tmp_path, monkeypatch):
    """The same batches: a byte-identical checkpoint and losses.csv; staging to $TMPDIR changes nothing but
    where the shards are read, here by a DataLoader worker process (its own member index)."""
    recipe = {"model": MODEL, "init": "scratch", "dataset": "tiny",
              "train": {"steps": 3, "batch_size": 4, "lr": 1e-3, "warmup": 1, "weight_decay": 0.1}}
    train(recipe, str(layouts["files"]), str(tmp_path / "files"), seed=2, settings=SETTINGS)
    train(recipe, str(layouts["shards"]), str(tmp_path / "shards"), seed=2, settings=SETTINGS)
    local = tmp_path / "node-local"
    monkeypatch.setenv("TMPDIR", str(local))
    seen: list[list[str]] = []  # the staged copies while the job trains
    train(recipe, str(layouts["shards"]), str(tmp_path / "staged"), seed=2,
          settings={**SETTINGS, "stage_shards": True, "workers": 1},  # members read in a DataLoader worker
          on_step=lambda step: seen.append(sorted(p.name for p in local.rglob("*.tar"))))
    for name in ("checkpoint.pt", "losses.csv"):
        reference = (tmp_path / "files" / name).read_bytes()
        assert (tmp_path / "shards" / name).read_bytes() == reference, name
        assert (tmp_path / "staged" / name).read_bytes() == reference, name
    assert seen == [["00000.tar", "00001.tar"]] * 3
    # the job's folder went when it ended; this user's folder stays, empty
    assert list((local / f"compo-shards-{os.getuid()}").iterdir()) == []


def test_staged_shards_are_read_from_the_local_copy(tmp_path):
    """TrainingData with a stage folder copies the shards there and reads only the copies: the originals can
    go once it has started."""
    samples = _samples()
    folder = _write_webdataset(tmp_path / "shared", samples)
    manifest, _ = _build(tmp_path, {"source": "webdataset", "path": str(folder)}, "m")
    data = TrainingData(tmp_path / "m.parquet", tokenizer=lambda texts: torch.zeros(len(texts), 4),
                        transform=lambda image: torch.from_numpy(np.asarray(image).copy()),
                        stage_dir=tmp_path / "local")
    copies = sorted((tmp_path / "local").rglob("*.tar"))
    assert [c.name for c in copies] == ["00000.tar", "00001.tar"]
    assert all(c.read_bytes() == (folder / c.name).read_bytes() for c in copies)
    assert all(split_member(p)[0] in map(str, copies) for p in data.rows["image_path"])
    before = [c.stat().st_mtime_ns for c in copies]
    again = stage(manifest["image_path"], tmp_path / "local", shard_records(manifest))  # a rerun: copies reused
    assert [c.stat().st_mtime_ns for c in copies] == before
    assert list(again.values()) == data.rows["image_path"].tolist()
    folder.rename(tmp_path / "gone")  # the shared copy disappears: reading goes on from the local one
    for i, path in enumerate(data.rows["image_path"]):
        expected = np.asarray(Image.open(io.BytesIO(samples[i]["jpg"])).convert("RGB"))
        assert np.array_equal(data.image(path, "test").numpy(), expected)


def test_the_dataset_stage_records_each_shards_size_and_sha256(layouts, tmp_path):
    """What a staged copy is checked against: recorded per row when the shards are indexed; a manifest of images
    stored as files is written as before (no shard columns)."""
    manifest = layouts["shards_frame"]
    for path, size, sha in zip(manifest["image_path"], manifest["shard_bytes"], manifest["shard_sha256"], strict=True):
        shard = split_member(path)[0]
        assert (size, sha) == (os.path.getsize(shard), hashlib.sha256(Path(shard).read_bytes()).hexdigest())
    assert not {"shard_bytes", "shard_sha256"} & set(layouts["files_frame"].columns)


def test_a_planted_copy_of_the_same_size_and_time_is_never_trained_on(tmp_path, caplog):
    """Issue 59: a file already at the staged path with the shard's size was reused unread, and trained on. Now it
    is reused only with the size and sha256 the dataset stage recorded: a planted copy of the same size and
    modification time (what the check before this one trusted) is replaced by the shard's bytes, with a log line."""
    folder = _write_webdataset(tmp_path / "shared", _samples())
    manifest, _ = _build(tmp_path, {"source": "webdataset", "path": str(folder)}, "m")
    records = shard_records(manifest)
    stage(manifest["image_path"], tmp_path / "local", records)
    target = next((tmp_path / "local").rglob("00000.tar"))
    source = folder / "00000.tar"
    size = source.stat().st_size  # another shard's samples, cut or padded to this shard's size exactly
    data = (folder / "00001.tar").read_bytes()[:size].ljust(size, b"\0")
    assert data != source.read_bytes()
    target.write_bytes(data)
    os.utime(target, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns))
    with caplog.at_level("WARNING", logger="compo.shards"):
        stage(manifest["image_path"], tmp_path / "local", records)
    assert target.read_bytes() == source.read_bytes()
    assert f"{target}: a staged copy of {source} is there, but its size or sha256 is not what the dataset stage " \
           "recorded for the shard: replaced by a fresh copy" in caplog.text
    # without a record (a manifest of an older compo) a staged file is never trusted: copied afresh
    caplog.clear()
    target.write_bytes(data)
    with caplog.at_level("WARNING", logger="compo.shards"):
        stage(manifest["image_path"], tmp_path / "local")
    assert target.read_bytes() == source.read_bytes() and "no size and sha256 recorded" in caplog.text


def test_a_shard_changed_since_its_manifest_is_refused_when_staged(tmp_path):
    """The shard itself rewritten after the dataset stage read it (same size): staging refuses it, naming the shard
    and both hashes, and leaves no copy."""
    folder = _write_webdataset(tmp_path / "shared", _samples())
    manifest, _ = _build(tmp_path, {"source": "webdataset", "path": str(folder)}, "m")
    shard = folder / "00001.tar"
    data = bytearray(shard.read_bytes())
    data[-2048] ^= 1  # a byte inside the last member's data, within the same size
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=rf"{shard}: {len(data)} bytes with sha256 [0-9a-f]{{64}} now, but its "
                                         rf"manifest recorded {len(data)} bytes .* rerun the dataset's rule"):
        stage(manifest["image_path"], tmp_path / "local", shard_records(manifest))
    assert not list((tmp_path / "local").rglob("00001.tar*")) and not list((tmp_path / "local").rglob(".*partial"))


def test_the_stage_folder_is_this_users_and_this_jobs_only(tmp_path, monkeypatch):
    """With TMPDIR unset the staged shards went to /tmp/compo-shards, shared by every user and job of a node: now a
    folder of this user's and, within it, of this job's (SLURM's job id, else the run's folder), each mode 0700; one
    open to others (or a link) is refused."""
    from compo.paths import OutsideRootError, private_dir
    from compo.train import shard_stage_dir

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    user = tmp_path / f"compo-shards-{os.getuid()}"
    folder = shard_stage_dir(tmp_path / "models" / "a")
    assert folder == user / "slurm-4242"
    assert (folder.stat().st_mode & 0o777) == 0o700 and (user.stat().st_mode & 0o777) == 0o700
    monkeypatch.delenv("SLURM_JOB_ID")
    one, other = shard_stage_dir(tmp_path / "models" / "a"), shard_stage_dir(tmp_path / "models" / "b")
    assert one.parent == other.parent == user and one != other and one.name.startswith("run-")
    assert one == shard_stage_dir(tmp_path / "models" / "a")  # the run's rerun finds its copies
    folder.chmod(0o777)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    with pytest.raises(OutsideRootError, match="mode 0o777; .* must be this user's .* with mode 0700"):
        shard_stage_dir(tmp_path / "models" / "a")
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OutsideRootError, match="found a link or a file"):
        private_dir(tmp_path / "link")


def test_a_failed_job_removes_its_staged_shards(layouts, tmp_path, monkeypatch):
    """A job that fails after staging (here: fewer captions than one batch) leaves no copy in $TMPDIR."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "node-local"))
    recipe = {"model": MODEL, "init": "scratch", "dataset": "tiny",
              "train": {"steps": 3, "batch_size": 64, "lr": 1e-3, "warmup": 1, "weight_decay": 0.1}}
    with pytest.raises(RuntimeError, match="fewer than one batch of 64"):
        train(recipe, str(layouts["shards"]), str(tmp_path / "model"), seed=2,
              settings={**SETTINGS, "stage_shards": True})
    assert list((tmp_path / "node-local" / f"compo-shards-{os.getuid()}").iterdir()) == []


def test_killed_jobs_folders_are_swept_after_stale_days(tmp_path, monkeypatch, caplog):
    """A killed job skips its own cleanup: the next job of the same user removes job folders untouched for
    shards.STALE_DAYS (7 days, beyond the profile's 48 h walltime), and nothing else: not a younger one (a running
    job's), not this job's, not a file or a folder of another name."""
    from compo.train import Inputs, Settings, open_stage_dir

    caplog.set_level("INFO", logger="compo.shards")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    user = tmp_path / f"compo-shards-{os.getuid()}"
    user.mkdir(mode=0o700)
    old = time.time() - (shards.STALE_DAYS + 1) * 86400
    for name in ("slurm-1", "run-0123456789abcdef", "slurm-2", "notes", "slurm-7"):
        (user / name).mkdir(mode=0o700)
        (user / name / "a").mkdir(mode=0o700)
        (user / name / "a" / "00000.tar").write_bytes(b"x")
        if name != "slurm-2":
            os.utime(user / name, (old, old))
    (user / "slurm-9").write_text("a file")
    os.utime(user / "slurm-9", (old, old))
    folder = open_stage_dir(tmp_path / "model", Settings.from_config({"stage_shards": True}), Inputs(None))
    assert folder == user / "slurm-7" and (folder / "a" / "00000.tar").exists()  # this job's, touched
    assert folder.stat().st_mtime > old + 86400
    assert sorted(p.name for p in user.iterdir()) == ["notes", "slurm-2", "slurm-7", "slurm-9"]
    assert "slurm-1: a job folder untouched for over 7 days" in caplog.text
    # a job that stages nothing makes no folder and sweeps nothing
    assert open_stage_dir(tmp_path / "model", Settings.from_config({}), Inputs(None)) is None


def test_a_compressed_shard_is_refused_with_its_name(tmp_path):
    """Random access needs uncompressed members: a gzipped shard is an error naming it, not a silent skip."""
    folder = tmp_path / "gz"
    folder.mkdir()
    with tarfile.open(folder / "00000.tar", "w:gz") as tar:
        info = tarfile.TarInfo("0.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(RawDataError, match=r"00000\.tar: not a readable uncompressed tar shard"):
        _build(tmp_path, {"source": "webdataset", "path": str(folder)}, "gz")


@pytest.mark.parametrize("form", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_the_member_index_equals_tarfiles(tmp_path, form):
    """The header scanner finds every regular member at tarfile's offsets, long and non-ASCII names included
    (ustar's prefix field, GNU's long-name header, pax's path record); folders and links are left out."""
    archive = tmp_path / "s.tar"
    names = ["000000000.jpg", "a" * 90 + "/" + "b" * 95 + ".jpg", "d/über-ñame.txt", "e" * 120 + ".json"]
    if form == tarfile.USTAR_FORMAT:
        names = names[:2]  # ustar holds neither names over 255 bytes nor non-ASCII reliably
    with tarfile.open(archive, "w", format=form) as tar:
        folder = tarfile.TarInfo("d")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        for i, name in enumerate(names):
            info = tarfile.TarInfo(name)
            info.size = 700 * i + 3
            tar.addfile(info, io.BytesIO(bytes([i]) * info.size))
        link = tarfile.TarInfo("link.jpg")
        link.type, link.linkname = tarfile.SYMTYPE, names[0]
        tar.addfile(link)
    with tarfile.open(archive) as tar:
        expected = {m.name: (m.offset_data, m.size) for m in tar if m.isfile()}
    assert member_index(archive) == expected and set(expected) == set(names)
    for name in names:
        assert image_source(member_path(archive, name)).read() == bytes([names.index(name)]) * expected[name][1]


def test_written_members_read_back_byte_equal(tmp_path):
    """ShardWriter's members open by member path (the header scanner) and with tarfile, PNG bytes unchanged,
    long and non-ASCII names included; the same members give the same bytes; a name twice is refused."""
    pngs = {}
    for i, name in enumerate(["c_0__0.png", "x" * 140 + "__1.png", "über__2.png"]):
        buffer = io.BytesIO()
        Image.new("RGB", (20 + i, 16), COLOURS[i]).save(buffer, format="PNG")
        pngs[name] = buffer.getvalue()
    archive = tmp_path / "images" / "0.tar"
    with ShardWriter(archive) as shard:
        paths = {name: shard.add(name, data) for name, data in pngs.items()}
        assert not archive.exists()  # under its .partial name until complete
        with pytest.raises(ShardError, match=r"0\.tar: member 'c_0__0\.png' added twice"):
            shard.add("c_0__0.png", b"again")
    assert sorted(p.name for p in archive.parent.iterdir()) == ["0.tar"]
    for name, data in pngs.items():
        assert paths[name] == member_path(archive, name) and open_member(paths[name]).read() == data
        assert np.array_equal(np.asarray(open_image(paths[name])), np.asarray(Image.open(io.BytesIO(data))))
    with tarfile.open(archive) as tar:
        assert {m.name: tar.extractfile(m).read() for m in tar} == pngs
    with ShardWriter(tmp_path / "again.tar") as shard:
        for name, data in pngs.items():
            shard.add(name, data)
    assert (tmp_path / "again.tar").read_bytes() == archive.read_bytes()  # no time or owner in the headers


def test_a_failed_job_leaves_no_shard_and_a_rerun_rewrites_it(tmp_path):
    archive = tmp_path / "0.tar"
    with pytest.raises(RuntimeError, match="the pipeline died"):
        with ShardWriter(archive) as shard:
            shard.add("a.png", b"a" * 1000)
            raise RuntimeError("the pipeline died")
    assert list(tmp_path.iterdir()) == []  # neither the shard nor its partial
    for attempt in range(2):  # a restarted job writes the whole shard again: each member once
        members = [("a.png", bytes([attempt]) * 1000), ("b.png", b"b")][::1 if attempt else -1]
        with ShardWriter(archive) as shard:
            for name, data in members:
                shard.add(name, data)
        # same size, maybe the same mtime, other offsets: the index is the new file's
        assert set(member_index(archive)) == {"a.png", "b.png"}
        assert open_member(member_path(archive, "a.png")).read() == bytes([attempt]) * 1000
    with pytest.raises(ShardError, match=r"0\.zip: a shard's name ends in \.tar"):
        ShardWriter(tmp_path / "0.zip")


class _MemberReads(torch.utils.data.Dataset):
    """Reads member i of a shard; returns the reading process and how often it has indexed the shard."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[int, int, bytes]:
        data = image_source(self.paths[i]).read()
        return os.getpid(), shards.scans[split_member(self.paths[i])[0]], data


@pytest.mark.parametrize("indexed_first", [False, True])
def test_a_dataloader_worker_indexes_each_shard_once(tmp_path, indexed_first):
    """Two DataLoader workers read 40 members: each builds the shard's member index once (or inherits the
    main process's, as training's does after checking the images), never once per sample."""
    folder = _write_webdataset(tmp_path / "wds", _samples(40))
    paths = [member_path(shard, name) for shard in sorted(folder.glob("*.tar")) for name in member_index(shard)
             if name.endswith(".jpg")] if indexed_first else \
        [member_path(folder / f"{s['shard']}.tar", f"{s['key']}.jpg") for s in _samples(40)]
    loader = torch.utils.data.DataLoader(_MemberReads(paths), batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    reads = list(loader)
    assert {pid for pid, _, _ in reads} - {os.getpid()} and len({pid for pid, _, _ in reads}) == 2
    assert [count for _, count, _ in reads] == [1] * 40  # the read that built it counts 1; later reads too
    assert [data for _, _, data in reads] == [s["jpg"] for s in _samples(40)]


# --- issue 59: repeated keys and members, shards cut short, invisible captions ----------------------------


def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    """A shard holding `members` in this order, names repeated as given (webdataset's TarWriter would too)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _plain(colour: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), colour).save(buffer, "PNG")
    return buffer.getvalue()


def _colour_of(path: str) -> str:
    pixel = Image.open(image_source(path)).convert("RGB").getpixel((8, 8))
    return next(name for name in COLOURS if Image.new("RGB", (1, 1), name).getpixel((0, 0)) == pixel)


@pytest.mark.parametrize("members", [
    # the key given twice in a row: the second sample's image was read for the first's caption
    [("k.png", "red"), ("k.txt", "red"), ("k.png", "blue"), ("k.txt", "blue")],
    # given again later in the shard
    [("k.png", "red"), ("k.txt", "red"), ("j.png", "green"), ("j.txt", "green"), ("k.png", "blue"),
     ("k.txt", "blue")],
    # a member twice in one sample (caption first): webdataset starts a new sample at the second image
    [("k.txt", "red"), ("k.png", "red"), ("k.png", "blue")],
], ids=["in-a-row", "later", "member-twice"])
def test_a_repeated_key_keeps_its_first_samples_own_image(tmp_path, members):
    """Issue 59: the repeat was counted but the kept caption was paired with the repeat's image (the member index
    kept the last member of a name). Each kept caption now names the colour of the image it is paired with."""
    shard = _tar(tmp_path / "wds" / "00000.tar",
                 [(n, _plain(c) if n.endswith(".png") else f"a {c} square".encode()) for n, c in members])
    frame, report = _build(tmp_path, {"source": "webdataset", "path": str(shard)}, "rep")
    assert report["records_repeated"] == 1
    assert frame["caption"].tolist() == ["a red square"] + (["a green square"] if len(members) == 6 else [])
    for caption, path in zip(frame["caption"], frame["image_path"], strict=True):
        assert caption == f"a {_colour_of(path)} square", (caption, path)
    assert member_index(shard)["k.png"] == next((m.offset_data, m.size) for m in tarfile.open(shard)
                                                if m.name == "k.png")  # a name stored twice: its first member


def _cut(shard: Path, how: str) -> None:
    """`shard` cut as a failed copy or download leaves it, or with bytes that are no header after its members."""
    data = shard.read_bytes()
    with tarfile.open(shard) as tar:
        last = tar.getmembers()[-1]
    end = last.offset_data + -(-last.size // 512) * 512  # where the end-of-archive marker starts
    cut = {"member-boundary": data[:end], "mid-header": data[:last.offset - 100],
           "one-zero-block": data[:end + 512], "mid-member": data[:last.offset_data + 10],
           "garbage": data[:end] + b"\x01" * 1024}[how]
    shard.write_bytes(cut)


@pytest.mark.parametrize("how", ["member-boundary", "mid-header", "one-zero-block", "mid-member", "garbage"])
def test_a_shard_cut_short_is_an_error_naming_it(tmp_path, how):
    """Issue 59: a shard cut at a member boundary (or in a header) read as complete, the samples past the cut gone
    uncounted. The end-of-archive marker is checked by the dataset stage and by the member index."""
    folder = _write_webdataset(tmp_path / "wds", _samples())
    _build(tmp_path, {"source": "webdataset", "path": str(folder)}, "whole")  # the shards as written read
    shard = folder / "00001.tar"
    _cut(shard, how)
    with pytest.raises(RawDataError, match=r"00001\.tar: (byte \d+: expected a member header or the end-of-archive "
                                           r"marker|not a readable uncompressed tar shard)"):
        _build(tmp_path, {"source": "webdataset", "path": str(folder)}, "cut")
    with pytest.raises(OSError, match=r"00001\.tar: byte \d+: (expected a member header or the end-of-archive"
                                      r"|not a tar header)"):
        member_index(shard)


def test_a_caption_of_hangul_fillers_is_counted_as_no_text(tmp_path):
    """Issue 59: a caption of U+3164 (a letter that renders as nothing) trained; the other fillers and the braille
    blank likewise count as captions without text, and a caption with a visible word beside them stays."""
    blanks = ["\u3164", "\u115f\u1160", "\uffa0 \u3164", "\u2800\u200b"]
    members = [(f"{i}.{e}", _plain("red") if e == "png" else text.encode())
               for i, text in enumerate([*blanks, "a red \u3164 square"]) for e in ("png", "txt")]
    shard = _tar(tmp_path / "wds" / "00000.tar", members)
    frame, report = _build(tmp_path, {"source": "webdataset", "path": str(shard)}, "blank")
    assert report["captions_no_text"] == len(blanks) and report["images_no_caption"] == len(blanks)
    assert frame["caption"].tolist() == ["a red \u3164 square"]


def test_the_dag_builds_format_check_reads_a_shard_as_a_shard(tmp_path):
    """`compo inputs` and the DAG build peek at a dataset's first raw file: a .tar shard was read as lines of
    text (UnicodeDecodeError), so a webdataset `path` naming shards stopped the DAG build. Its first samples are
    read by the shard reader now; a file that is no tar is still named."""
    from compo.inputs import malformed_inputs

    folder = _write_webdataset(tmp_path / "wds", _samples())
    config = {"datasets": {"w": {"source": "webdataset", "path": str(folder / "{00000..00001}.tar")}}, "benchmarks": {}}
    assert malformed_inputs(config) == []
    (folder / "00000.tar").write_bytes(b"not a tar file" * 100)
    [(item, problem)] = malformed_inputs(config)
    assert item.key == "datasets.w.path" and "00000.tar: not a readable uncompressed tar shard" in problem
