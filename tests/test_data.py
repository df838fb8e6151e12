"""Dataset manifests from the world split and from each real dataset's published raw format.

The raw fixtures (tests/fixtures/raw, written by tests/fixtures/make_raw_fixtures.py) are tiny copies of
the real formats with the real defects: missing image files, empty captions, other splits.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest
from PIL import Image

from compo.cli import main as cli_main
from compo.config import ConfigError, validate_config
from compo.data import RawDataError, build_manifest
from compo.io import read_table
from compo.paths import OutsideRootError

FIXTURES = Path(__file__).resolve().parent / "fixtures"
RAW = FIXTURES / "raw"
COCO = RAW / "coco"
CC3M = RAW / "cc3m"
LAION = RAW / "laion-coco"
SHAREGPT4V = RAW / "sharegpt4v" / "share-captioner_coco_lcs_sam_1246k_1107.json"
DOCCI = RAW / "docci" / "docci_descriptions.jsonlines"
DCI = RAW / "dci" / "densely_captioned_images"
LN = RAW / "localized_narratives"
LN_COCO = LN / "coco_train_localized_narratives-00000-of-00004.jsonl"
GROUND_TRUTH = ["scene", "gt_noun_phrases", "grounded_words", "ungrounded_words"]


def build(tmp_path: Path, spec: dict[str, Any], name: str = "ds", **kwargs: Any) -> tuple[pd.DataFrame, dict]:
    """Build a manifest; return it (validated by the manifest contract) and the report row."""
    out, report = tmp_path / f"{name}.parquet", tmp_path / f"{name}.csv"
    build_manifest(name, spec, out=out, report=report, **kwargs)
    rows = pd.read_csv(report).to_dict("records")
    assert len(rows) == 1
    return read_table(out, "manifest"), rows[0]


def check_real_manifest(frame: pd.DataFrame, name: str, kind: str) -> None:
    assert (frame["dataset"] == name).all()
    assert (frame["caption_kind"] == kind).all()
    assert frame[GROUND_TRUTH].isna().all().all()
    assert all(Path(p).is_file() for p in frame["image_path"])
    assert all(c and c == " ".join(c.split()) for c in frame["caption"])
    expected_ids = frame.groupby("image_id", sort=False).cumcount().astype(str)
    assert (frame["caption_id"] == frame["image_id"] + "#" + expected_ids).all()


# ------------------------------------------------------------------------------------------------
# COCO


def test_coco_karpathy_train_split(tmp_path):
    frame, report = build(tmp_path, {"source": "coco", "path": str(COCO / "dataset_coco.json"),
                                     "split": "train"}, name="coco")
    check_real_manifest(frame, "coco", "short")
    assert frame["caption_id"].tolist() == ["9#0", "9#1", "25#0"]
    # whitespace and the newline inside the raw caption are collapsed
    assert frame["caption"].tolist() == ["A red square on green grass.", "a small red box on the grass",
                                         "A blue circle near a tree."]
    assert frame["image_path"].iloc[0] == str(COCO / "train2014" / "COCO_train2014_000000000009.jpg")
    assert report["records_read"] == 6 and report["images_read"] == 6
    assert report["images_other_split"] == 3            # restval, val, test
    assert report["images_missing_file"] == 1           # cocoid 30
    assert report["captions_empty"] == 1
    assert report["images_kept"] == 2 and report["captions_kept"] == 3
    assert report["source"] == "coco" and report["caption_kind"] == "short"


@pytest.mark.parametrize(("split", "kept"), [("train+restval", ["9", "25", "42"]), ("val", ["73"]),
                                             ("test", ["74"]), ("restval+test", ["42", "74"])])
def test_coco_karpathy_splits(tmp_path, split, kept):
    spec = {"source": "coco", "path": str(COCO / "dataset_coco.json"), "split": split}
    frame, report = build(tmp_path, spec)
    assert list(dict.fromkeys(frame["image_id"])) == kept
    assert report["images_kept"] + report["images_other_split"] + report["images_missing_file"] == 6
    if "42" in kept:
        path = frame.loc[frame["image_id"] == "42", "image_path"].iloc[0]
        assert path == str(COCO / "val2014" / "COCO_val2014_000000000042.jpg")


def test_coco_unknown_split_names_the_available_ones(tmp_path):
    with pytest.raises(ValueError, match=r"datasets\.ds\.split: trian not in .*dataset_coco\.json.*restval"):
        build(tmp_path, {"source": "coco", "path": str(COCO / "dataset_coco.json"), "split": "trian"})


def test_coco_official_captions_file(tmp_path):
    # image_root defaults to the COCO root: the parent of annotations/
    frame, report = build(tmp_path, {"source": "coco", "path": str(COCO / "annotations" /
                                                                   "captions_train2014.json")})
    check_real_manifest(frame, "ds", "short")
    assert frame["caption_id"].tolist() == ["9#0", "9#1", "25#0"]
    assert frame["caption"].tolist() == ["A red square on green grass.", "A small red box on the grass.",
                                         "A blue circle near a tree."]
    assert report["records_read"] == 5 and report["images_read"] == 3
    assert report["captions_empty"] == 1 and report["images_missing_file"] == 1


# ------------------------------------------------------------------------------------------------
# CC3M and LAION-COCO


def test_cc3m_headerless_tsv_with_img2dataset_download(tmp_path):
    frame, report = build(tmp_path, {"source": "cc3m", "path": str(CC3M / "Train_GCC-training.tsv"),
                                     "image_root": str(CC3M / "images")})
    check_real_manifest(frame, "ds", "short")
    assert frame["image_id"].tolist() == ["000000000", "000000001"]      # img2dataset keys
    assert frame["image_path"].iloc[0] == str(CC3M / "images" / "00000" / "000000000.jpg")
    assert frame["caption"].tolist() == ["a man rides a bicycle down a hill",
                                         "actor attends the premiere of the film"]
    assert report["records_read"] == 5
    assert report["images_missing_file"] == 2           # download failed; URL never downloaded
    assert report["captions_empty"] == 1 and report["images_no_caption"] == 1


def test_cc3m_tsv_with_header_and_relative_image_paths(tmp_path):
    frame, report = build(tmp_path, {"source": "cc3m", "path": str(CC3M / "cc3m_coca_captions.tsv")})
    assert frame["image_path"].tolist() == [str(CC3M / "images" / "00000" / "000000000.jpg"),
                                            str(CC3M / "images" / "00000" / "000000001.jpg")]
    assert frame["caption"].iloc[0] == "a man riding a bike on a dirt road"
    assert report["images_missing_file"] == 1 and report["images_kept"] == 2


def test_cc3m_dreamlip_long_captions(tmp_path):
    spec = {"source": "cc3m", "captions": "long", "image_root": str(CC3M / "images"),
            "path": str(CC3M / "cc3m_3long_3short_1raw_captions_url.csv")}
    frame, report = build(tmp_path, spec)
    check_real_manifest(frame, "ds", "long")
    bike = frame[frame["image_id"] == "000000000"]["caption"].tolist()
    # one row per long caption column, in the order longIB, longSV, longLLA; the quoted newline is gone
    assert bike == ["In the image, a man is riding a bicycle down a steep hill. He wears a helmet.",
                    "A cyclist descends a grassy hill on a red bicycle under a clear sky.",
                    "The photo captures a man on a bicycle moving fast down a hill."]
    assert (frame["image_id"] == "000000001").sum() == 2                   # its longSV caption is empty
    assert report["captions_empty"] == 1 and report["images_missing_file"] == 1
    assert report["captions_kept"] == 5
    # DreamLIP reads the columns by position: other header names (they differ between releases) read alike
    renamed = tmp_path / "renamed.csv"
    lines = (CC3M / "cc3m_3long_3short_1raw_captions_url.csv").read_text().split("\n", 1)
    renamed.write_text("url,caption,a,b,c,d,e,f\n" + lines[1])
    again, _ = build(tmp_path, {**spec, "path": str(renamed)}, name="renamed")
    assert again["caption"].tolist() == frame["caption"].tolist()
    (tmp_path / "short.csv").write_text("url,caption\nhttp://example.com/cc3m/bike.jpg,a bike\n")
    with pytest.raises(RawDataError, match=r"short\.csv: row 2: 2 fields, DreamLIP's layout has 8"):
        build(tmp_path, {**spec, "path": str(tmp_path / "short.csv")})
    # short captions from the same file: the raw CC3M alt text
    frame, _ = build(tmp_path, {**spec, "captions": "short"})
    assert frame["caption"].tolist() == ["a man rides a bicycle down a hill",
                                         "actor attends the premiere of the film"]


def test_cc3m_dreamlip_columns_pick_the_short_llava_captions_c2lip_reads(tmp_path):
    """C2LIP's released script trains on DreamLIP's short LLaVA captions (shortLLA_captions): read by position
    as DreamLIP reads its CSV, whatever the header says; several columns give a row each, in the given order."""
    spec = {"source": "cc3m", "captions": "short", "dreamlip_columns": ["shortLLA_captions"],
            "image_root": str(CC3M / "images"), "path": str(CC3M / "cc3m_3long_3short_1raw_captions_url.csv")}
    frame, report = build(tmp_path, spec)
    check_real_manifest(frame, "ds", "short")
    assert frame["caption"].tolist() == ["bike ride", "premiere"]          # the dead link's image is missing
    assert report["captions_kept"] == 2 and report["images_missing_file"] == 1
    renamed = tmp_path / "renamed.csv"
    lines = (CC3M / "cc3m_3long_3short_1raw_captions_url.csv").read_text().split("\n", 1)
    renamed.write_text("url,caption,a,b,c,d,e,f\n" + lines[1])
    again, _ = build(tmp_path, {**spec, "path": str(renamed)}, name="renamed")
    assert again["caption"].tolist() == frame["caption"].tolist()
    both, _ = build(tmp_path, {**spec, "dreamlip_columns": ["shortSV_captions", "shortLLA_captions"]}, name="both")
    assert both["caption"].tolist() == ["a cyclist on a hill", "bike ride", "an actor at a premiere", "premiere"]
    with pytest.raises(ValueError, match=r"datasets\.ds\.dreamlip_columns: 'shortLLA' not a caption column of "
                                         r"DreamLIP's CSV \(expected some of raw_caption, shortIB_captions"):
        build(tmp_path, {**spec, "dreamlip_columns": ["shortLLA"]})
    with pytest.raises(ValueError, match=r"datasets\.ds\.dreamlip_columns: DreamLIP's CSV is CC3M's"):
        build(tmp_path, {**spec, "source": "laion-coco"})


def test_laion_coco_folder_and_parquet_part_agree(tmp_path):
    folder, folder_report = build(tmp_path, {"source": "laion-coco", "path": str(LAION / "img2dataset")},
                                  name="a")
    part, part_report = build(tmp_path, {"source": "laion-coco", "image_root": str(LAION / "img2dataset"),
                                         "path": str(LAION / "part-00000-laion-coco.parquet")}, name="b")
    check_real_manifest(folder, "a", "short")
    # the part file's BLIP caption (top_caption) is what img2dataset stored as `caption`
    assert folder["caption"].tolist() == part["caption"].tolist() == [
        "a red sofa in a living room", "a dog sitting on a wooden floor", "the sun setting over the ocean"]
    assert folder["image_path"].tolist() == part["image_path"].tolist()
    assert folder["image_id"].tolist() == part["image_id"].tolist() == ["000000000", "000000001", "000000002"]
    for report in (folder_report, part_report):
        assert report["images_missing_file"] == 1 and report["images_kept"] == 3


def test_web_table_errors(tmp_path):
    no_caption = tmp_path / "no_caption.parquet"
    pd.DataFrame({"image_path": ["a.jpg"], "width": [32]}).to_parquet(no_caption)
    with pytest.raises(RawDataError, match=r"no_caption\.parquet: no short caption column.*top_caption"):
        build(tmp_path, {"source": "cc3m", "path": str(no_caption)})
    no_image = tmp_path / "no_image.csv"
    no_image.write_text("caption,width\na dog,32\n")
    with pytest.raises(RawDataError, match=r"no_image\.csv: no image column.*image_path"):
        build(tmp_path, {"source": "cc3m", "path": str(no_image)})
    ragged = tmp_path / "ragged.tsv"
    ragged.write_text("caption\timage_path\na dog\ta.jpg\na cat\n")
    with pytest.raises(RawDataError, match=r"ragged\.tsv: line 3: 1 fields, the header has 2"):
        build(tmp_path, {"source": "cc3m", "path": str(ragged)})
    # URLs need an img2dataset download to resolve against
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RawDataError, match=r"GCC-training\.tsv: the image column holds URLs.*img2dataset"):
        build(tmp_path, {"source": "cc3m", "path": str(CC3M / "Train_GCC-training.tsv"),
                         "image_root": str(empty)})


# ------------------------------------------------------------------------------------------------
# ShareGPT4V, DOCCI, DCI, Localized Narratives


def test_sharegpt4v(tmp_path):
    frame, report = build(tmp_path, {"source": "sharegpt4v", "path": str(SHAREGPT4V), "holdout": 0})
    check_real_manifest(frame, "ds", "long")
    assert frame["image_id"].tolist() == ["000000000009", "sa_1", "GCC_train_000000010"]
    assert frame["caption"].iloc[0] == ("The image shows a red square resting on a patch of green grass. "
                                        "The light is soft.")
    assert frame["image_path"].iloc[1] == str(SHAREGPT4V.parent / "sam" / "images" / "sa_1.jpg")
    assert report["records_read"] == 5
    assert report["images_missing_file"] == 1 and report["captions_empty"] == 1
    assert report["images_kept"] == 3


def test_sharegpt4v_holds_out_longclips_test_records(tmp_path):
    # LongCLIP's ShareGPT4V-1k: the first 1,000 records are the test set, never trained on
    with pytest.raises(RawDataError, match=r"share-captioner.*\.json: datasets\.ds\.holdout 1000: the file holds 5 "
                                           r"record\(s\), and its first 1000 form the test split"):
        build(tmp_path, {"source": "sharegpt4v", "path": str(SHAREGPT4V)})
    frame, report = build(tmp_path, {"source": "sharegpt4v", "path": str(SHAREGPT4V), "holdout": 2})
    assert frame["image_id"].tolist() == ["GCC_train_000000010"]  # records 0 and 1 held out
    assert report["images_other_split"] == 2 and report["records_read"] == 5
    test, _ = build(tmp_path, {"source": "sharegpt4v", "path": str(SHAREGPT4V), "holdout": 2, "split": "test"})
    assert test["image_id"].tolist() == ["000000000009", "sa_1"]


def test_docci_splits(tmp_path):
    frame, report = build(tmp_path, {"source": "docci", "path": str(DOCCI), "split": "train"})
    check_real_manifest(frame, "ds", "long")
    assert frame["image_id"].tolist() == ["train_00001", "train_00002"]
    assert frame["image_path"].iloc[0] == str(DOCCI.parent / "images" / "train_00001.jpg")
    assert report["images_other_split"] == 2 and report["images_missing_file"] == 1
    frame, report = build(tmp_path, {"source": "docci", "path": str(DOCCI), "split": "test+qual_dev"})
    assert frame["image_id"].tolist() == ["test_00001", "qual_dev_00001"]
    assert report["images_other_split"] == 3


def test_dci_summarized_long_captions(tmp_path):
    frame, report = build(tmp_path, {"source": "dci", "path": str(DCI), "split": "train"})
    check_real_manifest(frame, "ds", "long")
    assert frame["image_id"].tolist() == ["sa_1", "sa_2"]
    # summaries["base"]: the first of a list, or the string itself
    assert frame["caption"].tolist() == ["A kitchen with a wooden table, two chairs and a bright window.",
                                         "Several small boats float in a calm harbor under a gray sky."]
    assert frame["image_path"].iloc[0] == str(DCI / "photos" / "sa_1.jpg")
    assert report["images_no_summary"] == 1             # sa_3
    assert report["images_other_split"] == 1            # sa_4 is in valid


def test_dci_short_captions(tmp_path):
    frame, report = build(tmp_path, {"source": "dci", "captions": "short", "path": str(DCI),
                                     "split": "train+valid"})
    assert frame["caption"].tolist() == ["A kitchen with a wooden table.", "A harbor with boats.",
                                         "A mountain road.", "A market stall with fruit."]
    assert report["images_no_summary"] == 0 and report["images_kept"] == 4


def test_localized_narratives_coco_and_open_images(tmp_path):
    frame, report = build(tmp_path, {"source": "localized-narratives", "path": str(LN_COCO),
                                     "image_root": str(LN / "coco")})
    check_real_manifest(frame, "ds", "long")
    # two annotators' narratives of image 9 become two captions of one image
    assert frame["caption_id"].tolist() == ["9#0", "9#1", "25#0"]
    assert frame["image_path"].iloc[0] == str(LN / "coco" / "train2017" / "000000000009.jpg")
    assert report["records_read"] == 5 and report["images_read"] == 4
    assert report["images_missing_file"] == 1 and report["captions_empty"] == 1
    assert report["images_no_caption"] == 1
    # the COCO narratives ship as shards: a glob or a list reads them in order as one dataset
    shard = tmp_path / "shards"
    shard.mkdir()
    lines = LN_COCO.read_text().splitlines()
    (shard / "coco_train_localized_narratives-00000-of-00004.jsonl").write_text("\n".join(lines[:3]) + "\n")
    (shard / "coco_train_localized_narratives-00001-of-00004.jsonl").write_text("\n".join(lines[3:]) + "\n")
    for path in (str(shard / "coco_train_localized_narratives-*.jsonl"),
                 sorted(str(p) for p in shard.glob("*.jsonl"))):
        sharded, sharded_report = build(tmp_path, {"source": "localized-narratives", "path": path,
                                                   "image_root": str(LN / "coco")}, name="sharded")
        assert sharded.drop(columns="dataset").equals(frame.drop(columns="dataset"))
        assert {k: v for k, v in sharded_report.items() if k not in ("dataset", "raw_path")} == {
            k: v for k, v in report.items() if k not in ("dataset", "raw_path")}
    with pytest.raises(RawDataError, match=r"nothing-\*\.jsonl: no raw file matches"):
        build(tmp_path, {"source": "localized-narratives", "path": str(shard / "nothing-*.jsonl")})
    open_images = LN / "open_images_train_v6_localized_narratives-00000-of-00010.jsonl"
    frame, _ = build(tmp_path, {"source": "localized-narratives", "path": str(open_images),
                                "image_root": str(LN / "open_images")})
    assert frame["image_path"].tolist() == [str(LN / "open_images" / "0a1b2c3d4e5f6789.jpg"),
                                            str(LN / "open_images" / "fedcba9876543210.jpg")]


# ------------------------------------------------------------------------------------------------
# shared behaviour


def test_sample_draws_a_seeded_uniform_subset_listed_in_file_order(tmp_path):
    """FSC-CLIP's "randomly sample 100K examples": a seeded draw among the usable images, recorded."""
    spec = {"source": "coco", "path": str(COCO / "dataset_coco.json"), "split": "train+restval"}
    usable = ["9", "25", "42"]  # 30's file is missing: it is never drawn
    drawn = {}
    for seed in range(12):
        frame, report = build(tmp_path, {**spec, "sample": 2, "sample_seed": seed}, name=f"s{seed}")
        ids = list(dict.fromkeys(frame["image_id"]))
        assert len(ids) == 2 and set(ids) <= set(usable) and ids == sorted(ids, key=usable.index)  # file order
        assert report["images_kept"] == 2 and report["sample_seed"] == seed
        assert report["images_not_sampled"] + report["images_missing_file"] >= 1
        drawn[seed] = tuple(ids)
    assert len(set(drawn.values())) == 3  # every pair of the three usable images is drawn by some seed
    again, _ = build(tmp_path, {**spec, "sample": 2, "sample_seed": 5}, name="again")
    assert tuple(dict.fromkeys(again["image_id"])) == drawn[5]
    frame, report = build(tmp_path, {**spec, "sample": 10}, name="all")
    assert list(dict.fromkeys(frame["image_id"])) == usable and report["images_not_sampled"] == 0
    with pytest.raises(ValueError, match=r"datasets\.ds: give limit .* or sample"):
        build(tmp_path, {**spec, "sample": 2, "limit": 2})
    _, report = build(tmp_path, {**spec, "limit": 2}, name="limited")
    assert report["sample_seed"] == "none"


