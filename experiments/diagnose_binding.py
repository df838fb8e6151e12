"""Can the embedded testbed learn to bind attributes to objects at all? Fine-tune a study's base with the
workflow's own trainer on negatives made exactly like SugarCrepe's swap-att items, and print what it learned.

The positive control (NegCLIP's swap negatives vs plain fine-tuning on SugarCrepe swap) was not detected;
this separates "the tower cannot bind at this scale" from "NegCLIP's swaps rarely ask it to". It rewrites
every fine-tuning caption of a multi-object image as a fresh caption of the same scene that has a swap-att
negative (one attribute exchanged between two mentioned objects, proven false of the image by the world's
truth checker), then trains:

- `infonce`: those captions alone (the oracle's plain fine-tuning reference);
- `oracle`: NegCLIP's loss with that swap-att negative in the caption's negative slot (an upper bound for
  what hard negatives can teach here; not a method of the study);
- `clip-ft`: the study's clip-ft recipe on the study's own captions (the swap variant's reference);
- `swap`: NegCLIP's loss with the study's own swap negatives (the study's `swap` table, unchanged).

    python experiments/diagnose_binding.py --results /path/to/results --steps 350 1000 --lr 5e-4
    python experiments/diagnose_binding.py --results /path/to/results --image-probe --steps 300 1000 3000
    python experiments/diagnose_binding.py --frozen-probe results/models/base-clip/pretrain/seed0 \
        results/models/negclip/coco/seed0

`--compare A B --workdirs W0 W1 W2` prints the paired difference A - B on SugarCrepe swap-att and
swap-obj over the seeds' work folders (each holds `eval/A` and `eval/B`), with the study's
seeds-then-items bootstrap CI (`compo.stats.paired_difference`).

`--image-probe` asks the image tower alone, told the answer directly: trained on two-object scenes to
score the 56 (colour, shape) conjunctions present (multi-label), does it put the right pairing above the
swapped one on held-out scenes (red star + blue circle over blue star + red circle; chance 0.5)? From
scratch and from the base. `--text-probe` asks the same of the text tower, on the scene's caption ("a red
star and a blue circle", the objects in random order) instead of its render.

`--frozen-probe MODEL...` asks where a trained model loses binding, tower by tower, without training it:
on two-object scenes ("a red star and a blue circle"), a linear probe (and a one-hidden-layer MLP) on each
tower's frozen, standardised embedding, fitted to the scene's conjunctions, scored as `--image-probe` scores
(right pairing over the binding swap, held out); the model's own choice between the caption and its swap for
the image (text match: SugarCrepe swap-att's question on these scenes) and between the image and its swapped
render for the caption (image match); and the mean cosine between an embedding and its swap's. A probe at
0.5 means the tower's embedding does not carry the binding at all, whatever the fine-tuning.

`--results` is a results folder of the default study (its CLIP base, fine-tuning manifest, swap negatives
and world benchmarks are read, never written); `--base` fine-tunes another CLIP base instead (e.g. one that
`diagnose_bases.py --workdir W` kept under `W/models`). Prints SugarCrepe swap-att / swap-obj / replace-att and
zero-shot shape per (variant, steps); docs/embedded-study.md quotes them.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from diagnose_bases import fit_probe, score  # noqa: E402 - the scripts' shared probe and scoring

COLUMNS = [("sugarcrepe", "swap_att"), ("sugarcrepe", "swap_obj"), ("sugarcrepe", "replace_att"),
           ("zeroshot-shape", "top1")]
VARIANTS = ("infonce", "oracle", "clip-ft", "swap")


def oracle_tables(manifest_path: Path, world: dict, seed: int, out: Path) -> tuple[Path, Path, int]:
    """The fine-tuning manifest with every multi-object caption redrawn to carry a swap-att negative, and
    the negatives table (contract `negatives`) holding those negatives. Returns both paths and the count
    of captions that got one."""
    import pandas as pd

    from compo.io import write_table
    from compo.world.benchmarks import PERTURBATIONS
    from compo.world.captions import render_short, sample_short_plan
    from compo.world.scene import rng_stream
    from compo.world.truth import caption_holds

    manifest = pd.read_parquet(manifest_path)
    rng = rng_stream(seed, "diagnose", "binding")
    captions, negatives = [], []
    for row in manifest.itertuples(index=False):
        scene = json.loads(row.scene)
        caption, negative = row.caption, None
        for _ in range(50 if len(scene["objects"]) > 1 else 0):
            plan = sample_short_plan(rng, scene, world["ungrounded_rate"])
            swapped = PERTURBATIONS["swap_att"](rng, scene, plan)
            if swapped is None:
                continue
            text, foil = render_short(plan).text, render_short(swapped).text
            if caption_holds(scene, text) is True and caption_holds(scene, foil) is False:
                caption, negative = text, foil
                break
        captions.append(caption)
        negatives.append({"caption_id": row.caption_id, "slot": 0, "negative": negative,
                          "type": "adjective" if negative else "none", "keyword": None, "concreteness": None,
                          "generator": "oracle-swap-att", "valid": negative is not None,
                          "reason": "ok" if negative else "exhausted",
                          "truth": "false" if negative else "unknown", "negative_image": None})
    manifest = manifest.assign(caption=captions)
    out.mkdir(parents=True, exist_ok=True)
    manifest.to_parquet(out / "manifest.parquet", index=False)
    write_table(pd.DataFrame(negatives), out / "negatives.parquet", "negatives")
    return out / "manifest.parquet", out / "negatives.parquet", sum(n["valid"] for n in negatives)


def fresh_split(config: dict, images: int, out: Path) -> Path:
    """A finetune split of `images` scenes written as the workflow writes it, and its `coco` manifest."""
    from compo.data import build_manifest
    from compo.world import generate_split

    world = config["world"]
    generate_split("finetune", {**world, "splits": {**world["splits"], "finetune": images}}, config["seed"], out)
    build_manifest("coco", config["datasets"]["coco"], out / "train.parquet", out / "manifest.parquet")
    return out / "train.parquet"


def two_object_scenes(seed: int, stream: str, n: int) -> list[dict]:
    """`n` two-object scenes whose objects differ in colour and in shape, so that exchanging their colours
    gives a different scene (its binding swap), drawn from `seed`'s stream `stream`."""
    from compo.world.scene import rng_stream, sample_scene

    rng = rng_stream(seed, "diagnose", "binding-probe", stream)
    found: list[dict] = []
    while len(found) < n:
        scene = sample_scene(rng, f"{stream}-{len(found)}", 2, n_objects=2)
        a, b = scene["objects"]
        if a["colour"] != b["colour"] and a["shape"] != b["shape"]:
            found.append(scene)
    return found


