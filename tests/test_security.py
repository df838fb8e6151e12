"""Config strings never reach a shell as code; benchmark item paths stay inside their image root; a
downloaded file needs a checksum (issue 10, items 1-3)."""

from __future__ import annotations

import copy
import hashlib
import shutil
from pathlib import Path

import pytest
import yaml

from compo.concreteness import NormsError, load_norms
from compo.config import ConfigError, validate_config
from compo.evaluate.common import OUTSIDE_ROOT, OutsideRoot, item_path, open_image

INJECTION = "x;touch MARK;$(touch MARK)`touch MARK`"


def _rename(section: dict, old: str, new: str) -> None:
    section[new] = section.pop(old)


# Every config string that becomes a file name, a wildcard or a command word follows a safe pattern.
NAME_INJECTIONS = [
    ("results", lambda c: c.update(results=f"r;{INJECTION}")),
    ("results", lambda c: c.update(results="my results")),
    ("parse.spacy_model", lambda c: c["parse"].update(spacy_model=f"en;{INJECTION}")),
    ("bases.clip.init", lambda c: c["bases"]["clip"].update(init=f"openai;{INJECTION}")),
    ("methods", lambda c: _rename(c["methods"], "lss-lora", f"m;{INJECTION}")),
    ("datasets", lambda c: _rename(c["datasets"], "long", "long data")),
    ("bases", lambda c: _rename(c["bases"], "siglip", "$(touch MARK)")),
    ("benchmarks", lambda c: _rename(c["benchmarks"], "winoground", "wino;touch MARK")),
    ("negatives", lambda c: _rename(c["negatives"], "shuffle", "-shuffle")),
    ("ablations", lambda c: _rename(c["ablations"], "fsc-lora", "fsc|lora")),
]


@pytest.mark.parametrize(("key", "mutate"), NAME_INJECTIONS, ids=[f"{k}-{i}" for i, (k, _) in
                                                                  enumerate(NAME_INJECTIONS)])
def test_unsafe_names_are_config_errors_naming_the_key(config: dict, key: str, mutate) -> None:
    bad = copy.deepcopy(config)
    mutate(bad)
    with pytest.raises(ConfigError, match=rf"^config key {key.replace('.', '[.]')}: .* is not a (name|path) of "):
        validate_config(bad)


def test_results_must_not_be_empty(config: dict) -> None:
    config["results"] = ""
    with pytest.raises(ConfigError, match=r"^config key results: '' is not a path"):
        validate_config(config)


def test_item_paths_stay_inside_their_root() -> None:
    root = Path("bench/images")
    assert item_path(root, "000000000001.jpg") == Path("bench/images/000000000001.jpg")
    assert item_path(root, "val2017", "a.jpg") == Path("bench/images/val2017/a.jpg")
    assert item_path(root, "", "a.jpg") == Path("bench/images/a.jpg")  # Flickr30k: no filepath
    assert not isinstance(item_path(root, "sub/../a.jpg"), OutsideRoot)  # stays inside
    for parts in [("../../x.png",), ("/etc/passwd",), ("sub/../../x.png",), ("val2017", "../../x.png"), ("..",)]:
        escaped = item_path(root, *parts)
        assert isinstance(escaped, OutsideRoot), parts
        assert open_image(escaped) == OUTSIDE_ROOT


def test_norms_url_needs_a_checksum(config: dict) -> None:
    for url in ("http://example.org/norms.tsv", "https://example.org/norms.tsv"):
        bad = copy.deepcopy(config)
        bad["concreteness"] = {"norms": url, "sha256": None}
        with pytest.raises(ConfigError, match=r"^config key concreteness\.sha256: the norms http.* are "
                                              r"downloaded, so their sha256 is required"):
            validate_config(bad)
        with pytest.raises(NormsError, match="a download needs its sha256"):
            load_norms(url)  # refused before any download
    bad = copy.deepcopy(config)
    bad["negatives"]["concrete-hc"].update(norms="http://example.org/norms.tsv", sha256=None)
    with pytest.raises(ConfigError, match=r"^config key negatives\.concrete-hc\.sha256"):
        validate_config(bad)
    # the explicit opt-out is accepted; a local file without a checksum stays allowed (a warning)
    config["concreteness"] = {"norms": "https://example.org/norms.tsv", "sha256": "unverified"}
    validate_config(config)
    config["concreteness"] = {"norms": "data/norms.tsv", "sha256": None}
    validate_config(config)


