"""Evaluation: one self-describing JSON (and per-item predictions, in the model's predictions/ folder) per model
and benchmark.

One job per model evaluates it on every benchmark of its set (the model is loaded once), writing the
per-benchmark files and, last, the model's evaluation index (what the tables read); asking for one
benchmark's JSON runs that model's evaluation job. Models are
evaluated on the study's benchmarks; WiSE-FT models on `wiseft.benchmarks` (default: the same). A
method's text protocol (LongCLIP-70: texts cut to 70 words) comes from its recipe (text_protocol_args).
"""


rule benchmark_set:
    """The files of an evaluation set (the study's benchmarks, WiSE-FT's) with their sizes and times: its
    evaluation jobs read this record instead of every file each, and rerun when a file changes."""
    conda:
        "../../envs/stats.yaml"
    input:
        lambda wildcards: STUDY.benchmark_set_files(wildcards.set),
    output:
        f"{R}/benchmarks/sets/{{set}}.json",
    wildcard_constraints:
        set="study|wiseft",
    params:
        benchmarks=lambda wildcards: json_arg(STUDY.benchmark_set_contents(wildcards.set)),
    log:
        f"{R}/logs/benchmarks/{{set}}.log",
    shell:
        "python -m compo benchmark-set --benchmarks {params.benchmarks:q} --out {output:q} --log {log:q}"


rule prepare_benchmark:
    """A benchmark kind's model-independent work (ARO Order's caption perturbations: spaCy and NLTK), done once
    for every evaluation job of the benchmark (compo.evaluate.kinds: `prepare`)."""
    conda:
        "../../envs/nlp.yaml"
    input:
        lambda wildcards: STUDY.benchmark_files(wildcards.benchmark),
    output:
        f"{R}/benchmarks/prepared/{{benchmark}}.json",
    params:
        spec=lambda wildcards: json_arg(config["benchmarks"][wildcards.benchmark]),
        folder=lambda wildcards: STUDY.benchmark_dir(wildcards.benchmark),
    log:
        main=f"{R}/logs/benchmarks/prepared/{{benchmark}}.log",
        timing=f"{R}/timing/prepared/{{benchmark}}.tsv",
    shell:
        "python -m compo prepare-benchmark --spec {params.spec:q} --dir {params.folder:q} --out {output:q}"
        " --log {log.main:q} --timing {log.timing:q}"


# the command both evaluation rules run
EVALUATE_COMMAND = (
    "python -m compo evaluate --model-dir {params.model_dir:q} --model-id {wildcards.model:q}"
    " --benchmarks {params.benchmarks:q} --templates {params.templates:q} {params.text:q}"
    " --threads {threads:q} --device {params.device:q} --precision {params.precision:q}"
    " --out-dir {params.out_dir:q} --log {log.main:q} --timing {log.timing:q}"
)


rule evaluate:
    """A trained model (a base or a fine-tune) on the study's benchmarks."""
    conda:
        "../../envs/train.yaml"
    input:
        checkpoint=f"{R}/models/{{model}}/{layout.CHECKPOINT}",
        benchmarks=STUDY.benchmark_set_record(STUDY.eval_benchmarks),
    output:
        results=[f"{R}/eval/{{model}}/{b}.json" for b in STUDY.eval_benchmarks],
        predictions=directory(f"{R}/eval/{{model}}/{layout.PREDICTIONS_DIR}"),
        index=f"{R}/eval/{{model}}/{layout.EVAL_INDEX}",
    wildcard_constraints:
        model=rf"(?!{layout.WISEFT_PREFIX}){layout.MODEL_ID_REGEX}",
    params:
        benchmarks=json_arg(STUDY.benchmark_entries(STUDY.eval_benchmarks)),
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
        main=f"{R}/logs/eval/{{model}}.log",
        timing=f"{R}/timing/eval/{{model}}.tsv",
    shell:
        EVALUATE_COMMAND


rule evaluate_wiseft:
    """A WiSE-FT model on `wiseft.benchmarks` (default: the study's)."""
    conda:
        "../../envs/train.yaml"
    input:
        checkpoint=f"{R}/models/{{model}}/{layout.CHECKPOINT}",
        benchmarks=STUDY.benchmark_set_record(STUDY.wiseft_benchmarks),
    output:
        results=[f"{R}/eval/{{model}}/{b}.json" for b in STUDY.wiseft_benchmarks],
        predictions=directory(f"{R}/eval/{{model}}/{layout.PREDICTIONS_DIR}"),
        index=f"{R}/eval/{{model}}/{layout.EVAL_INDEX}",
    wildcard_constraints:
        model=rf"{layout.WISEFT_PREFIX}{layout.MODEL_ID_REGEX}",
    params:
        benchmarks=json_arg(STUDY.benchmark_entries(STUDY.wiseft_benchmarks)),
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
        main=f"{R}/logs/eval/{{model}}.log",
        timing=f"{R}/timing/eval/{{model}}.tsv",
    shell:
        EVALUATE_COMMAND
