"""End to end: the workflow on a reduced config, through the real Snakemake CLI.

One module-scoped run of the whole reduced study (tiny splits, a few training steps) feeds several checks:
the results table, idempotence (a second `snakemake` does nothing), and targeted dry-runs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import workflow_runner
import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIGS = [str(REPO / "config" / "config.yaml"), str(REPO / "tests" / "e2e" / "config.yaml")]

pytestmark = pytest.mark.e2e


def snakemake(workdir: Path, *args: str, local: bool = True, configs: list[str] = CONFIGS,
              cwd: Path | None = None) -> subprocess.CompletedProcess:
    return workflow_runner.snakemake(workdir, *args, configs=configs, cores=2 if local else None, cwd=cwd)


def untracked_in_repo() -> set[str]:
    """The checkout's untracked and ignored paths (wholly new folders as one entry), Python's byte-code aside."""
    status = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=normal"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout
    return {line[3:] for line in status.splitlines() if line[:2] in ("??", "!!") and "__pycache__" not in line}


@pytest.fixture(scope="module")
def repo_before_the_study() -> set[str]:
    return untracked_in_repo()


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a (dry) run as {rule: count}."""
    table = output.split("Job stats:")[1].split("total")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.M)}


@pytest.fixture(scope="module")
def cluster_run(request, tmp_path_factory) -> Iterator[tuple[Path, subprocess.Popen, Path] | None]:
    """test_slurm_run_matches_local_run's SLURM run, started before the local study it is compared with, so that
    its waits on the cluster's polling overlap the study's CPU work instead of following it. None when that test
    is not run."""
    wanted = any(item.originalname == "test_slurm_run_matches_local_run" for item in request.session.items)
    if not wanted or os.environ.get("COMPO_TEST_SLURM") != "1":
        yield None
        return
    workdir = tmp_path_factory.mktemp("cluster")
    log = workdir.with_name(f"{workdir.name}.log")
    targets = [f"results/eval/{model}/coco/seed0/_evaluated.json" for model in SLURM_TARGETS]
    process = workflow_runner.snakemake(
        workdir, "--executor", "compo-slurm", "--workflow-profile", str(REPO / "workflow" / "profiles" / "slurm-test"),
        *targets, configs=CONFIGS, cores=None, background=True, output=log)
    yield workdir, process, log
    if process.poll() is None:  # the test did not wait for it (it failed, or was deselected after collection)
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def study(tmp_path_factory, repo_before_the_study, cluster_run) -> Path:
    workdir = tmp_path_factory.mktemp("study")
    launch = workdir.with_name(f"{workdir.name}-cwd")  # run from a folder of its own: what lands there is a stray
    launch.mkdir()
    run = snakemake(workdir, cwd=launch)
    assert run.returncode == 0, run.stderr[-5000:]
    return workdir


def test_one_target_schedules_only_its_ancestors(tmp_path):
    run = snakemake(tmp_path, "-n", "results/eval/negclip/coco/seed0/sugarcrepe.json")
    assert run.returncode == 0, run.stderr[-3000:]
    counts = job_counts(run.stdout + run.stderr)
    assert counts["evaluate"] == 1 and counts["train"] == 1 and counts["pretrain"] == 1
    assert "aggregate" not in counts and "all" not in counts


def test_a_study_writes_nothing_outside_its_results_and_snakemakes_folder(study, repo_before_the_study):
    """The study's files are under results/ (Snakemake's own state under .snakemake/): nothing in the folder
    snakemake ran from, nothing else in its --directory, and nothing new in the checkout (a stray
    results.results.yaml holding a machine path was once committed at its root)."""
    assert sorted(p.name for p in study.iterdir()) == [".snakemake", "results"]
    assert list(study.with_name(f"{study.name}-cwd").iterdir()) == []
    assert untracked_in_repo() - repo_before_the_study == set()


