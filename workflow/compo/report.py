"""The report's tables as standalone HTML pages (Snakemake's report shows HTML results inline; a CSV
result is only a download).

`claims_page` (the claims table, a verdict per claim), `results_page` (every method's headline metrics
and composites, mean and 95 % CI over seeds, from results.csv: `compo.stats.seed_summary`) and
`table_page` (any CSV: negative quality, parse, ConcretePlant) render the workflow's tables as they are;
nothing is recomputed here.
`write_report_tables` (`compo report-tables`) writes them all. Pages are self-contained (inline CSS, no
script, no external resource) so they load in the report's iframe without a request or console error.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from compo.claims import KIND_COLUMNS, claim_why, control_sides, control_word, effect_number, kind_detects
from compo.figures import (
    CLAIMS_COLUMNS,
    SUMMARY_COLUMNS,
    VERDICT_STYLE,
    model_labels,
    ordered_methods,
    read_csv,
)
from compo.io import write_text
from compo.layout import WISEFT_METHOD, is_base

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; font-size: 13px; color: #1a1a1a;
       margin: 16px; background: #ffffff; }
h1 { font-size: 18px; margin: 0 0 6px 0; }
p.warning { color: #8a1c1c; max-width: 1000px; }
p.intro { max-width: 70em; margin: 0 0 12px 0; line-height: 1.4; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid #dddddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f2f2f2; position: sticky; top: 0; }
td.num { text-align: right; white-space: nowrap; }
tr.control td { background: #f7f7fb; }
td.verdict { font-weight: 600; white-space: nowrap; }
td.id { font-weight: 600; min-width: 7em; }
small { color: #555555; }
td.text { min-width: 14em; }
td.wrap { overflow-wrap: anywhere; min-width: 6em; }
table.claims, table.kinds { width: 100%; }
table.claims td.statement { min-width: 16em; }
table.claims td.why { min-width: 14em; }
span.swatch { display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.35em; border-radius: 2px; }
"""


def page(title: str, intro: str, table: str, warning: str = "") -> str:
    """A self-contained HTML page: a heading, a short explanation, a warning (plain text) if any, the table."""
    warned = f'<p class="warning"><strong>{html.escape(warning)}</strong></p>\n' if warning else ""
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head>\n<body>\n"
            f"<h1>{html.escape(title)}</h1>\n<p class=\"intro\">{intro}</p>\n{warned}{table}\n</body></html>\n")