def conjunction_targets(pairs: list[tuple[dict, dict]]) -> tuple:
    """For two-object scenes: the multi-label targets over the 56 (colour, shape) conjunctions, and per scene
    the indices of its two conjunctions and of its binding swap's two (colours exchanged)."""
    import torch

    from compo.world.vocab import COLOURS, SHAPES

    def conjunction(obj: dict) -> int:
        return COLOURS.index(obj["colour"]) * len(SHAPES) + SHAPES.index(obj["shape"])

    targets = torch.zeros(len(pairs), len(COLOURS) * len(SHAPES))
    for row, (a, b) in enumerate(pairs):
        targets[row, [conjunction(a), conjunction(b)]] = 1.0
    right = torch.tensor([[conjunction(a), conjunction(b)] for a, b in pairs])
    swapped = torch.tensor([[conjunction({**a, "colour": b["colour"]}), conjunction({**b, "colour": a["colour"]})]
                            for a, b in pairs])
    return targets, right, swapped


def swap_colours(scene: dict) -> dict:
    """A two-object scene's binding swap: the same objects in the same places, their colours exchanged."""
    a, b = scene["objects"]
    return {**scene, "objects": [{**a, "colour": b["colour"]}, {**b, "colour": a["colour"]}]}


def probe_caption(scene: dict, a_first: bool) -> str:
    """The world's short caption naming a two-object scene's objects by colour and shape, in that order."""
    from compo.world.captions import Mention, ShortPlan, render_short

    objects = scene["objects"] if a_first else scene["objects"][::-1]
    mentions = [Mention(i, {"colour": o["colour"], "shape": o["shape"]}) for i, o in enumerate(objects)]
    return render_short(ShortPlan(mentions, [None], None)).text


