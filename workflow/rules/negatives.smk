"""Hard negative captions, one table per dataset and generator; LLM generators run in shards."""


rule negatives:
    """Generate K negatives per caption with type, keyword, validity and the world's truth label; with
    `images: true` also each negative's exact image (the folder `images`, empty otherwise)."""
    conda:
        "../../envs/nlp.yaml"
    wildcard_constraints:
        generator=_alternatives(STUDY.unsharded_generators()),
    input:
        manifest=STUDY.manifest("{dataset}"),
        parse=f"{R}/parse/{{dataset}}.parquet",
        concreteness=f"{R}/concreteness/{{dataset}}.parquet",
        norms=get_generator_norms,
        released=lambda wildcards: released_negatives(config["negatives"][wildcards.generator]),
    output:
        negatives=f"{R}/negatives/{{dataset}}/{{generator}}.parquet",
        images=directory(STUDY.negative_images("{dataset}", "{generator}")),
        report=f"{R}/tables/negatives/{{dataset}}/{{generator}}.csv",
    params:
        spec=lambda wildcards: json_arg(config["negatives"][wildcards.generator]),
        seed=config["seed"],
    log:
        main=f"{R}/logs/negatives/{{dataset}}/{{generator}}.log",
        timing=f"{R}/timing/negatives/{{dataset}}/{{generator}}.tsv",
    shell:
        "python -m compo negatives --manifest {input.manifest:q} --parse {input.parse:q}"
        " --concreteness {input.concreteness:q} --spec {params.spec:q} --seed {params.seed:q}"
        " --out {output.negatives:q} --images-dir {output.images:q} --report {output.report:q} --log {log.main:q} --timing {log.timing:q}"


rule negatives_shard:
    """One shard (a contiguous block of captions) of an LLM generator; shards run in parallel."""
    conda:
        "../../envs/llm.yaml"
    wildcard_constraints:
        generator=_alternatives(STUDY.sharded_generators()),
        shard=r"\d+",
    input:
        manifest=STUDY.manifest("{dataset}"),
        parse=f"{R}/parse/{{dataset}}.parquet",
        concreteness=f"{R}/concreteness/{{dataset}}.parquet",
        norms=get_generator_norms,
    output:
        negatives=temp(f"{R}/negatives/{{dataset}}/{{generator}}.shards/{{shard}}.parquet"),
        report=temp(f"{R}/negatives/{{dataset}}/{{generator}}.shards/{{shard}}.csv"),
    params:
        spec=lambda wildcards: json_arg(config["negatives"][wildcards.generator]),
        seed=config["seed"],
        n_shards=lambda wildcards: STUDY.negative_shards(wildcards.generator),
    resources:
        **PROFILE.gpu_job_resources("negatives_shard", lambda wildcards: shard_gpus(wildcards.generator)),
        # a vLLM engine spans negatives.<name>.vllm.tensor_parallel_size GPUs (the profile may add a GPU model)
        gpu=lambda wildcards: shard_gpus(wildcards.generator),
        runtime=planned_runtime("negatives_shard"),
        nodes=1,  # a multi-GPU engine's GPUs on one node
    log:
        main=f"{R}/logs/negatives/{{dataset}}/{{generator}}.shard{{shard}}.log",
        timing=f"{R}/timing/negatives/{{dataset}}/{{generator}}.shard{{shard}}.tsv",
    shell:
        "python -m compo negatives --manifest {input.manifest:q} --parse {input.parse:q}"
        " --concreteness {input.concreteness:q} --spec {params.spec:q} --seed {params.seed:q}"
        " --shard {wildcards.shard:q} --n-shards {params.n_shards:q}"
        " --out {output.negatives:q} --report {output.report:q} --log {log.main:q} --timing {log.timing:q}"


