"""Peak memory per rule of a finished run, against a workflow profile's mem_mb (issue 10.5).

Every rule with a `benchmark:` file records its job's peak resident memory (Snakemake's `max_rss`, MB)
under `{results}/timing/`. This prints, per rule, the number of jobs, the largest peak, the mem_mb that
peak plus a margin asks for, and the mem_mb the profile gives the rule, flagging rules the profile
starves. The rule of a timing file is found from its path (`timing/<folder>/...`, see RULE_OF_FOLDER).

    python workflow/scripts/bench_memory.py results [--profile workflow/profiles/local] [--margin 1.3]
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from pathlib import Path

import pandas as pd
import yaml

# timing/<folder>/... -> rule (the benchmark paths of workflow/rules/*.smk)
RULE_OF_FOLDER = {"world": "world", "benchmarks": "benchmarks", "dataset": "dataset", "parse": "parse",
                  "concreteness": "concreteness", "attributes": "dataset_attributes", "negatives": "negatives",
                  "eval": "evaluate", "wiseft": "wiseft", "concreteplant": "concreteplant_table",
                  "aggregate.tsv": "aggregate", "claims.tsv": "claims"}


def rule_of(path: Path, timing: Path) -> str:
    parts = path.relative_to(timing).parts
    if parts[0] == "train":
        return "pretrain" if parts[1].startswith("base-") else "train"
    if parts[0] == "eval" and parts[1].startswith("wiseft-"):
        return "evaluate_wiseft"
    if parts[0] == "negatives" and ".shard" in parts[-1]:
        return "negatives_shard"
    return RULE_OF_FOLDER.get(parts[0], parts[0])


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
    timing = Path(args.results) / "timing"
    peaks: dict[str, list[float]] = defaultdict(list)
    for path in timing.rglob("*.tsv"):
        peaks[rule_of(path, timing)].append(float(pd.read_csv(path, sep="\t")["max_rss"].max()))
    default, per_rule = profile_mem_mb(Path(args.profile))
    print(f"{'rule':<22} {'jobs':>5} {'peak MB':>9} {'asks mem_mb':>12} {'profile mem_mb':>15}")
    for rule in sorted(peaks):
        peak = max(peaks[rule])
        asks = int(math.ceil(peak * args.margin / 250) * 250)
        given = per_rule.get(rule, default)
        flag = "  <- below the peak" if given is not None and given < peak else (
            "  <- below peak + margin" if given is not None and given < asks else "")
        print(f"{rule:<22} {len(peaks[rule]):>5} {peak:>9.0f} {asks:>12} {given!s:>15}{flag}")


if __name__ == "__main__":
    main()
