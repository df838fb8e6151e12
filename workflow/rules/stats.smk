"""Statistics and tables over every evaluation result."""


rule aggregate:
    """Flatten every evaluation JSON into the results table and the benchmark correlation table."""
    conda:
        "../../envs/stats.yaml"
    input:
        get_eval_jsons(),
    output:
        results=report(f"{R}/tables/results.csv", caption="../report/results.rst", category="Results"),
        results_md=f"{R}/tables/results.md",
        correlations=report(
            f"{R}/tables/correlations.csv", caption="../report/correlations.rst", category="Results"
        ),
        correlations_md=f"{R}/tables/correlations.md",
    params:
        out=lambda wildcards, output: os.path.dirname(output.results),
    log:
        f"{R}/logs/aggregate.log",
    shell:
        "compo aggregate --inputs {input} --out {params.out} --log {log}"


rule concreteplant_table:
    """Seed 002 Table 1: keyword statistics of D_hc / D_lc / D_wo and the base model's I2T / T2I accuracy."""
    conda:
        "../../envs/train.yaml"
    input:
        unpack(get_concreteplant_table_inputs),
    output:
        f"{R}/tables/concreteplant/{{dataset}}.csv",
    params:
        negatives=lambda wildcards, input: " ".join(f"{p}={input[p]}" for p in concreteplant_generators()),
        model_dir=lambda wildcards, input: os.path.dirname(input.model),
        device=config.get("evaluate", {}).get("device", "auto"),
        precision=config.get("evaluate", {}).get("precision", "auto"),
    log:
        f"{R}/logs/concreteplant/{{dataset}}.log",
    shell:
        "compo concreteplant-table --concreteness {input.concreteness} --manifest {input.manifest}"
        " --negatives {params.negatives} --model-dir {params.model_dir} --device {params.device}"
        " --precision {params.precision} --out {output} --log {log}"


# One target per ablation group of the config, e.g. `snakemake ablation_degla_table7`.
for group in config.get("ablations", {}):

    rule:
        name:
            f"ablation_{group.replace('-', '_')}"
        conda:
            "../../envs/stats.yaml"
        input:
            ablation_eval_jsons(group),
        output:
            results=f"{R}/tables/ablations/{group}/results.csv",
            results_md=f"{R}/tables/ablations/{group}/results.md",
            correlations=f"{R}/tables/ablations/{group}/correlations.csv",
            correlations_md=f"{R}/tables/ablations/{group}/correlations.md",
        params:
            out=lambda wildcards, output: os.path.dirname(output.results),
        log:
            f"{R}/logs/ablations/{group}.log",
        shell:
            "compo aggregate --inputs {input} --out {params.out} --log {log}"
