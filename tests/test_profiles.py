"""Every workflow profile names only rules the workflow has (issue 12.6): a `set-resources` or
`set-threads` entry for a rule that does not exist is silently ignored by Snakemake, so its jobs would
run without the GPU or memory the entry meant to give them. The memory, GPU and walltime the profiles give their
jobs, and the CPUs of the paper's jobs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

# marked slow test by test: those that ask the real Snakemake or compo plan, and the quick ones kept in the slow lane
# with them; the paper jobs' CPUs (two YAML files read) are checked in every lane
PROFILES = sorted((Path(__file__).resolve().parents[1] / "workflow" / "profiles").glob("*/config.yaml"))


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory, run_snakemake) -> set[str]:
    """The rule names of the workflow under the default config (as `snakemake --list-rules` prints them)."""
    run = run_snakemake(tmp_path_factory.mktemp("rules"), "--list-rules")
    assert run.returncode == 0, run.stderr[-2000:]
    names = {line.split()[0] for line in run.stdout.splitlines() if line and not line[0].isspace()}
    assert {"train", "evaluate", "negatives_shard", "all"} <= names
    return names


@pytest.mark.slow
@pytest.mark.parametrize("profile", PROFILES, ids=[p.parent.name for p in PROFILES])
def test_profile_names_only_rules_of_the_workflow(profile: Path, rules: set[str]) -> None:
    config = yaml.safe_load(profile.read_text())
    for section in ("set-resources", "set-threads"):
        unknown = sorted(set(config.get(section) or {}) - rules)
        assert not unknown, f"{profile}: {section} names no rule of the workflow: {unknown}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["slurm", "slurm-test"])
def test_llm_shards_get_a_gpu_and_memory(name: str) -> None:
    profile = Path(__file__).resolve().parents[1] / "workflow" / "profiles" / name / "config.yaml"
    shard = yaml.safe_load(profile.read_text())["set-resources"]["negatives_shard"]
    # the rule asks for its engine's GPUs (and, where the profile names them per GPU, their CPUs and memory)
    assert "gpu" not in shard and shard.get("mem_mb", shard.get("mem_mb_per_gpu", 0)) >= 4000


@pytest.mark.slow
def test_every_job_of_the_default_study_fits_the_local_memory_cap() -> None:
    """The local profile caps the summed mem_mb of running jobs (the study's 4 GB budget): a job asking for
    more than the cap alone could never start, and two of the heaviest fine-tunes must not fit together."""
    repo = Path(__file__).resolve().parents[1]
    profile = yaml.safe_load((repo / "workflow" / "profiles" / "local" / "config.yaml").read_text())
    train = yaml.safe_load((repo / "config" / "config.yaml").read_text())["memory_mb"]["train"]
    cap = profile["resources"]["mem_mb"]
    asked = {"default": profile["default-resources"]["mem_mb"],
             **{rule: spec["mem_mb"] for rule, spec in profile["set-resources"].items() if "mem_mb" in spec},
             **{f"train {method}": mem_mb for method, mem_mb in train.items()}}
    assert "mem_mb" not in profile["set-resources"]["train"], "it would override config memory_mb.train"
    assert max(asked.values()) <= cap, asked
    assert 2 * max(train.values()) > cap


@pytest.mark.slow
def test_the_local_profile_says_how_many_gpu_jobs_share_one_gpu(run_snakemake, tmp_path: Path) -> None:
    """With a GPU, `device: auto` puts every job that reads train.device or evaluate.device on it: each of those
    rules holds one `gpu_jobs` of the local profile's few (issue 45, item 4); no other rule holds one."""
    repo = Path(__file__).resolve().parents[1]
    profile = yaml.safe_load((repo / "workflow" / "profiles" / "local" / "config.yaml").read_text())
    sharing = {rule for rule, spec in profile["set-resources"].items() if spec.get("gpu_jobs") == 1}
    assert sharing == {"pretrain", "train", "evaluate", "evaluate_wiseft", "concreteplant_table"}
    assert 1 < profile["resources"]["gpu_jobs"] <= 8
    run = run_snakemake(tmp_path, "-n", "--workflow-profile", str(repo / "workflow" / "profiles" / "local"),
                        "results/models/clip-ft/coco/seed0/checkpoint.pt")
    assert run.returncode == 0, run.stderr[-2000:]
    jobs = {job.split(":")[0]: job for job in run.stdout.split("\nrule ")[1:]}
    assert "gpu_jobs=1" in jobs["train"] and "gpu_jobs=1" in jobs["pretrain"] and "gpu_jobs" not in jobs["world"]


# --- profiles checked (issue 43): a missing profile, a rule the workflow does not have ------------------------------


@pytest.mark.slow
def test_compo_plan_refuses_a_missing_profile(tmp_path: Path) -> None:
    from compo.plan import plan
    from compo.profiles import ProfileError

    repo = Path(__file__).resolve().parents[1]
    with pytest.raises(ProfileError, match=r"workflow profile .*slurm-typo: not found"):
        plan([str(repo / "config" / "paper.yaml")], str(tmp_path / "slurm-typo"), str(repo / "Snakefile"),
             str(tmp_path))


@pytest.mark.slow
def test_a_profile_naming_no_rule_is_an_error_naming_profile_and_rule(tmp_path: Path) -> None:
    """What the Snakefile runs on the resources Snakemake parsed from a profile."""
    from compo.profiles import ProfileError, check_rule_names

    sections = {"set-resources": {"trian": {"gpu": 1}, "evaluate": {"gpu": 1}}, "set-threads": None}
    with pytest.raises(ProfileError, match=rf"workflow profile {tmp_path}: set-resources names trian, not a rule"):
        check_rule_names(str(tmp_path), sections, ["train", "evaluate"])
    check_rule_names(str(tmp_path), {"set-threads": {"evaluate": 4}}, ["train", "evaluate"])


@pytest.mark.slow
def test_the_dry_run_refuses_a_misspelt_rule_and_a_missing_profile(tmp_path: Path, run_snakemake) -> None:
    """At DAG build: the Snakefile checks the resources Snakemake parsed from the profile, and that a
    --workflow-profile exists (Snakemake ignores both)."""
    repo = Path(__file__).resolve().parents[1]
    profile = tmp_path / "typo-profile"
    profile.mkdir()
    (profile / "config.yaml").write_text("set-resources:\n  evaluat:\n    mem_mb: 2000\n")
    run = run_snakemake(tmp_path / "work", "-n", "--workflow-profile", str(profile))
    assert run.returncode != 0
    assert f"workflow profile {profile}: set-resources names evaluat, not a rule" in run.stderr + run.stdout
    missing = tmp_path / "no-such-profile"
    run = run_snakemake(tmp_path / "work", "-n", "--workflow-profile", str(missing))
    assert run.returncode != 0 and f"workflow profile {missing}: not found" in run.stderr + run.stdout
    assert (repo / "workflow" / "profiles" / "slurm" / "config.yaml").is_file()


@pytest.mark.slow
def test_a_gpu_model_named_in_the_profile_builds_and_sizes_the_plan(tmp_path: Path) -> None:
    """README step 4: `gpu_model: "h100"` under the GPU rules of the SLURM profile (Snakemake keeps such a string
    unevaluated while the DAG is built; reading its value stopped every DAG build). The dry run asks for that GPU
    and `compo plan` sizes the walltimes on it."""
    from paper_fixtures import write_paper_overlay

    from compo.plan import plan

    repo = Path(__file__).resolve().parents[1]
    profile = yaml.safe_load((repo / "workflow" / "profiles" / "slurm" / "config.yaml").read_text())
    for spec in profile["set-resources"].values():
        if spec.get("slurm_partition") == "gpu":
            spec["gpu_model"] = "h100"
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "config.yaml").write_text(yaml.safe_dump(profile))
    configs = [str(repo / "config" / "paper.yaml"), str(write_paper_overlay(tmp_path / "inputs"))]
    rows, notes = plan(configs, str(tmp_path / "profile"), str(repo / "Snakefile"), str(tmp_path / "work"))
    assert notes.startswith("estimated on h100 (the profile's gpu_model")
    assert {row.rule for row in rows} >= {"train", "evaluate"}
    # a numeric resource written as text is an error naming the rule and the resource, at DAG build
    profile["set-resources"]["train"]["gpu_mem_gb"] = "80GB"
    (tmp_path / "profile" / "config.yaml").write_text(yaml.safe_dump(profile))
    refused = "the dry run failed: ValueError: profile: set-resources.train.gpu_mem_gb: '80GB' is not a number"
    with pytest.raises(RuntimeError, match=refused):
        plan(configs, str(tmp_path / "profile"), str(repo / "Snakefile"), str(tmp_path / "work"))


