"""Samples/s of DataLoader workers reading small images inside tar shards against one file per image (issue 44,
item 3), and how often each worker builds a shard's member index (`compo.shards.scans`).

Writes N small JPEGs (48x48, under 1 KB: where per-image overhead shows, not decoding) as img2dataset would: in
`--shards` tar shards (webdataset layout) and as one file each (files layout). Each case reads every image once
through a torch DataLoader in batches of `--batch` (as training builds a step's batch in a worker): `read` the
stored bytes (`compo.images.image_source`), `decode` the image as RGB (`compo.images.open_image`). Workers start
by fork (Linux's default: they inherit the main process's member index when it built one, as training's do
after checking its images) or spawn (each builds its own). Figures vary with the machine's load.

    python tools/bench_shard_reading.py [--n 2000] [--shards 4] [--workers 0 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image, ImageDraw

from compo import shards
from compo.images import image_source, open_image
from compo.shards import member_path, split_member


def _jpeg(i: int) -> bytes:
    image = Image.new("RGB", (48, 48), "white")
    ImageDraw.Draw(image).rectangle([4 + i % 16, 6, 40, 40 - i % 16], fill=(i % 256, 80, 160))
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=85)
    return buffer.getvalue()


def write_layouts(root: Path, n: int, n_shards: int) -> tuple[list[str], list[str]]:
    """(member paths, file paths) of the same n images in both layouts."""
    members, files = [], []
    per_shard = -(-n // n_shards)
    for s in range(n_shards):
        archive, folder = root / f"{s:05d}.tar", root / f"{s:05d}"
        folder.mkdir(parents=True)
        with tarfile.open(archive, "w") as tar:
            for i in range(s * per_shard, min(n, (s + 1) * per_shard)):
                key, data = f"{s:05d}{i % per_shard:04d}", _jpeg(i)
                for extension, body in (("jpg", data), ("txt", f"box {i}".encode())):
                    info = tarfile.TarInfo(f"{key}.{extension}")
                    info.size = len(body)
                    tar.addfile(info, io.BytesIO(body))
                (folder / f"{key}.jpg").write_bytes(data)
                members.append(member_path(archive, f"{key}.jpg"))
                files.append(str(folder / f"{key}.jpg"))
    return members, files


class Reads(torch.utils.data.Dataset):
    """Image i read (`read`: its bytes) or decoded (`decode`); the item is (pid, index builds of its shard)."""

    def __init__(self, paths: list[str], mode: str) -> None:
        self.paths, self.mode = paths, mode

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[int, int]:
        path = self.paths[i]
        if self.mode == "read":
            image_source(path).read() if split_member(path) else Path(path).read_bytes()
        elif isinstance(open_image(path), str):
            raise OSError(f"{path}: does not decode")
        parts = split_member(path)
        return os.getpid(), shards.scans[parts[0]] if parts else 0


def measure(paths: list[str], mode: str, workers: int, context: str, batch: int) -> tuple[float, float, int]:
    """(seconds to the first batch: worker start-up, samples/s after it, most index builds of one shard
    seen in one process). Training keeps its workers for the whole run: the rate after start-up is its."""
    loader = torch.utils.data.DataLoader(Reads(paths, mode), batch_size=batch, num_workers=workers,
                                         multiprocessing_context=context if workers else None)
    start = time.perf_counter()
    first, builds, after = 0.0, 0, 0
    for number, (_, counts) in enumerate(loader):
        builds = max(builds, int(counts.max()))
        if number == 0:
            first = time.perf_counter()
        else:
            after += len(counts)
    return first - start, after / (time.perf_counter() - first), builds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many passes per case")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        members, files = write_layouts(Path(tmp), args.n, args.shards)
        print(f"{args.n} images ({sum(len(_jpeg(i)) for i in range(16)) // 16} bytes each on average), "
              f"{args.shards} shards; best of {args.repeats}", flush=True)
        print(f"{'layout':8} {'mode':7} {'workers':>7} {'start':6} {'start-up s':>9} {'samples/s':>10} "
              f"{'index builds/shard/process':>27}")
        for mode in ("read", "decode"):
            for workers in args.workers:
                for context in (["fork", "spawn"] if workers else ["-"]):
                    for layout, paths in (("files", files), ("shards", members)):
                        shards._INDEX.clear()  # each case starts unindexed: workers build (or inherit none)
                        shards.scans.clear()
                        runs = [measure(paths, mode, workers, context, args.batch) for _ in range(args.repeats)]
                        startup, rate = min(r[0] for r in runs), max(r[1] for r in runs)
                        builds = max(r[2] for r in runs)
                        print(f"{layout:8} {mode:7} {workers:>7} {context:6} {startup:>9.2f} {rate:>10,.0f} "
                              f"{builds if layout == 'shards' else '-':>27}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
