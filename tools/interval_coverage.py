"""Do the claims' 95 % intervals hold the true difference 95 % of the time at this study's design?

Fits the variance components of `compo_tools.power.Design` (items, method x item, bases, seeds) to two methods'
per-item predictions in a finished study (a difference claim's pair, e.g. a control's negclip vs clip-ft), metric
by metric, then draws whole studies from each fitted design, at its own seeds, bases and item count (and at one
base when the study had several), builds every interval of `compo.stats.INTERVALS` as the claims do, and prints
how often each holds the truth, its mean width and its power at the simulated effect:

    python tools/interval_coverage.py --results results --methods negclip clip-ft --base-seeds 0 1 \
        --metrics sugarcrepe/swap_att sugarcrepe/swap aro_order/precision_at_1 --simulations 1000

`--effect` (points, default 0) is the true difference simulated (shifted on the probability scale, clipping
included). docs/intervals.md and docs/embedded-study.md quote the figures.
"""

from __future__ import annotations

import argparse
import glob
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

from compo.claim_specs import Claim  # noqa: E402
from compo.claims import StudyResults  # noqa: E402
from compo.layout import base_seed_for  # noqa: E402
from compo.stats import INTERVALS  # noqa: E402
from compo_tools.power import coverage, fit_design  # noqa: E402


def per_item(results: StudyResults, method: str, metric: str) -> np.ndarray:
    """The method's per-item correctness [seeds, items] behind `metric` (one component, e.g. SugarCrepe's
    swap over its two subsets)."""
    claim = Claim(id="coverage", statement="", compare=[method, method], metric=metric, expected="+")
    dataset = results.dataset_of(method, claim)
    measure = results.measure(method, dataset, metric, claim)
    if len(measure) != 1 or measure[0].macro:
        raise SystemExit(f"{metric}: {len(measure)} components (macro: {measure[0].macro}); pick a metric that "
                         "is one micro mean over its items")
    return measure[0].values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, required=True, help="a finished study's results folder")
    parser.add_argument("--methods", nargs=2, default=["negclip", "clip-ft"], help="the pair compared (a b)")
    parser.add_argument("--metrics", nargs="+", default=["sugarcrepe/swap_att", "sugarcrepe/swap",
                                                         "sugarcrepe/replace", "aro_order/precision_at_1"])
    parser.add_argument("--base-seeds", type=int, nargs="*", default=None,
                        help="the study's study.base_seeds (default: one base)")
    parser.add_argument("--effect", type=float, default=0.0, help="true difference simulated, points")
    parser.add_argument("--simulations", type=int, default=1000)
    parser.add_argument("--draws", type=int, default=1000, help="bootstrap replicates per interval")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    results = StudyResults(sorted(glob.glob(str(args.results / "eval" / "*" / "*" / "*" / "*.json"))), {})
    print(f"{args.results}: {args.methods[0]} vs {args.methods[1]}; {args.simulations} simulated studies per design, "
          f"{args.draws} bootstrap draws per interval, true difference {args.effect:+.1f} points")
    for metric in args.metrics:
        a, b = (per_item(results, m, metric) for m in args.methods)
        seeds = results.seeds(args.methods[1], results.dataset_of(args.methods[1], Claim(
            id="coverage", statement="", compare=args.methods, metric=metric, expected="+")))
        labels = np.array([base_seed_for(s, args.base_seeds) if args.base_seeds else 0 for s in seeds])
        fitted = fit_design(a, b, labels)
        print(f"\n{metric}: {a.shape[1]} items, {len(seeds)} seeds over {fitted.bases} base(s); fitted (probability "
              f"scale, as sd in points): accuracy {100 * fitted.accuracy:.1f}, items "
              f"{100 * np.sqrt(fitted.item_var):.1f}, method x item {100 * np.sqrt(fitted.method_item_var):.1f}, "
              f"method x base {100 * np.sqrt(fitted.base_var):.2f}, method x seed {100 * np.sqrt(fitted.seed_var):.2f}")
        # the study's own design, and the default study's one base
        designs = [fitted.with_design(seeds=3, bases=n) for n in dict.fromkeys((fitted.bases, 1))]
        for design in designs:
            # the claims' estimand (the effect on the study's own bases) for every interval, then the effect over
            # a population of bases where there are several bases to resample
            variants = [(name, True) for name in INTERVALS] + [(name, False) for name in INTERVALS
                                                               if design.bases > 1]
            for interval, bases_fixed in variants:
                began = time.perf_counter()
                figures = coverage(design, args.effect / 100, interval, args.simulations, args.draws, args.seed,
                                   bases_fixed=bases_fixed)
                estimand = "these bases" if bases_fixed else "over bases"
                print(f"  {design.seeds} seeds x {design.bases} base(s), effect on {estimand:>11}, "
                      f"{interval:>21} interval: coverage {100 * figures['coverage']:.1f} %, mean width "
                      f"{100 * figures['width']:.1f} points, power {100 * figures['power']:.1f} % (truth "
                      f"{100 * figures['truth']:+.2f}; {time.perf_counter() - began:.0f} s)", flush=True)


if __name__ == "__main__":
    main()

