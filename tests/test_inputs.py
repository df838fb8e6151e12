"""Raw inputs: every path the config names is listed with its key, checked at DAG build (all missing paths in
one message, before anything runs), and README's step 2 lists exactly the keys of config/paper.yaml."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from compo.config import ConfigError, load_config
from compo.inputs import check_raw_inputs, key_summary, missing_inputs, raw_inputs, template

REPO = Path(__file__).resolve().parents[1]
PAPER = REPO / "config" / "paper.yaml"
README_BEGIN, README_END = "<!-- compo inputs --summary: begin -->", "<!-- compo inputs --summary: end -->"


def test_the_paper_config_names_every_raw_input() -> None:
    config = load_config(PAPER)
    keys = {item.key for item in raw_inputs(config)}
    for name in config["datasets"]:
        assert {f"datasets.{name}.path", f"datasets.{name}.image_root"} <= keys, name
    for name, spec in config["benchmarks"].items():
        assert f"benchmarks.{name}.path" in keys
        for key in ("image_root", "classnames", "templates"):
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
