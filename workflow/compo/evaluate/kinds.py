"""Benchmark kinds, each declared in its own module of this package, as a loss is (`compo.losses`).

A module that scores a kind assigns a top-level `BENCHMARKS = (Benchmark(...), ...)`; `declared()` finds every
such module of `compo.evaluate` and is the one registry the workflow reads: the rules' inputs (`files`), the
overlap guard (`images`), `compo plan` (`size`), the figures (`subsets`, `chance`) and evaluation itself (`run`).
No list of kinds is kept anywhere else, so a kind cannot be half-added: a declaration missing a field is an error
at discovery naming its module and the field, and tests/test_benchmark_kinds.py asks every kind every question.

The modules import without torch (their scoring imports it when it runs), so the rules read the declarations
while Snakemake builds the DAG. Every function a declaration names takes the benchmark's config entry (`spec`)
and, where it reads files, the benchmark's folder:

    run(loaded, folder, spec, templates[, prepared]) -> BenchmarkResult    score a model (compo.evaluate.common);
                                             `prepared`: the file `prepare` wrote (a kind that declares one)
    prepare(spec, folder, out) -> None       optional: the kind's model-independent work (ARO Order's caption
                                             perturbations), written to `out` once per benchmark by rule
                                             prepare_benchmark instead of in every evaluation job; run without
                                             `prepared` (compo eval, tests) does it itself, with the same result
    files(spec, folder) -> [Path]            the release's files that define it (evaluation reruns when they change)
    images(spec, folder) -> [Path]           the image files it evaluates on, as its reader resolves them; None for
                                             a kind whose images are class folders no training set draws from
    size(spec) -> BenchmarkSize | None       its images and texts at the release's size (None: no published figure)
    selections(metric, metrics) -> [Selection] | None   the prediction rows behind a metric (compo.stats' intervals)
    downloads(spec) -> {key: line}           where the release's files come from ("address; layout"), per key leaf
    check(spec) -> [(key, message)]          optional: what the keys' schemas cannot say (a key another of the
                                             entry's choices makes unused), refused with the config at load

A declaration's `keys` are the kind's own config keys (`benchmarks.<name>.<key>` beyond the ones every kind has:
workflow/schemas/config.schema.yaml), each with its value's JSON schema, meaning and source: the config check
validates an entry against its kind's keys and refuses a key its kind does not read (it would be silently unused),
and config/README's table of them is written from the declarations (`compo benchmark-keys`).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from compo.doc_sections import replace_between
from compo.evaluate.files import BenchmarkError
from compo.schema import problems

DECLARATION = "BENCHMARKS"  # the top-level name a module declares its kinds under
DECLARES = re.compile(rf"^{DECLARATION}\s*=", re.MULTILINE)
SCORER = re.compile(r"^def run\(", re.MULTILINE)  # a module that scores without declaring: a half-added kind


POSITIVE_INT: dict[str, Any] = {"type": "integer", "minimum": 1}
NAMES: dict[str, Any] = {"type": "array", "minItems": 1, "uniqueItems": True,
                         "items": {"type": "string", "minLength": 1}}
FOLDERS: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}  # a name -> a folder


@dataclass(frozen=True)
class Selection:
    """Which rows of a kind's per-item predictions make one component of a metric, and how each row scores: what
    compo.stats resamples for the claims' intervals (a metric of several components is their mean)."""

    subsets: tuple[str, ...] | None  # None: every row
    at_k: int = 1                     # a row scores 1 when its rank <= at_k (rank 1 = correct)
    macro: bool = False               # each subset weighted equally (else each row)
    column: str = "rank"              # the predictions' rank column (ARO Order's strict reading: rank_strict)
    weight: float = 1.0


def stored_only(metric: str, metrics: Mapping[str, Any]) -> None:
    """A kind whose predictions give none of its metrics as a mean of per-row scores: each is read as stored."""
    return None


