"""compo.figures and compo.report on small literal tables (tests/figure_fixtures.py): every figure is written
and shows the fixture's numbers, a missing input becomes a notice with its reason, a malformed one an error."""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from figure_fixtures import CLAIMS, EFFECTS, QUALITY, summary_table, write_inputs
from PIL import Image

from compo import figures
from compo.figures import FIGURES, FigureInputs, draw_figures
from compo.report import claims_page, results_page, table_page, write_report_tables


@pytest.fixture
def inputs(tmp_path) -> FigureInputs:
    return write_inputs(tmp_path)


def image_content(path: Path) -> int:
    """Distinct colours of a PNG (1: blank); opening and loading it also checks it decodes."""
    with Image.open(path) as image:
        image.load()
        return len(image.convert("RGB").getcolors(maxcolors=1 << 20) or [])


def test_every_figure_is_written_as_png_and_pdf(inputs, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="compo.figures"):
        outcome = draw_figures(inputs, tmp_path / "figures")
    assert set(outcome) == set(FIGURES)
    # the fixture trains every method on one dataset: attributes vs scores has nothing to relate
    assert outcome.pop("dataset_attributes").startswith("every method of this study trains on one dataset")
    assert set(outcome.values()) == {"drawn"}
    for name in FIGURES:
        assert image_content(tmp_path / "figures" / f"{name}.png") > 20, name
        assert (tmp_path / "figures" / f"{name}.pdf").read_bytes().startswith(b"%PDF"), name
    assert "figure dataset_attributes not drawn: every method" in caplog.text


def test_a_figure_without_its_input_is_a_notice_with_the_reason(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="compo.figures"):
        outcome = draw_figures(FigureInputs(), tmp_path, ["tradeoff", "concreteness_gap", "gradient_shares"])
    assert outcome == {
        "tradeoff": "the study wrote no summary table (mean and CI over seeds)",
        "concreteness_gap": "the study wrote no ConcretePlant per-pair table "
                            "(no ConcretePlant negatives in the config)",
        "gradient_shares": "the study wrote no training logs (losses.csv)",
    }
    assert "figure tradeoff not drawn: the study wrote no summary table" in caplog.text
    assert image_content(tmp_path / "tradeoff.png") > 2  # the notice's text


def test_a_study_without_the_compositional_composite_gets_notices_not_errors(inputs, tmp_path):
    # config/quick.yaml declares only the zero-shot composite: the figures that read the compositional one
    # say so (its summary's method column is read as pandas' string dtype, where an empty selection must not
    # meet a boolean mask)
    summary = pd.read_csv(inputs.summary)
    summary[summary["metric"] != "compositional"].to_csv(tmp_path / "results.csv", index=False)
    quick = dataclasses.replace(inputs, summary=tmp_path / "results.csv")
    outcome = draw_figures(quick, tmp_path / "figures", ["dataset_attributes", "tradeoff", "benchmarks"])
    assert outcome["dataset_attributes"] == "the summary table has no 'compositional' composite (config composites)"
    assert "compositional" in outcome["tradeoff"] and outcome["benchmarks"] == "drawn"


def test_gradient_shares_need_cements_logged_shares(inputs, tmp_path):
    plain = [p for p in inputs.losses if "/clip-ft/" in p.as_posix()]
    outcome = draw_figures(FigureInputs(losses=plain), tmp_path, ["gradient_shares", "training_curves"])
    assert outcome["gradient_shares"].startswith("no training log has Cement's gradient shares")
    assert outcome["training_curves"] == "drawn"


