"""Dataset attributes of seed 004: images, caption length, vocabulary coverage, Yngve depth."""


rule dataset_attributes:
    """One row of data attributes per training dataset (reference vocabulary: the concreteness norms)."""
    conda:
        "../../envs/nlp.yaml"
    input:
        manifest=STUDY.manifest("{dataset}"),
        parse=f"{R}/parse/{{dataset}}.parquet",
        norms=norms_files(config["concreteness"]),
    output:
        f"{R}/tables/datasets/{{dataset}}.csv",
    params:
        norms=norms_args(config["concreteness"]),
    log:
        main=f"{R}/logs/attributes/{{dataset}}.log",
        timing=f"{R}/timing/attributes/{{dataset}}.tsv",
    shell:
        "python -m compo attributes --manifest {input.manifest:q} --parse {input.parse:q} --dataset {wildcards.dataset:q}"
        " {params.norms:q} --out {output:q} --log {log.main:q} --timing {log.timing:q}"