def test_longest_caption_is_the_anchor_of_each_image(tmp_path):
    """Concrete Jungle: Karpathy train only (not restval), one caption per image, its longest."""
    spec = {"source": "coco", "path": str(COCO / "dataset_coco.json"), "split": "train", "caption": "longest"}
    frame, report = build(tmp_path, spec)
    assert list(frame["image_id"]) == ["9", "25"]  # 42 is restval; 30's file is missing
    assert list(frame["caption"]) == ["a small red box on the grass", "A blue circle near a tree."]
    assert list(frame["caption_id"]) == ["9#1", "25#0"]
    assert report["captions_not_longest"] == 1 and report["captions_empty"] == 1 and report["captions_kept"] == 2
    with pytest.raises(ValueError, match=r"datasets\.ds\.caption: applies to real datasets"):
        build(tmp_path, {"source": "world", "caption": "longest"}, world_manifest=tmp_path / "none.parquet")


def test_limit_keeps_the_first_usable_images(tmp_path):
    spec = {"source": "coco", "path": str(COCO / "dataset_coco.json"), "split": "train+restval"}
    # file order: 9, 25, 30 (file missing), 42; the missing image does not use up a place
    frame, report = build(tmp_path, {**spec, "limit": 3})
    assert list(dict.fromkeys(frame["image_id"])) == ["9", "25", "42"]
    assert report["images_missing_file"] == 1 and report["images_beyond_limit"] == 0
    frame, report = build(tmp_path, {**spec, "limit": 2})
    assert list(dict.fromkeys(frame["image_id"])) == ["9", "25"]
    # past the limit no image file is checked: 30 and 42 both count as beyond it
    assert report["images_kept"] == 2 and report["images_beyond_limit"] == 2
    assert report["images_missing_file"] == 0
    again, _ = build(tmp_path, {**spec, "limit": 2}, name="again")
    pd.testing.assert_frame_equal(frame.drop(columns="dataset"), again.drop(columns="dataset"))


