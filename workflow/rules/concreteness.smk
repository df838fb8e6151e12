"""Concreteness: Brysbaert et al. (2014) ratings of each caption's keyword candidates."""


rule concreteness:
    """Rate every keyword candidate (lemmas and two-word expressions); pick ConcretePlant's keyword per
    policy (hc, lc, wo) with its ARO category."""
    conda:
        "../../envs/nlp.yaml"
    input:
        parse=f"{R}/parse/{{dataset}}.parquet",
        norms=norms_files(config["concreteness"]),
    output:
        f"{R}/concreteness/{{dataset}}.parquet",
    params:
        norms=norms_args(config["concreteness"]),
        seed=config["seed"],
    log:
        main=f"{R}/logs/concreteness/{{dataset}}.log",
        timing=f"{R}/timing/concreteness/{{dataset}}.tsv",
    shell:
        "python -m compo concreteness --parse {input.parse:q} {params.norms:q} --seed {params.seed:q} --out {output:q}"
        " --log {log.main:q} --timing {log.timing:q}"
