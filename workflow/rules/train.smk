"""Models: base pretraining and fine-tuning, one trainer for every recipe."""


rule pretrain:
    """Pretrain a base model inside the workflow (init: scratch) or export open_clip pretrained weights."""
    conda:
        "../../envs/train.yaml"
    input:
        unpack(get_pretrain_inputs),
    output:
        multiext(f"{R}/models/{BASE_MODEL}/", *MODEL_FILES),
    params:
        recipe=lambda wildcards: json_arg(config["bases"][wildcards.base]),
        settings=json_arg(config["train"]),
        manifest=lambda wildcards, input: optional_arg("--manifest", input, "manifest"),
        val=lambda wildcards: val_benchmark_arg(config["bases"][wildcards.base]),
        out=lambda wildcards, output: os.path.dirname(output[0]),
        launcher=get_launcher,
    threads: config["train"]["threads"]
    resources:
        runtime=planned_runtime("pretrain"),
    log:
        main=f"{R}/logs/train/{BASE_MODEL}.log",
        timing=f"{R}/timing/train/{BASE_MODEL}.tsv",
    shell:
        "{params.launcher} train --recipe {params.recipe:q} --settings {params.settings:q} {params.manifest:q}"
        " {params.val:q} --seed {wildcards.seed:q} --out {params.out:q} --log {log.main:q} --timing {log.timing:q}"


rule train:
    """Fine-tune a base model with one method recipe on one dataset and seed (under torchrun, one process
    per GPU, when the job has more than one: resource `gpu`, see get_launcher). It reads only what its
    loss needs (get_train_inputs)."""
    conda:
        "../../envs/train.yaml"
    input:
        unpack(get_train_inputs),
    output:
        multiext(f"{R}/models/{METHOD_MODEL}/", *MODEL_FILES),
    params:
        recipe=lambda wildcards: json_arg(STUDY.recipe(wildcards.method)),
        settings=json_arg(config["train"]),
        parse=lambda wildcards, input: optional_arg("--parse", input, "parse"),
        negatives=lambda wildcards, input: optional_arg("--negatives", input, "negatives"),
        val=lambda wildcards: val_benchmark_arg(STUDY.recipe(wildcards.method)),
        init_dir=lambda wildcards, input: os.path.dirname(input.init),
        out=lambda wildcards, output: os.path.dirname(output[0]),
        launcher=get_launcher,
    # the job's CPUs (per GPU where the profile names them so); the trainer splits them over its ranks
    threads: PROFILE.gpu_job_threads("train", train_job_gpus, config["train"]["threads"])
    resources:
        **TRAIN_RESOURCES,
        runtime=planned_runtime("train"),
    log:
        main=f"{R}/logs/train/{METHOD_MODEL}.log",
        timing=f"{R}/timing/train/{METHOD_MODEL}.tsv",
    shell:
        "{params.launcher} train --recipe {params.recipe:q} --settings {params.settings:q} --threads {threads}"
        " --manifest {input.manifest:q} {params.parse:q} {params.negatives:q} {params.val:q}"
        " --init-dir {params.init_dir:q} --seed {wildcards.seed:q} --out {params.out:q} --log {log.main:q} --timing {log.timing:q}"
