"""Evaluation: one self-describing JSON (and per-item predictions) per model and benchmark.

One job per model evaluates it on every benchmark of its set (the model is loaded once), writing the
per-benchmark files; asking for one benchmark's JSON runs that model's evaluation job. Models are
evaluated on the study's benchmarks; WiSE-FT models on `wiseft.benchmarks` (default: the same). A
method's text protocol (LongCLIP-70: texts cut to 70 words) comes from its recipe (text_protocol_args).
"""

# the command both evaluation rules run
EVALUATE_COMMAND = (
    "python -m compo evaluate --model-dir {params.model_dir:q} --model-id {wildcards.model:q}"
    " --benchmarks {params.benchmarks:q} --templates {params.templates:q} {params.text:q}"
    " --threads {threads:q} --device {params.device:q} --precision {params.precision:q}"
    " --out-dir {params.out_dir:q} --log {log:q}"
)


rule evaluate:
    """A trained model (a base or a fine-tune) on the study's benchmarks."""
    conda:
        "../../envs/train.yaml"
    input:
        checkpoint=f"{R}/models/{{model}}/{layout.CHECKPOINT}",
        benchmarks=[f for b in EVAL_BENCHMARKS for f in get_benchmark_files(b)],
    output:
        results=[f"{R}/eval/{{model}}/{b}.json" for b in EVAL_BENCHMARKS],
        predictions=[f"{R}/eval/{{model}}/{b}.predictions.parquet" for b in EVAL_BENCHMARKS],
    wildcard_constraints:
        model=rf"(?!{layout.WISEFT_PREFIX}){layout.MODEL_ID_REGEX}",
    params:
        benchmarks=eval_benchmarks_arg(EVAL_BENCHMARKS),
        templates=json_arg(config.get("zeroshot_templates")),
        text=text_protocol_args,
        out_dir=lambda wildcards, output: os.path.dirname(output.results[0]),
        model_dir=lambda wildcards, input: os.path.dirname(input.checkpoint),
        device=config.get("evaluate", {}).get("device", "auto"),
        precision=config.get("evaluate", {}).get("precision", "auto"),
    threads: config.get("evaluate", {}).get("threads", 1)
    resources:
        runtime=planned_runtime("evaluate"),
    log:
        f"{R}/logs/eval/{{model}}.log",
    benchmark:
        f"{R}/timing/eval/{{model}}.tsv"
    shell:
        EVALUATE_COMMAND


rule evaluate_wiseft:
    """A WiSE-FT model on `wiseft.benchmarks` (default: the study's)."""
    conda:
        "../../envs/train.yaml"
    input:
        checkpoint=f"{R}/models/{{model}}/{layout.CHECKPOINT}",
        benchmarks=[f for b in WISEFT_BENCHMARKS for f in get_benchmark_files(b)],
    output:
        results=[f"{R}/eval/{{model}}/{b}.json" for b in WISEFT_BENCHMARKS],
        predictions=[f"{R}/eval/{{model}}/{b}.predictions.parquet" for b in WISEFT_BENCHMARKS],
    wildcard_constraints:
        model=rf"{layout.WISEFT_PREFIX}{layout.MODEL_ID_REGEX}",
    params:
        benchmarks=eval_benchmarks_arg(WISEFT_BENCHMARKS),
        templates=json_arg(config.get("zeroshot_templates")),
        text=text_protocol_args,
        out_dir=lambda wildcards, output: os.path.dirname(output.results[0]),
        model_dir=lambda wildcards, input: os.path.dirname(input.checkpoint),
        device=config.get("evaluate", {}).get("device", "auto"),
        precision=config.get("evaluate", {}).get("precision", "auto"),
    threads: config.get("evaluate", {}).get("threads", 1)
    resources:
        runtime=planned_runtime("evaluate_wiseft"),
    log:
        f"{R}/logs/eval/{{model}}.log",
    benchmark:
        f"{R}/timing/eval/{{model}}.tsv"
    shell:
        EVALUATE_COMMAND