def test_the_report_gets_the_drawn_figures_only(inputs, tmp_path):
    """rule figures' report shows `{shown}/{name}/`: a drawn figure's PNG is there, a notice is not (an earlier
    run's copy of a figure now not drawn is removed), so a notice never shows as a figure."""
    shown = tmp_path / "shown"
    (shown / "gradient_shares").mkdir(parents=True)
    (shown / "gradient_shares" / "gradient_shares.png").write_bytes(b"an earlier run's figure")
    plain = [p for p in inputs.losses if "/clip-ft/" in p.as_posix()]
    outcome = draw_figures(FigureInputs(losses=plain), tmp_path / "figures", ["gradient_shares", "training_curves"],
                           shown_dir=shown)
    assert outcome["gradient_shares"] != "drawn" and outcome["training_curves"] == "drawn"
    assert sorted(p.relative_to(shown).as_posix() for p in shown.rglob("*")) == [
        "gradient_shares", "training_curves", "training_curves/training_curves.png"]
    copy = (shown / "training_curves" / "training_curves.png").read_bytes()
    assert copy == (tmp_path / "figures" / "training_curves.png").read_bytes()
    assert (tmp_path / "figures" / "gradient_shares.png").exists()  # the notice stays in the figures folder


def test_a_malformed_input_names_the_file_and_column(inputs, tmp_path):
    summary = pd.read_csv(inputs.summary).drop(columns="ci_low")
    summary.to_csv(tmp_path / "results.csv", index=False)
    inputs.summary = tmp_path / "results.csv"
    with pytest.raises(ValueError, match=r"results\.csv: missing column\(s\) ci_low of the summary table"):
        draw_figures(inputs, tmp_path / "out", ["tradeoff"])
    claims = CLAIMS.assign(verdict=["holds", "maybe", "holds", "holds"])
    claims.to_csv(tmp_path / "claims.csv", index=False)
    with pytest.raises(ValueError, match=r"claims\.csv: column 'verdict' has \['maybe'\]"):
        figures.figure_claims(FigureInputs(claims=tmp_path / "claims.csv"))


def test_tradeoff_places_each_method_at_its_composite_means(inputs):
    figures._style()
    fig = figures.figure_tradeoff(inputs)
    points = {c.get_label(): tuple(c.lines[0].get_xydata()[0]) for c in fig.axes[0].containers}
    # zero-shot = shape top1; compositional = mean of sugarcrepe overall and winoground group, per seed
    assert points == {"base-clip": pytest.approx((92.0, 40.0)), "clip-ft": pytest.approx((90.0, 42.0)),
                      "negclip": pytest.approx((87.0, 46.5))}


def test_wiseft_draws_each_methods_trajectory_in_alpha_order(inputs):
    fig = figures.figure_wiseft(inputs)
    (container,) = fig.axes[0].containers
    assert container.get_label() == "negclip"
    path = container.lines[0].get_xydata()
    assert path[:, 0] == pytest.approx([92.0, 91.0, 87.0])
    assert path[:, 1] == pytest.approx([40.0, 45.0, 140 / 3])
    assert [t.get_text() for t in fig.axes[0].texts] == ["α=0", "α=1"]


def test_benchmark_panels_are_the_subsets_in_the_study():
    summary = pd.DataFrame({
        "benchmark": ["sugarcrepe"] * 4 + ["wino"] * 2 + ["valse"] * 3 + ["zeroshot-shape"] + ["aro_relation"] * 2
        + ["composite"],
        "metric": ["overall", "swap_att", "replace_obj", "swap", "group", "text", "mean", "relations", "foil-it",
                   "top1", "macro", "relation/above", "compositional"],
    })
    kinds = {"sugarcrepe": "sugarcrepe", "wino": "winoground", "valse": "valse", "zeroshot-shape": "zeroshot",
             "aro_relation": "aro_relation"}
    assert figures.benchmark_panels(summary, kinds) == [
        ("sugarcrepe", "sugarcrepe", "replace_obj"), ("sugarcrepe", "sugarcrepe", "swap_att"),
        ("wino", "winoground", "text"), ("wino", "winoground", "group"),
        ("valse", "valse", "relations"), ("valse", "valse", "foil-it"),
        ("aro_relation", "aro_relation", "macro"),
    ]  # the study's benchmark order; each kind's subsets in its declaration's order
    assert figures.chance_level("winoground", "group") == pytest.approx(1 / 6)
    assert figures.chance_level("sugarcrepe_pp", "itt_swap_att") == pytest.approx(1 / 3)
    assert figures.chance_level("zeroshot", "top1") is None