@pytest.mark.slow
def test_walltimes_stay_within_the_partition_limit_and_per_gpu_figures_are_not_overridden(tmp_path: Path) -> None:
    """max_runtime (the partitions' time limit) caps every GPU job's walltime, and the plan names the jobs whose
    first attempt would need a longer partition (issue 56 item 8). A rule naming cpus_per_gpu beside cpus_per_task
    is an error: set-resources' cpus_per_task would override the scaled figure without a word."""
    from paper_fixtures import write_paper_overlay

    from compo.plan import plan

    repo = Path(__file__).resolve().parents[1]
    profile = yaml.safe_load((repo / "workflow" / "profiles" / "slurm" / "config.yaml").read_text())
    assert profile["default-resources"]["max_runtime"] == "48h"
    profile["default-resources"]["max_runtime"] = "8h"
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "config.yaml").write_text(yaml.safe_dump(profile))
    configs = [str(repo / "config" / "paper.yaml"), str(write_paper_overlay(tmp_path / "inputs"))]
    rows, notes = plan(configs, str(tmp_path / "profile"), str(repo / "Snakefile"), str(tmp_path / "work"))
    train = next(row for row in rows if row.rule == "train")
    assert train.longest_h == 8 and train.longest_estimate_h * 1.4 > 8  # c2lip: 13 h asked under 48 h
    assert all(row.longest_h <= 8 for row in rows if row.gpus)
    assert "at most the profile's max_runtime (8 h)" in notes and "would need a longer partition: " in notes
    assert "train c2lip (3 jobs, 13 h asked of 8)" in notes
    profile["default-resources"]["max_runtime"] = "48h"
    profile["set-resources"]["train"]["cpus_per_task"] = 8
    (tmp_path / "profile" / "config.yaml").write_text(yaml.safe_dump(profile))
    refused = ("the dry run failed: ValueError: profile: set-resources.train names both cpus_per_gpu and "
               "cpus_per_task")
    with pytest.raises(RuntimeError, match=refused):
        plan(configs, str(tmp_path / "profile"), str(repo / "Snakefile"), str(tmp_path / "work"))


def test_paper_jobs_use_the_cpus_the_slurm_profile_gives_them(repo: Path) -> None:
    """The threads a paper job passes to its command (decode workers, spaCy processes) are the CPUs the SLURM
    profile asks for; concreteplant_table (~1.9 M images) is a GPU job."""
    paper = yaml.safe_load((repo / "config/paper.yaml").read_text())
    slurm = yaml.safe_load((repo / "workflow/profiles/slurm/config.yaml").read_text())["set-resources"]
    for rule, threads in (("evaluate", paper["evaluate"]["threads"]), ("parse", paper["parse"]["threads"]),
                          ("concreteplant_table", paper["evaluate"]["threads"])):
        assert slurm[rule]["cpus_per_task"] == threads, rule
    assert slurm["concreteplant_table"]["gpu"] == 1 and slurm["concreteplant_table"]["slurm_partition"] == "gpu"