def html_table(header: Sequence[str], rows: Sequence[Sequence[tuple[str, str]]],
               row_classes: Sequence[str] | None = None, table_class: str = "") -> str:
    """rows: per row, (cell html, css class) per column; `table_class` names the table for the CSS."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        cells = "".join(f'<td class="{c}">{v}</td>' if c else f"<td>{v}</td>" for v, c in row)
        body.append(f"<tr{cls}>{cells}</tr>")
    opening = f'<table class="{table_class}">' if table_class else "<table>"
    return f"{opening}\n<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(body) + "\n</tbody></table>"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def p_value(value: Any) -> str:
    if _missing(value):
        return "n/a"
    return "&lt; 0.001" if float(value) < 0.001 else f"{float(value):.3f}"


def effect_cell(effect: Any, low: Any, high: Any, unit: str) -> str:
    def number(value: Any) -> str:
        return "n/a" if _missing(value) else effect_number(value, unit)

    interval = "" if _missing(low) else f" [{number(low)}, {number(high)}]"
    return f"{number(effect)}{interval} {html.escape(str(unit))}"


def claims_page(claims: pd.DataFrame, kinds: pd.DataFrame | None = None) -> str:
    """The claims table: controls first, one verdict per claim (its colour repeats the word; a control's in
    `control_word`s), `why` only where some row has one."""
    claims = claims.assign(order=claims["role"] != "control").sort_values("order", kind="stable")
    sides = control_sides(kinds)
    whys = [claim_why(r) for r in claims.itertuples()]
    # the verdict, the effect and the statement first, and few enough columns to fit the report's ~950 px frame:
    # what is compared, the metric, the expectation, seeds, source and note go on a line under the statement
    header = ["id", "role", "verdict", "effect [95 % CI]", "MDE", "p (Holm)", "p", "statement", "why"]
    rows = []
    for r, why in zip(claims.itertuples(), whys, strict=True):
        colour = VERDICT_STYLE.get(r.verdict, ("#000000", ""))[0]
        word = control_word(sides.get(str(r.id)) if r.role == "control" else None, str(r.verdict))
        expected = f"expected {getattr(r, 'expected', '')}"
        margin = getattr(r, "margin", None)
        if not _missing(margin) and str(margin) not in ("", "0", "0.0"):
            expected += f" (margin {margin})"
        note = "" if _missing(getattr(r, "note", None)) else str(r.note)
        details = " · ".join(str(d) for d in (r.comparison, r.metric, expected, f"{getattr(r, 'n_seeds', '')} seeds",
                                               getattr(r, "source", ""), note) if str(d).strip())
        rows.append([
            (html.escape(str(r.id)), "id"), (html.escape(str(r.role)), ""),
            (f'<span class="swatch" style="background:{colour}"></span>{html.escape(word)}', "verdict"),
            (effect_cell(r.effect, r.ci_low, r.ci_high, str(r.unit)), "num"),
            ("" if _missing(getattr(r, "mde", None)) else effect_number(r.mde, str(r.unit)).lstrip("+"), "num"),
            (p_value(r.p_holm), "num"), (p_value(getattr(r, "p", float("nan"))), "num"),
            (f"{html.escape(str(r.statement))}<br><small>{html.escape(details)}</small>", "statement"),
            (html.escape(why), "why"),
        ])
    if not any(whys):  # an empty column would only take width from the statement
        drop = header.index("why")
        header = header[:drop] + header[drop + 1:]
        rows = [row[:drop] + row[drop + 1:] for row in rows]
    intro = ("Each seed paper's claim measured on this study: the effect with its 95 % confidence interval, the "
             "p-value and its Holm correction across the claims, the minimum detectable effect (MDE: the smallest "
             "effect seen with 80 % power) and the verdict (holds / not detected / reversed / equivalent, or "
             "untestable here where a kind of effect it reads fails its controls, with why). A control's verdict "
             "says what it means for its kind: passes (a positive control that holds, a negative control not "
             "reversed) or fails. The intervals are the raw ones and the verdicts read the Holm-adjusted p (Holm's "
             "step-down correction has no matching interval): where a raw interval clears the null and the "
             "adjusted p does not, why says so. The table above it says, kind by kind, whether this testbed "
             "detects effects of that kind. The controls come first. Verdicts are results, not targets.")
    classes = ["control" if r == "control" else "" for r in claims["role"]]
    return page("Claims", intro, kinds_table(kinds) + "\n" + html_table(header, rows, classes, "claims"))


def kinds_table(kinds: pd.DataFrame | None) -> str:
    """The kinds of effect (compo.claims.kind_table): each kind's controls and whether this testbed detects
    effects of that kind, down to how many points."""
    if kinds is None or kinds.empty:
        return ""
    rows = [[(html.escape(str(r.kind)), "id"), (html.escape(str(r.what)), "text"),
             (html.escape(str(r.positive)), "wrap"), (html.escape(str(r.negative)), "wrap"),
             (html.escape(kind_detects(r)), "text")] for r in kinds.itertuples()]
    return html_table(["kind of effect", "what it reads", "positive control", "negative control",
                       "this testbed"], rows, table_class="kinds")


def _rst(text: Any) -> str:
    """Plain text as one line of reStructuredText (inline markup characters escaped)."""
    text = " ".join(str(text).split())
    for char in "\\*`_|":
        text = text.replace(char, "\\" + char)
    return text


def verdict_counts(claims: pd.DataFrame, kinds: pd.DataFrame | None = None) -> dict[str, dict[str, list[str]]]:
    """{role: {verdict word: [claim ids]}} in the claims table's order (controls in `control_word`s)."""
    sides = control_sides(kinds)
    counts: dict[str, dict[str, list[str]]] = {}
    for r in claims.itertuples():
        word = control_word(sides.get(str(r.id)) if r.role == "control" else None, str(r.verdict))
        counts.setdefault(str(r.role), {}).setdefault(word, []).append(str(r.id))
    return counts


