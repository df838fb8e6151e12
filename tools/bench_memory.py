"""Peak memory per rule of a finished run, against a workflow profile's mem_mb (issue 10.5).

Every timed rule's job records its peak resident memory (`max_rss`, MB: compo.resource_use) under
`{results}/timing/`. This prints, per rule, the number of jobs, the largest peak, the mem_mb that
peak plus a margin asks for, and the mem_mb the profile gives the rule, flagging rules the profile
starves; then the same per method for the fine-tuning jobs, against the config's `memory_mb.train`. The
rule of a record is found from its path (`compo.layout.timing_rule`).

    python tools/bench_memory.py results [--profile workflow/profiles/local] [--margin 1.1]
        [--config config/config.yaml]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import yaml

from compo.config import load_config, train_mem_mb
from compo.layout import TIMING_DIR, parse_model_id
from compo_tools.timing import read_resource_records


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
    parser.add_argument("--margin", type=float, default=1.1, help="asked mem_mb = peak x margin (rounded up)")
    parser.add_argument("--config", default="config/config.yaml", help="its memory_mb.train: the fine-tunes' mem_mb")
    args = parser.parse_args()
    jobs = read_resource_records(args.results)
    peaks = jobs.groupby("rule")["max_rss_mb"].agg(["size", "max"])
    default, per_rule = profile_mem_mb(Path(args.profile))
    print(f"{'rule':<22} {'jobs':>5} {'peak MB':>9} {'asks mem_mb':>12} {'profile mem_mb':>15}")
    config = load_config(args.config)
    per_method = train_mem_mb(config, "") is not None
    for rule, (count, peak) in peaks.iterrows():
        given = "per method" if rule == "train" and per_method else per_rule.get(rule, default)
        print(row(rule, count, peak, given, args.margin))
    trains = jobs[jobs["rule"] == "train"]
    if per_method and len(trains):
        timing = Path(args.results) / TIMING_DIR / "train"  # {model id}.tsv
        methods = trains["job"].map(lambda job: parse_model_id(Path(job).relative_to(timing).with_suffix("").as_posix()
                                                               ).method)
        print(f"\n{'train: method':<22} {'jobs':>5} {'peak MB':>9} {'asks mem_mb':>12} {'config mem_mb':>15}")
        for method, (count, peak) in trains.groupby(methods)["max_rss_mb"].agg(["size", "max"]).iterrows():
            print(row(method, count, peak, train_mem_mb(config, method), args.margin))


def row(name: str, count: int, peak: float, given: float | str | None, margin: float) -> str:
    """One line: the peak, what peak x margin asks (rounded up to 50 MB), what is given, and a flag."""
    asks = int(math.ceil(peak * margin / 50) * 50)
    number = given if isinstance(given, int | float) else None
    flag = "  <- below the peak" if number is not None and number < peak else (
        "  <- below peak + margin" if number is not None and number < asks else "")
    return f"{name:<22} {int(count):>5} {peak:>9.0f} {asks:>12} {given!s:>15}{flag}"


if __name__ == "__main__":
    main()
