"""compo.resource_use: a job's own record of its wall time, CPU seconds (its children's included) and peak
memory, written at exit by `compo ... --timing`, and read back per job (torchrun's ranks summed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from compo.plan import measured_by_rule
from compo.resource_use import read_uses

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "workflow")}

# a process that sleeps, has a child burn CPU, holds ~200 MB itself, then records: the record must show all three
WORKLOAD = """
import subprocess, sys, time
from compo.resource_use import write_use
time.sleep(0.5)
burn = "import time\\nend = time.process_time() + 0.6\\nwhile time.process_time() < end: pass"
subprocess.run([sys.executable, "-c", burn], check=True)
held = bytearray(200 * 2**20)
held[::4096] = b"x" * len(held[::4096])
write_use(sys.argv[1])
"""


# the job's spawner (Snakemake, pytest) holding 600 MB: Linux carries its resident set into the job's ru_maxrss
SPAWNER = """
import subprocess, sys
held = bytearray(600 * 2**20)
held[::4096] = b"x" * len(held[::4096])
subprocess.run([sys.executable, "-c", sys.argv[1], sys.argv[2]], check=True)
"""


def _record(path: Path, env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-c", SPAWNER, WORKLOAD, str(path)], check=True, env=env, timeout=60)


def test_a_record_counts_the_whole_life_the_children_s_cpu_and_the_true_peak(tmp_path: Path) -> None:
    record = tmp_path / "timing" / "train" / "negclip" / "coco" / "seed0.tsv"
    _record(record, ENV)
    [use] = read_uses(tmp_path)
    assert use.rule == "train" and use.job == str(record)
    assert use.wall_s >= 1.1          # the sleep and the child's work: the process's age, not the call's
    assert use.cpu_s >= 0.6           # the child's CPU, waited for, is the job's
    assert 200 <= use.max_rss_mb < 500  # its own peak, not its 600 MB spawner's
    assert measured_by_rule(tmp_path)["train"].jobs == 1


def test_torchrun_ranks_record_apart_and_read_as_one_job(tmp_path: Path) -> None:
    record = tmp_path / "timing" / "train" / "c2lip" / "coco" / "seed0.tsv"
    for rank in (0, 1):
        _record(record, {**ENV, "RANK": str(rank)})
    assert sorted(p.name for p in record.parent.iterdir()) == ["seed0.tsv", "seed0.tsv.rank1"]
    # a rank of a former run of the job with more GPUs, written before this run started, is not this job's
    stale = record.parent / "seed0.tsv.rank2"
    stale.write_text("s\tcpu_time\tmax_rss\n5\t500\t9000\n")
    os.utime(stale, (record.stat().st_mtime - 3600,) * 2)
    [use] = read_uses(tmp_path)
    assert 1.2 <= use.cpu_s < 500 and 400 <= use.max_rss_mb < 1000   # both ranks' CPU and memory, not the stale's
    assert use.wall_s < 10


def test_a_command_records_its_use_even_when_it_fails(tmp_path: Path) -> None:
    """The rules pass `--timing {log.timing}` to every timed command; a failure still leaves the record."""
    record = tmp_path / "results" / "timing" / "world" / "eval.tsv"
    run = subprocess.run([sys.executable, "-m", "compo", "world", "--split", "eval", "--world", "{}", "--seed", "0",
                          "--out", str(tmp_path / "out"), "--log", str(tmp_path / "world.log"),
                          "--timing", str(record)], capture_output=True, text=True, env=ENV, timeout=120)
    assert run.returncode == 1, run.stderr
    [use] = read_uses(tmp_path / "results")
    assert use.rule == "world" and use.cpu_s > 0 and use.max_rss_mb > 0


def test_snakemake_benchmark_files_of_earlier_runs_still_read_and_a_stranger_is_named(tmp_path: Path) -> None:
    timing = tmp_path / "timing" / "eval" / "clip-ft" / "coco"
    timing.mkdir(parents=True)
    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    (timing / "seed0.tsv").write_text(header + "0.4\t0:00:00\tNA\tNA\tNA\tNA\tNA\tNA\tNA\tNA\n")  # too short
    (timing / "seed1.tsv").write_text(header + "20.1\t0:00:20\t712.5\t1\t1\t1\t0\t0\t40\t8.0\n")
    assert [(u.wall_s, u.cpu_s, u.max_rss_mb) for u in read_uses(tmp_path)] == [(0.4, 0, 0), (20.1, 8.0, 712.5)]
    (timing / "seed2.tsv").write_text("seconds\tcpu\n1\t1\n")
    with pytest.raises(ValueError, match=r"seed2\.tsv: not a job's resource record .*missing \['cpu_time', "):
        read_uses(tmp_path)