def test_unverified_opt_out_reads_a_local_file(repo: Path) -> None:
    shipped = repo / "workflow" / "compo" / "resources" / "brysbaert2014_subset.tsv"
    assert len(load_norms(shipped, "unverified")) == len(load_norms(shipped))


# --- real targets: the injections through Snakemake ---------------------------------------------------


def _markers(*roots: Path) -> list[Path]:
    return [p for root in roots for p in root.rglob("MARK")]


REFUSED = [
    ("results", {"results": f"r;{INJECTION}"}),
    ("results", {"results": "my results"}),
    ("parse.spacy_model", {"parse": {"spacy_model": f"en;{INJECTION}"}}),
    ("bases.clip.init", {"bases": {"clip": {"init": f"openai;{INJECTION}"}}}),
    ("methods", {"methods": {f"m;{INJECTION}": {"parent": "clip-ft"}}}),
]


@pytest.mark.slow
@pytest.mark.parametrize(("key", "overlay"), REFUSED, ids=[f"{k}-{i}" for i, (k, _) in enumerate(REFUSED)])
def test_refused_injection_builds_nothing(tmp_path: Path, run_snakemake, key: str, overlay: dict) -> None:
    """The target is asked for for real (not a dry run): Snakemake stops at the config check with one
    line naming the key, and no command ran."""
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(overlay))
    run = run_snakemake(tmp_path, "results/world/eval/manifest.parquet", configs=[tmp_path / "bad.yaml"])
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[0].startswith(f"compo-study: config key {key}: ")
    assert not _markers(tmp_path) and not list(tmp_path.glob("*/world"))


@pytest.mark.slow
def test_injected_paths_are_passed_as_data(tmp_path: Path, repo: Path, run_snakemake) -> None:
    """Free-form paths (the norms file, a raw dataset) may hold any character: each is quoted on its way
    through the shell, so these targets build from the oddly named files and nothing else runs."""
    odd = tmp_path / f"data {INJECTION}"
    odd.mkdir()
    norms = odd / f"norms {INJECTION}.tsv"
    shutil.copy(repo / "workflow" / "compo" / "resources" / "brysbaert2014_subset.tsv", norms)
    coco = odd / "coco"
    shutil.copytree(repo / "tests" / "fixtures" / "raw" / "coco", coco)
    overlay = {
        "world": {"splits": {"pretrain": 4, "finetune": 6, "long": 2, "eval": 4}},
        "concreteness": {"norms": str(norms), "sha256": hashlib.sha256(norms.read_bytes()).hexdigest()},
        "datasets": {"wild": {"source": "coco", "path": str(coco / "dataset_coco.json"),
                              "image_root": str(coco), "split": "train"}},
    }
    (tmp_path / "odd.yaml").write_text(yaml.safe_dump(overlay))
    targets = ["results/concreteness/coco.parquet", "results/tables/datasets/coco.csv",
               "results/data/wild/manifest.parquet"]
    run = run_snakemake(tmp_path, *targets, configs=[tmp_path / "odd.yaml"])
    assert run.returncode == 0, run.stderr[-3000:]
    assert all((tmp_path / target).is_file() for target in targets)
    assert str(norms) in (tmp_path / "results" / "logs" / "concreteness" / "coco.log").read_text()
    assert not _markers(tmp_path)


def test_non_utf8_benchmark_file_is_named(tmp_path: Path) -> None:
    from compo.evaluate.common import read_json_file
    from compo.evaluate.files import BenchmarkError

    bad = tmp_path / "swap_att.json"
    bad.write_bytes('{"0": {"caption": "caf\xe9"}}'.encode("latin-1"))
    with pytest.raises(BenchmarkError, match=r"swap_att\.json: not UTF-8 text .*SugarCrepe subset is read as UTF-8"):
        read_json_file(bad, "SugarCrepe subset")
