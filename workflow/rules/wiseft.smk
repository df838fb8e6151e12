"""WiSE-FT: weight interpolation between each fine-tuned model and its base (config `wiseft`).

Model ids `wiseft-{method}-a{alpha}/{dataset}/seed{seed}` (compo.layout), alpha formatted 0.0 .. 1.0; the
interpolated model is a normal model directory, so the `evaluate_wiseft` rule evaluates it like any other.
"""


rule wiseft:
    """Interpolate a fine-tuned model with its base at one alpha (WiSE-FT)."""
    conda:
        "../../envs/train.yaml"
    input:
        unpack(get_wiseft_inputs),
    output:
        multiext(f"{R}/models/{WISEFT_MODEL}/", *MODEL_FILES),
    wildcard_constraints:
        alpha=r"0\.\d|1\.0",
    params:
        base_dir=lambda wildcards, input: os.path.dirname(input.base),
        finetuned_dir=lambda wildcards, input: os.path.dirname(input.finetuned),
        out=lambda wildcards, output: os.path.dirname(output[0]),
        device="cpu",  # a weight average of two checkpoints: a minute or two, no GPU needed
    resources:
        runtime=planned_runtime("wiseft"),
    log:
        main=f"{R}/logs/wiseft/{WISEFT_MODEL}.log",
        timing=f"{R}/timing/wiseft/{WISEFT_MODEL}.tsv",
    shell:
        "python -m compo wiseft --base-dir {params.base_dir:q} --finetuned-dir {params.finetuned_dir:q}"
        " --alpha {wildcards.alpha:q} --device {params.device:q} --out {params.out:q} --log {log.main:q} --timing {log.timing:q}"


rule wiseft_trajectories:
    """Every WiSE-FT model of the study's datasets and seeds evaluated on the study's benchmarks."""
    input:
        STUDY.eval_indexes(STUDY.study_wiseft_model_ids()),
