"""Figures and the report's HTML tables, from the tables the study writes (`snakemake --report`).

Every figure and table is a report() output in one of the categories Claims, Compositionality, Data,
Multi-modal and Training (the report lists categories alphabetically, so Claims comes first); its caption
in workflow/report/ says what it shows and which seed figure it reproduces. Within a category, results
are listed by their label. Categories and labels are below; their inputs come from compo.study.
"""

# figure name (compo.figures.FIGURES) -> (report category, label)
FIGURE_REPORT = {
    "claims_forest": ("Claims", "Effects of the claims (forest plot)"),
    "benchmarks": ("Compositionality", "Benchmark subsets by method"),
    "correlations": ("Compositionality", "Benchmark correlations across models"),
    "tradeoff": ("Multi-modal", "Compositionality vs zero-shot trade-off"),
    "wiseft": ("Multi-modal", "WiSE-FT trajectories"),
    "gradient_shares": ("Training", "Gradient shares over training"),
    "training_curves": ("Training", "Training curves"),
    "negative_quality": ("Data", "Negative quality (figure)"),
    "concreteness_gap": ("Data", "Concreteness vs score gap (figure)"),
    "dataset_attributes": ("Data", "Dataset attributes vs scores (figure)"),
}
# per-dataset tables rendered as HTML: kind -> (input table, label)
DATA_TABLES = {
    "quality": (f"{R}/tables/negatives/{{dataset}}/quality.csv", "Negative quality table"),
    "parse": (f"{R}/tables/parse/{{dataset}}.csv", "Parse quality table"),
    "concreteplant": (f"{R}/tables/concreteplant/{{dataset}}.csv", "ConcretePlant table"),
    "overlap": (f"{R}/tables/overlap/{{dataset}}.csv", "Benchmark images in the training set"),
}


rule figures:
    """Every figure of the study as PNG and PDF; a figure the study has no input for is an image saying why,
    and the reason is logged. The report shows report/figures/{name}/, which holds the PNG only when the
    figure was drawn (whether it is, the tables decide), so a notice never shows as a figure."""
    conda:
        "../../envs/stats.yaml"
    input:
        **STUDY.figure_inputs(),
    output:
        **{name: f"{R}/figures/{name}.png" for name in FIGURE_REPORT},
        pdfs=[f"{R}/figures/{name}.pdf" for name in FIGURE_REPORT],
        shown=[
            report(
                directory(f"{R}/report/figures/{name}"),
                patterns=["{figure}.png"],
                caption=f"../report/figures/{name}.rst",
                category=category,
                labels={"result": label},
            )
            for name, (category, label) in FIGURE_REPORT.items()
        ],
    params:
        out=lambda wildcards, output: os.path.dirname(output.pdfs[0]),
        shown=lambda wildcards, output: os.path.dirname(output.shown[0]),
        order=config["study"]["methods"],
        kinds=benchmark_kinds(),
    log:
        f"{R}/logs/figures.log",
    shell:
        "python -m compo figures --summary {input.summary:q} --claims {input.claims:q} --effects {input.effects:q}"
        " --kinds {params.kinds:q}"
        " --correlations {input.correlations:q} --losses {input.losses:q} --quality {input.quality:q}"
        " --pairs {input.pairs:q} --attributes {input.attributes:q} --order {params.order:q}"
        " --out {params.out:q} --shown {params.shown:q} --log {log:q}"


rule report_tables:
    """The claims table, the results table (mean and 95 % CI over seeds) and the per-dataset tables as
    HTML pages for the report, and the report's landing page (the answer above workflow/report/workflow.rst)."""
    conda:
        "../../envs/stats.yaml"
    input:
        **{
            kind: expand(DATA_TABLES[kind][0], dataset=STUDY.data_table_datasets(kind))
            for kind in STUDY.data_table_kinds(DATA_TABLES)
        },
        claims=f"{R}/tables/claims.csv",
        effects=f"{R}/tables/effects.csv",
        summary=f"{R}/tables/results.csv",
        landing=os.path.join(workflow.basedir, "workflow", "report", "workflow.rst"),
    output:
        **{
            kind: [
                report(
                    f"{R}/report/{kind}/{d}.html",
                    caption=f"../report/{kind}.rst",
                    category="Data",
                    labels={"result": f"{DATA_TABLES[kind][1]} ({d})"},
                )
                for d in STUDY.data_table_datasets(kind)
            ]
            for kind in STUDY.data_table_kinds(DATA_TABLES)
        },
        claims=report(
            f"{R}/report/claims.html",
            caption="../report/claims.rst",
            category="Claims",
            labels={"result": "Claims table"},
        ),
        results=report(
            f"{R}/report/results.html",
            caption="../report/results_table.rst",
            category="Claims",
            labels={"result": "Results table (mean and 95 % CI over seeds)"},
        ),
        # the report's landing page (the Snakefile's report directive reads it once it exists)
        landing=f"{R}/report/workflow.rst",
    params:
        out=lambda wildcards, output: os.path.dirname(output.claims),
        order=config["study"]["methods"],
        tables=lambda wildcards, input: [
            word for kind in STUDY.data_table_kinds(DATA_TABLES) for word in (f"--{kind}", *input[kind])
        ],
    log:
        f"{R}/logs/report_tables.log",
    shell:
        "python -m compo report-tables --claims {input.claims:q} --effects {input.effects:q} --summary {input.summary:q}"
        " {params.tables:q} --landing {input.landing:q} --order {params.order:q} --out {params.out:q} --log {log:q}"