def binding_accuracy(logits, right, swapped) -> float:  # noqa: ANN001 - tensors
    """Share of scenes whose two conjunctions outscore their binding swap's (a tie counts as wrong)."""
    return (logits.gather(1, right).sum(1) > logits.gather(1, swapped).sum(1)).float().mean().item()


def tower_probe(config: dict, base: Path, steps: list[int], threads: int, seed: int, tower_name: str) -> None:
    """One tower alone (`image`: the scene's render; `text`: its caption) trained on the (colour, shape)
    conjunctions of two-object scenes; see the module docstring."""
    import torch

    from compo.models import create_model, get_tokenizer, image_transform, load_model
    from compo.world.render import render_scene
    from compo.world.scene import rng_stream

    torch.set_num_threads(threads)
    size, model_name = config["world"]["image_size"], config["bases"]["clip"]["model"]
    transform, tokenizer = image_transform(create_model(model_name, "scratch", seed)), get_tokenizer(model_name)
    order = rng_stream(seed, "diagnose", "binding-probe", f"{tower_name}-probe-order")

    class TextTower(torch.nn.Module):
        """A CLIP model's text tower alone: tokens in, the pooled text embedding out."""

        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            model.visual = torch.nn.Identity()  # only the text tower's parameters are trained
            self.model, self.output_dim = model, model.text_projection.shape[1]

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.model.encode_text(tokens)

    def inputs(stream: str, n: int) -> tuple[torch.Tensor, list[tuple[dict, dict]]]:
        found = two_object_scenes(seed, stream, n)
        if tower_name == "image":
            x = torch.stack([transform(render_scene(s, size)) for s in found])
        else:
            x = tokenizer([probe_caption(s, bool(order.random() < 0.5)) for s in found])
        return x, [tuple(s["objects"]) for s in found]

    train_x, train_pairs = inputs("train", 6000)
    test_x, test_pairs = inputs("test", 1000)
    train_y, _, _ = conjunction_targets(train_pairs)
    _, right, swapped = conjunction_targets(test_pairs)
    print(f"{tower_name} tower    steps  held-out binding accuracy (chance 0.5)")
    for start in ("scratch", "base"):
        model = load_model(base).model if start == "base" else create_model(model_name, "scratch", seed)
        tower = model.visual if tower_name == "image" else TextTower(model)
        head = torch.nn.Linear(tower.output_dim, train_y.shape[1])
        loss = torch.nn.functional.binary_cross_entropy_with_logits
        for n in fit_probe(tower, head, train_x, train_y, loss, steps, seed):
            with torch.no_grad():
                logits = head(tower(test_x))
            print(f"{start:<12} {n:>7}  {binding_accuracy(logits, right, swapped):.3f}", flush=True)