def test_benchmark_bars_show_means_in_percent(inputs):
    fig = figures.figure_benchmarks(inputs)
    swap = next(ax for ax in fig.axes if ax.get_title() == "sugarcrepe\nswap_att")
    widths = [bar.get_width() for bar in swap.patches]
    assert widths == pytest.approx([55.0, 57.0, 72.0])  # base-clip, clip-ft, negclip
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["base-clip", "clip-ft", "negclip"]


def test_claims_forest_lists_controls_first_with_verdict_and_p(inputs):
    fig = figures.figure_claims(inputs)
    points, rho, verdicts = fig.axes[0], fig.axes[1], fig.axes[2]  # a panel per unit; twins (verdicts) after
    # whole labels, wrapped at FOREST_LABEL_CHARS, never cut
    assert [t.get_text() for t in points.get_yticklabels()] == [
        "[control] control-positive\n(negclip vs clip-ft)",
        "[control] control-negative\n(negclip-random vs clip-ft)",
        "degla-hn (degla-cn vs clip-ft)"]
    assert all(t.get_fontsize() == figures.FOREST_LABEL_PT for t in points.get_yticklabels())
    # a control's verdict in what it means for its kind (effects.csv: control-negative is binding's negative one)
    assert [t.get_text() for t in verdicts.get_yticklabels()] == [
        "passes (p_Holm < 0.001)", "passes (p_Holm 1.000)", "reversed (p_Holm 0.030)"]
    assert points.get_xlabel() == "effect (percentage points)" and rho.get_xlabel() == "Spearman ρ"
    markers = [line for line in points.lines if len(line.get_xdata()) == 1 and line.get_marker() != "None"]
    assert [(m.get_xdata()[0], m.get_color()) for m in markers] == [
        (15.0, "#0072B2"), (0.4, "#888888"), (-2.0, "#D55E00")]


def test_correlation_heatmap_writes_rho_with_ci_and_frames_aro_vs_sugarcrepe_pp(inputs):
    fig = figures.figure_correlations(inputs)
    ax = fig.axes[0]
    cells = sorted(t.get_text() for t in ax.texts)
    assert cells == ["+0.50\n[-0.10, +0.90]", "-0.37\n[-0.80, +0.20]", "n/a"]
    frames = [p for p in ax.patches if not p.get_fill()]
    assert len(frames) == 1 and frames[0].get_xy() == (-0.5, 0.5)  # row sugarcrepe_pp, column aro_relation


def test_a_correlation_table_of_many_benchmarks_draws_the_compositional_ones(tmp_path):
    """The paper study's 87 headline metrics made a 70 x 60 in heatmap: past MAX_CORRELATION_METRICS the figure
    keeps the compositional kinds' metrics and says how many of how many; a smaller table is drawn whole."""
    from itertools import combinations

    compositional = ["sugarcrepe/overall", "aro_relation/macro", "winoground/group"]
    names = compositional + [f"zs{i}/top1" for i in range(figures.MAX_CORRELATION_METRICS)]
    rows = [{"metric_a": a, "metric_b": b, "rho": 0.5, "n": 4} for a, b in combinations(names, 2)]
    path = tmp_path / "correlations.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    kinds = {"sugarcrepe": "sugarcrepe", "aro_relation": "aro_relation", "winoground": "winoground",
             **{f"zs{i}": "zeroshot" for i in range(figures.MAX_CORRELATION_METRICS)}}
    fig = figures.figure_correlations(figures.FigureInputs(correlations=path, kinds=kinds))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [figures.short_metric(n) for n in compositional[1:]]
    assert "the 3 compositional of 23 metrics" in ax.get_title() and len(ax.texts) == 3
    drawn_whole = pd.DataFrame(rows[:1])  # two metrics: under the cap
    drawn_whole.to_csv(path, index=False)
    fig = figures.figure_correlations(figures.FigureInputs(correlations=path, kinds=kinds))
    assert "compositional of" not in fig.axes[0].get_title() and len(fig.axes[0].texts) == 1