def landing_rst(claims: pd.DataFrame, kinds: pd.DataFrame | None, description: str) -> str:
    """The report's landing page (Snakemake's workflow description): the answer first, what this testbed can
    detect kind by kind and the claims' verdict counts, each linking to the claims table, then `description`
    (workflow/report/workflow.rst, a Jinja template Snakemake renders). The results' text goes in a raw block,
    so nothing in it is read as Jinja."""
    def link(text: str, target: str = "claims.html") -> str:  # Snakemake's link targets open a result by name
        return f"`{text} <{target}_>`__"

    lines = ["{% raw %}", "**What this testbed can detect** (each kind of effect passes its positive and "
             f"negative controls or not; the {link('claims table')} has each control's effect):", ""]
    if kinds is not None and not kinds.empty:
        lines += [".. list-table::", "   :header-rows: 1", "   :class: kinds", "",
                  "   * - kind of effect", "     - what it reads", "     - this testbed"]
        for r in kinds.itertuples():
            lines += [f"   * - {_rst(r.kind)}", f"     - {_rst(r.what)}", f"     - {_rst(kind_detects(r))}"]
    else:
        lines.append("No kinds of effect are declared (config ``effects``).")
    lines += ["", "**The claims' verdicts** (the effects with 95 % CIs, Holm-adjusted p and why in the "
              f"{link('claims table')}; the {link('forest plot', 'claims_forest.png')} draws them):", ""]
    names = {"control": "controls", "claim": "seed papers' claims", "hypothesis": "the study's own hypotheses"}
    for role, words in verdict_counts(claims, kinds).items():
        parts = [link(f"{len(ids)} {_rst(word)}") + f" ({_rst(', '.join(ids))})"
                 for word, ids in words.items()]
        lines.append(f"- {_rst(names.get(role, role))}: " + "; ".join(parts))
    lines += ["{% endraw %}", "", description]
    return "\n".join(lines) + "\n"


def results_page(summary: pd.DataFrame, order: Sequence[str] = ()) -> str:
    """One row per model (method, dataset): the composites, then each benchmark's headline metric, as
    mean [95 % CI] over seeds in percent."""
    summary = summary[~summary["method"].str.match(WISEFT_METHOD)]
    composites = summary["benchmark"] == "composite"
    headline = summary[summary["headline"].astype(bool) & ~composites][["benchmark", "metric"]]
    composite = summary[composites][["benchmark", "metric"]]
    columns = pd.concat([composite.drop_duplicates().sort_values("metric"),
                         headline.drop_duplicates().sort_values("benchmark")])
    keys = list(zip(columns["benchmark"], columns["metric"], strict=True))
    indexed = summary.set_index(["method", "dataset", "benchmark", "metric"])
    models = summary[["method", "dataset"]].drop_duplicates()
    models = models.assign(label=model_labels(models))
    methods = ordered_methods(models["method"], order)
    models = models.assign(r=models["method"].map(methods.index)).sort_values(["r", "dataset"])
    header = ["model", "seeds", *[m if b == "composite" else f"{b} · {m}" for b, m in keys]]
    rows = []
    for model in models.itertuples():
        cells = [(html.escape(model.label), ""), ("", "num")]
        seeds = set()
        for benchmark, metric in keys:
            key = (model.method, model.dataset, benchmark, metric)
            if key not in indexed.index:
                cells.append(("", "num"))
                continue
            row = indexed.loc[key]
            seeds.add(int(row["n_seeds"]))
            interval = "" if _missing(row["ci_low"]) else \
                f" <small>[{100 * row['ci_low']:.1f}, {100 * row['ci_high']:.1f}]</small>"
            cells.append((f"{100 * row['mean']:.1f}{interval}", "num"))
        cells[1] = ("/".join(map(str, sorted(seeds))), "num")
        rows.append(cells)
    intro = ("Every model's composites and each benchmark's headline metric in percent: mean over seeds with the "
             "95 % t-interval in brackets (none with one seed; bases are trained once). Every metric of every "
             "seed is in results_long.csv, every metric's summary in results.csv; WiSE-FT models are in the "
             "WiSE-FT figure.")
    classes = ["control" if is_base(m) else "" for m in models["method"]]
    return page("Results (mean and 95 % CI over seeds)", intro, html_table(header, rows, classes))