def test_relative_paths_stay_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(RAW)
    out = tmp_path / "m.parquet"
    build_manifest("ds", {"source": "docci", "path": "docci/docci_descriptions.jsonlines"}, out=out)
    frame = read_table(out, "manifest")
    assert frame["image_path"].tolist() == ["docci/images/train_00001.jpg", "docci/images/train_00002.jpg"]


def test_caption_kind_the_source_lacks_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"datasets\.ds\.captions: sharegpt4v provides long captions"):
        build(tmp_path, {"source": "sharegpt4v", "captions": "short", "path": str(SHAREGPT4V)})


def test_missing_raw_file_and_path(tmp_path):
    with pytest.raises(RawDataError, match=r"nowhere\.json: raw file of dataset 'ds' \(coco\) not found"):
        build(tmp_path, {"source": "coco", "path": str(tmp_path / "nowhere.json")})
    with pytest.raises(ValueError, match=r"datasets\.ds\.path: source docci needs"):
        build(tmp_path, {"source": "docci"})


def test_nothing_kept_is_an_error(tmp_path):
    with pytest.raises(RawDataError, match=r"kept no captions.*images_missing_file=4"):
        build(tmp_path, {"source": "sharegpt4v", "path": str(SHAREGPT4V), "image_root": str(tmp_path),
                         "holdout": 0})


