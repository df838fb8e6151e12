"""The paper study's config: valid, its whole DAG schedules, and its data rules run on raw-format fixtures.

The paper study cannot run here (no GPU, no downloads), so the config is pointed at the fixtures in
`tests/fixtures/raw/` (a few records of each real raw format) and at benchmark files in the real formats
(written by the synthetic world); the DAG is dry-run and the data-preparation rules are run for real.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from paper_fixtures import REPO, write_paper_overlay
from workflow_runner import PAPER, snakemake

from compo.config import load_config
from compo.layout import timing_rule
from compo.study import Study


@pytest.fixture(scope="module")
def paper_overlay(tmp_path_factory) -> Path:
    return write_paper_overlay(tmp_path_factory.mktemp("paper"))


def run_snakemake(overlay: Path, *args: str) -> subprocess.CompletedProcess:
    return snakemake(overlay.parent, *args, configs=[PAPER, overlay])


@pytest.fixture(scope="module")
def paper_dry_run(paper_overlay: Path) -> subprocess.CompletedProcess:
    """The whole paper DAG's dry run, shared by the tests that read its job counts and its jobs (~10 s each)."""
    return run_snakemake(paper_overlay, "-n")


def test_paper_config_is_valid_and_complete() -> None:
    config = load_config(REPO / "config" / "paper.yaml")
    assert config["bases"]["clip"] == {"model": "ViT-B-32-quickgelu", "init": "openai"}
    assert config["study"]["seeds"] == [0, 1, 2]
    assert "world" not in config  # a complete study of its own: nothing of the embedded default leaks in
    for method in config["study"]["methods"]:
        assert method in config["methods"]


# Steps derived from the seeds' epochs: method -> (epochs, examples per epoch, batch size, rounding). Examples:
# Karpathy train (= COCO train2014, DeGLA's split) captions (414,113), Karpathy train images (82,783, one longest
# caption each), FSC-CLIP's 100K samples, DreamLIP's CC3M (~3.0M pairs), the long-caption sets' captions
# (config/paper.yaml comments).
STEPS = {
    "clip-ft": (5, 414_113, 256, "floor"), "cement": (5, 82_783, 1024, "floor"),
    "fsc-clip": (5, 100_000, 256, "floor"), "fsc-clip-coco": (5, 100_000, 256, "floor"),
    "negclip-dagger": (5, 100_000, 256, "floor"), "siglip-ft": (5, 2_820_000, 768, "floor"),
    "lss-docci": (2.5, 9_647, 1024, "round"), "lss-dci": (2.5, 7_600, 1024, "round"),
    "lss-ln": (2.5, 134_272, 1024, "round"),
}


def test_paper_steps_are_the_arithmetic_of_their_epochs() -> None:
    config = load_config(REPO / "config" / "paper.yaml")
    for method, (epochs, examples, batch, rounding) in STEPS.items():
        recipe = config["methods"][method]
        train = dict(recipe.get("train", {}))
        while "batch_size" not in train or "steps" not in train:
            recipe = config["methods"][recipe["parent"]]
            train = {**recipe.get("train", {}), **train}
        assert train["batch_size"] == batch, method
        exact = epochs * examples / batch
        assert train["steps"] == (int(exact) if rounding == "floor" else round(exact)), (method, exact)
        if rounding == "round":  # warm-up 5% of the steps, as Table 5's 150 of 3,000
            assert train["warmup"] == max(1, round(0.05 * train["steps"])), method


def test_fsc_clip_runs_its_coco_100k_and_negclip_dagger_and_figure_4_compares_one_training_set() -> None:
    """Seed 003 Table 1 trains FSC-CLIP (and LoRA) on COCO too and compares NegCLIP‡ (online negclip swaps, no
    hard-image batches, FSC-CLIP's schedule) on the same data; Figure 4 interpolates models fine-tuned on
    LAION-COCO, so every WiSE-FT trajectory of the study is one of a LAION-COCO-100K model."""
    from compo.config import resolve_method

    config = load_config(REPO / "config" / "paper.yaml")
    recipe = {m: resolve_method(config, m) for m in config["methods"]}
    dagger = recipe["negclip-dagger"]
    assert (dagger["loss"], dagger["online_negatives"], dagger["k"]) == ("negclip-online", ["swap"], 1)
    assert dagger.get("hard_images") is None and dagger.get("negatives") is None
    assert dagger["train"] == recipe["fsc-clip"]["train"] and dagger["datasets"] == ["laion-coco-100k"]
    for name, parent in (("fsc-clip-coco", "fsc-clip"), ("fsc-clip-lora-coco", "fsc-clip-lora"),
                         ("negclip-dagger-coco", "negclip-dagger")):
        same = {k: v for k, v in recipe[name].items() if k not in ("name", "datasets")}
        assert same == {k: v for k, v in recipe[parent].items() if k not in ("name", "datasets")}, name
        assert recipe[name]["datasets"] == ["coco-100k"] and name in config["study"]["methods"]
    coco_100k, coco = config["datasets"]["coco-100k"], config["datasets"]["coco"]
    assert {k: v for k, v in coco_100k.items() if k not in ("sample", "sample_seed")} == coco  # train2014 only
    assert coco_100k["sample"] * 5 == 100_000  # images; 5 captions a COCO image: NegCLIP's 100K captions
    assert {d for m in config["wiseft"]["methods"] for d in recipe[m]["datasets"]} == {"laion-coco-100k"}
    assert "negclip-dagger" in config["wiseft"]["methods"]
    trajectory = next(c for c in config["claims"] if c["id"] == "003-wiseft-above-negclip")
    assert trajectory["compare"] == ["fsc-clip", "negclip-dagger"]