def frozen_probe(config: dict, models: list[Path], threads: int, seed: int, steps: int = 3000) -> None:
    """Where a model loses binding: per tower, does its frozen embedding still tell a two-object scene (or
    its caption) from the scene's binding swap? See the module docstring."""
    import torch

    from compo.models import encode_images, encode_texts, load_model
    from compo.world.render import render_scene
    from compo.world.scene import rng_stream

    torch.set_num_threads(threads)
    size = config["world"]["image_size"]
    order = rng_stream(seed, "diagnose", "binding-probe", "mention-order")

    train_scenes, test_scenes = two_object_scenes(seed, "train", 6000), two_object_scenes(seed, "test", 1000)
    train_y, _, _ = conjunction_targets([tuple(s["objects"]) for s in train_scenes])
    _, right, swapped = conjunction_targets([tuple(s["objects"]) for s in test_scenes])
    train_captions = [probe_caption(s, bool(order.random() < 0.5)) for s in train_scenes]
    train_images = [render_scene(s, size) for s in train_scenes]
    test_first = [bool(order.random() < 0.5) for _ in test_scenes]  # a caption and its swap share the order
    test_captions = [probe_caption(s, first) for s, first in zip(test_scenes, test_first, strict=True)]
    test_swapped_captions = [probe_caption(swap_colours(s), first)
                             for s, first in zip(test_scenes, test_first, strict=True)]
    test_images = [render_scene(s, size) for s in test_scenes]
    test_swapped_images = [render_scene(swap_colours(s), size) for s in test_scenes]
    example = f"{test_captions[0]!r} vs {test_swapped_captions[0]!r}"
    print(f"two-object scenes: 6,000 to fit each probe, 1,000 held out (e.g. {example}); chance 0.5")
    print(f"{'model':<44} {'probe image':>11} {'probe text':>10} {'mlp image':>9} {'mlp text':>8} "
          f"{'text match':>10} {'image match':>11} {'cos text':>8} {'cos image':>9}")
    for model in models:
        loaded = load_model(model)
        embedded = {
            "image": (encode_images(loaded, train_images), encode_images(loaded, test_images)),
            "text": (encode_texts(loaded, train_captions), encode_texts(loaded, test_captions)),
        }
        swapped_text = encode_texts(loaded, test_swapped_captions)
        swapped_image = encode_images(loaded, test_swapped_images)
        row = {}
        for tower, (train_x, test_x) in embedded.items():
            mean, sd = train_x.mean(0), train_x.std(0) + 1e-6  # standardised: the probe's rate fits every model
            train_z, test_z = (train_x - mean) / sd, (test_x - mean) / sd
            for kind in ("probe", "mlp"):
                torch.manual_seed(seed)
                dim, out = train_z.shape[1], train_y.shape[1]
                head = (torch.nn.Linear(dim, out) if kind == "probe" else
                        torch.nn.Sequential(torch.nn.Linear(dim, 256), torch.nn.ReLU(), torch.nn.Linear(256, out)))
                loss = torch.nn.functional.binary_cross_entropy_with_logits
                for _ in fit_probe(torch.nn.Identity(), head, train_z, train_y, loss, [steps], seed):
                    with torch.no_grad():
                        row[f"{kind} {tower}"] = binding_accuracy(head(test_z), right, swapped)
        image, text = embedded["image"][1], embedded["text"][1]
        # the model's own scores: the caption over its swap for the image (SugarCrepe swap-att's question),
        # and the image over its swap for the caption (Winoground's image score)
        row["text match"] = ((image * text).sum(1) > (image * swapped_text).sum(1)).float().mean().item()
        row["image match"] = ((image * text).sum(1) > (swapped_image * text).sum(1)).float().mean().item()
        row["cos text"] = (text * swapped_text).sum(1).mean().item()
        row["cos image"] = (image * swapped_image).sum(1).mean().item()
        name = str(model)[-44:]
        print(f"{name:<44} {row['probe image']:>11.3f} {row['probe text']:>10.3f} {row['mlp image']:>9.3f} "
              f"{row['mlp text']:>8.3f} {row['text match']:>10.3f} {row['image match']:>11.3f} "
              f"{row['cos text']:>8.4f} {row['cos image']:>9.4f}", flush=True)


