"""docs/paper-scale.md's table of the GPU rules: per rule of a study under a profile, the GPU-hours asked, the plan's
estimate (`compo.plan`) and the first-principles figure (`compo.first_principles`), with the ratio of the two.

    python tools/paper_scale_table.py --configfile config/paper.yaml --profile workflow/profiles/slurm
"""

from __future__ import annotations

import argparse
from pathlib import Path

from compo import plan
from compo.config import load_config
from compo_tools import first_principles

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configfile", nargs="+", required=True)
    parser.add_argument("--profile", required=True)
    args = parser.parse_args()
    config = load_config(*args.configfile)
    jobs = plan.parse_dry_run(plan.dry_run(args.configfile, args.profile, str(REPO / "Snakefile"), str(REPO)),
                              plan.local_rules(str(REPO / "Snakefile")))
    rows: dict[str, list[float]] = {}
    for job in jobs:
        gpus = int(job.resources.get("gpu", 0) or 0)
        if not gpus:
            continue
        gpu_model = job.resources.get("gpu_model")
        estimate = plan.job_estimate(config, job)
        work = first_principles.job_minutes(config, job.rule, job.wildcards, gpu_model)
        row = rows.setdefault(job.rule, [0, 0.0, 0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += gpus * float(job.resources.get("runtime", 0) or 0) / 60
        row[2] += gpus * (estimate or 0) / 60
        row[3] += gpus * (work or 0) / 60
        row[4] = max(row[4], (estimate or 0) / (work or float("nan")))
    print("| rule | jobs | GPU-h asked | estimated | first principles | estimate / first principles |")
    print("|---|---|---|---|---|---|")
    for rule, (count, asked, estimated, work, _) in sorted(rows.items(), key=lambda r: -r[1][1]):
        print(f"| {rule} | {count} | {asked:,.0f} | {estimated:,.0f} | {work:,.0f} | {estimated / work:.2f} |")
    totals = [sum(r[i] for r in rows.values()) for i in range(1, 4)]
    print(f"| all GPU rules | {sum(r[0] for r in rows.values())} | {totals[0]:,.0f} | {totals[1]:,.0f} | "
          f"{totals[2]:,.0f} | {totals[1] / totals[2]:.2f} |")


if __name__ == "__main__":
    main()
