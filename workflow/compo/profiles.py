"""Workflow profiles checked (issue 43): Snakemake silently ignores a `--workflow-profile` that does not exist and
a rule name under a profile's `set-resources` or `set-threads` that is not a rule of the workflow, so the jobs
would run without the GPU, memory or walltime the entry meant to give them. Here both are errors naming the
profile and the rule: in `compo plan` (which reads the profile) and while the DAG is built (the Snakefile checks
the resources Snakemake parsed, naming the profile given on its command line). Also read from that command line:
the options that delete or write outputs without running jobs (`destructive_options`), for which the Snakefile
takes the study lock (compo.results_root).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

SECTIONS = ("set-resources", "set-threads")
DESTRUCTIVE_OPTIONS = ("delete_all_output", "delete_temp_output", "touch", "cleanup_metadata")


class ProfileError(ValueError):
    """A profile that does not exist or names a rule the workflow does not have."""


def profile_file(profile: str | Path) -> Path:
    """The config.yaml of a workflow profile (a folder holding one, or the file itself); an error naming the
    profile when there is none."""
    path = Path(profile)
    file = path / "config.yaml" if path.is_dir() else path
    if not file.is_file():
        raise ProfileError(f"workflow profile {profile}: not found (expected a folder holding config.yaml, "
                           "e.g. workflow/profiles/slurm)")
    return file


def profile_settings(profile: str | Path) -> dict[str, Any]:
    """A profile's settings (its config.yaml), checked to be a mapping."""
    import yaml

    file = profile_file(profile)
    settings = yaml.safe_load(file.read_text()) or {}
    if not isinstance(settings, dict):
        raise ProfileError(f"workflow profile {file}: expected a mapping of settings, found {type(settings).__name__}")
    return settings


def check_rule_names(where: str, sections: Mapping[str, Iterable[str] | None], rules: Iterable[str]) -> None:
    """Every rule named under each section (set-resources, set-threads) is a rule of the workflow, else an
    error naming `where` (the profile), the section and the rules."""
    known = set(rules)
    for section, names in sections.items():
        unknown = sorted(set(names or ()) - known)
        if unknown:
            raise ProfileError(f"workflow profile {where}: {section} names {', '.join(unknown)}, not a rule of the "
                               f"workflow (a misspelt name is ignored by Snakemake: its jobs would run without "
                               f"those resources); rules: {', '.join(sorted(known))}")


def profiles_in_argv(argv: Sequence[str]) -> list[str]:
    """The profiles a Snakemake command line names (`--workflow-profile X`, `--profile X`, `--opt=X` forms)."""
    found = []
    for i, word in enumerate(argv):
        for flag in ("--workflow-profile", "--profile"):
            if word == flag and i + 1 < len(argv):
                found.append(argv[i + 1])
            elif word.startswith(flag + "="):
                found.append(word.split("=", 1)[1])
    return [p for p in found if p != "none"]


def check_workflow_profile(argv: Sequence[str], basedir: str | Path) -> None:
    """A `--workflow-profile` on the command line exists (as Snakemake looks it up: the path, or profiles/<name>
    here or in the Snakefile's folder `basedir`), else an error naming it."""
    for i, word in enumerate(argv):
        value = argv[i + 1] if word == "--workflow-profile" and i + 1 < len(argv) else \
            word.split("=", 1)[1] if word.startswith("--workflow-profile=") else None
        if value in (None, "none"):
            continue
        # relative to where Snakemake started: before --directory changed the working directory
        start = Path(os.environ.get("PWD", "."))
        candidates = [start / value, start / "profiles" / value, Path(basedir) / "profiles" / value]
        if not any(c.exists() for c in candidates):
            raise ProfileError(f"workflow profile {value}: not found (Snakemake would run without it); looked at "
                               f"{', '.join(str(c) for c in candidates)}")


def destructive_options(argv: list[str]) -> list[str]:
    """The options of a Snakemake command line (`argv` without the program) that delete or write outputs
    without running jobs, as written (e.g. ['--delete-all-output']); [] with --dry-run (they only list).
    Read with Snakemake's own parser, so abbreviations (--delete-all) and joined short flags (-Ft) count."""
    from snakemake.cli import get_argument_parser

    try:
        args, _ = get_argument_parser().parse_known_args(argv)
    except SystemExit:  # not a Snakemake command line (the workflow run through the API)
        return []
    if getattr(args, "dryrun", False):
        return []
    return [f"--{name.replace('_', '-')}" for name in DESTRUCTIVE_OPTIONS if getattr(args, name, None)]