def copy_fixture(tmp_path: Path, path: Path) -> Path:
    copy = tmp_path / path.name
    shutil.copy(path, copy)
    return copy


def test_malformed_json_names_the_file(tmp_path):
    broken = tmp_path / "dataset_coco.json"
    broken.write_text((COCO / "dataset_coco.json").read_text()[:-20])
    with pytest.raises(RawDataError, match=r"dataset_coco\.json: not valid JSON"):
        build(tmp_path, {"source": "coco", "path": str(broken), "split": "train"})
    lines = tmp_path / "docci_descriptions.jsonlines"
    text = DOCCI.read_text().splitlines()
    lines.write_text("\n".join(text[:2] + ['{"example_id": "train_9", '] + text[2:]) + "\n")
    with pytest.raises(RawDataError, match=r"docci_descriptions\.jsonlines: line 3: not valid JSON"):
        build(tmp_path, {"source": "docci", "path": str(lines), "image_root": str(DOCCI.parent / "images")})


def rewrite_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_missing_fields_name_file_record_and_field(tmp_path):
    karpathy = copy_fixture(tmp_path, COCO / "dataset_coco.json")
    rewrite_json(karpathy, lambda d: d["images"][3]["sentences"][1].pop("raw"))
    with pytest.raises(RawDataError, match=r"dataset_coco\.json: images\[3\] \(cocoid 42\) sentences\[1\]: "
                                           r"missing field 'raw'"):
        build(tmp_path, {"source": "coco", "path": str(karpathy), "split": "train"})

    sharegpt = copy_fixture(tmp_path, SHAREGPT4V)
    rewrite_json(sharegpt, lambda d: d[2]["conversations"].pop(1))
    with pytest.raises(RawDataError, match=r"record 2 \(id GCC_train_000000010\): no conversation turn"):
        build(tmp_path, {"source": "sharegpt4v", "path": str(sharegpt)})

    docci = tmp_path / DOCCI.name
    records = [json.loads(line) for line in DOCCI.read_text().splitlines()]
    del records[1]["description"]
    docci.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(RawDataError, match=r"line 2 \(example_id train_00002\): missing field 'description'"):
        build(tmp_path, {"source": "docci", "path": str(docci)})

    narratives = tmp_path / LN_COCO.name
    records = [json.loads(line) for line in LN_COCO.read_text().splitlines()]
    records[0]["image_id"] = ["9"]
    narratives.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(RawDataError, match=r"line 1: field 'image_id' should be str/int, got list"):
        build(tmp_path, {"source": "localized-narratives", "path": str(narratives)})


