"""compo.study: the study's models, each rule's inputs, the negatives tables that train and the report's outputs,
as functions of the config (no dry run: the rules' input functions are one line each over these answers; the dry
runs of tests/test_workflow.py, test_paper_config.py and test_rules.py check the wiring)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from compo import layout
from compo.config import ConfigError, load_config
from compo.study import Study, norms_files, released_negatives

REPO = Path(__file__).resolve().parents[1]
DEFAULT = REPO / "config" / "config.yaml"
PAPER = REPO / "config" / "paper.yaml"


@pytest.fixture(scope="module")
def default() -> Study:
    return Study(load_config(DEFAULT))


@pytest.fixture(scope="module")
def paper_study(paper: dict) -> Study:
    """The paper study (conftest's `paper`: config/paper.yaml loaded and checked)."""
    return Study(paper)


def with_overlay(tmp_path: Path, text: str, *configs: Path) -> Study:
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(text)
    return Study(load_config(*(configs or (DEFAULT,)), overlay))


def test_train_jobs_read_only_what_their_loss_needs(default: Study) -> None:
    """A contrastive fine-tune reads its base, manifest and the overlap guard; FSC-CLIP's online negatives add the
    parse table; a loss over precomputed pairs adds its negatives table, never the concreteness table."""
    base = {"init": "results/models/base-clip/pretrain/seed0/checkpoint.pt",
            "manifest": "results/data/coco/manifest.parquet", "overlap": "results/tables/overlap/coco.csv"}
    assert default.train_inputs("clip-ft", "coco", 0) == base
    assert default.train_inputs("fsc-clip", "coco", 0) == base | {"parse": "results/parse/coco.parquet"}
    pairs = default.train_inputs("slipform", "coco", 0)
    assert pairs["negatives"] == "results/negatives/coco/concrete-hc.parquet"
    assert not any("concreteness" in str(path) for path in pairs.values())


def test_each_seed_fine_tunes_and_interpolates_the_base_it_is_laid_out_on(tmp_path: Path) -> None:
    """study.base_seeds [0, 1]: seed s starts from (and WiSE-FT returns to) base seed s mod 2; the study evaluates
    both bases."""
    study = with_overlay(tmp_path, "study: {base_seeds: [0, 1], seeds: [0, 1, 2, 3]}\n")
    assert study.base_seeds == [0, 1]
    for seed in range(4):
        base = f"results/models/base-clip/pretrain/seed{seed % 2}/checkpoint.pt"
        assert study.train_inputs("clip-ft", "coco", seed)["init"] == base
        assert study.wiseft_inputs("negclip", "coco", seed) == {
            "base": base, "finetuned": f"results/models/negclip/coco/seed{seed}/checkpoint.pt"}
    assert {"base-clip/pretrain/seed0", "base-clip/pretrain/seed1"} <= set(study.study_model_ids())


def test_the_tables_read_one_evaluation_index_a_model(default: Study) -> None:
    """aggregate and claims read each study model's `_evaluated.json`, not its benchmark files; an evaluation job
    reads its set's record, and the record's job reads the files."""
    models = default.study_model_ids()
    assert default.eval_indexes() == [f"results/eval/{m}/{layout.EVAL_INDEX}" for m in models]
    assert default.claims_inputs()["results"] == default.eval_indexes()
    assert default.benchmark_set_record(default.eval_benchmarks) == "results/benchmarks/sets/study.json"
    assert "results/benchmarks/world/sugarcrepe/swap_att.json" in default.benchmark_set_files("study")


def test_a_kinds_model_independent_work_is_prepared_once_and_recorded_with_its_set(paper_study: Study) -> None:
    """ARO Order's perturbations are drawn once per benchmark (rule prepare_benchmark): each evaluation job is
    told the prepared file, and the set's record holds it, so evaluations rerun when it changes."""
    order = [b for b in paper_study.eval_benchmarks if paper_study.config["benchmarks"][b]["kind"] == "aro_order"]
    assert order, "paper.yaml evaluates ARO Order"
    entries = paper_study.benchmark_entries(paper_study.eval_benchmarks)
    for benchmark, entry in entries.items():
        prepared = f"results/benchmarks/prepared/{benchmark}.json" if benchmark in order else None
        assert paper_study.prepared_file(benchmark) == prepared and entry.get("prepared") == prepared
        assert paper_study.benchmark_set_contents("study")[benchmark] == [
            *paper_study.benchmark_files(benchmark), *([prepared] if prepared else [])]
    assert set(paper_study.benchmark_set_files("study")) >= {f"results/benchmarks/prepared/{b}.json" for b in order}


def test_the_study_models_are_its_bases_methods_and_wiseft_trajectories(default: Study) -> None:
    config = default.config
    study, wiseft = config["study"], config["wiseft"]
    ids = default.study_model_ids()
    assert len(ids) == len(set(ids))
    parsed = [layout.parse_model_id(m) for m in ids]
    assert all(p is not None for p in parsed), ids
    methods = {p.method for p in parsed}
    assert set(study["methods"]) <= methods and {"base-clip", "base-siglip"} <= methods
    # a method's own datasets win (the long-caption methods train on `long`)
    assert f"lss/long/seed{study['seeds'][0]}" in ids and "lss/coco/seed0" not in ids
    trajectories = [m for m in ids if layout.is_wiseft(m)]
    assert len(trajectories) == len(wiseft["methods"]) * len(study["seeds"]) * len(wiseft["alphas"])
    assert "wiseft-negclip-a0.2/coco/seed1" in trajectories
    # the claims read the fine-tunes' training logs, the figures every trained or exported model's
    assert not any(layout.is_wiseft(m) or layout.is_base(m) for m in default.claims_loss_models())
    losses = default.figure_inputs()["losses"]
    assert "results/models/base-clip/pretrain/seed0/losses.csv" in losses
    assert not any("wiseft-" in path for path in losses)


def test_a_method_target_evaluates_every_seed_of_the_method(paper_study: Study) -> None:
    """`snakemake method_<name>`: every seed and dataset of a method with its bases; a method only an ablation
    trains (FSC-CLIP's gamma = 1 row of its sensitivity ablation, on its dataset) at that ablation's seeds."""
    seeds = paper_study.config["study"]["seeds"]
    assert paper_study.method_model_ids("negclip") == ["base-clip/openai/seed0",
                                                       *(f"negclip/coco/seed{s}" for s in seeds)]
    assert "fsc-clip-gamma1" not in paper_study.config["study"]["methods"]
    assert set(paper_study.method_model_ids("fsc-clip-gamma1")) == {
        "base-clip/openai/seed0", *(f"fsc-clip-gamma1/laion-coco-100k/seed{s}" for s in seeds)}
    assert "fsc-clip-gamma1" in paper_study.study_and_ablation_methods()


def test_ablations_train_at_their_own_scope_and_feed_the_reproduction_table(paper_study: Study) -> None:
    """An ablation group's datasets and seeds default to the study's; its models that are not study models are
    read only by the reproduction table."""
    study = set(paper_study.study_model_ids())
    for group in paper_study.ablation_groups():
        datasets, seeds = paper_study.ablation_scope(group)
        assert seeds == paper_study.config["ablations"][group].get("seeds", paper_study.config["study"]["seeds"])
        for model in paper_study.ablation_model_ids(group):
            parsed = layout.parse_model_id(model)
            assert parsed is not None and (layout.is_base(parsed.method) or parsed.seed in seeds), model
    only = paper_study.reproduction_only_indexes()
    assert only and not any(index.split("/eval/")[1].rsplit("/", 1)[0] in study for index in only)
    assert "results/eval/fsc-clip-gamma1/laion-coco-100k/seed0/_evaluated.json" in only
    outputs = paper_study.study_outputs()
    assert [o for o in outputs if "/ablations/" in o] == [f"results/tables/ablations/{g}/results.md"
                                                          for g in paper_study.ablation_groups()]


def test_gpu_generators_run_only_on_the_datasets_a_method_trains_them_on(paper_study: Study) -> None:
    """Issue 42: ConcretePlant's LLM negatives on Karpathy train's longest captions, not on all of COCO; the
    rule-based generators on every dataset."""
    pairs = paper_study.trained_generator_pairs()
    assert ("coco-train-longest", "concrete-hc") in pairs and ("coco", "concrete-hc") not in pairs
    assert "concrete-hc" in paper_study.dataset_generators("coco-train-longest")
    assert "concrete-hc" not in paper_study.dataset_generators("coco")
    rule_based = [g for g in paper_study.config["negatives"] if not paper_study.generator_costs_gpus(g)]
    assert rule_based and all(g in paper_study.dataset_generators("coco") for g in rule_based)
    sharded = paper_study.sharded_generators()
    assert "concrete-hc" in sharded and not set(sharded) & set(paper_study.unsharded_generators())
    assert paper_study.concreteplant_dataset() == "coco-train-longest"
    # with SDXL-Turbo images (seed 002 section 2.2) training reads the table that has them
    assert "concrete-hc" in paper_study.diffusion_generators()
    assert paper_study.negatives_table("coco-train-longest", "concrete-hc").endswith(
        "/negatives/coco-train-longest/concrete-hc.images.parquet")


def test_concreteplant_reads_one_table_per_policy_and_the_first_base_seed(default: Study) -> None:
    inputs = default.concreteplant_table_inputs("coco")
    assert default.concreteplant_generators() == {p: f"concrete-{p}" for p in ("hc", "lc", "wo")}
    assert {p: inputs[p] for p in ("hc", "lc", "wo")} == {
        p: f"results/negatives/coco/concrete-{p}.parquet" for p in ("hc", "lc", "wo")}
    assert inputs["model"] == "results/models/base-clip/pretrain/seed0/checkpoint.pt"
    assert default.claims_inputs()["pairs"] == "results/tables/concreteplant/coco.pairs.csv"


def test_a_study_of_released_bases_trains_nothing_and_writes_no_dataset_tables() -> None:
    study = Study(load_config(PAPER, REPO / "config" / "released.yaml"))
    released = study.config["study"]["bases"]
    assert not study.config["study"]["methods"] and study.report_datasets() == []
    assert {layout.parse_model_id(m).method for m in study.study_model_ids()} == {f"base-{b}" for b in released}
    assert study.claims_loss_models() == [] and study.trained_generator_pairs() == set()
    assert not any(re.search(r"/tables/(parse|negatives|concreteplant)/", o) for o in study.study_outputs())
    # a local weights file is the export's input (replacing it reruns it); a hub release is read from the cache
    assert study.pretrain_inputs("negclip-released") == {"weights": "data/released/negclip.pth"}
    assert study.pretrain_inputs("fsc-clip-coco") == {}


def test_rule_all_asks_for_every_table_figure_and_report_page(default: Study) -> None:
    outputs = default.study_outputs()
    assert outputs[:3] == ["results/tables/results.md", "results/tables/correlations.md", "results/tables/claims.md"]
    assert "results/tables/datasets/long.csv" in outputs  # a dataset only a method's own `datasets` names
    assert "results/tables/concreteplant/coco.csv" in outputs
    report = default.report_outputs(["tradeoff"], ["quality", "concreteplant"])
    assert report == ["results/figures/tradeoff.png", "results/figures/tradeoff.pdf", "results/report/claims.html",
                      "results/report/results.html", "results/report/workflow.rst", "results/report/quality/coco.html",
                      "results/report/concreteplant/coco.html"]


def test_pretraining_reads_a_manifest_a_weights_file_or_nothing(tmp_path: Path, default: Study) -> None:
    assert default.pretrain_inputs("clip") == {"manifest": "results/data/pretrain/manifest.parquet",
                                               "overlap": "results/tables/overlap/pretrain.csv"}
    weights = tmp_path / "w.pt"
    study = with_overlay(tmp_path, f"bases: {{clip: {{init: openai, weights: {weights}}}}}\n")
    assert study.pretrain_inputs("clip") == {"weights": str(weights)}
    assert study.base_model_id("clip", 2) == "base-clip/openai/seed0"


def test_a_dataset_manifest_reads_its_world_split_or_every_raw_file(tmp_path: Path, default: Study) -> None:
    assert default.dataset_inputs("coco") == {
        "world": f"results/world/{default.config['datasets']['coco']['split']}/manifest.parquet"}
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text("[]")
    spec = {"source": "coco", "path": str(tmp_path / "*.json"), "image_root": str(tmp_path)}
    study = Study({**default.config, "datasets": {**default.config["datasets"], "raw": spec}})
    assert study.dataset_inputs("raw") == {"raw": [str(tmp_path / "a.json"), str(tmp_path / "b.json")]}


def test_norms_and_released_files_are_inputs_only_when_local() -> None:
    assert norms_files({}) == [] and norms_files({"norms": "https://example.org/n.tsv"}) == []
    assert norms_files({"norms": "data/norms.tsv"}) == ["data/norms.tsv"]
    assert released_negatives({"path": "neg.json"}) == ["neg.json"] and released_negatives({}) == []


def test_the_overlap_guard_reads_the_evaluation_sets_records(tmp_path: Path, default: Study,
                                                             paper_study: Study) -> None:
    """Every evaluated benchmark's files reach the guard through the sets' records, as they reach an evaluation
    job: the study's and WiSE-FT's (paper.yaml's WiSE-FT set is narrower), one record when the sets are equal."""
    assert paper_study.overlap_inputs("coco-100k") == {
        "manifest": "results/data/coco-100k/manifest.parquet",
        "benchmarks": ["results/benchmarks/sets/study.json", "results/benchmarks/sets/wiseft.json"]}
    assert set(paper_study.overlap_benchmarks()) == {b for name in ("study", "wiseft")
                                                     for b in paper_study.benchmark_sets[name]}
    same = with_overlay(tmp_path, f"wiseft: {{benchmarks: [{', '.join(default.eval_benchmarks)}]}}\n")
    assert same.overlap_inputs("coco")["benchmarks"] == ["results/benchmarks/sets/study.json"]


def test_the_open_clip_model_of_every_kind_of_model_id(default: Study) -> None:
    clip = default.config["bases"]["clip"]["model"]
    siglip = default.config["bases"]["siglip"]["model"]
    assert default.model_name("base-siglip/pretrain/seed0") == siglip
    assert default.model_name("c2lip/coco/seed0") == siglip != clip
    assert default.model_name("wiseft-fsc-clip-a0.4/coco/seed1") == clip


def test_an_unknown_method_is_an_error_naming_it(default: Study) -> None:
    with pytest.raises(ConfigError, match="no-such-method"):
        default.train_inputs("no-such-method", "coco", 0)