def plain_resource(resource: Any) -> Any:
    """A resource's value as the profile (or `--set-resources`) wrote it, read while the DAG is built. Snakemake keeps
    a string from a profile unevaluated (an expression it evaluates per job), so reading its `.value` raises
    "Resource must be evaluated within the context of a rule": its text is the value (`h100`; a quoted `'h100'`
    reads as the string it quotes). None for a resource a function computes, or none given."""
    if resource is None or not hasattr(resource, "is_evaluable"):
        return resource
    if not resource.is_evaluable():
        return resource.value
    raw = getattr(resource, "raw", None)
    if not isinstance(raw, str):
        return None
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw
    return value if isinstance(value, str | int | float) else raw


# --- the resources a workflow profile gives a rule, read while the DAG is built ----------------------------------
# A job's CPUs and host memory scale with its GPUs where the profile names them per GPU (set-resources.<rule>:
# cpus_per_gpu, mem_mb_per_gpu): a 4-GPU C2LIP job runs 4 ranks, each decoding its images and reading its tables,
# so it asks 4x a 1-GPU job's (cpus_per_task and mem_mb, the figures the SLURM plugin submits), without giving
# every 1-GPU fine-tune as much. The job's threads are the same CPUs: the trainer splits them over its ranks.
PER_GPU = {"cpus_per_gpu": "cpus_per_task", "mem_mb_per_gpu": "mem_mb"}


class RuleResources:
    """The resources Snakemake parsed from the workflow profile and the command line (`workflow.resource_settings`:
    `overwrite_resources`, per rule, and `default_resources`), as each rule reads them."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    def value(self, rule: str, name: str, defaults: bool = True) -> Any:
        """The value the profile (or --set-resources) gives resource `name` of `rule`: its set-resources, else
        (`defaults`) its default-resources, as written (plain_resource); None: not set, or computed by a function."""
        sources = [(self.settings.overwrite_resources or {}).get(rule) or {}]
        if defaults:
            sources.append(self.settings.default_resources or {})
        for resources in sources:
            value = plain_resource(resources.get(name)) if hasattr(resources, "get") else None
            if value is not None:
                return value
        return None

    def number(self, rule: str, name: str) -> int | float | None:
        """A numeric resource the profile gives `rule` (e.g. gpu_mem_gb), or None; a value that is not a number is
        an error naming the rule and the resource."""
        value = self.value(rule, name)
        if value is not None and not isinstance(value, int | float):
            raise ValueError(f"profile: set-resources.{rule}.{name}: {value!r} is not a number (e.g. {name}: 80)")
        return value

    def per_gpu_figure(self, rule: str, name: str) -> int | float | None:
        """The per-GPU figure `name` (cpus_per_gpu, mem_mb_per_gpu) the profile gives `rule`, or None. Naming the
        whole-job figure it replaces under the same rule's set-resources is an error (set-resources would override
        the scaled figure: the per-GPU one would be dropped without a word)."""
        figure = self.number(rule, name)
        if figure is not None and self.value(rule, PER_GPU[name], defaults=False) is not None:
            raise ValueError(
                f"profile: set-resources.{rule} names both {name} and {PER_GPU[name]}: keep {name} (the job asks for "
                f"{name} x its GPUs) or {PER_GPU[name]} (the same for any GPU count)")
        return figure

    def gpu_job_resources(self, rule: str, gpus: Any) -> dict[str, Any]:
        """cpus_per_task and mem_mb of a job of the GPU rule `rule`, each the profile's per-GPU figure x the job's
        GPUs (`gpus`, a function of the wildcards) where the profile names one; the others are left to the
        profile as for any rule."""
        resources = {}
        for name, whole in PER_GPU.items():
            figure = self.per_gpu_figure(rule, name)
            if figure is not None:
                resources[whole] = lambda wildcards, figure=figure: int(figure * gpus(wildcards))
        return resources

    def gpu_job_threads(self, rule: str, gpus: Any, fallback: Any) -> Any:
        """A GPU rule's threads: the CPUs the job asks for (cpus_per_gpu x its GPUs) where the profile names them
        per GPU, else `fallback` (the config's threads)."""
        figure = self.per_gpu_figure(rule, "cpus_per_gpu")
        if figure is None:
            return fallback
        return lambda wildcards: int(figure * gpus(wildcards))

    def gpu_model(self, rule: str) -> str | None:
        """The gpu_model the profile gives `rule` (set-resources, else default-resources); None: none named."""
        value = self.value(rule, "gpu_model")
        return None if value is None else str(value)