def test_fsc_clips_claims_read_its_own_zs_and_comp_and_maintaining_is_non_inferiority() -> None:
    """Seed 003's claims read FSC-CLIP's meta averages (ZS: ELEVATER's 21 tasks, Comp: its 11 benchmarks, I2T / T2I
    Ret), not DeGLA's zero-shot average or the study's compositional one; a claim that ZS is maintained is a
    non-inferiority reading whose margin's source the claim states."""
    config = load_config(REPO / "config" / "paper.yaml")
    own = {"composite/fsc-zs", "composite/fsc-comp", "composite/fsc-i2t-ret", "composite/fsc-t2i-ret"}
    fsc = [c for c in config["claims"] if c["id"].startswith("003-")]
    assert fsc
    for claim in fsc:
        metrics = [claim["metric"]] if isinstance(claim["metric"], str) else claim["metric"]
        assert set(metrics) <= own, (claim["id"], metrics)
        if re.search(r"maintain|keep|near", claim["statement"]):
            assert claim["expected"] == ">=" and claim["margin"] > 0, claim["id"]
            assert f"Margin {claim['margin']:g} points" in claim["source"], claim["id"]
    assert len(config["composites"]["fsc-zs"]) == 21 and len(config["composites"]["fsc-comp"]) == 11


def test_the_seeds_headline_comparisons_are_declared_with_their_source_lines() -> None:
    """Issue 57: each seed's headline comparisons among the study's models are declared (DeGLA and Slipform over
    CLIP, FSC-CLIP's Comp over CLIP at near-equal ZS and NegCLIP‡'s costs, LSS's ImageNet cost), and every seed
    claim's source cites the seed, a line and a table, section or figure."""
    config = load_config(REPO / "config" / "paper.yaml")
    claims = {c["id"]: c for c in config["claims"]}
    headline = {"000-degla-beats-clip": ["degla", "base-clip"], "002-slipform-beats-clip": ["slipform", "base-clip"],
                "003-fsc-comp-over-clip": ["fsc-clip", "base-clip"],
                "003-fsc-zs-near-clip": ["fsc-clip-lora", "base-clip"],
                "003-negclip-dagger-zs-cost": ["negclip-dagger", "base-clip"],
                "003-negclip-dagger-i2t-cost": ["negclip-dagger", "base-clip"],
                "004-lss-in1k-cost": ["lss", "base-clip"],
                # their ablation tables' components, C2LIP's retrieval, LSS against LongCLIP
                "000-igc-aro": ["degla-igc", "degla-cn"], "000-sd-zeroshot": ["degla", "degla-igc-tgc"],
                "002-fd-beats-static": ["slipform", "cement-static"],
                "002-inverse-margin-degrades": ["cement-inverse", "infonce-hc"],
                "003-scr-i2t": ["fsc-clip", "fsc-clip-both"],
                "003-both-comp-over-local": ["fsc-clip-both", "fsc-clip-local"],
                "001-c2lip-retrieval-over-ft": ["c2lip", "siglip-ft"], "001-xac-needed": ["c2lip", "c2lip-npc"],
                "004-lss-matches-longclip": ["lss", "longclip"], "004-lss-beats-longclip-70": ["lss", "longclip-70"]}
    for name, compare in headline.items():
        assert claims[name]["compare"] == compare, name
    # an ablation's model a claim compares is a study model too: the ablation trains it at the study's datasets and
    # seeds, so listing it in study.methods adds no job (README's plan is unchanged)
    study = config["study"]
    for group in study["ablations"]:
        spec = config["ablations"][group]
        if set(spec["methods"]) & set(study["methods"]):
            assert "seeds" not in spec and "datasets" not in spec, group
    for claim in claims.values():
        if claim.get("role", "claim") == "control":
            continue
        assert re.match(r"seed 00\d", claim["source"]), claim["id"]
        source = claim["source"]
        assert re.search(r"\bline", source), claim["id"]
        # a seed's claim cites where it reports it; a hypothesis cites the explanation it tests (lines)
        assert claim.get("role") == "hypothesis" or re.search(r"table|sec\.|figure", source, re.I), claim["id"]