rule negatives_gather:
    """Merge an LLM generator's shards (in order) into the dataset's negatives table and report."""
    conda:
        "../../envs/nlp.yaml"
    wildcard_constraints:
        generator=_alternatives(STUDY.sharded_generators()),
    input:
        shards=lambda wildcards: [
            f"{R}/negatives/{wildcards.dataset}/{wildcards.generator}.shards/{i}.parquet"
            for i in range(STUDY.negative_shards(wildcards.generator))
        ],
        reports=lambda wildcards: [
            f"{R}/negatives/{wildcards.dataset}/{wildcards.generator}.shards/{i}.csv"
            for i in range(STUDY.negative_shards(wildcards.generator))
        ],
    output:
        negatives=f"{R}/negatives/{{dataset}}/{{generator}}.parquet",
        report=f"{R}/tables/negatives/{{dataset}}/{{generator}}.csv",
    log:
        f"{R}/logs/negatives/{{dataset}}/{{generator}}.gather.log",
    shell:
        "python -m compo negatives-gather --shards {input.shards:q} --shard-reports {input.reports:q}"
        " --out {output.negatives:q} --report {output.report:q} --log {log:q}"


rule negative_images_shard:
    """SDXL-Turbo img2img negative images (real data, seed 002 section 2.2) for one shard of a generator's
    negatives table: each valid negative caption edits its anchor image. The shard's folder holds one tar of
    its PNGs (`images.tar`, format tar: the default) or a PNG each (format png)."""
    conda:
        "../../envs/diffusion.yaml"
    wildcard_constraints:
        generator=_alternatives(STUDY.diffusion_generators()),
        shard=r"\d+",
    input:
        negatives=f"{R}/negatives/{{dataset}}/{{generator}}.parquet",
        manifest=STUDY.manifest("{dataset}"),
    output:
        negatives=temp(f"{R}/negatives/{{dataset}}/{{generator}}.images.shards/{{shard}}.parquet"),
        report=temp(f"{R}/negatives/{{dataset}}/{{generator}}.images.shards/{{shard}}.csv"),
        images=directory(f"{R}/negatives/{{dataset}}/{{generator}}.images/{{shard}}"),
    params:
        spec=lambda wildcards: json_arg(config["negatives"][wildcards.generator]["images"]),
        seed=config["seed"],
        n_shards=lambda wildcards: STUDY.image_shards(wildcards.generator),
    resources:
        runtime=planned_runtime("negative_images_shard"),
    log:
        main=f"{R}/logs/negatives/{{dataset}}/{{generator}}.images.shard{{shard}}.log",
        timing=f"{R}/timing/negatives/{{dataset}}/{{generator}}.images.shard{{shard}}.tsv",
    shell:
        "python -m compo negative-images --negatives {input.negatives:q} --manifest {input.manifest:q}"
        " --spec {params.spec:q} --seed {params.seed:q} --shard {wildcards.shard:q} --n-shards {params.n_shards:q}"
        " --images {output.images:q} --out {output.negatives:q} --report {output.report:q} --log {log.main:q} --timing {log.timing:q}"


rule negative_images_gather:
    """Join the image shards (in order) into the generator's negatives table with images."""
    conda:
        "../../envs/nlp.yaml"
    wildcard_constraints:
        generator=_alternatives(STUDY.diffusion_generators()),
    input:
        shards=lambda wildcards: [
            f"{R}/negatives/{wildcards.dataset}/{wildcards.generator}.images.shards/{i}.parquet"
            for i in range(STUDY.image_shards(wildcards.generator))
        ],
        reports=lambda wildcards: [
            f"{R}/negatives/{wildcards.dataset}/{wildcards.generator}.images.shards/{i}.csv"
            for i in range(STUDY.image_shards(wildcards.generator))
        ],
    output:
        negatives=f"{R}/negatives/{{dataset}}/{{generator}}.images.parquet",
        report=f"{R}/tables/negatives/{{dataset}}/{{generator}}.images.csv",
    log:
        f"{R}/logs/negatives/{{dataset}}/{{generator}}.images.gather.log",
    shell:
        "python -m compo negatives-gather --shards {input.shards:q} --shard-reports {input.reports:q}"
        " --out {output.negatives:q} --report {output.report:q} --log {log:q}"


rule negatives_quality:
    """Every generator's validity and truth shares (by type and concreteness bin) in one table."""
    conda:
        "../../envs/nlp.yaml"
    input:
        reports=lambda wildcards: STUDY.negatives_quality_inputs(wildcards.dataset),
    output:
        f"{R}/tables/negatives/{{dataset}}/quality.csv",
    params:
        names=lambda wildcards: STUDY.dataset_generators(wildcards.dataset),
    log:
        f"{R}/logs/negatives/{{dataset}}/quality.log",
    shell:
        "python -m compo negatives-quality --names {params.names:q} --reports {input.reports:q} --out {output:q} --log {log:q}"
