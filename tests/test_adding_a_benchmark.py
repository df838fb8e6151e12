"""docs/adding-a-benchmark.md stays true: its worked example, built from the guide's own code blocks in a copy of
the repository, declares itself, passes its test file and the completeness test of every kind, and dry-runs with
the study, touching only the files the guide names."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from test_adding_a_method import copy_repository, follow_the_guide, run

pytestmark = pytest.mark.slow  # a copy of the repository, a pytest run and a Snakemake dry run

GUIDE = "docs/adding-a-benchmark.md"


def test_the_guides_worked_example_declares_itself_tests_and_dry_runs(repo: Path, tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    copy.mkdir()
    copy_repository(repo, copy)
    shutil.copy2(repo / "tests" / "test_benchmark_kinds.py", copy / "tests")
    written = follow_the_guide(repo, copy, GUIDE)
    # one module, its test, a copy of its file and config.yaml: no registry, schema or list edited
    assert sorted(written) == ["config/config.yaml", "tests/evaluate/test_caption_pick.py",
                               "tests/fixtures/benchmarks/caption_pick/items.jsonl",
                               "workflow/compo/evaluate/caption_pick.py"]

    # config/README's table of the kinds and their keys, by the command the guide names
    keys = run(copy, "compo", "benchmark-keys", "--write", "config/README.md")
    assert keys.returncode == 0, keys.stderr
    assert "`caption_pick`" in (copy / "config" / "README.md").read_text()

    # its own test, and every question of every kind asked of it (config/README's table among them)
    tests = run(copy, sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                "tests/evaluate/test_caption_pick.py",
                "tests/test_benchmark_kinds.py")
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert "test_a_kind_answers_every_question[caption_pick] PASSED" in tests.stdout
    assert "test_caption_pick.py::test_scores_equal_the_plain_loop_and_a_missing_image_is_counted PASSED" in (
        tests.stdout)

    # the study with it: every model is evaluated on it, and its file guards training against overlap
    dry = run(copy, "snakemake", "-n", "-p", "--cores", "1", "results/tables/results.csv")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "results/eval/negclip/coco/seed0/caption_pick.json" in dry.stdout
    assert "tests/fixtures/benchmarks/caption_pick/items.jsonl" in dry.stdout

    # a misspelt kind is refused at DAG build with the known kinds, caption_pick among them
    config = yaml.safe_load((copy / "config" / "config.yaml").read_text())
    config["benchmarks"]["caption_pick"]["kind"] = "caption_pik"
    (copy / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    refused = run(copy, "snakemake", "-n", "--cores", "1")
    assert refused.returncode != 0
    assert "config key benchmarks.caption_pick.kind: 'caption_pik' is not one of" in refused.stderr
    assert "'caption_pick'" in refused.stderr


def test_the_guide_describes_every_field_of_a_declaration(repo: Path) -> None:
    """The guide's table of fields: one row per field of `Benchmark`, none for a field it lacks. (Here, not in
    test_benchmark_kinds.py, which the worked example runs in a copy without docs/.)"""
    from compo.evaluate.kinds import FIELDS

    rows = re.findall(r"^\| `(\w+)[`(]", (repo / GUIDE).read_text(), re.M)
    assert sorted(rows) == sorted(FIELDS)
