"""Peak memory per rule of a finished run, against a workflow profile's mem_mb (issue 10.5).

Every rule with a `benchmark:` file records its job's peak resident memory (Snakemake's `max_rss`, MB)
under `{results}/timing/`. This prints, per rule, the number of jobs, the largest peak, the mem_mb that
peak plus a margin asks for, and the mem_mb the profile gives the rule, flagging rules the profile
starves. The rule of a benchmark file is found from its path (`compo.layout.timing_rule`).

    python workflow/scripts/bench_memory.py results [--profile workflow/profiles/local] [--margin 1.3]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import yaml

from compo.io import read_benchmark_files


def profile_mem_mb(profile: Path) -> tuple[float | None, dict[str, float]]:
    config = yaml.safe_load((profile / "config.yaml").read_text())
    default = (config.get("default-resources") or {}).get("mem_mb")
    per_rule = {rule: spec["mem_mb"] for rule, spec in (config.get("set-resources") or {}).items()
                if isinstance(spec, dict) and "mem_mb" in spec}
    return default, per_rule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="the results folder of a finished run")
    parser.add_argument("--profile", default="workflow/profiles/local")
    parser.add_argument("--margin", type=float, default=1.3, help="asked mem_mb = peak x margin (rounded up)")
    args = parser.parse_args()
    jobs = read_benchmark_files(args.results)
    peaks = jobs.groupby("rule")["max_rss_mb"].agg(["size", "max"])
    default, per_rule = profile_mem_mb(Path(args.profile))
    print(f"{'rule':<22} {'jobs':>5} {'peak MB':>9} {'asks mem_mb':>12} {'profile mem_mb':>15}")
    for rule, (count, peak) in peaks.iterrows():
        asks = int(math.ceil(peak * args.margin / 250) * 250)
        given = per_rule.get(rule, default)
        flag = "  <- below the peak" if given is not None and given < peak else (
            "  <- below peak + margin" if given is not None and given < asks else "")
        print(f"{rule:<22} {int(count):>5} {peak:>9.0f} {asks:>12} {given!s:>15}{flag}")


if __name__ == "__main__":
    main()
