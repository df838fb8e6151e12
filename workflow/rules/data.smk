"""Training datasets: one manifest per dataset, from a world split or the user's raw files."""


rule dataset:
    """Write the manifest of one training dataset (the contract every later stage reads)."""
    conda:
        "../../envs/nlp.yaml"
    input:
        unpack(get_dataset_inputs),
    output:
        manifest=f"{R}/data/{{dataset}}/manifest.parquet",
        report=f"{R}/tables/data/{{dataset}}.csv",
    params:
        spec=lambda wildcards: json_arg(config["datasets"][wildcards.dataset]),
        world=lambda wildcards, input: optional_arg("--world-manifest", input, "world"),
    # decoding every listed image (compo.data): a real dataset's 100K+ images want several cores
    threads: lambda wildcards: 1 if config["datasets"][wildcards.dataset]["source"] == "world" else 8
    log:
        main=f"{R}/logs/dataset/{{dataset}}.log",
        timing=f"{R}/timing/dataset/{{dataset}}.tsv",
    shell:
        "python -m compo dataset --name {wildcards.dataset:q} --spec {params.spec:q} {params.world:q}"
        " --out {output.manifest:q} --report {output.report:q} --threads {threads} --log {log.main:q} --timing {log.timing:q}"


rule overlap:
    """Stop before training when a dataset holds benchmark images (compo.overlap): its images (files or shard
    members) against every evaluated benchmark's, by COCO id, by bytes and by perceptual hash (re-encoded and
    resized copies); the table lists the counts and the accepted overlaps."""
    conda:
        "../../envs/train.yaml"
    input:
        unpack(get_overlap_inputs),
    output:
        f"{R}/tables/overlap/{{dataset}}.csv",
    params:
        benchmarks=lambda wildcards: json_arg(STUDY.benchmark_entries(STUDY.overlap_benchmarks())),
        accept=json_arg(config.get("overlap", {}).get("accept", [])),
    threads: config.get("overlap", {}).get("threads", 4)
    log:
        f"{R}/logs/overlap/{{dataset}}.log",
    shell:
        "python -m compo overlap --name {wildcards.dataset:q} --manifest {input.manifest:q}"
        " --benchmarks {params.benchmarks:q} --accept {params.accept:q} --threads {threads}"
        " --out {output:q} --log {log:q}"