def test_gradient_shares_compare_hard_push_over_pull(inputs):
    fig = figures.figure_gradient_shares(inputs)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert titles == ["cement-none (3 seeds)", "cement (3 seeds)", "hard-negative push as a share of the pull"]
    ratio = {line.get_label(): line.get_ydata() for line in fig.axes[2].lines}
    # per seed s: hard 0.1 + 0.01 s, pull 0.6 + 0.01 s; the mean of the three ratios
    expected = np.mean([0.10 / 0.60, 0.11 / 0.61, 0.12 / 0.62])
    assert ratio["cement"] == pytest.approx(np.full(12, expected))


def test_training_curves_draw_every_loss_term_per_model(inputs):
    fig = figures.figure_training_curves(inputs)
    panels = {ax.get_title(): [line.get_label() for line in ax.lines] for ax in fig.axes if ax.get_visible()}
    assert panels == {"clip-ft (3 seeds)": ["loss", "i2t", "t2i"], "cement-none (3 seeds)": ["loss", "i2t", "t2i"],
                      "cement (3 seeds)": ["loss", "i2t", "t2i"]}
    first = next(line for line in fig.axes[0].lines if line.get_label() == "i2t")
    assert first.get_ydata()[0] == pytest.approx(np.mean([2.0, 2.1, 2.2]))  # 2/step + 0.1 seed, step 1


def test_training_curves_tell_apart_more_terms_than_the_palette_has_colours(tmp_path):
    # the default study logs some 30 distinct terms across its methods; 24 styles before any repeats
    folder = tmp_path / "results" / "models" / "many" / "coco" / "seed0"
    folder.mkdir(parents=True)
    frame = pd.DataFrame({"step": [1, 2], "epoch": 0, "lr": 1e-4, "seconds": 0.5})
    for k in range(24):
        frame[f"term{k}"] = [1.0 + k, 0.5 + k]
    frame["loss"] = frame[[f"term{k}" for k in range(24)]].sum(axis=1)
    frame.to_csv(folder / "losses.csv", index=False)
    fig = figures.figure_training_curves(FigureInputs(losses=[folder / "losses.csv"]))
    styles = {(line.get_color(), line.get_linestyle()) for line in fig.axes[0].lines}
    assert len(fig.axes[0].lines) == len(styles) == 25


def test_negative_quality_stacks_truth_shares_and_leaves_empty_bins_out(inputs):
    fig = figures.figure_negative_quality(inputs)
    hc, swap = fig.axes[0], fig.axes[1]
    assert hc.get_title() == "coco · concrete-hc" and swap.get_title() == "coco · swap"
    assert [t.get_text() for t in swap.get_xticklabels()] == ["all", "unrated"]
    heights = [bar.get_height() for bar in hc.patches]
    assert heights == pytest.approx([50, 25, 62.5, 10, 25, 2.5, 40, 50, 35])  # false, true, unknown per bin


def test_concreteness_gap_counts_pairs_without_a_rated_keyword(inputs):
    fig = figures.figure_concreteness_gap(inputs)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[:3] == [f"coco · {label}\n29 pairs (1 unrated left out)" for label, _ in
                          figures.POLICY_STYLE.values()]
    assert [line.get_label() for line in fig.axes[3].lines if not line.get_label().startswith("_")] == [
        label for label, _ in figures.POLICY_STYLE.values()]


