"""The dose-response of the testbed's controls (issue 45, item 3): each kind of effect's positive and negative
control at each fine-tuning dose, measured alike, and the decision rule of docs/embedded-study.md applied.

Each arm is a results folder holding clip-ft, negclip and negclip-random (3 seeds) and their base, evaluated on the
controls' benchmarks: the default study's own (1x) and those of config/dose-x4.yaml and dose-x16.yaml. The controls
(config `claims` with role control) are measured on every arm by the claims' own code (`compo.claims.write_claims`:
bootstrap over seeds then items, Holm over the same 11 controls on every arm, so the doses compare alike; an arm's own
`tables/claims.csv` adjusts over its study's claims), written to `--out/<label>/`. The bases' targets are read from
the same evaluations: clip-ft's and negclip's zero-shot shape and colour (>= 90 %) and their retrieval mean recall (at
least the base's minus 2 points).

    .venv/bin/python tools/dose_response.py --arm 1x=results:350 --arm 4x=results-dose-x4:1400 \
        --arm 16x=results-dose-x16:5600 --out results-dose/tables

Each `--arm LABEL=FOLDER:STEPS` names a results folder and its fine-tuning steps (caption draws = steps x 64); its
evaluations are checked against the model folders beside them (compo.layout.result_model_dir). Prints the markdown
table (and writes it to `--out/dose-response.md`).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from compo.claim_specs import study_claims
from compo.claims import write_claims
from compo.config import load_config
from compo.layout import EVAL_INDEX, LOSSES_CSV, model_dir, parse_model_id
from compo.stats import load_results

REPO = Path(__file__).resolve().parents[2]
METHODS = ("clip-ft", "negclip", "negclip-random")
BATCH = 64
ZERO_SHOT_TARGET, RETRIEVAL_SLACK = 0.90, 0.02  # docs/embedded-study.md, "The dose-response of the controls"


def arm_inputs(folder: Path) -> tuple[list[str], dict[str, str], str]:
    """The evaluation indexes of the controls' models and their base in `folder`, the fine-tunes' losses, and the
    seeds evaluated per fine-tuned method (`clip-ft / negclip / negclip-random`: an arm still under way shows)."""
    models = {}  # evaluation index -> (model id, its parts)
    for index in sorted((folder / "eval").glob(f"*/*/seed*/{EVAL_INDEX}")):
        name = str(index.parent.relative_to(folder / "eval"))
        model = parse_model_id(name)
        if model is not None and (model.method in METHODS or model.method == "base-clip"):
            models[str(index)] = (name, model)
    if not models:
        raise SystemExit(f"{folder}: no evaluated model of {', '.join(METHODS)} (expected {folder}/eval/...)")
    tuned = [(name, model) for name, model in models.values() if model.method in METHODS]
    losses = {name: str(Path(model_dir(str(folder), name)) / LOSSES_CSV) for name, _ in tuned}
    seeds = " / ".join(str(sum(model.method == method for _, model in tuned)) for method in METHODS)
    return list(models), losses, seeds


def targets(indexes: list[str]) -> dict[str, float]:
    """Mean over seeds of the targets' metrics per method (and the base), as fractions."""
    long = load_results(indexes)
    wanted = {("zeroshot-shape", "top1"): "shape", ("zeroshot-colour", "top1"): "colour",
              ("retrieval", "mean_recall"): "retrieval"}
    rows = long[[(b, m) in wanted for b, m in zip(long["benchmark"], long["metric"], strict=True)]]
    means = rows.groupby(["method", "benchmark", "metric"])["value"].mean()
    return {f"{method}/{wanted[(b, m)]}": float(v) for (method, b, m), v in means.items()}


def cell(row: pd.Series) -> str:
    return (f"{row.effect:+.1f} [{row.ci_low:+.1f}, {row.ci_high:+.1f}] (MDE {row.mde:.1f}) {row.verdict}"
            if not math.isnan(row.effect) else "not measured")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arm", action="append", required=True, help="LABEL=RESULTS_FOLDER:STEPS")
    parser.add_argument("--configfile", nargs="+", default=[str(REPO / "config" / "config.yaml"),
                                                            str(REPO / "config" / "dose-x4.yaml")],
                        help="the config whose control claims and effects are measured (default: the dose arms')")
    parser.add_argument("--out", type=Path, required=True, help="folder of each arm's claims tables and the table")
    args = parser.parse_args()
    config = load_config(*args.configfile)
    out_root = args.out.resolve()
    controls = [c for c in study_claims(config) if c.get("role") == "control"]
    effects = {k: v for k, v in config["effects"].items() if "direct" not in v}
    lines = ["| kind | dose (steps; caption draws; seeds) | positive control(s) | negative control | passes | targets "
             "(clip-ft / negclip: shape, colour, retrieval; base retrieval) | adopted |",
             "|---|---|---|---|---|---|---|"]
    for spec in args.arm:
        label, _, rest = spec.partition("=")
        folder, _, steps = rest.rpartition(":")
        folder_path = (Path(folder) if Path(folder).is_absolute() else REPO / folder).resolve()
        indexes, losses, seeds = arm_inputs(folder_path)
        out = out_root / label
        table = write_claims(controls, config.get("composites", {}), indexes, out, losses=losses,
                             base_seeds=[int(config["seed"])], effects=effects).set_index("id")
        kinds = pd.read_csv(out / "effects.csv").set_index("kind")
        got = targets(indexes)
        kept = all(got.get(f"{m}/{t}", 0) >= ZERO_SHOT_TARGET for m in ("clip-ft", "negclip")
                   for t in ("shape", "colour")) and all(
            got.get(f"{m}/retrieval", 0) >= got.get("base-clip/retrieval", 1) - RETRIEVAL_SLACK
            for m in ("clip-ft", "negclip"))
        pct = {key: f"{100 * value:.1f}" for key, value in got.items()}
        target_cell = (f"{pct.get('clip-ft/shape')} / {pct.get('negclip/shape')}, {pct.get('clip-ft/colour')} / "
                       f"{pct.get('negclip/colour')}, {pct.get('clip-ft/retrieval')} / {pct.get('negclip/retrieval')}; "
                       f"{pct.get('base-clip/retrieval')} ({'kept' if kept else 'NOT kept'})")
        for kind, spec_ in effects.items():
            positive = "; ".join(f"{n.removeprefix('control-')}: {cell(table.loc[n])}" for n in spec_["positive"])
            negative = "; ".join(f"{cell(table.loc[n])}" for n in spec_["negative"])
            passes = bool(kinds.loc[kind, "passes"])
            dose = f"{label} ({int(steps):,}; {int(steps) * BATCH:,}; {seeds})"
            lines.append(f"| {kind} | {dose} | {positive} | {negative} | "
                         f"{'yes' if passes else 'no'} | {target_cell} | {'yes' if passes and kept else 'no'} |")
    text = "\n".join(lines) + "\n"
    out_root.mkdir(parents=True, exist_ok=True)
    (out_root / "dose-response.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