def test_results_table(study):
    e2e = yaml.safe_load((REPO / "tests" / "e2e" / "config.yaml").read_text())
    tables = study / "results" / "tables"
    long = pd.read_csv(tables / "results_long.csv")
    wiseft = [f"wiseft-{m}-a{a:.1f}" for m in e2e["wiseft"]["methods"] for a in e2e["wiseft"]["alphas"]]
    assert set(long["method"]) == {"base-clip", "base-siglip", *e2e["study"]["methods"], *wiseft}
    assert set(long.loc[long["method"] == "lss", "dataset"]) == {"long"}  # a method's own datasets
    assert set(e2e["study"]["benchmarks"]) <= set(long["benchmark"])
    sugarcrepe = long[long["benchmark"] == "sugarcrepe"]
    assert {"replace_obj", "replace_att", "replace_rel", "swap_obj", "swap_att", "add_obj", "add_att"} <= set(
        sugarcrepe["metric"])
    counts = long["metric"].str.startswith("n_")  # e.g. ARO's n_groups: how many groups the macro mean covers
    assert long.loc[~counts, "value"].between(0, 1).all() and (long.loc[counts, "value"] >= 0).all()
    summary = pd.read_csv(tables / "results.csv")
    assert (summary["n_seeds"] == 1).all() and summary["ci_low"].isna().all()  # one seed: no interval
    composites = summary[summary["benchmark"] == "composite"]
    assert {"compositional", "zero-shot", "aro", "long-r1"} <= set(composites["metric"])
    assert (tables / "results.md").read_text().count("\n") >= 4
    assert (tables / "correlations.csv").exists()


def test_claims_table(study):
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    claims = pd.read_csv(study / "results" / "tables" / "claims.csv")
    # in the config's order within each role: controls, the seeds' claims, then the study's own hypotheses
    from compo.claims import ROLE_ORDER

    role = dict(zip(claims["id"], claims["role"], strict=True))
    assert list(claims["id"]) == sorted((c["id"] for c in config["claims"]), key=lambda i: ROLE_ORDER[role[i]])
    assert claims["verdict"].isin(["holds", "not detected", "reversed", "equivalent", "untestable here"]).all()
    assert (claims["why"].fillna("") != "").eq(claims["verdict"] == "untestable here").all()  # untestable: why
    markdown = (study / "results" / "tables" / "claims.md").read_text()
    assert all(f"| {c['id']}" in markdown for c in config["claims"])
    kinds = pd.read_csv(study / "results" / "tables" / "effects.csv")
    assert list(kinds["kind"]) == list(config["effects"])  # the kinds open claims.md, before the claims
    assert markdown.index(f"| {list(config['effects'])[0]} |") < markdown.index(f"| {config['claims'][0]['id']}")


def test_study_side_tables(study):
    tables = study / "results" / "tables"
    ablation = pd.read_csv(tables / "ablations" / "cement-margin" / "results.csv")
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    assert set(ablation["method"]) == {"base-clip", *config["ablations"]["cement-margin"]["methods"]}
    quality = pd.read_csv(tables / "negatives" / "coco" / "quality.csv")
    assert {"swap", "replace", "shuffle", "concrete-hc"} <= set(quality["negatives"])
    assert (tables / "datasets" / "coco.csv").exists() and (tables / "parse" / "coco.csv").exists()
    plant = pd.read_csv(tables / "concreteplant" / "coco.csv")
    assert sorted(plant["policy"]) == ["hc", "lc", "wo"] and plant["i2t"].between(0, 1).all()
    pairs = pd.read_csv(tables / "concreteplant" / "coco.pairs.csv")  # the per-pair rows behind Table 1
    i2t = pairs.groupby("policy")["i2t_correct"].mean()
    assert i2t.to_dict() == pytest.approx(plant.set_index("policy")["i2t"].to_dict())
    # WiSE-FT at alpha 0 is the base, so their results are identical
    long = pd.read_csv(tables / "results_long.csv")
    overall = long[(long["benchmark"] == "sugarcrepe") & (long["metric"] == "overall")].set_index("method")["value"]
    assert overall["wiseft-fsc-clip-a0.0"] == overall["base-clip"]