def test_helpers_order_style_and_smooth():
    assert figures.ordered_methods(["negclip", "base-clip", "zzz", "clip-ft"], ["clip-ft", "negclip"]) == [
        "base-clip", "clip-ft", "negclip", "zzz"]
    styles = figures.method_styles([f"m{i}" for i in range(20)])
    assert len({(s["color"], s["marker"]) for s in styles.values()}) == 20
    frame = pd.DataFrame({"method": ["lss", "lss", "negclip"], "dataset": ["coco", "long", "coco"]})
    assert list(figures.model_labels(frame)) == ["lss (coco)", "lss (long)", "negclip"]
    assert figures.smoothing_window(49) == 1 and figures.smoothing_window(500) == 10
    assert figures.margin_bounds(">=", 2) == [-2.0] and figures.margin_bounds("<=", 2.0) == [2.0]
    assert figures.margin_bounds("+", 1) == [-1.0, 1.0] and figures.margin_bounds("+", 0) == []
    band = figures.seed_band(pd.DataFrame({"step": [1, 1, 2, 2], "seed": [0, 1, 0, 1], "x": [1.0, 3.0, 5.0, 9.0]}), "x")
    assert band.to_dict("list") == {"step": [1, 2], "mean": [2.0, 7.0], "low": [1.0, 5.0], "high": [3.0, 9.0]}
    assert figures.model_of(Path("results/models/cement/coco/seed2/losses.csv")) == ("cement", "coco", 2)
    with pytest.raises(ValueError, match="expected results/models/<method>/<dataset>/seed<N>/losses.csv"):
        figures.model_of(Path("elsewhere/losses.csv"))


# --- the report's HTML tables --------------------------------------------------------------------------
def rows_of(page: str) -> list[str]:
    return re.findall(r"<tr[^>]*>(.*?)</tr>", page.split("<tbody>")[1])


def test_claims_page_lists_controls_first_with_a_verdict_each():
    claims = CLAIMS.iloc[[2, 0, 3, 1]]  # controls out of order in the file
    page = claims_page(claims)
    rows = rows_of(page)
    assert [re.search(r'<td class="id">([^<]*)</td>', r)[1] for r in rows] == [
        "control-positive", "control-negative", "degla-hn", "lss-rank"]
    assert [re.search(r'class="verdict">.*?</span>([^<]*)</td>', r)[1] for r in rows] == [
        "holds", "not detected", "reversed", "not detected"]
    assert "+15.0 [+11.0, +19.0] points" in rows[0] and "&lt; 0.001" in rows[0]
    assert "+0.350 [-0.200, +0.800] rho" in rows[3]  # as in claims.md (compo.claims.effect_number)
    # the kinds of effect open the page, each saying whether this testbed detects it
    kinds = pd.DataFrame([
        {"kind": "binding", "what": "w", "passes": False, "positive": "control-positive: +1.0 [-2.0, +4.0], not "
         "detected", "negative": "n", "mde": 6.5, "reads": "degla-hn", "why": "its positive control is not detected"},
        {"kind": "recognition", "what": "w", "passes": True, "positive": "none needed", "negative": "none needed",
         "mde": float("nan"), "reads": "", "why": "read directly: the accuracy itself"}])
    with_kinds = claims_page(claims, kinds)
    assert with_kinds.index("cannot detect effects of this kind: its positive control is not detected") < \
        with_kinds.index("control-negative")
    assert "read directly: the accuracy itself" in with_kinds


def test_results_page_shows_mean_and_ci_in_percent():
    page = results_page(summary_table(), order=["clip-ft", "negclip"])
    header = re.findall(r"<th>([^<]*)</th>", page)
    assert header == ["model", "seeds", "compositional", "zero-shot", "sugarcrepe · overall", "winoground · group",
                      "zeroshot-shape · top1"]
    rows = rows_of(page)
    assert [re.search(r"<td>([^<]*)</td>", r)[1] for r in rows] == ["base-clip", "clip-ft", "negclip"]
    # negclip sugarcrepe overall: 0.80, 0.79, 0.81 -> mean 80.0, t(0.975, 2) * 1.0 / sqrt(3) = 2.48 points
    assert "80.0 <small>[77.5, 82.5]</small>" in rows[2]
    assert '<td class="num">70.0</td>' in rows[0] and '<td class="num">1</td>' in rows[0]  # one seed: no CI


