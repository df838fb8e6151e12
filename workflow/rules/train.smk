"""Models: base pretraining and fine-tuning, one trainer for every recipe."""


rule pretrain:
    """Pretrain a base model inside the workflow (init: scratch) or export open_clip pretrained weights."""
    conda:
        "../../envs/train.yaml"
    input:
        unpack(get_pretrain_inputs),
    output:
        multiext(f"{R}/models/base-{{base}}/{{dataset}}/seed{{seed}}/", *MODEL_FILES),
    params:
        recipe=lambda wildcards: json_arg(config["bases"][wildcards.base]),
        settings=json_arg(config["train"]),
        manifest=lambda wildcards, input: optional_arg("--manifest", input, "manifest"),
        out=lambda wildcards: f"{R}/models/base-{wildcards.base}/{wildcards.dataset}/seed{wildcards.seed}",
        launcher=get_launcher,
    threads: config["train"]["threads"]
    log:
        f"{R}/logs/train/base-{{base}}/{{dataset}}/seed{{seed}}.log",
    benchmark:
        f"{R}/timing/train/base-{{base}}/{{dataset}}/seed{{seed}}.tsv"
    shell:
        "{params.launcher} train --recipe {params.recipe:q} --settings {params.settings:q} {params.manifest:q}"
        " --seed {wildcards.seed:q} --out {params.out:q} --log {log:q}"


rule train:
    """Fine-tune a base model with one method recipe on one dataset and seed (under torchrun, one process
    per GPU, when the job has more than one: resource `gpu`, see get_launcher)."""
    conda:
        "../../envs/train.yaml"
    input:
        unpack(get_train_inputs),
    output:
        multiext(f"{R}/models/{{method}}/{{dataset}}/seed{{seed}}/", *MODEL_FILES),
    params:
        recipe=lambda wildcards: json_arg(get_recipe(wildcards.method)),
        settings=json_arg(config["train"]),
        negatives=lambda wildcards, input: optional_arg("--negatives", input, "negatives"),
        init_dir=lambda wildcards, input: os.path.dirname(input.init),
        out=lambda wildcards: f"{R}/models/{wildcards.method}/{wildcards.dataset}/seed{wildcards.seed}",
        launcher=get_launcher,
    threads: config["train"]["threads"]
    log:
        f"{R}/logs/train/{{method}}/{{dataset}}/seed{{seed}}.log",
    benchmark:
        f"{R}/timing/train/{{method}}/{{dataset}}/seed{{seed}}.tsv"
    shell:
        "{params.launcher} train --recipe {params.recipe:q} --settings {params.settings:q}"
        " --manifest {input.manifest:q} --parse {input.parse:q} --concreteness {input.concreteness:q}"
        " {params.negatives:q} --init-dir {params.init_dir:q} --seed {wildcards.seed:q} --out {params.out:q}"
        " --log {log:q}"
