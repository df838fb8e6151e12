"""Caption parsing with spaCy."""


rule parse:
    """Parse every caption of a dataset; report noun-phrase precision/recall against ground truth."""
    conda:
        "../../envs/nlp.yaml"
    input:
        manifest=STUDY.manifest("{dataset}"),
    output:
        parse=f"{R}/parse/{{dataset}}.parquet",
        report=f"{R}/tables/parse/{{dataset}}.csv",  # in the report as HTML (rule report_tables)
    params:
        model=config["parse"]["spacy_model"],
        batch_size=config["parse"]["batch_size"],
    threads: config["parse"].get("threads", 1)
    log:
        main=f"{R}/logs/parse/{{dataset}}.log",
        timing=f"{R}/timing/parse/{{dataset}}.tsv",
    shell:
        "python -m compo parse --manifest {input.manifest:q} --spacy-model {params.model:q}"
        " --batch-size {params.batch_size:q} --threads {threads:q} --out {output.parse:q}"
        " --report {output.report:q} --log {log.main:q} --timing {log.timing:q}"
