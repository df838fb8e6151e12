"""Benchmark kinds, each declared in its own module of this package, as a loss is (`compo.losses`).

A module that scores a kind assigns a top-level `BENCHMARKS = (Benchmark(...), ...)`; `declared()` finds every
such module of `compo.evaluate` and is the one registry the workflow reads: the rules' inputs (`files`), the
overlap guard (`images`), `compo plan` (`size`), the figures (`subsets`, `chance`) and evaluation itself (`run`).
No list of kinds is kept anywhere else, so a kind cannot be half-added: a declaration missing a field is an error
at discovery naming its module and the field, and tests/test_benchmark_kinds.py asks every kind every question.

The modules import without torch (their scoring imports it when it runs), so the rules read the declarations
while Snakemake builds the DAG. Every function a declaration names takes the benchmark's config entry (`spec`)
and, where it reads files, the benchmark's folder:

    run(loaded, folder, spec, templates) -> BenchmarkResult    score a model (compo.evaluate.common)
    files(spec, folder) -> [Path]            the release's files that define it (evaluation reruns when they change)
    images(spec, folder) -> [Path]           the image files it evaluates on, as its reader resolves them; None for
                                             a kind whose images are class folders no training set draws from
    size(spec) -> BenchmarkSize | None       its images and texts at the release's size (None: no published figure)
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from compo.evaluate.files import BenchmarkError

DECLARATION = "BENCHMARKS"  # the top-level name a module declares its kinds under
DECLARES = re.compile(rf"^{DECLARATION}\s*=", re.MULTILINE)
SCORER = re.compile(r"^def run\(", re.MULTILINE)  # a module that scores without declaring: a half-added kind


class BenchmarkSize(NamedTuple):
    images: int         # decoded (a probe: its training and test images)
    texts: int          # encoded (zero-shot and probes: not counted, their class prompts take seconds)
    probe_train: int    # of the images, a probe's training images


@dataclass(frozen=True, kw_only=True)
class Benchmark:
    """One benchmark kind, as its module declares it (see the module docstring for the functions' signatures)."""

    kind: str                      # the config's `benchmarks.<name>.kind`
    source: str                    # the release its files follow, and the scorer its numbers reproduce
    run: Callable[..., Any]
    files: Callable[[dict[str, Any], Path], list[Path]]
    images: Callable[[dict[str, Any], Path], list[Path]] | None
    size: Callable[[dict[str, Any]], BenchmarkSize | None]
    headline: str                  # the metric that summarises it by default (a spec's `headline` may name another)
    # the metrics the subsets figure draws, in order; empty: not a compositional benchmark (no panel)
    subsets: tuple[str, ...]
    # chance level where the protocol fixes it: one for every subset, or per subset ({} / None: no fixed level)
    chance: float | Mapping[str, float] | None

    @property
    def compositional(self) -> bool:
        return bool(self.subsets)

    def chance_of(self, metric: str) -> float | None:
        if isinstance(self.chance, Mapping):
            return self.chance.get(metric)
        return self.chance


FIELDS = tuple(f.name for f in fields(Benchmark))


class DeclarationError(TypeError):
    """A module's benchmark declaration is missing a field or holds a wrong one; the message names the module."""


def _check(benchmark: Any, module: str) -> Benchmark:
    if not isinstance(benchmark, Benchmark):
        raise DeclarationError(f"{module}.{DECLARATION}: expected Benchmark(...) entries, got {benchmark!r:.80}")
    wrong = [name for name in ("run", "files", "size") if not callable(getattr(benchmark, name))]
    wrong += ["images"] if benchmark.images is not None and not callable(benchmark.images) else []
    wrong += [name for name in ("kind", "source", "headline") if not isinstance(getattr(benchmark, name), str)
              or not getattr(benchmark, name)]
    if not isinstance(benchmark.subsets, tuple) or not all(isinstance(s, str) and s for s in benchmark.subsets):
        wrong.append("subsets")
    chance = benchmark.chance if isinstance(benchmark.chance, Mapping) else {"": benchmark.chance}
    if not all(c is None or (isinstance(c, float) and 0 < c < 1) for c in chance.values()):
        wrong.append("chance")
    if wrong:
        raise DeclarationError(f"{module}: benchmark kind {benchmark.kind!r} declares a wrong {', '.join(wrong)} "
                               "(see compo.evaluate.kinds)")
    return benchmark


def _module_declarations(name: str, source: str) -> tuple[Benchmark, ...]:
    module_name = f"compo.evaluate.{name}"
    if not DECLARES.search(source):
        if SCORER.search(source):
            raise DeclarationError(f"{module_name} defines run() but declares no {DECLARATION}: a benchmark kind "
                                   "declares itself (see compo.evaluate.kinds)")
        return ()  # a helper module (files, scoring, ...): not imported here, so torch stays out of the DAG build
    try:
        module = importlib.import_module(module_name)
    except TypeError as error:  # Benchmark(...) without a field: the dataclass names it, we name the module
        if "Benchmark.__init__()" not in str(error):
            raise
        missing = str(error).split("argument", 1)[-1].strip(": s")
        raise DeclarationError(f"{module_name}: its benchmark declaration is missing {missing} (every kind "
                               f"answers {', '.join(FIELDS)})") from error
    declared = getattr(module, DECLARATION)
    if not isinstance(declared, tuple | list):
        raise DeclarationError(f"{module_name}.{DECLARATION}: expected a tuple of Benchmark(...), got "
                               f"{type(declared).__name__}")
    return tuple(_check(benchmark, module_name) for benchmark in declared)


@cache
def declared() -> dict[str, Benchmark]:
    """Every benchmark kind declared in `compo.evaluate`, by kind name."""
    package = importlib.import_module("compo.evaluate")
    kinds: dict[str, Benchmark] = {}
    where: dict[str, str] = {}
    for module in sorted(m.name for m in pkgutil.iter_modules(package.__path__)):
        source = (Path(package.__path__[0]) / f"{module}.py").read_text(encoding="utf-8")
        for benchmark in _module_declarations(module, source):
            if benchmark.kind in kinds:
                raise DeclarationError(f"benchmark kind {benchmark.kind!r} is declared twice: in "
                                       f"compo.evaluate.{where[benchmark.kind]} and compo.evaluate.{module}")
            kinds[benchmark.kind], where[benchmark.kind] = benchmark, module
    return dict(sorted(kinds.items()))


def kind_of(kind: Any) -> Benchmark:
    """The declaration of `kind`; an unknown kind is an error listing the known ones."""
    kinds = declared()
    if kind not in kinds:
        raise BenchmarkError(f"benchmark kind {kind!r} unknown (known: {', '.join(kinds)})")
    return kinds[kind]


def benchmark_files(kind: str, benchmark_dir: str, spec: dict[str, Any] | None = None) -> list[str]:
    """The files that define a benchmark of this kind in `benchmark_dir` (evaluation reruns when they
    change); `spec` is the benchmark's config entry (file names, formats, VALSE's pieces)."""
    folder = Path(benchmark_dir)
    return [f"{benchmark_dir}/{path.relative_to(folder)}" if path.is_relative_to(folder) else str(path)
            for path in kind_of(kind).files(spec or {}, folder)]


def benchmark_images(kind: str, spec: dict[str, Any], folder: str | Path) -> list[Path] | None:
    """The image files a benchmark of this kind evaluates on (its reader's resolution), None for kinds whose images
    are class folders (not compared by the overlap guard)."""
    images = kind_of(kind).images
    return None if images is None else images(spec, Path(folder))