def test_dci_errors(tmp_path):
    dci = tmp_path / "densely_captioned_images"
    shutil.copytree(DCI, dci)
    (dci / "complete" / "sa_2.json").unlink()
    with pytest.raises(RawDataError, match=r"sa_2\.json: annotation listed in splits\.json not found"):
        build(tmp_path, {"source": "dci", "path": str(dci)})
    with pytest.raises(RawDataError, match=r"expected the densely_captioned_images folder"):
        build(tmp_path, {"source": "dci", "path": str(dci / "photos")})


def test_same_image_id_with_another_file_is_an_error(tmp_path):
    sharegpt = copy_fixture(tmp_path, SHAREGPT4V)
    rewrite_json(sharegpt, lambda d: d[1].update(id="000000000009"))
    with pytest.raises(RawDataError, match=r"record 1 \(id 000000000009\): image id '000000000009' already "
                                           r"appeared at record 0"):
        build(tmp_path, {"source": "sharegpt4v", "path": str(sharegpt), "image_root": str(SHAREGPT4V.parent)})


# ------------------------------------------------------------------------------------------------
# the synthetic world


def world_manifest(path: Path) -> Path:
    rows = []
    (path.parent / "images").mkdir(exist_ok=True)
    for image in range(4):
        Image.new("RGB", (16, 16), "red").save(path.parent / "images" / f"w{image}.png")
        kinds = ["short", "short", "long"] if image != 3 else ["short"]
        for i, kind in enumerate(kinds):
            rows.append({"image_id": f"w{image}", "image_path": str(path.parent / "images" / f"w{image}.png"),
                         "caption_id": f"w{image}#{i}", "caption": f"{kind} caption {i} of image {image}",
                         "dataset": "finetune", "caption_kind": kind, "scene": json.dumps({"objects": []}),
                         "gt_noun_phrases": ["a red square"], "grounded_words": ["red", "square"],
                         "ungrounded_words": []})
    frame = pd.DataFrame(rows)
    frame.to_parquet(path, index=False)
    return path