class Key(NamedTuple):
    """A config key a kind reads: the JSON schema of its value, and config/README's meaning and source."""

    schema: Mapping[str, Any]
    meaning: str
    source: str = ""


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
    keys: Mapping[str, Key]        # the kind's own config keys ({} when it reads only the common ones)
    # selections(metric, the record's metrics) -> [Selection] | None: how a metric is recomputed from the per-item
    # predictions (None: a statistic that is no mean of row scores, or a rule the predictions do not record:
    # compo.stats then reads it as stored per seed); `stored_only` for a kind with none
    selections: Callable[[str, Mapping[str, Any]], list[Selection] | None]
    # downloads(spec) -> {key leaf: "address; layout"}: where the files of the keys a user sets by hand come from
    # (`compo inputs --template` writes each beside its key; compo.sources holds addresses several kinds share)
    downloads: Callable[[dict[str, Any]], Mapping[str, str]]
    # prepare(spec, folder, out): model-independent work done once per benchmark (None: the kind has none)
    prepare: Callable[[dict[str, Any], Path, Path], None] | None = None
    # check(spec) -> [(key, message)]: the entry's problems its keys' schemas cannot express (None: none to check)
    check: Callable[[dict[str, Any]], list[tuple[str, str]]] | None = None

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
    wrong = [name for name in ("run", "files", "size", "selections", "downloads")
             if not callable(getattr(benchmark, name))]
    wrong += [name for name in ("images", "prepare", "check")
              if getattr(benchmark, name) is not None and not callable(getattr(benchmark, name))]
    wrong += [name for name in ("kind", "source", "headline") if not isinstance(getattr(benchmark, name), str)
              or not getattr(benchmark, name)]
    if not isinstance(benchmark.subsets, tuple) or not all(isinstance(s, str) and s for s in benchmark.subsets):
        wrong.append("subsets")
    chance = benchmark.chance if isinstance(benchmark.chance, Mapping) else {"": benchmark.chance}
    if not all(c is None or (isinstance(c, float) and 0 < c < 1) for c in chance.values()):
        wrong.append("chance")
    if not isinstance(benchmark.keys, Mapping) or not all(
            isinstance(name, str) and isinstance(key, Key) and isinstance(key.schema, Mapping) and key.meaning
            for name, key in benchmark.keys.items()):
        wrong.append("keys")
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


def prepares(kind: str) -> bool:
    """Whether a benchmark of this kind has model-independent work done once (rule prepare_benchmark)."""
    return kind_of(kind).prepare is not None


def benchmark_images(kind: str, spec: dict[str, Any], folder: str | Path) -> list[Path] | None:
    """The image files a benchmark of this kind evaluates on (its reader's resolution), None for kinds whose images
    are class folders (not compared by the overlap guard)."""
    images = kind_of(kind).images
    return None if images is None else images(spec, Path(folder))


def kind_keys() -> dict[str, list[str]]:
    """Every kind's own config key, with the kinds that read it, in key order."""
    readers: dict[str, list[str]] = {}
    for kind, benchmark in declared().items():
        for key in benchmark.keys:
            readers.setdefault(key, []).append(kind)
    return dict(sorted(readers.items()))


def check_keys(spec: dict[str, Any], common: Iterable[str]) -> list[tuple[str, str]]:
    """Problems of a benchmark entry of a declared kind as (key, message): a key neither `common` (every kind's)
    nor its kind's own (it would be silently unused), then each own key's value against the kind's schema, then
    (values valid) the kind's own `check`."""
    benchmark = kind_of(spec.get("kind"))
    own, common = benchmark.keys, set(common)
    found = [(key, f"kind {benchmark.kind} does not read {key} (its own keys: {', '.join(own) or 'none'}; "
                   f"read by kind {', '.join(kind_keys().get(key, ['none']))})")
             for key in spec if key not in common and key not in own]
    schema = {"type": "object", "properties": {key: dict(own[key].schema) for key in own}}
    found += problems(schema, {key: value for key, value in spec.items() if key in own})
    return found or (benchmark.check(spec) if benchmark.check else [])


def keys_table() -> list[str]:
    """config/README's table of the kinds and their own keys, from the declarations: what `compo benchmark-keys`
    prints. A key several kinds read with one meaning (the same Key) is one entry naming them all."""
    kinds = declared()
    rows = ["| key | kind: meaning | source |", "|---|---|---|",
            f"| `benchmarks.<name>.kind` | one of {', '.join(f'`{kind}`' for kind in kinds)}: each reads its "
            "release's file format (`workflow/compo/evaluate/<module>.py` declares it) | DESIGN §7 |"]
    for key, readers in kind_keys().items():
        meanings: list[tuple[Key, list[str]]] = []  # (a Key holds a dict: compared, not hashed)
        for kind in readers:
            same = next((names for declared_key, names in meanings if declared_key == kinds[kind].keys[key]), None)
            if same is None:
                meanings.append((kinds[kind].keys[key], [kind]))
            else:
                same.append(kind)
        meaning = "; ".join(f"{', '.join(names)}: {declared_key.meaning}" for declared_key, names in meanings)
        sources = dict.fromkeys(k.source for k, _ in meanings if k.source)
        rows.append(f"| `benchmarks.<name>.{key}` | {meaning} | {'; '.join(sources)} |")
    return rows


KEYS_MARKERS = ("<!-- benchmark keys: begin (written by compo benchmark-keys) -->", "<!-- benchmark keys: end -->")


def write_keys_table(path: Path) -> None:
    """Replace the table between KEYS_MARKERS in `path` (config/README.md) by `keys_table()`."""
    replace_between(path, *KEYS_MARKERS, "\n".join(keys_table()))
