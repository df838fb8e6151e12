"""WiSE-FT: weight interpolation between each fine-tuned model and its base (config `wiseft`).

Model ids `wiseft-{method}-a{alpha}/{dataset}/seed{seed}`, alpha formatted 0.0 .. 1.0; the interpolated
model is a normal model directory, so the `evaluate` rule evaluates it like any other model.
"""

rule wiseft:
    """Interpolate a fine-tuned model with its base at one alpha (WiSE-FT)."""
    conda:
        "../../envs/train.yaml"
    input:
        unpack(get_wiseft_inputs),
    output:
        multiext(f"{R}/models/wiseft-{{method}}-a{{alpha}}/{{dataset}}/seed{{seed}}/", *MODEL_FILES),
    wildcard_constraints:
        alpha=r"0\.\d|1\.0",
    params:
        out=lambda wildcards, output: os.path.dirname(output[0]),
        device=config["train"].get("device", "auto"),
    log:
        f"{R}/logs/wiseft/{{method}}-a{{alpha}}/{{dataset}}/seed{{seed}}.log",
    benchmark:
        f"{R}/timing/wiseft/{{method}}-a{{alpha}}/{{dataset}}/seed{{seed}}.tsv"
    shell:
        "compo wiseft --base-dir $(dirname {input.base}) --finetuned-dir $(dirname {input.finetuned})"
        " --alpha {wildcards.alpha} --device {params.device} --out {params.out} --log {log}"


rule wiseft_trajectories:
    """Every WiSE-FT model of the study's datasets and seeds evaluated on the study's benchmarks."""
    input:
        get_eval_jsons(wiseft_model_ids(config["study"]["datasets"], config["study"]["seeds"])),
