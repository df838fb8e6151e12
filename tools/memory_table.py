"""The GPU memory model's table for every method of a config (issue 42): per method, its model, batch, GPUs,
accum_freq and micro-batch, GiB per GPU by part (compo.memory), the total, and the total without the config's
accum_freq (accum_freq 1: "before"), against the share of a GPU's memory a job may be planned to use
(compo.memory.usable_gb: GPU_MEM_USABLE of the card).

    python tools/memory_table.py [--config config/paper.yaml] [--gpu-mem-gb 80]
"""

from __future__ import annotations

import argparse

from compo.config import load_config, resolve_method
from compo.memory import accum_freq, gpus, train_memory, usable_gb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="config/paper.yaml")
    parser.add_argument("--gpu-mem-gb", type=float, default=80.0)
    args = parser.parse_args()
    config = load_config(args.config)
    settings = config.get("train") or {}
    limit = usable_gb(args.gpu_mem_gb)
    print(f"{'method':22s} {'model':20s} {'batch':>5s} {'GPUs':>4s} {'accum':>5s} {'micro':>5s} {'static':>6s} "
          f"{'activ.':>6s} {'loss':>5s} {'GB':>6s} {'before':>6s} fits {limit:.1f} of {args.gpu_mem_gb:g}")
    for name in config["methods"]:
        recipe = resolve_method(config, name)
        model = config["bases"][recipe["base"]]["model"]
        now = train_memory(recipe, model, settings)
        if now is None:
            print(f"{name:22s} {model:20s} no figure")
            continue
        before = train_memory({**recipe, "train": {**recipe["train"], "accum_freq": 1}}, model, settings)
        assert before is not None
        print(f"{name:22s} {model:20s} {recipe['train']['batch_size']:>5d} {gpus(recipe):>4d} "
              f"{accum_freq(recipe):>5d} {now.micro_batch:>5d} {now.static:>6.1f} {now.activations:>6.1f} "
              f"{now.loss_terms:>5.1f} {now.total:>6.1f} {before.total:>6.1f} "
              f"{'yes' if now.total <= limit else 'NO'}")


if __name__ == "__main__":
    main()