def _cell(value: Any) -> tuple[str, str]:
    if isinstance(value, float):
        if math.isnan(value):
            return "", "num"
        if value.is_integer() and abs(value) >= 2:  # a count read back as float (a column with gaps)
            return f"{int(value):,}", "num"
        return (f"{value:.3f}" if abs(value) < 1000 else f"{value:,.0f}"), "num"
    if isinstance(value, int):
        return f"{value:,}", "num"
    return html.escape(str(value)), ""


def table_page(frame: pd.DataFrame, title: str, intro: str,
               formats: dict[str, Callable[[Any], str]] | None = None) -> str:
    """Any table as it is (floats to 3 decimals, empty where not defined)."""
    formats = formats or {}
    rows = [[(formats[c](v), "num") if c in formats else _cell(v) for c, v in zip(frame.columns, row, strict=True)]
            for row in frame.itertuples(index=False)]
    return page(title, html.escape(intro), html_table([str(c) for c in frame.columns], rows))


TABLE_INTROS = {
    "quality": ("Negative quality", "Per generator: slots and valid negatives, and the share of valid negatives "
                "the synthetic world finds truly false, accidentally true (a hard positive) or cannot judge; by "
                "negative type and by concreteness bin of the changed words."),
    "parse": ("Parse quality", "Noun-phrase precision, recall and F1 of the spaCy parse against the world's "
              "ground-truth noun phrases, and captions without words or noun phrases."),
    "concreteplant": ("ConcretePlant (seed 002 Table 1)", "Per sampling policy (hc: high concreteness, lc: low, "
                      "wo: concreteness ignored): captions with a keyword, mean and median keyword concreteness, "
                      "unique keywords, ARO category shares, and the base model's I2T / T2I accuracy on the pairs."),
    "overlap": ("Benchmark images in the training set", "Per benchmark: how many of its images the training set "
                "holds, found by COCO id (file names) or by content (sha256), and whether the config accepts the "
                "overlap (overlap.accept); an overlap not accepted stops the workflow before training."),
}


def write_report_tables(out_dir: str | Path, claims: Path | None = None, summary: Path | None = None,
                        tables: dict[str, list[Path]] | None = None, order: Sequence[str] = (),
                        effects: Path | None = None, landing: Path | None = None) -> list[Path]:
    """Write claims.html, results.html and `{kind}/{dataset}.html` for each kind of TABLE_INTROS given in
    `tables` ({kind: CSV paths}), and with `landing` (the workflow description's template) and `claims` the
    report's landing page workflow.rst (`landing_rst`); returns the pages written."""
    out_dir = Path(out_dir)
    written = []
    if claims is not None:
        kinds = read_csv(effects, KIND_COLUMNS, "kinds-of-effect table") if effects is not None else None
        table = read_csv(claims, CLAIMS_COLUMNS, "claims table")
        written.append(_write(claims_page(table, kinds), out_dir / "claims.html"))
        if landing is not None:
            written.append(_write(landing_rst(table, kinds, Path(landing).read_text()), out_dir / "workflow.rst"))
    if summary is not None:
        frame = read_csv(summary, [*SUMMARY_COLUMNS, "headline"], "summary table (mean and CI over seeds)")
        written.append(_write(results_page(frame, order), out_dir / "results.html"))
    for kind, paths in (tables or {}).items():
        if kind not in TABLE_INTROS:
            raise ValueError(f"unknown report table kind {kind!r} (known: {', '.join(TABLE_INTROS)})")
        title, intro = TABLE_INTROS[kind]
        for path in paths:
            dataset = Path(path).parent.name if Path(path).name == "quality.csv" else Path(path).stem
            frame = pd.read_csv(path)
            written.append(_write(table_page(frame, f"{title}: {dataset}", intro), out_dir / kind / f"{dataset}.html"))
    return written


def _write(text: str, path: Path) -> Path:
    write_text(text, path)
    return path
