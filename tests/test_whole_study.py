"""The whole paper study on stand-ins: config/paper.yaml unchanged in composition (every method, ablation, benchmark,
negative generator, WiSE-FT, the tables, claims, figures and report tables), with an overlay that changes sizes only
(`paper_fixtures.write_stand_in_study`: tiny CLIP- and SigLIP-style models laid out by `compo prefetch --from`, one
seed, a few steps, a stand-in of every raw input in its released format), run to rule `all` on the local executor,
on the CPU, with the network refused. A capability proved on a slice is proved on the slice only: this run is where
every rule, method, ablation and benchmark kind meets the others."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image
from workflow_runner import snakemake

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.whole_study, pytest.mark.slow]


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The study built once: its folder, config files, the plan's jobs per rule and Snakemake's output."""
    from paper_fixtures import offline_env, write_stand_in_study

    from compo.config import load_config
    from compo.plan import plan

    root = tmp_path_factory.mktemp("whole")
    configs = write_stand_in_study(root)
    rows, _ = plan(configs, None, str(REPO / "Snakefile"), str(root))
    attempts = root / "network-attempts.log"
    run = snakemake(root, configs=configs, env=offline_env(root), timeout=5000)
    output = run.stdout + run.stderr
    (root / "snakemake.log").write_text(output)
    assert run.returncode == 0, output[-3000:]
    return {"root": root, "results": root / "results", "config": load_config(*configs), "output": output,
            "planned": {row.rule: row.jobs for row in rows}, "attempts": attempts}


