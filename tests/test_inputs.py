"""Raw inputs: every path the config names is listed with its key, checked at DAG build (all missing paths in
one message, before anything runs), and README's step 2 lists exactly the keys of config/paper.yaml."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from compo.config import ConfigError, load_config
from compo.inputs import (
    check_input_formats,
    check_raw_inputs,
    key_summary,
    malformed_inputs,
    missing_inputs,
    raw_inputs,
    template,
)

REPO = Path(__file__).resolve().parents[1]
PAPER = REPO / "config" / "paper.yaml"
README_BEGIN, README_END = "<!-- compo inputs --summary: begin -->", "<!-- compo inputs --summary: end -->"


def test_the_paper_config_names_every_raw_input() -> None:
    config = load_config(PAPER)
    keys = {item.key for item in raw_inputs(config)}
    for name, spec in config["datasets"].items():  # webdataset shards hold their images: no image folder
        assert f"datasets.{name}.path" in keys and (f"datasets.{name}.image_root" in keys) == (
            spec["source"] != "webdataset"), name
    for name, spec in config["benchmarks"].items():
        assert f"benchmarks.{name}.path" in keys
        for key in ("image_root", "classnames", "templates", "dataset_info"):
            assert (f"benchmarks.{name}.{key}" in keys) == bool(spec.get(key)), (name, key)
    assert {f"benchmarks.valse.image_roots.{piece}" for piece in config["benchmarks"]["valse"]["image_roots"]} <= keys
    assert "concreteness.norms" in keys
    assert {f"negatives.{n}.norms" for n, s in config["negatives"].items() if s.get("norms")} <= keys


def test_missing_inputs_name_their_keys_and_a_present_tree_passes(tmp_path: Path) -> None:
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "replace_obj.json").write_text("{}")
    config = {
        "datasets": {"cc": {"source": "cc3m", "path": str(tmp_path / "shard-*.tsv"), "image_root": str(tmp_path)},
                     "world": {"source": "world", "split": "pretrain"}},
        "benchmarks": {"sc": {"kind": "sugarcrepe", "source": "files", "path": str(tmp_path / "bench")},
                       "gone": {"kind": "sugarcrepe", "source": "files", "path": str(tmp_path / "nowhere")}},
        "concreteness": {"norms": "https://example.org/norms.tsv"},  # a URL: prefetch's business
        "negatives": {"hc": {"generator": "concreteplant-hc", "norms": str(tmp_path / "norms.tsv")}},
    }
    missing = {item.key: item.path for item in missing_inputs(config)}
    # the glob matches nothing; six of SugarCrepe's seven files are absent; the missing folder is reported
    # once, not with each of its files
    assert missing["datasets.cc.path"].endswith("shard-*.tsv")
    assert sum(p.startswith(str(tmp_path / "bench")) for k, p in missing.items() if k == "benchmarks.sc.path") == 1
    assert missing["benchmarks.gone.path"] == str(tmp_path / "nowhere")
    assert missing["negatives.hc.norms"] == str(tmp_path / "norms.tsv")
    assert not any(key.startswith(("concreteness", "datasets.world")) for key in missing)
    with pytest.raises(ConfigError, match=r"raw input\(s\).*\n  datasets\.cc\.path: .*shard-\*\.tsv"):
        check_raw_inputs(config)
    (tmp_path / "shard-0.tsv").write_text("x")
    (tmp_path / "norms.tsv").write_text("x")
    (tmp_path / "nowhere").mkdir()
    for subset in ("replace_att", "replace_rel", "swap_obj", "swap_att", "add_obj", "add_att"):
        for folder in ("bench", "nowhere"):
            (tmp_path / folder / f"{subset}.json").write_text("{}")
    (tmp_path / "nowhere" / "replace_obj.json").write_text("{}")
    check_raw_inputs(config)  # everything is there now


def test_the_template_sets_every_key_to_its_value() -> None:
    config = load_config(PAPER)
    items = raw_inputs(config)
    merged = load_config(PAPER, overrides=template(items))
    assert raw_inputs(merged) == items


@pytest.mark.slow
def test_a_dry_run_lists_every_missing_input_with_its_key_before_anything_runs(tmp_path: Path) -> None:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    run = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "-s", str(REPO / "Snakefile"),
                          "--directory", str(tmp_path), "--configfile", str(PAPER), "-n"],
                         capture_output=True, text=True, env=env, check=False)
    output = run.stdout + run.stderr
    assert run.returncode != 0
    assert "MissingInputException" not in output
    first = output.splitlines()[0]
    assert re.match(r"compo-study: \d+ raw input\(s\) named by the config do not exist", first), first
    for key in ("benchmarks.imagenet.classnames", "benchmarks.cifar10.templates", "concreteness.norms",
                "negatives.concrete-hc.norms", "benchmarks.valse.image_roots.foil-it", "datasets.coco.path"):
        assert f"  {key}: " in output, key


def test_readme_step_2_lists_exactly_the_paper_configs_keys() -> None:
    readme = (REPO / "README.md").read_text()
    assert README_BEGIN in readme and README_END in readme, "README lost the generated list of step 2"
    block = readme.split(README_BEGIN)[1].split(README_END)[0]
    listed = [line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith("```")]
    expected = key_summary(raw_inputs(load_config(PAPER)))
    assert listed == expected, ("README step 2 is stale: replace its list with the output of "
                                "`compo inputs --configfile config/paper.yaml --summary`")


def test_compo_inputs_prints_the_template_and_the_status(tmp_path: Path) -> None:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    compo = [sys.executable, "-m", "compo", "inputs", "--configfile", str(PAPER)]
    listed = subprocess.run(compo, capture_output=True, text=True, env=env, cwd=tmp_path, check=False)
    assert listed.returncode == 1 and "MISSING  benchmarks.imagenet.classnames:" in listed.stdout
    # nothing exists here: no line says ok (a file inside a missing folder is absent, the folder missing)
    lines = listed.stdout.splitlines()
    assert not [line for line in lines if line.startswith("ok")], listed.stdout
    absent = [line for line in lines if line.startswith("absent")]
    assert absent and all(line.endswith("(inside a missing folder)") for line in absent)
    assert re.fullmatch(rf"{len(lines) - 1} raw inputs, \d+ missing \({len(absent)} more inside them\)", lines[-1])
    made = subprocess.run([*compo, "--template"], capture_output=True, text=True, env=env, check=True)
    assert yaml.safe_load(made.stdout)["benchmarks"]["valse"]["image_roots"]["foil-it"]


# --- preflight: formats and the model cache, at DAG build (issue 42, item 9) -------------------------------------
def _coco(path: Path, images: int) -> None:
    path.write_text(json.dumps({"images": [
        {"filepath": "val2014", "filename": f"{i}.jpg", "imgid": i, "split": "train",
         "sentences": [{"raw": f"a photo number {i}."}]} for i in range(images)], "dataset": "coco"}))


def _formats_config(tmp_path: Path) -> dict:
    bench = tmp_path / "bench"
    bench.mkdir()
    for subset in ("replace_obj", "replace_att", "replace_rel", "swap_obj", "swap_att", "add_obj", "add_att"):
        (bench / f"{subset}.json").write_text(json.dumps({"0": {"filename": "a.jpg", "caption": "a dog.",
                                                                "negative_caption": "a cat."}}))
    _coco(tmp_path / "dataset_coco.json", 3)
    (tmp_path / "norms.tsv").write_text("Word\tConc.M\ndog\t4.9\n")
    return {"datasets": {"coco": {"source": "coco", "path": str(tmp_path / "dataset_coco.json"),
                                  "image_root": str(tmp_path)}},
            "benchmarks": {"sc": {"kind": "sugarcrepe", "source": "files", "path": str(bench),
                                  "image_root": str(tmp_path)}},
            "concreteness": {"norms": str(tmp_path / "norms.tsv")}}


def test_an_empty_or_malformed_raw_file_is_named_with_its_key(tmp_path: Path) -> None:
    config = _formats_config(tmp_path)
    assert malformed_inputs(config) == []
    check_input_formats(config)
    (tmp_path / "bench" / "swap_obj.json").write_text("")
    (tmp_path / "bench" / "add_att.json").write_text('{"0": {"filename": "a.jpg", "caption"')  # cut short
    (tmp_path / "dataset_coco.json").write_text(json.dumps({"annotations": []}))  # no images: not Karpathy's
    (tmp_path / "norms.tsv").write_bytes(b"Word\tConc.M\n\xff\xfe\n")
    found = {item.key: problem for item, problem in malformed_inputs(config)}
    assert found.keys() == {"benchmarks.sc.path", "datasets.coco.path", "concreteness.norms"}
    problems = [p for item, p in malformed_inputs(config) if item.key == "benchmarks.sc.path"]
    assert problems == [f"{tmp_path / 'bench' / 'swap_obj.json'}: empty file",
                        f"{tmp_path / 'bench' / 'add_att.json'}: not valid JSON in its first items "
                        "(Expecting ':' delimiter: line 1 column 38 (char 37))"]
    assert found["datasets.coco.path"].startswith(f"{tmp_path / 'dataset_coco.json'}: ")
    assert "not valid TSV" in found["concreteness.norms"]
    with pytest.raises(ConfigError, match=r"4 raw input\(s\) named by the config cannot be read:\n  "
                                          r"datasets\.coco\.path: "):
        check_input_formats(config)


@pytest.mark.parametrize("suffix", [".tsv", ".jsonl", ".parquet"])
def test_a_large_raw_file_is_read_up_to_its_first_items(tmp_path: Path, monkeypatch, suffix: str) -> None:
    """Big files are not read whole: a table or JSON lines file is cut to its first items, a JSON file's first
    items decoded from its head; what follows them is not looked at."""
    import compo.inputs

    monkeypatch.setattr(compo.inputs, "WHOLE_JSON_BYTES", 10)
    monkeypatch.setattr(compo.inputs, "PEEK_BYTES", 600)
    _coco(tmp_path / "dataset_coco.json", 50)  # ~5 KB: its head holds the first few images, then is cut
    config = {"datasets": {"coco": {"source": "coco", "path": str(tmp_path / "dataset_coco.json"),
                                    "image_root": str(tmp_path)}}}
    assert malformed_inputs(config) == []
    rows = [{"caption": f"a photo number {i}.", "url": f"http://x/{i}.jpg"} for i in range(50)]
    path = tmp_path / f"cc3m{suffix}"
    if suffix == ".parquet":
        pd.DataFrame(rows).to_parquet(path)
    elif suffix == ".tsv":
        path.write_text("caption\turl\n" + "".join(f"{r['caption']}\t{r['url']}\n" for r in rows) + "\x00bad\n")
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{not json\n")
    source = "docci" if suffix == ".jsonl" else "cc3m"
    if source == "docci":  # DOCCI's JSON lines: example_id, split, image_file, description
        path.write_text("".join(json.dumps({"example_id": str(i), "split": "train", "image_file": f"{i}.jpg",
                                            "description": f"a photo number {i}."}) + "\n" for i in range(50))
                        + "{not json\n")
    config = {"datasets": {"d": {"source": source, "path": str(path), "image_root": str(tmp_path)}}}
    assert malformed_inputs(config) == []
    path.write_bytes(b"" if suffix != ".parquet" else b"PAR1 not parquet")
    (problem,) = [p for _, p in malformed_inputs(config)]
    assert problem.startswith(str(path)) and (problem.endswith("empty file") or "Parquet" in problem), problem


def test_a_missing_model_is_named_with_the_prefetch_command(tmp_path: Path) -> None:
    from paper_fixtures import write_stand_in_cache

    from compo.prefetch import check_model_cache, uncached_artifacts

    config = load_config(PAPER)
    with pytest.raises(ConfigError) as error:
        check_model_cache(config, ["config/paper.yaml", "my-paths.yaml"], tmp_path / "empty")
    message = str(error.value)
    assert message.startswith(f"22 model(s) or released dataset(s) the config needs are not in the model cache "
                              f"{tmp_path / 'empty'} "
                              "(config key model_cache): run `compo prefetch --configfile config/paper.yaml "
                              "my-paths.yaml` on a node with internet")
    assert "\n  llm:Qwen/Qwen3-32B (named by negatives.concrete-hc.model" in message
    assert "\n  dataset:wjpoom/SPEC (named by benchmarks.spec.hub)" in message  # 17 hub releases (issues 46, 47, 58)
    cache = write_stand_in_cache(tmp_path / "cache", config)
    check_model_cache(config, [], cache)
    (cache / "0" / "stand-in").unlink()  # recorded, but gone
    assert [a.id for a in uncached_artifacts(config, cache)] == ["open_clip:ViT-B-32-quickgelu openai"]


def test_a_base_read_from_a_local_weights_file_needs_only_its_tokenizer_cached(tmp_path: Path) -> None:
    """`bases.<name>.weights` is used where it is (the dose-response arms read the default study's base so): the
    preflight asks the cache for no weights of it, only for a Hugging Face tokenizer its model config names."""
    from compo.prefetch import uncached_artifacts

    weights = tmp_path / "base.pt"
    weights.write_bytes(b"")
    config = {"bases": {"clip": {"model": "compo-tiny-clip", "init": "mine", "weights": str(weights)},
                        "siglip": {"model": "ViT-B-16-SigLIP", "init": "mine", "weights": str(weights)}}}
    assert [a.id for a in uncached_artifacts(config, tmp_path / "empty")] == ["tokenizer:timm/ViT-B-16-SigLIP"]
    del config["bases"]["siglip"], config["bases"]["clip"]["weights"]
    assert [a.id for a in uncached_artifacts(config, tmp_path / "empty")] == ["open_clip:compo-tiny-clip mine"]


@pytest.mark.slow
def test_a_paper_dry_run_stops_on_an_empty_cache_or_benchmark_file_before_any_job(tmp_path: Path) -> None:
    from paper_fixtures import write_paper_overlay

    overlay = write_paper_overlay(tmp_path)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    command = [str(Path(sys.executable).parent / "snakemake"), "-s", str(REPO / "Snakefile"), "--directory",
               str(tmp_path), "--configfile", str(PAPER), str(overlay), "-n", "--quiet", "rules"]
    manifest = tmp_path / "model-cache" / "compo-prefetch.json"
    recorded = manifest.read_text()
    manifest.unlink()
    run = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    assert run.returncode != 0 and "Job stats" not in run.stdout + run.stderr
    # the overlay reads local fixtures (`hub: null`): the five models are what the cache lacks
    assert run.stderr.startswith("compo-study: 5 model(s) or released dataset(s) the config needs are not in the "
                                 "model cache"), run.stderr
    assert f"compo prefetch --configfile {PAPER} {overlay}" in run.stderr
    manifest.write_text(recorded)
    sugarcrepe = Path(load_config(PAPER, overlay)["benchmarks"]["sugarcrepe"]["path"]) / "swap_obj.json"
    sugarcrepe.write_text("")
    run = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    assert run.stderr.startswith("compo-study: 1 raw input(s) named by the config cannot be read:\n"
                                 f"  benchmarks.sugarcrepe.path: {sugarcrepe}: empty file"), run.stderr
