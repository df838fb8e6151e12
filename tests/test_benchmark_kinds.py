"""compo.evaluate.kinds: every benchmark kind declares itself in its module and answers every question the workflow
asks of it (its files for the rules, its images for the overlap guard, its size for the plan, its subsets and chance
level for the figures, its scorer), on the world's benchmarks and on the paper study's stand-ins of each release."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from compo.config import config_schema
from compo.evaluate.kinds import Benchmark, BenchmarkSize, DeclarationError, declared, kind_keys, kind_of
from compo.evaluate.kinds import _module_declarations as module_declarations

REPO = Path(__file__).resolve().parents[1]
PAPER = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
DEFAULT = yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def test_the_config_check_knows_the_declared_kinds_and_refuses_another() -> None:
    from compo.config import ConfigError, validate_schema

    schema = config_schema()["properties"]["benchmarks"]["additionalProperties"]["properties"]["kind"]
    assert schema["enum"] == list(declared())
    with pytest.raises(ConfigError, match="config key benchmarks.new.kind: 'sugarcrep' is not one of .*'sugarcrepe'"):
        validate_schema({**DEFAULT, "benchmarks": {**DEFAULT["benchmarks"],
                                                   "new": {"kind": "sugarcrep", "source": "world"}}})
    used = {spec["kind"] for config in (PAPER, DEFAULT) for spec in config["benchmarks"].values()}
    assert used <= set(declared())


@pytest.mark.parametrize("kind", sorted(declared()))
def test_a_kind_answers_every_question(kind: str) -> None:
    benchmark = kind_of(kind)
    assert benchmark.kind == kind and benchmark.source and benchmark.headline
    assert all(callable(f) for f in (benchmark.run, benchmark.files, benchmark.size, benchmark.selections,
                                     benchmark.downloads))
    assert benchmark.images is None or callable(benchmark.images)
    assert benchmark.prepare is None or callable(benchmark.prepare)
    for metric in benchmark.subsets:
        chance = benchmark.chance_of(metric)
        assert chance is None or 0 < chance < 1
    # every paper benchmark of the kind has a size at its release's size (the plan refuses one without)
    for name, spec in PAPER["benchmarks"].items():
        if spec["kind"] == kind:
            size = benchmark.size(spec)
            assert isinstance(size, BenchmarkSize) and size.images > 0, name
            # and says where its release comes from (compo inputs --template writes it beside the key)
            lines = benchmark.downloads(spec)
            assert lines.get("path") and all(isinstance(line, str) and line for line in lines.values()), name


def test_every_format_and_dataset_source_says_where_its_release_comes_from() -> None:
    from compo.data import DOWNLOADS, READERS
    from compo.evaluate.files import (
        CLASSIFICATION_FORMATS,
        LABELLED_DOWNLOADS,
        LONG_RETRIEVAL_DOWNLOADS,
        LONG_RETRIEVAL_FORMATS,
    )

    assert set(LABELLED_DOWNLOADS) == set(CLASSIFICATION_FORMATS)
    assert set(LONG_RETRIEVAL_DOWNLOADS) == set(LONG_RETRIEVAL_FORMATS)
    assert set(DOWNLOADS) == set(READERS)
    for table in (LABELLED_DOWNLOADS, LONG_RETRIEVAL_DOWNLOADS, DOWNLOADS):
        assert all(lines.get("path") for lines in table.values())


def test_the_scorer_is_imported_without_torch_until_it_scores() -> None:
    code = ("import sys; from compo.evaluate.kinds import declared; declared(); "
            "print(sorted(m for m in ('torch', 'open_clip') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_an_unknown_kind_names_the_known_ones() -> None:
    from compo.evaluate.files import BenchmarkError

    with pytest.raises(BenchmarkError, match="'sugarcrep' unknown .*sugarcrepe"):
        kind_of("sugarcrep")


def _declaring(tmp_path: Path, name: str, body: str) -> str:
    """A module of compo.evaluate written for the test (removed again by the fixture)."""
    import compo.evaluate

    path = Path(compo.evaluate.__path__[0]) / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path.read_text()


@pytest.fixture
def scratch_module():
    import compo.evaluate

    name = "zz_test_kind"
    path = Path(compo.evaluate.__path__[0]) / f"{name}.py"
    yield name
    path.unlink(missing_ok=True)
    sys.modules.pop(f"compo.evaluate.{name}", None)


def test_a_declaration_missing_a_field_names_the_module_and_the_field(tmp_path: Path, scratch_module: str) -> None:
    source = _declaring(tmp_path, scratch_module, """
        from compo.evaluate.kinds import Benchmark

        def run(*args):
            return None

        BENCHMARKS = (Benchmark(kind="zz", source="a test", run=run, files=lambda s, f: [], images=None,
                                headline="mean", subsets=(), chance=None, keys={}, selections=print,
                                downloads=dict),)
    """)
    with pytest.raises(DeclarationError, match=rf"compo.evaluate.{scratch_module}: .*missing 'size'"):
        module_declarations(scratch_module, source)


def test_a_scorer_without_a_declaration_is_refused(tmp_path: Path, scratch_module: str) -> None:
    source = _declaring(tmp_path, scratch_module, """
        def run(loaded, folder, spec, templates=None):
            return None
    """)
    with pytest.raises(DeclarationError, match=rf"compo.evaluate.{scratch_module} defines run\(\) but declares no"):
        module_declarations(scratch_module, source)


def test_a_wrong_field_is_named(tmp_path: Path, scratch_module: str) -> None:
    source = _declaring(tmp_path, scratch_module, """
        from compo.evaluate.kinds import Benchmark

        BENCHMARKS = (Benchmark(kind="zz", source="a test", run=print, files=print, images=None, size=print,
                                headline="mean", subsets=("a",), chance=2.0, keys={}, selections=print,
                                downloads=dict),)
    """)
    with pytest.raises(DeclarationError, match="'zz' declares a wrong chance"):
        module_declarations(scratch_module, source)


def test_declared_kinds_are_plain_benchmarks() -> None:
    assert all(isinstance(b, Benchmark) for b in declared().values())
    compositional = {kind for kind, b in declared().items() if b.compositional}
    # the 15 kinds that pick the right caption or image among candidates, the others read directly
    assert compositional == set(declared()) - {"retrieval", "long_retrieval", "zeroshot", "linear_probe"}


def test_config_readme_lists_every_kind_and_its_own_keys_as_declared() -> None:
    from compo.evaluate.kinds import keys_table

    readme = (REPO / "config" / "README.md").read_text()
    assert "\n".join(keys_table()) in readme, "run: compo benchmark-keys --write config/README.md"
    schema = config_schema()["properties"]["benchmarks"]["additionalProperties"]["properties"]
    assert set(kind_keys()) <= set(schema)


def test_a_key_of_another_kind_is_refused_naming_the_kind_that_reads_it() -> None:
    from compo.config import ConfigError, validate_config

    config = {**DEFAULT, "benchmarks": {**DEFAULT["benchmarks"],
                                        "sugarcrepe": {**DEFAULT["benchmarks"]["sugarcrepe"], "max_items": 10}}}
    with pytest.raises(ConfigError, match=r"config key benchmarks.sugarcrepe.max_items: kind sugarcrepe does not "
                                          r"read max_items \(its own keys: none; read by kind eqben\)"):
        validate_config(config)


@pytest.mark.parametrize(("kind", "key", "value", "message"), [
    ("whatsup", "subsets", ["WhatsUp_C"], r"benchmarks.b.subsets.0: 'WhatsUp_C' is not one of"),
    ("long_retrieval", "subsets", ["WhatsUp_A"], r"benchmarks.b.subsets.0: 'WhatsUp_A' is not one of"),
    ("linear_probe", "headline", "roc_auc", r"benchmarks.b.headline: 'roc_auc' is not one of"),
    ("eqben", "max_items", 0, r"benchmarks.b.max_items: 0 is less than the minimum of 1"),
])
def test_a_value_its_kind_refuses_names_the_key(kind: str, key: str, value: object, message: str) -> None:
    """The same key is checked by the schema of the entry's own kind (What's Up's subsets are not IIW's)."""
    from compo.config import ConfigError, validate_config

    entry = {"kind": kind, "source": "files", "path": "data/b", key: value}
    with pytest.raises(ConfigError, match=rf"config key {message}"):
        validate_config({**DEFAULT, "benchmarks": {**DEFAULT["benchmarks"], "b": entry}})


def test_a_declaration_with_a_key_without_meaning_is_named(tmp_path: Path, scratch_module: str) -> None:
    source = _declaring(tmp_path, scratch_module, """
        from compo.evaluate.kinds import Benchmark, Key

        BENCHMARKS = (Benchmark(kind="zz", source="a test", run=print, files=print, images=None, size=print,
                                headline="mean", subsets=("a",), chance=0.5, keys={"n": Key({}, "")},
                                selections=print, downloads=dict),)
    """)
    with pytest.raises(DeclarationError, match="'zz' declares a wrong keys"):
        module_declarations(scratch_module, source)