def compare(a: str, b: str, workdirs: list[Path]) -> None:
    """A - B per metric over the seeds' work folders, as the claims table measures a difference."""
    import pandas as pd

    from compo.io import read_json
    from compo.stats import metric_scores, paired_difference

    def measure(name: str, metric: str):  # noqa: ANN202 - compo.stats.Measure
        folders = [workdir / "eval" / name for workdir in workdirs]
        records = [read_json(folder / "sugarcrepe.json") for folder in folders]
        predictions = [pd.read_parquet(folder / "sugarcrepe.parquet") for folder in folders]
        return metric_scores(records, predictions, metric, f"{name} ({len(folders)} seeds)")

    print(f"{a} - {b}, {len(workdirs)} seeds: effect [95 % CI] (points), bootstrap p")
    for metric in ("swap_att", "swap_obj"):
        result = paired_difference(measure(a, metric), measure(b, metric), seeds=len(workdirs))
        print(f"  sugarcrepe/{metric}: {100 * result['effect']:+.1f} [{100 * result['ci_low']:+.1f}, "
              f"{100 * result['ci_high']:+.1f}]  p = {result['p']:.3g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "config" / "config.yaml")
    parser.add_argument("--results", type=Path, help="a default study's results folder")
    parser.add_argument("--base", type=Path,
                        help="CLIP base to fine-tune (default: the results folder's models/base-clip/pretrain/seed0)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--steps", nargs="+", type=int, default=[350])
    parser.add_argument("--lr", type=float, help="fine-tuning learning rate (default: the negclip recipe's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--finetune-images", type=int,
                        help="fine-tune on a freshly generated finetune split of this many images instead "
                             "(more distinct scenes at the same steps; the swap variant needs the study's table)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--image-probe", action="store_true", help="the image tower on conjunction labels instead")
    mode.add_argument("--text-probe", action="store_true", help="the text tower on conjunction labels instead")
    mode.add_argument("--frozen-probe", nargs="+", type=Path, metavar="MODEL",
                      help="probe these models' frozen embeddings for binding, per tower, instead")
    mode.add_argument("--compare", nargs=2, metavar=("A", "B"), help="paired difference of two models' folders")
    parser.add_argument("--workdirs", nargs="+", type=Path, help="--compare: one work folder per seed")
    parser.add_argument("--workdir", type=Path, help="keep tables and models here (default: a temporary folder)")
    args = parser.parse_args()

    from compo.config import resolve_method
    from compo.train import train

    with open(args.config, encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    if args.compare:
        compare(*args.compare, args.workdirs)
        return
    if args.frozen_probe:
        missing = [str(m) for m in args.frozen_probe if not (m / "checkpoint.pt").is_file()]
        if missing:  # checked before a minute of rendering, not after it
            parser.error(f"--frozen-probe: {', '.join(missing)} holds no checkpoint.pt "
                         "(expected trained models' folders)")
        frozen_probe(config, args.frozen_probe, args.threads, args.seed)
        return
    if args.results is None:
        parser.error("--results is required (unless --compare)")
    results = args.results
    from compo.layout import base_model_id, model_dir

    base = args.base or Path(model_dir(str(results), base_model_id("clip", config["bases"]["clip"]["dataset"], 0)))
    if not (base / "checkpoint.pt").is_file():
        parser.error(f"--base / --results: {base} holds no checkpoint.pt (expected a trained CLIP base's folder)")
    if args.image_probe or args.text_probe:
        tower_probe(config, base, args.steps, args.threads, args.seed, "image" if args.image_probe else "text")
        return
    with tempfile.TemporaryDirectory() as scratch:
        root = args.workdir or Path(scratch)
        source = results / "data" / "coco" / "manifest.parquet"
        if args.finetune_images:
            source = fresh_split(config, args.finetune_images, root / "finetune")
        manifest, oracle, n = oracle_tables(source, config["world"], config["seed"], root / "oracle")
        print(f"{n} fine-tuning captions carry a swap-att negative (the rest keep their caption, no negative)")
        print("variant   steps     lr  s/step  " + "  ".join(f"{m:>11}" for _, m in COLUMNS), flush=True)
        for variant in args.variants:
            recipe = copy.deepcopy(resolve_method(config, "negclip" if variant in ("oracle", "swap") else "clip-ft"))
            study_captions = variant in ("clip-ft", "swap")
            if variant == "oracle":
                recipe["drop_true_negatives"] = False  # every oracle negative is proven false already
            for steps in args.steps:
                hp = recipe["train"]
                lr = args.lr or hp["lr"]
                recipe["train"] = {**hp, "steps": steps, "lr": lr, "warmup": min(hp["warmup"], steps)}
                out = root / "models" / f"{variant}-{steps}-{lr:g}"
                negatives = {"oracle": oracle, "swap": results / "negatives" / "coco" / "swap.parquet"}.get(variant)
                start = time.perf_counter()
                train(recipe, str(results / "data" / "coco" / "manifest.parquet" if study_captions else manifest),
                      str(out), seed=args.seed, negatives=None if negatives is None else str(negatives),
                      init_dir=str(base), settings={**config["train"], "threads": args.threads})
                per_step = (time.perf_counter() - start) / max(steps, 1)
                row = score(out, config, results / "benchmarks" / "world", root, COLUMNS)
                print(f"{variant:<8} {steps:>6} {lr:6.0e}  {per_step:6.3f}  "
                      + "  ".join(f"{row[c]:>11.3f}" for c in COLUMNS), flush=True)


if __name__ == "__main__":
    main()