def test_c2lip_and_its_siglip_baseline_read_dreamlips_short_llava_captions() -> None:
    """C2LIP's released script reads DreamLIP's shortLLA_captions; its SigLIP baseline trains on the same data."""
    from compo.config import resolve_method

    config = load_config(REPO / "config" / "paper.yaml")
    for method in ("siglip-ft", "c2lip", "c2lip-npc", "c2lip-xac"):
        (dataset,) = resolve_method(config, method)["datasets"]
        assert config["datasets"][dataset]["dreamlip_columns"] == ["shortLLA_captions"], method


@pytest.mark.slow
def test_paper_dag_schedules_every_job(paper_overlay: Path, paper_dry_run: subprocess.CompletedProcess) -> None:
    output = paper_dry_run.stdout + paper_dry_run.stderr
    assert paper_dry_run.returncode == 0, output[-4000:]
    table = output.split("Job stats:")[1].split("\ntotal")[0]
    counts = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.M)}
    study = Study(load_config(REPO / "config" / "paper.yaml", paper_overlay))
    assert counts["pretrain"] == 2  # both bases exported from their open_clip pretrained weights
    # the LLM generators run sharded (one job per shard) and are gathered, only on the datasets a method trains on
    # with them (issue 42; which those are: tests/test_study.py)
    sharded = set(study.sharded_generators())
    pairs = {(dataset, g) for dataset, g in study.trained_generator_pairs() if g in sharded}
    assert pairs and counts["negatives_gather"] == len(pairs)
    assert counts["negatives_shard"] == sum(study.negative_shards(g) for _, g in pairs)
    assert counts["train"] >= 100 and counts["evaluate"] >= 100
    assert sum(counts.values()) >= 300, counts


@pytest.mark.slow
def test_every_resource_record_names_its_rule(paper_dry_run: subprocess.CompletedProcess,
                                              default_dry_run: subprocess.CompletedProcess) -> None:
    """`compo.layout.timing_rule` (what `compo plan`, bench_memory and bench_study group by) gives back the rule
    of every job's resource record (its `log.timing`, compo.resource_use) in the dry runs of both studies (the
    paper's has the sharded LLM and image negatives, the default the WiSE-FT evaluations)."""
    seen = set()
    for run in (default_dry_run, paper_dry_run):
        assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
        timed = r"^(?:local)?rule (\w+):\n(?:    .*\n)*?    log: .*?(\S+/timing/\S+?)(?:,|$)"
        for block in re.finditer(timed, run.stdout, re.M):
            rule, path = block.groups()
            parts = Path(path).parts
            assert timing_rule(parts[parts.index("timing") + 1:]) == rule, path
            seen.add(rule)
    assert {"pretrain", "train", "evaluate", "evaluate_wiseft", "negatives_shard", "negative_images_shard",
            "wiseft", "aggregate", "claims"} <= seen, seen


@pytest.mark.slow
def test_an_ablation_target_evaluates_the_models_compo_study_names(paper_overlay: Path) -> None:
    """`snakemake ablation_<group>` and `method_<name>` schedule the evaluations of the models compo.study names
    for them (its unit tests: tests/test_study.py), and the ablation's table reads their evaluation indexes."""
    run = run_snakemake(paper_overlay, "-n", "-p", "ablation_degla_table7", "method_degla_cn")
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    evaluated = set(re.findall(r"^rule evaluate:\n(?:    .*\n)*?    wildcards: model=(\S+)$", run.stdout, re.M))
    study = Study(load_config(REPO / "config" / "paper.yaml", paper_overlay))
    ablation = study.ablation_model_ids("degla-table7")
    assert evaluated == set(ablation) | set(study.method_model_ids("degla-cn")), evaluated
    table = re.search(r"^rule ablation_degla_table7:\n    input: (.*)$", run.stdout, re.M)
    assert table is not None and table.group(1).split(", ") == study.eval_indexes(ablation)
