"""Statistics and tables over every evaluation result."""


rule aggregate:
    """Flatten every evaluation JSON (through each model's evaluation index) into the results table and the
    benchmark correlation table; the reproduction table also reads the study's ablation models."""
    conda:
        "../../envs/stats.yaml"
    input:
        study=STUDY.eval_indexes(),
        ablations=STUDY.reproduction_only_indexes(),
    output:
        results=report(
            f"{R}/tables/results.csv",
            caption="../report/results.rst",
            category="Claims",
            labels={"result": "Results per metric (CSV download)"},
        ),
        results_md=f"{R}/tables/results.md",
        correlations=report(
            f"{R}/tables/correlations.csv",
            caption="../report/correlations.rst",
            category="Compositionality",
            labels={"result": "Benchmark correlations (CSV download)"},
        ),
        correlations_md=f"{R}/tables/correlations.md",
        reproduction=report(
            f"{R}/tables/reproduction.csv",
            caption="../report/reproduction.rst",
            category="Claims",
            labels={"result": "Reported beside reproduced (CSV download)"},
        ),
        reproduction_md=f"{R}/tables/reproduction.md",
    params:
        out=lambda wildcards, output: os.path.dirname(output.results),
        composites=json_arg(config.get("composites", {})),
        reported=json_arg(config.get("reported", [])),
        base_seeds=json_arg(BASE_SEEDS),
        version=package_version(),  # shown by the results' caption in the report (pyproject.toml's)
    log:
        main=f"{R}/logs/aggregate.log",
        timing=f"{R}/timing/aggregate.tsv",
    shell:
        "python -m compo aggregate --inputs {input.study:q} --reproduction-inputs {input.ablations:q}"
        " --composites {params.composites:q} --reported {params.reported:q}"
        " --base-seeds {params.base_seeds:q}"
        " --out {params.out:q} --log {log.main:q} --timing {log.timing:q}"


rule claims:
    """Measure every claim of config `claims` (controls first): effect, 95 % CI (compo.stats.difference_interval),
    Holm-adjusted p, minimum detectable effect and a verdict per claim, `untestable here` where a kind of effect
    it reads (config `effects`) fails its controls; effects.csv: the kinds and their controls."""
    conda:
        "../../envs/stats.yaml"
    input:
        **STUDY.claims_inputs(),
    output:
        claims=report(
            f"{R}/tables/claims.csv",
            caption="../report/claims.rst",
            category="Claims",
            labels={"result": "Claims table (CSV download)"},
        ),
        claims_md=f"{R}/tables/claims.md",
        effects=f"{R}/tables/effects.csv",
    params:
        claims=json_arg(STUDY.claims()),
        # [kind, spec] pairs: the kinds keep the config's order (json_arg sorts the keys of a mapping)
        effects=json_arg(list(config.get("effects", {}).items())),
        composites=json_arg(config.get("composites", {})),
        losses=lambda wildcards, input: [
            f"{model}={path}" for model, path in zip(STUDY.claims_loss_models(), input.losses)
        ],
        pairs=lambda wildcards, input: optional_arg("--pairs", input, "pairs"),
        base_seeds=json_arg(BASE_SEEDS),
        out=lambda wildcards, output: os.path.dirname(output.claims),
    log:
        main=f"{R}/logs/claims.log",
        timing=f"{R}/timing/claims.tsv",
    shell:
        "python -m compo claims --claims {params.claims:q} --composites {params.composites:q} --inputs {input.results:q}"
        " --losses {params.losses:q} {params.pairs:q} --base-seeds {params.base_seeds:q}"
        " --effects {params.effects:q} --out {params.out:q} --log {log.main:q} --timing {log.timing:q}"


rule concreteplant_table:
    """Seed 002 Table 1: keyword statistics of D_hc / D_lc / D_wo and the base model's I2T / T2I accuracy."""
    conda:
        "../../envs/train.yaml"
    input:
        unpack(get_concreteplant_table_inputs),
    output:
        table=f"{R}/tables/concreteplant/{{dataset}}.csv",
        pairs=f"{R}/tables/concreteplant/{{dataset}}.pairs.csv",
    params:
        negatives=lambda wildcards, input: [f"{p}={input[p]}" for p in STUDY.concreteplant_generators()],
        model_dir=lambda wildcards, input: os.path.dirname(input.model),
        device=config.get("evaluate", {}).get("device", "auto"),
        precision=config.get("evaluate", {}).get("precision", "auto"),
    threads: config.get("evaluate", {}).get("threads", 1)
    resources:
        runtime=planned_runtime("concreteplant_table"),
    log:
        main=f"{R}/logs/concreteplant/{{dataset}}.log",
        timing=f"{R}/timing/concreteplant/{{dataset}}.tsv",
    shell:
        "python -m compo concreteplant-table --concreteness {input.concreteness:q} --manifest {input.manifest:q}"
        " --negatives {params.negatives:q} --model-dir {params.model_dir:q} --device {params.device:q}"
        " --precision {params.precision:q} --threads {threads:q} --out {output.table:q} --pairs {output.pairs:q}"
        " --log {log.main:q} --timing {log.timing:q}"


# One target per method of the study or its ablations, e.g. `snakemake method_negclip`: every seed and dataset of
# the method evaluated (its bases included), without the tables.
for method in STUDY.study_and_ablation_methods():

    rule:
        name:
            f"method_{method.replace('-', '_')}"
        input:
            STUDY.eval_indexes(STUDY.method_model_ids(method)),


# One target per ablation group of the config, e.g. `snakemake ablation_degla_table7`.
for group in config.get("ablations", {}):

    rule:
        name:
            f"ablation_{group.replace('-', '_')}"
        conda:
            "../../envs/stats.yaml"
        input:
            STUDY.eval_indexes(STUDY.ablation_model_ids(group)),
        output:
            results=f"{R}/tables/ablations/{group}/results.csv",
            results_md=f"{R}/tables/ablations/{group}/results.md",
            correlations=f"{R}/tables/ablations/{group}/correlations.csv",
            correlations_md=f"{R}/tables/ablations/{group}/correlations.md",
        params:
            out=lambda wildcards, output: os.path.dirname(output.results),
            base_seeds=json_arg(BASE_SEEDS),
        log:
            f"{R}/logs/ablations/{group}.log",
        shell:
            "python -m compo aggregate --inputs {input:q} --base-seeds {params.base_seeds:q} --out {params.out:q} --log {log:q}"