def test_world_source_filters_caption_kind(tmp_path):
    source = world_manifest(tmp_path / "world.parquet")
    frame, report = build(tmp_path, {"source": "world", "split": "finetune", "captions": "long"}, name="long",
                          world_manifest=source)
    assert frame["caption_id"].tolist() == ["w0#2", "w1#2", "w2#2"]
    assert (frame["dataset"] == "long").all() and (frame["caption_kind"] == "long").all()
    assert frame["grounded_words"].iloc[0].tolist() == ["red", "square"]       # ground truth kept
    assert report["records_read"] == 10 and report["images_read"] == 4
    assert report["images_no_caption"] == 1 and report["captions_kept"] == 3

    frame, report = build(tmp_path, {"source": "world", "split": "finetune", "limit": 2}, name="coco",
                          world_manifest=source)                     # captions default to short
    assert frame["caption_id"].tolist() == ["w0#0", "w0#1", "w1#0", "w1#1"]
    assert report["images_beyond_limit"] == 2 and report["images_kept"] == 2


def test_world_source_needs_its_manifest(tmp_path):
    with pytest.raises(ValueError, match=r"datasets\.pretrain: source world needs"):
        build(tmp_path, {"source": "world", "split": "pretrain"}, name="pretrain")


def test_cli_dataset_command(tmp_path):
    out, report = tmp_path / "m.parquet", tmp_path / "r.csv"
    spec = {"source": "docci", "path": str(DOCCI), "split": "train"}
    cli_main(["dataset", "--name", "docci", "--spec", json.dumps(spec), "--out", str(out),
              "--report", str(report)])
    assert read_table(out, "manifest")["image_id"].tolist() == ["train_00001", "train_00002"]
    assert pd.read_csv(report)["images_kept"].tolist() == [2]


