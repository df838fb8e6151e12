"""The synthetic world (embedded default only): image splits and benchmark files."""


rule world:
    """Generate one split of the synthetic world: rendered images, scene graphs, caption manifest."""
    conda:
        "../../envs/train.yaml"
    output:
        manifest=f"{R}/world/{{split}}/manifest.parquet",
        scenes=f"{R}/world/{{split}}/scenes.jsonl",
        images=directory(f"{R}/world/{{split}}/images"),
    params:
        world=json_arg({k: v for k, v in config.get("world", {}).items() if k != "benchmarks"}),
        seed=config["seed"],
        out=lambda wildcards: f"{R}/world/{wildcards.split}",
    log:
        main=f"{R}/logs/world/{{split}}.log",
        timing=f"{R}/timing/world/{{split}}.tsv",
    shell:
        "python -m compo world --split {wildcards.split:q} --world {params.world:q} --seed {params.seed:q}"
        " --out {params.out:q} --log {log.main:q} --timing {log.timing:q}"


rule benchmarks:
    """Generate the synthetic benchmarks from held-out scenes, in the real benchmarks' file formats."""
    conda:
        "../../envs/train.yaml"
    output:
        STUDY.world_benchmark_outputs(),
    params:
        world=json_arg(config.get("world")),
        seed=config["seed"],
        out=lambda wildcards, output: os.path.commonpath(list(output)),
    log:
        main=f"{R}/logs/benchmarks/world.log",
        timing=f"{R}/timing/benchmarks/world.tsv",
    shell:
        "python -m compo benchmarks --world {params.world:q} --seed {params.seed:q} --out {params.out:q} --log {log.main:q} --timing {log.timing:q}"