def test_table_pages_and_written_files(inputs, tmp_path):
    page = table_page(QUALITY, "Negative quality: coco", "intro")
    assert len(rows_of(page)) == len(QUALITY) and "<th>false_rate</th>" in page and "0.625" in page
    parse = tmp_path / "parse.csv"
    pd.DataFrame({"group": ["all"], "np_f1": [0.77]}).to_csv(parse, index=False)
    written = write_report_tables(tmp_path / "report", claims=inputs.claims, summary=inputs.summary,
                                  tables={"quality": inputs.quality, "parse": [parse]})
    assert sorted(p.relative_to(tmp_path / "report").as_posix() for p in written) == [
        "claims.html", "parse/parse.html", "quality/coco.html", "results.html"]
    assert "<script" not in "".join(p.read_text() for p in written)  # self-contained, nothing to run


def test_a_controls_verdict_reads_what_it_means_for_its_kind():
    from compo.claims import control_sides, control_word

    assert control_sides(EFFECTS) == {"control-positive": "positive", "control-negative": "negative"}
    assert [control_word("negative", v) for v in ("not detected", "holds", "equivalent", "reversed")] == [
        "passes", "passes", "passes", "fails (reversed)"]
    assert [control_word("positive", v) for v in ("holds", "not detected", "reversed")] == [
        "passes", "fails (not detected)", "fails (reversed)"]
    assert control_word(None, "not detected") == "not detected"  # a claim keeps its verdict


def test_holm_note_explains_a_raw_interval_that_the_adjusted_p_does_not_count():
    from compo.claims import holm_note

    assert "not after Holm's correction (p_Holm 0.08)" in holm_note(0.01, 0.08)
    assert holm_note(0.01, 0.03) == "" and holm_note(0.2, 0.6) == "" and holm_note(float("nan"), 0.5) == ""


def test_claims_page_shows_why_only_when_some_row_has_one_and_controls_in_their_words():
    header = lambda page: re.findall(r"<th>([^<]*)</th>", page.split("<table class=\"claims\">")[1])  # noqa: E731
    page = claims_page(CLAIMS, EFFECTS)
    assert header(page) == ["id", "role", "verdict", "effect [95 % CI]", "MDE", "p (Holm)", "p", "statement"]
    words = [re.search(r'class="verdict">.*?</span>([^<]*)</td>', r)[1] for r in rows_of(page.split("</table>")[1])]
    assert words == ["passes", "passes", "reversed", "not detected"]
    # a raw CI clearing 0 whose Holm p does not: why says so
    raw_only = CLAIMS.assign(p=[0.0001, 0.6, 0.01, 0.3], p_holm=[0.0004, 1.0, 0.07, 0.6])
    page = claims_page(raw_only, EFFECTS)
    assert header(page)[7:] == ["statement", "why"]
    assert "but not after Holm&#x27;s correction (p_Holm 0.07)" in page


def test_landing_page_holds_the_kinds_and_the_verdict_counts_as_valid_rst():
    from docutils.core import publish_parts
    from jinja2 import Environment

    from compo.report import landing_rst

    text = landing_rst(CLAIMS, EFFECTS, "The description {{ word }}.")
    assert text.index("What this testbed can detect") < text.index("The description")
    assert "cannot detect effects of this kind: its negative control control-negative is reversed" in text
    assert "`2 passes <claims.html_>`__ (control-positive, control-negative)" in text
    assert "`1 reversed <claims.html_>`__ (degla-hn)" in text
    # as Snakemake renders it: Jinja (the results' text raw), then docutils with its link targets
    targets = "\n\n.. _claims.html: javascript:x()\n.. _claims_forest.png: javascript:y()\n"
    rendered = Environment().from_string(text + targets).render(word="rendered")
    html = publish_parts(rendered, writer_name="html")["html_body"]
    assert "System Message" not in html and "The description rendered." in html
    assert html.count('href="javascript:x()"') == 2 + 3  # two in the prose, one per verdict count
    assert "<table" in html and "which attribute goes with which object" in html