def test_every_rule_ran_the_jobs_the_plan_counts(whole: dict) -> None:
    ran = Counter(re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", whole["output"]))
    assert dict(ran) == whole["planned"]
    # every method, ablation group and generator of paper.yaml is in it
    config = whole["config"]
    assert {f"ablation_{g.replace('-', '_')}" for g in config["study"]["ablations"]} <= set(ran)
    trained = {p.parts[-4] for p in (whole["results"] / "models").glob("*/*/seed0/checkpoint.pt")}  # the method
    ablated = {m for g in config["study"]["ablations"] for m in config["ablations"][g]["methods"]}
    assert {*config["study"]["methods"], *ablated} <= trained


def test_most_jobs_forked_from_a_pre_imported_server(whole: dict) -> None:
    """The local executor's jobs ran through compo.forkserver: all but those that came while a server imported."""
    ran = len(re.findall(r"Finished jobid: \d+ \(Rule: \w+\)", whole["output"]))
    forked = re.search(r"(\d+) jobs forked from a server that imported torch once", whole["output"])
    assert forked and ran / 2 < int(forked.group(1)) <= ran, (forked, ran)


def test_nothing_left_the_machine(whole: dict) -> None:
    assert not whole["attempts"].exists(), whole["attempts"].read_text()
    assert not (whole["root"] / "empty-hf-home").exists()


def test_every_output_exists_and_parses(whole: dict) -> None:
    results = whole["results"]
    read = Counter()
    for path in results.rglob("*"):
        if path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".parquet" and path.is_file():
            pd.read_parquet(path)
        elif path.suffix == ".csv":
            pd.read_csv(path)
        else:
            continue
        read[path.suffix] += 1
    assert read[".json"] and read[".parquet"] and read[".csv"]
    config = whole["config"]
    for index in results.glob("eval/*/*/seed0/_evaluated.json"):  # a WiSE-FT model: the trajectory's benchmarks
        benchmarks = config["wiseft" if index.parts[-4].startswith("wiseft-") else "study"]["benchmarks"]
        assert len(json.loads(index.read_text())["results"]) == len(benchmarks), index


def test_the_data_rules_read_every_raw_format(whole: dict) -> None:
    """Each training set's manifest from its raw-format fixture, every image on disk, the data report counting
    what was kept; DeGLA's released negatives read from a file in its layout."""
    from paper_fixtures import FIXTURE_DATASETS

    from compo.io import read_table

    results = whole["results"]
    for name in FIXTURE_DATASETS:
        manifest = read_table(results / "data" / name / "manifest.parquet", "manifest")
        assert len(manifest) > 0 and (manifest["dataset"] == name).all()
        assert all(Path(p).is_file() for p in manifest["image_path"])
        report = pd.read_csv(results / "tables" / "data" / f"{name}.csv")
        assert int(report.loc[0, "captions_kept"]) == len(manifest)
    released = read_table(results / "negatives" / "coco" / "degla-released.parquet", "negatives")
    rewrites = tuple(f"(rewrite {i})" for i in range(4))
    assert released["valid"].all() and released["negative"].str.endswith(rewrites).all()


def test_image_negatives_are_the_text_negatives_with_a_picture_in_each_shard(whole: dict) -> None:
    """Each negatives entry with `images` (ConcretePlant's three through the tiny SDXL-Turbo pipeline, 2 shards):
    the gathered table is the text table with `negative_image` filled for every valid row of a readable anchor, an
    image of the pipeline's resolution inside its shard's images.tar, none loose, none for an invalid row."""
    from artifact_fixtures import SDXL_SIZE

    from compo.images import image_source
    from compo.io import read_table
    from compo.shards import split_member

    root, results = whole["root"], whole["results"]
    imaged = sorted(name for name, spec in whole["config"]["negatives"].items() if spec.get("images"))
    tables = sorted(results.glob("negatives/*/*.images.parquet"))
    assert imaged and sorted(path.name.removesuffix(".images.parquet") for path in tables) == imaged
    for path in tables:
        table = read_table(path, "negatives")
        text = read_table(path.with_name(path.name.replace(".images", "")), "negatives")
        pd.testing.assert_frame_equal(table.drop(columns="negative_image"), text.drop(columns="negative_image"))
        manifest = read_table(results / "data" / path.parent.name / "manifest.parquet", "manifest")
        images = table.loc[table["valid"] & table["caption_id"].isin(set(manifest["caption_id"])), "negative_image"]
        assert len(images) > 0 and images.notna().all(), path
        for member in images:  # relative to the working directory, as every path the workflow writes
            shard, _ = split_member(member)
            assert Path(shard).name == "images.tar" and root / Path(shard).parent.parent == path.with_suffix("")
            assert Image.open(image_source(root / member)).size == (SDXL_SIZE, SDXL_SIZE)
        folders = path.with_suffix("")
        assert [p.name for p in folders.glob("*/*.tar")] == ["images.tar"] * 2 and not list(folders.glob("*/*.png"))
        assert table.loc[~table["valid"], "negative_image"].isna().all()


def test_no_benchmark_image_is_a_training_image(whole: dict) -> None:
    tables = [pd.read_csv(path) for path in (whole["results"] / "tables" / "overlap").glob("*.csv")]
    overlap = pd.concat(tables, ignore_index=True)
    assert set(overlap["dataset"]) == {d for d in whole["config"]["datasets"]
                                       if (whole["results"] / "data" / d / "manifest.parquet").exists()}
    assert (overlap["overlap"] == 0).all(), overlap[overlap["overlap"] > 0]
    compared = overlap[~overlap["examples"].fillna("").str.startswith("not compared")]
    assert set(compared["kind"]) == {spec["kind"] for spec in whole["config"]["benchmarks"].values()} - {
        "zeroshot", "linear_probe"}
    # every kind's image lister found the stand-in's images (the paper study once stopped here: 8 of its 17 kinds
    # had none); ImageCoDe's are the files of its set folders, absent from the stand-in (its scorer stops on it)
    listed = compared[compared["kind"] != "imagecode"]
    assert (listed["benchmark_images"] > 0).all(), listed[listed["benchmark_images"] == 0]


def test_every_reported_cell_with_a_method_is_reproduced(whole: dict) -> None:
    """Each cell the seeds report whose row names a method of the study or its ablations has a reproduced value
    in tables/reproduction.csv (ablation models included: aggregate reads them)."""
    table = pd.read_csv(whole["results"] / "tables" / "reproduction.csv")
    cells = sum(1 for block in whole["config"]["reported"] for row in block["rows"] for v in row["values"]
                if v is not None)
    assert len(table) >= cells
    named = table[table["method"].notna()]
    assert set(named["status"]) <= {"reproduced", "metric not measured"}, named[named["status"] == "method not run"]


def test_every_claim_has_a_verdict(whole: dict) -> None:
    claims = pd.read_csv(whole["results"] / "tables" / "claims.csv")
    assert set(claims["id"]) == {claim["id"] for claim in whole["config"]["claims"]}
    assert claims["verdict"].notna().all() and (claims["verdict"].str.len() > 0).all()


def test_the_subsets_figure_draws_every_compositional_kind(whole: dict) -> None:
    from compo.evaluate.kinds import declared
    from compo.figures import SUMMARY_COLUMNS, benchmark_panels

    summary = pd.read_csv(whole["results"] / "tables" / "results.csv")[SUMMARY_COLUMNS]
    specs = whole["config"]["benchmarks"]
    kinds = {name: specs[name]["kind"] for name in whole["config"]["study"]["benchmarks"]}
    drawn = {kind for _, kind, _ in benchmark_panels(summary, kinds)}
    assert drawn == {kind for kind in kinds.values() if declared()[kind].compositional}
    assert (whole["results"] / "figures" / "benchmarks.png").is_file()


def test_the_report_tables_exist(whole: dict) -> None:
    pages = list((whole["results"] / "report").glob("*.html"))
    assert pages, "no report table written"


def test_every_measured_rule_records_its_jobs_resources(whole: dict, capsys: pytest.CaptureFixture) -> None:
    """Each job of a timed rule wrote its resource record (what `compo plan` reads as measured figures), with CPU
    time and a peak; the run's figures per rule (jobs, CPU minutes, the largest resident set) are printed into the
    test log."""
    from compo.layout import TIMED_RULES
    from compo.plan import measured_by_rule

    measured = measured_by_rule(whole["results"])
    ran = Counter(re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", whole["output"]))
    assert {rule: ran[rule] for rule in ran if rule in TIMED_RULES} == {rule: m.jobs for rule, m in measured.items()}
    assert all(m.max_rss_mb > 0 and m.cpu_s > 0 for m in measured.values()), measured
    lines = [f"{'rule':24s} {'jobs':>5s} {'CPU min':>8s} {'peak RSS MB':>12s}"]
    lines += [f"{rule:24s} {m.jobs:5d} {m.cpu_s / 60:8.1f} {m.max_rss_mb:12.0f}"
              for rule, m in sorted(measured.items(), key=lambda item: -item[1].cpu_s)]
    with capsys.disabled():
        print("\n[whole study] measured per rule:\n" + "\n".join(lines))