# ------------------------------------------------------------------------------------------------
# the fixtures themselves


def test_fixture_script_reproduces_the_committed_fixtures(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_raw_fixtures", FIXTURES / "make_raw_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.make_all(tmp_path)
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(p.relative_to(RAW) for p in RAW.rglob("*") if p.is_file())
    assert made == committed
    for relative in made:
        if relative.suffix == ".parquet":  # compare content; the file embeds the writer's version
            assert pq.read_table(tmp_path / relative).equals(pq.read_table(RAW / relative)), relative
        else:
            assert (tmp_path / relative).read_bytes() == (RAW / relative).read_bytes(), relative
    assert sum((RAW / r).stat().st_size for r in committed) < 300_000


@pytest.mark.parametrize(("holdout", "split", "outcome"), [
    (5, "train", "every record is held out, none left for split train"),
    (6, "train", "its test split would be smaller than asked"),
    (6, "test", "its test split would be smaller than asked"),
])
def test_a_sharegpt4v_holdout_the_file_cannot_fill_names_the_holdout(tmp_path, holdout, split, outcome):
    """Issue 59: a holdout of as many records as the file (or more) was blamed on the split ("split: train not in
    ... (splits there: test)"), and one larger than the file with split test gave a smaller test set silently."""
    with pytest.raises(RawDataError, match=rf"datasets\.ds\.holdout {holdout}: the file holds 5 record\(s\).*"
                                           rf"{outcome}\. Expected a holdout below 5"):
        build(tmp_path, {"source": "sharegpt4v", "path": str(SHAREGPT4V), "holdout": holdout, "split": split})
    frame, _ = build(tmp_path, {"source": "sharegpt4v", "path": str(SHAREGPT4V), "holdout": 2, "split": split})
    assert len(frame) > 0


# --- the dataset stage opens every image and applies the image-root check -----------------------------


def test_broken_and_outside_images_are_skipped_with_a_count(tmp_path: Path, caplog) -> None:
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


def test_a_world_image_that_does_not_decode_is_skipped_too(tmp_path: Path, write_manifest) -> None:
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
    """The manifest and report of the COCO-format dataset under `root`."""
    return _manifest(tmp_path, _coco_spec(root, **spec), name)


def _kept(tmp_path: Path, root: Path, name: str) -> int:
    return int(_build(tmp_path, root, name)[1]["images_kept"])


# --- a caption longer than the bound stops at the dataset stage ----------------------------------------


def test_a_caption_beyond_the_bound_is_skipped_with_a_count_before_any_generator(tmp_path: Path, caplog) -> None:
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


def test_the_bound_is_a_config_key(config: dict) -> None:
    config["datasets"]["coco"]["max_caption_chars"] = 0
    with pytest.raises(ConfigError, match=r"^config key datasets\.coco\.max_caption_chars: "):
        validate_config(config)


def _manifest(tmp_path: Path, spec: dict, name: str = "ds") -> tuple[pd.DataFrame, dict]:
    out, report = tmp_path / f"{name}.parquet", tmp_path / f"{name}.csv"
    build_manifest(name, spec, out=out, report=report)
    return read_table(out, "manifest"), pd.read_csv(report).iloc[0].to_dict()


def _coco_spec(root: Path, **spec) -> dict:
    return {"source": "coco", "path": str(root / "dataset_coco.json"), "image_root": str(root),
            "split": "train+restval+val+test", **spec}


def test_an_image_linked_from_outside_the_image_root_is_skipped_with_a_count(tmp_path: Path, caplog) -> None:
    """A symbolic link inside image_root to an image outside it was decoded and kept as training data."""
    root = tmp_path / "coco"
    shutil.copytree(COCO, root)
    train = [i for i in json.loads((root / "dataset_coco.json").read_text())["images"] if i["split"] == "train"]
    before = int(_manifest(tmp_path, _coco_spec(root), "before")[1]["images_kept"])
    listed = root / train[0]["filepath"] / train[0]["filename"]
    outside = tmp_path / "elsewhere.jpg"
    shutil.move(listed, outside)
    listed.symlink_to(outside)
    with caplog.at_level("WARNING", logger="compo.data"):
        frame, report = _manifest(tmp_path, _coco_spec(root), "after")
    assert report["images_outside_root"] == 1 and report["images_kept"] == before - 1
    assert str(listed) not in set(frame["image_path"])
    assert "1 images_outside_root, e.g." in caplog.text


def test_a_dci_split_entry_outside_the_dataset_folder_is_refused(tmp_path: Path) -> None:
    """A splits.json entry `../../outside.json` was read from outside the folder; its summary became a caption."""
    dci = tmp_path / "data" / "densely_captioned_images"
    shutil.copytree(DCI, dci)
    shutil.copy(dci / "complete" / "sa_1.json", tmp_path / "data" / "outside.json")
    splits = json.loads((dci / "splits.json").read_text())
    splits["train"].append("../../outside.json")
    (dci / "splits.json").write_text(json.dumps(splits))
    with pytest.raises(OutsideRootError, match=rf"^{dci / 'splits.json'}: split 'train' entry: path "
                                               rf"'../../outside.json' resolves to .*outside {dci / 'complete'}"):
        _manifest(tmp_path, {"source": "dci", "path": str(dci), "split": "train"})


# --- duplicates: an error where the meaning breaks, a count where harmless ------------------------------


def _official_coco(tmp_path: Path, mutate) -> Path:
    root = tmp_path / "coco"
    shutil.copytree(COCO, root)
    path = root / "annotations" / "captions_train2014.json"
    data = json.loads(path.read_text())
    mutate(data)
    path.write_text(json.dumps(data))
    return path


def test_a_coco_images_id_given_twice_is_an_error(tmp_path: Path) -> None:
    """The caption was paired with the second file given under the id."""
    path = _official_coco(tmp_path, lambda d: d["images"].append({**d["images"][0], "file_name": "other.jpg"}))
    with pytest.raises(ValueError, match=r"captions_train2014\.json: images\[3\]: image id 9 already given at "
                                         r"images\[0\]; expected each image once"):
        _manifest(tmp_path, {"source": "coco", "path": str(path)})


def test_a_repeated_annotation_or_shard_is_read_once_with_a_count(tmp_path: Path, caplog) -> None:
    """A repeated COCO annotation record or a file listed twice doubled the captions."""
    clean = _official_coco(tmp_path / "a", lambda d: None)
    _, before = _manifest(tmp_path, {"source": "coco", "path": str(clean)}, "before")
    path = _official_coco(tmp_path / "b", lambda d: d["annotations"].append(dict(d["annotations"][0])))
    with caplog.at_level("WARNING", logger="compo.data"):
        frame, report = _manifest(tmp_path, {"source": "coco", "path": [str(path), str(path)]}, "after")
    assert report["records_repeated"] == 1 and report["files_repeated"] == 1
    assert report["captions_kept"] == before["captions_kept"] == len(frame)
    assert "1 records_repeated, e.g. 9 (annotations[5]" in caplog.text and "1 files_repeated, e.g." in caplog.text
    path = _official_coco(tmp_path / "c", lambda d: d["annotations"].append({**d["annotations"][0], "caption": "x"}))
    with pytest.raises(ValueError, match=r"annotations\[5\]: annotation id 101 already given at annotations\[0\] "
                                         "with other content"):
        _manifest(tmp_path, {"source": "coco", "path": str(path)}, "other")


def test_a_repeated_docci_example_id_is_an_error(tmp_path: Path) -> None:
    """Two images under one example_id were merged."""
    docci = tmp_path / "docci"
    shutil.copytree(RAW / "docci", docci)
    path = docci / "docci_descriptions.jsonlines"
    lines = path.read_text().splitlines()
    second = json.loads(lines[1])
    lines.append(json.dumps({**second, "example_id": json.loads(lines[0])["example_id"]}))
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"docci_descriptions\.jsonlines: line {len(lines)} \(example_id train_00001"
                                         r"\): image id 'train_00001' already appeared at line 1 .*expected each "
                                         "image once"):
        _manifest(tmp_path, {"source": "docci", "path": str(path), "split": "train+test+qual_dev+qual_test"})