def test_figures_and_report(study):
    figures = study / "results" / "figures"
    assert sorted(p.stem for p in figures.glob("*.png")) == sorted(p.stem for p in figures.glob("*.pdf"))
    assert (study / "results" / "report" / "claims.html").exists()
    run = snakemake(study, "--report", str(study / "report.html"))
    assert run.returncode == 0, run.stderr[-3000:]
    page = (study / "report.html").read_text()
    assert all(f'"{c}"' in page for c in ("Claims", "Compositionality", "Data", "Multi-modal", "Training"))


def test_training_logs_and_checkpoints(study):
    model = study / "results" / "models" / "negclip" / "coco" / "seed0"
    losses = pd.read_csv(model / "losses.csv")
    assert len(losses) == 4 and "loss" in losses.columns and "seconds" not in losses.columns
    assert len(pd.read_csv(model / "timings.csv")) == 4
    assert not (model.parent / f".{model.name}.resume").exists()


def test_rerun_does_nothing(study):
    run = snakemake(study, "-n")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Nothing to be done" in run.stdout + run.stderr


def test_dose_response_reads_an_arm_as_the_claims_do(study, tmp_path):
    """tools/dose_response.py on the reduced study as one arm: every kind of effect gets its row, with the
    same controls' effects as the study's own effects table (the same claims code; Holm over the same 11 controls
    here, as the reduced study adjusts them separately from the claims) and the targets read."""
    script = REPO / "tools" / "dose_response.py"
    run = subprocess.run([sys.executable, str(script), "--arm", f"1x={study / 'results'}:4", "--configfile", *CONFIGS,
                          "--out", str(tmp_path)], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    seeds = len(yaml.safe_load((REPO / "tests" / "e2e" / "config.yaml").read_text())["study"]["seeds"])
    dose = f"| 1x (4; 256; {seeds} / {seeds} / {seeds}) |"  # the seeds evaluated per fine-tuned method
    rows = [line for line in (tmp_path / "dose-response.md").read_text().splitlines() if dose in line]
    controlled = [kind for kind, spec in config["effects"].items() if "direct" not in spec]  # those with controls
    assert [row.split(" | ")[0].strip("| ") for row in rows] == controlled
    ours = pd.read_csv(tmp_path / "1x" / "effects.csv").set_index("kind")
    study_kinds = pd.read_csv(study / "results" / "tables" / "effects.csv").set_index("kind")
    assert ours.loc[controlled, "positive"].to_dict() == study_kinds.loc[controlled, "positive"].to_dict()
    assert all("None" not in row for row in rows)  # every target was read


@pytest.fixture(scope="module")
def controls(tmp_path_factory) -> Path:
    """The quick study's controls over two pretrained bases, at test size: config/controls-bases.yaml (the study of
    config/quick.yaml: every kind's controls only, no compositional composite; `base_seeds` 0 and 1) with 4 of its
    6 seeds. One run holds the quick study's checks and the two bases' (each was its own run before)."""
    workdir = tmp_path_factory.mktemp("controls")
    four_seeds = workdir / "four-seeds.yaml"
    four_seeds.write_text("study:\n  seeds: [0, 1, 2, 3]\n")
    configs = [str(REPO / "config" / "config.yaml"), str(REPO / "config" / "controls-bases.yaml"),
               str(REPO / "tests" / "e2e" / "quick.yaml"), str(four_seeds)]
    run = snakemake(workdir, configs=configs)
    assert run.returncode == 0, run.stderr[-5000:]
    report = snakemake(workdir, "--report", str(workdir / "report.html"), configs=configs)
    assert report.returncode == 0, report.stderr[-3000:]
    return workdir


def test_quick_study_runs_to_its_controls_figures_and_report(controls):
    """Every job runs, the claims table holds the quick study's controls, every figure is drawn or is a notice,
    and the report builds."""
    quick = yaml.safe_load((REPO / "config" / "quick.yaml").read_text())
    bases = yaml.safe_load((REPO / "config" / "controls-bases.yaml").read_text())
    assert bases["study"]["claims"] == quick["study"]["claims"]  # the same study, over two bases
    claims = pd.read_csv(controls / "results" / "tables" / "claims.csv")
    assert list(claims["id"]) == quick["study"]["claims"] and claims["verdict"].notna().all()
    figures = controls / "results" / "figures"
    assert sorted(p.stem for p in figures.glob("*.png")) == sorted(p.stem for p in figures.glob("*.pdf"))
    assert (figures / "dataset_attributes.png").exists()
    assert (controls / "report.html").stat().st_size > 0


def test_controls_over_two_bases_pair_each_seed_with_its_own_base(controls):
    """Both bases are pretrained and evaluated, seeds 1, 3 fine-tune base seed 1 and seeds 0, 2 base seed 0, and the
    tables say the statistics resampled two bases."""
    results = controls / "results"
    for seed in range(4):
        trained = yaml.safe_load((results / "models" / "negclip" / "coco" / f"seed{seed}" / "config.yaml").read_text())
        assert trained["inputs"]["init_dir"] == f"results/models/base-clip/pretrain/seed{seed % 2}"
    long = pd.read_csv(results / "tables" / "results_long.csv")
    assert sorted(set(long.loc[long["method"] == "base-clip", "seed"])) == [0, 1]
    summary = pd.read_csv(results / "tables" / "results.csv")
    tuned = summary[summary["method"] == "clip-ft"]
    assert (tuned["n_seeds"] == 4).all() and (tuned["n_bases"] == 2).all()
    claims = pd.read_csv(results / "tables" / "claims.csv")
    assert (claims["n_seeds"] == 4).all() and claims["verdict"].notna().all()
    assert "over 2 pretrained bases" in (results / "tables" / "claims.md").read_text()
    assert "2 pretrained bases; fine-tuning seeds 0, 1, 2, 3 alternate" in (results / "tables" / "results.md"
                                                                                  ).read_text()


# What the cluster run builds: one NegCLIP model from the world up (world, benchmarks, datasets, parse, negatives,
# pretraining, fine-tuning, evaluation, the local benchmark_set rule) and its WiSE-FT trajectory (one group job).
# The whole reduced study through SLURM took 1,027 s on the 2-core dev machine (89 jobs at ~12 s of submission and
# polling each); these 21 jobs cover every kind of job the cluster path runs (submitted, local, grouped).
SLURM_TARGETS = ["negclip", *(f"wiseft-negclip-a{alpha}" for alpha in ("0.0", "0.5", "1.0"))]


def evaluations(workdir: Path, model: str) -> dict[str, tuple[str, dict]]:
    """Each benchmark's metrics and the checkpoint bytes they scored, of one model's evaluation."""
    folder = workdir / "results" / "eval" / model / "coco" / "seed0"
    results = {}
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        if "metrics" in record:
            results[path.stem] = (record["checkpoint_sha256"], record["metrics"])
    return results


@pytest.mark.slurm
@pytest.mark.skipif(os.environ.get("COMPO_TEST_SLURM") != "1",
                    reason="needs the localhost SLURM cluster (scripts/slurm/up.sh) and COMPO_TEST_SLURM=1")
def test_slurm_run_matches_local_run(study, cluster_run):
    """A model and its WiSE-FT trajectory dispatched job by job through SLURM (fixture cluster_run): the same
    checkpoint bytes and the same scores as the local run."""
    workdir, process, log = cluster_run
    returncode = process.wait(timeout=1800)
    output = log.read_text()
    assert returncode == 0, output[-5000:]
    assert "slurm" in output.lower()
    for model in SLURM_TARGETS:
        cluster = evaluations(workdir, model)
        assert cluster and cluster == evaluations(study, model), model
