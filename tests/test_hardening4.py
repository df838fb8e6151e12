"""Hostile and broken inputs, fourth round (issue 43, items 1, 3 and 7): one test per case, each reading the
message.

1 nothing is read from outside its root (links followed): prefetch --from, manifest entries, images, DCI splits
3 duplicates and text that is not text are named (an error where the meaning breaks, a count where harmless)
7 the unclear cases end in one line naming the file, the item or key, and what was expected
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from compo.artifacts import CACHE_ENV, MANIFEST, resolve
from compo.data import build_manifest
from compo.images import OutsideRoot, item_path
from compo.io import read_table
from compo.paths import OutsideRootError, contained, has_visible_text, repeated

REPO = Path(__file__).resolve().parents[1]
RAW = REPO / "tests" / "fixtures" / "raw"
COCO = RAW / "coco"
DCI = RAW / "dci" / "densely_captioned_images"


def _build(tmp_path: Path, spec: dict, name: str = "ds") -> tuple[pd.DataFrame, dict]:
    out, report = tmp_path / f"{name}.parquet", tmp_path / f"{name}.csv"
    build_manifest(name, spec, out=out, report=report)
    return read_table(out, "manifest"), pd.read_csv(report).iloc[0].to_dict()


def _coco_spec(root: Path, **spec) -> dict:
    return {"source": "coco", "path": str(root / "dataset_coco.json"), "image_root": str(root),
            "split": "train+restval+val+test", **spec}


# --- 1. one containment rule, links followed ---------------------------------------------------------------


def test_1_the_rule_follows_links_and_keeps_the_joined_form(tmp_path: Path) -> None:
    shared = tmp_path / "shared" / "images"
    shared.mkdir(parents=True)
    (shared / "a.jpg").write_bytes(b"x")
    (tmp_path / "outside.jpg").write_bytes(b"x")
    root = tmp_path / "bench" / "images"
    root.parent.mkdir()
    root.symlink_to(shared)  # a root that is a link to shared storage is fine
    (shared / "escape.jpg").symlink_to(tmp_path / "outside.jpg")  # a link inside it pointing out is not
    assert contained(root, "a.jpg", source="f", entry="e") == root / "a.jpg"  # joined, not resolved
    assert item_path(root, "sub/../a.jpg") == root / "sub/../a.jpg"
    for parts in (("escape.jpg",), ("../../outside.jpg",), (str(tmp_path / "outside.jpg"),)):
        assert isinstance(item_path(root, *parts), OutsideRoot), parts
    with pytest.raises(OutsideRootError, match=rf"^list.json: item 7: path 'escape.jpg' resolves to "
                                               rf"{tmp_path / 'outside.jpg'}, outside {root}; refused"):
        contained(root, "escape.jpg", source="list.json", entry="item 7")


def test_1_prefetch_from_refuses_a_model_name_leaving_the_folder(tmp_path: Path) -> None:
    """`org/../../outside/x` once copied files from outside --from into a folder outside the model cache
    and recorded that path in the manifest."""
    from compo.prefetch import prefetch

    source = tmp_path / "shared-models"
    (source / "org").mkdir(parents=True)
    victim = tmp_path / "outside" / "x"
    victim.mkdir(parents=True)
    (victim / "config.json").write_text("{}")  # a file the llm patterns would copy
    name = "org/../../outside/x"
    config = {"negatives": {"llm": {"generator": "degla-llm", "backend": "transformers", "model": name}}}
    cache = tmp_path / "cache"
    with pytest.raises(OutsideRootError, match=rf"^--from {source}: llm:{name}: path '{name}' resolves to "
                                               rf"{victim}, outside {source}"):
        prefetch(config, cache, source_dir=source, log=lambda line: None)
    assert not (cache / MANIFEST).exists() and not (tmp_path / "x").exists()

    (source / "org" / "m").mkdir()  # a file linked in from outside is refused too
    (source / "org" / "m" / "config.json").symlink_to(victim / "config.json")
    config["negatives"]["llm"]["model"] = "org/m"
    with pytest.raises(OutsideRootError, match=rf"llm:org/m: path 'config.json' resolves to {victim}"):
        prefetch(config, cache, source_dir=source, log=lambda line: None)


@pytest.mark.parametrize("how", ["dotdot", "link"])
def test_1_a_manifest_entry_outside_the_cache_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         how: str) -> None:
    """A manifest entry `../outside/weights.pt` was followed: a base's weights read from outside the cache."""
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    (outside / "weights.pt").write_bytes(b"not the cache's")
    cache.mkdir()
    path = "../outside/weights.pt"
    if how == "link":
        (cache / "weights.pt").symlink_to(outside / "weights.pt")
        path = "weights.pt"
    entry = {"kind": "llm", "source": "org/m", "path": path, "files": {}, "bytes": 0}
    (cache / MANIFEST).write_text(json.dumps({"artifacts": {"llm:org/m": entry}}))
    monkeypatch.setenv(CACHE_ENV, str(cache))
    with pytest.raises(OutsideRootError, match=rf"^{cache / MANIFEST}: artifact 'llm:org/m': path '{path}' "
                                               rf"resolves to {outside / 'weights.pt'}, outside {cache}"):
        resolve("llm", "org/m")


def test_1_an_image_linked_from_outside_the_image_root_is_skipped_with_a_count(tmp_path: Path, caplog) -> None:
    """A symbolic link inside image_root to an image outside it was decoded and kept as training data."""
    root = tmp_path / "coco"
    shutil.copytree(COCO, root)
    train = [i for i in json.loads((root / "dataset_coco.json").read_text())["images"] if i["split"] == "train"]
    before = int(_build(tmp_path, _coco_spec(root), "before")[1]["images_kept"])
    listed = root / train[0]["filepath"] / train[0]["filename"]
    outside = tmp_path / "elsewhere.jpg"
    shutil.move(listed, outside)
    listed.symlink_to(outside)
    with caplog.at_level("WARNING", logger="compo.data"):
        frame, report = _build(tmp_path, _coco_spec(root), "after")
    assert report["images_outside_root"] == 1 and report["images_kept"] == before - 1
    assert str(listed) not in set(frame["image_path"])
    assert "1 images_outside_root, e.g." in caplog.text


def test_1_a_dci_split_entry_outside_the_dataset_folder_is_refused(tmp_path: Path) -> None:
    """A splits.json entry `../../outside.json` was read from outside the folder; its summary became a caption."""
    dci = tmp_path / "data" / "densely_captioned_images"
    shutil.copytree(DCI, dci)
    shutil.copy(dci / "complete" / "sa_1.json", tmp_path / "data" / "outside.json")
    splits = json.loads((dci / "splits.json").read_text())
    splits["train"].append("../../outside.json")
    (dci / "splits.json").write_text(json.dumps(splits))
    with pytest.raises(OutsideRootError, match=rf"^{dci / 'splits.json'}: split 'train' entry: path "
                                               rf"'../../outside.json' resolves to .*outside {dci / 'complete'}"):
        _build(tmp_path, {"source": "dci", "path": str(dci), "split": "train"})


# --- 3. the shared checks ----------------------------------------------------------------------------------


def test_3_the_shared_checks() -> None:
    assert repeated(["a", "b", "a", "c", "a", "b"]) == {"a": 3, "b": 2}
    assert repeated([1, 2, 3]) == {}
    for text in ("a red cube", "7", "日本", "\u200ba"):
        assert has_visible_text(text), text
    for text in ("", " ", "\u200b\u200c\u200d", "\u202e\u2066", "\ufeff", "\x00\x00", "...", "\u00a0\t"):
        assert not has_visible_text(text), repr(text)