def test_captions_without_visible_text_are_skipped_with_a_count(tmp_path: Path, caplog) -> None:
    """Captions of zero-width, direction or BOM characters, or NUL bytes, were kept for training."""
    root = tmp_path / "coco"
    shutil.copytree(COCO, root)
    karpathy = json.loads((root / "dataset_coco.json").read_text())
    first = karpathy["images"][0]["sentences"]
    _, before = _manifest(tmp_path, _coco_spec(root), "before")
    first += [{"raw": "\u200b\u200d"}, {"raw": "\u202e\ufeff"}, {"raw": "\x00\x00"}]
    (root / "dataset_coco.json").write_text(json.dumps(karpathy))
    with caplog.at_level("WARNING", logger="compo.data"):
        _, report = _manifest(tmp_path, _coco_spec(root), "after")
    assert report["captions_no_text"] == 3 and report["captions_kept"] == before["captions_kept"]
    assert "3 captions_no_text, e.g." in caplog.text


@pytest.mark.parametrize(("column", "values", "expected"), [
    ("caption", [101, 102], "column 'caption' holds int 101"),
    ("caption", [{"text": "a"}, {"text": "b"}], "column 'caption' holds dict"),
    ("image_path", [7, 8], "column 'image_path' holds int 7"),
])
def test_a_table_cell_that_is_not_a_string_names_the_column_and_type(tmp_path: Path, column: str, values: list,
                                                                       expected: str) -> None:
    """A parquet caption column of integers or structs was read as '101' or a Python repr; an integer image
    column was reported only as missing files."""
    table = {"caption": ["a red cube", "a blue ball"], "image_path": ["1.jpg", "2.jpg"]}
    table[column] = values
    path = tmp_path / "table.parquet"
    pd.DataFrame(table).to_parquet(path)
    with pytest.raises(ValueError, match=rf"table\.parquet: row 1: {expected}.*; expected a string"):
        _manifest(tmp_path, {"source": "cc3m", "path": str(path)})
