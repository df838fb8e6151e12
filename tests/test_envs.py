"""The conda environments in envs/ pin the same versions as pyproject.toml (the tested venv)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)$")
# envs/llm.yaml runs vLLM, which pins its own torch and transformers, and whose numba needs numpy < 2.3: the
# deliberate differences.
OWN_PINS = {"llm.yaml": {"torch", "transformers", "numpy"}}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project_pins() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {}
    for requirement in project["dependencies"] + project["optional-dependencies"]["dev"]:
        match = PIN.match(requirement)
        assert match, f"pyproject.toml: {requirement!r} is not pinned with =="
        pins[normalise(match.group(1))] = match.group(2)
    return pins


def env_pins(path: Path) -> dict[str, str]:
    pins = {}
    for entry in yaml.safe_load(path.read_text())["dependencies"]:
        for requirement in entry["pip"] if isinstance(entry, dict) else []:
            match = PIN.match(requirement)
            if match:
                pins[normalise(match.group(1))] = match.group(2)
    return pins


@pytest.mark.parametrize("env", sorted(p.name for p in (REPO / "envs").glob("*.yaml")))
def test_env_pins_agree_with_pyproject(env: str) -> None:
    project = project_pins()
    pins = env_pins(REPO / "envs" / env)
    assert pins, f"envs/{env} pins nothing"
    for name, version in pins.items():
        if name in project and name not in OWN_PINS.get(env, set()):
            assert version == project[name], f"envs/{env}: {name}=={version}, pyproject.toml has {project[name]}"


def test_every_rule_names_an_existing_env() -> None:
    for rules in (REPO / "workflow" / "rules").glob("*.smk"):
        for env in re.findall(r'"\.\./\.\./envs/([^"]+)"', rules.read_text()):
            assert (REPO / "envs" / env).exists(), f"{rules.name} names envs/{env}, which does not exist"


CONTAINER = REPO / "containers" / "compo-study.def"


def container_pins() -> dict[str, str]:
    """The packages the container's %post installs with pip, pinned (the line continuations joined)."""
    post = CONTAINER.read_text().split("%post")[1].split("\n%")[0].replace("\\\n", " ")
    pins = {}
    for line in post.splitlines():
        if "pip install" in line:
            for word in line.split():
                match = PIN.match(word)
                if match:
                    pins[normalise(match.group(1))] = match.group(2)
    return pins


def test_the_container_installs_exactly_the_pinned_dependencies() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    expected = {normalise(m.group(1)): m.group(2) for m in map(PIN.match, project)}
    assert container_pins() == expected


def test_no_env_installs_the_package_and_the_nlp_envs_get_wordnet() -> None:
    """An editable install from a relative path (`-e ..`) resolves against the env file's folder under conda but
    against its own folder under mamba, and ties every env to one checkout: rules run `python -m compo` from
    the checkout instead. The envs whose jobs read WordNet fetch it after creation (identical scripts)."""
    for env in (REPO / "envs").glob("*.yaml"):
        for entry in yaml.safe_load(env.read_text())["dependencies"]:
            for requirement in entry["pip"] if isinstance(entry, dict) else []:
                assert not requirement.startswith(("-e", ".", "/")), f"envs/{env.name} installs {requirement}"
    scripts = {name: (REPO / "envs" / f"{name}.post-deploy.sh").read_text() for name in ("nlp", "llm", "train")}
    assert len(set(scripts.values())) == 1, "the post-deploy scripts differ"
    assert "nltk.downloader" in scripts["nlp"]
    for rules in (REPO / "workflow" / "rules").glob("*.smk"):
        text = rules.read_text()
        assert not re.search(r'^\s*"compo ', text, re.M), f"{rules.name}: a rule runs the `compo` script"


@pytest.fixture
def nltk_index(tmp_path: Path) -> Path:
    """A local NLTK data index (index.xml) serving WordNet 3.0 zipped from the files scripts/install-wordnet.sh
    laid out (the data NLTK's own index serves), so the post-deploy script's downloader runs for real here.
    NLTK opens a file:// index only inside an NLTK data folder: the caller lists this one in NLTK_DATA."""
    import hashlib
    import shutil

    from compo.negatives.lexicon import default_nltk_data

    root = tmp_path / "index"
    root.mkdir()
    source = default_nltk_data() / "corpora" / "wordnet"
    archive = Path(shutil.make_archive(str(root / "wordnet"), "zip", source.parent, "wordnet"))
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    size = sum(p.stat().st_size for p in source.iterdir())
    (root / "index.xml").write_text(
        '<?xml version="1.0"?>\n<nltk_data><packages>\n'
        f'<package id="wordnet" name="WordNet" subdir="corpora" url="{archive.as_uri()}"'
        f' size="{archive.stat().st_size}" unzipped_size="{size}" checksum="{md5}" unzip="1" />\n'
        '</packages><collections /></nltk_data>\n')
    return root / "index.xml"


@pytest.mark.slow
def test_the_post_deploy_script_lays_out_wordnet_where_the_env_reads_it(tmp_path: Path, nltk_index: Path) -> None:
    import os
    import subprocess
    import sys

    prefix = tmp_path / "conda-env"
    env = {**os.environ, "CONDA_PREFIX": str(prefix), "NLTK_INDEX_URL": nltk_index.as_uri(),
           "NLTK_DATA": str(nltk_index.parent),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    run = subprocess.run(["bash", str(REPO / "envs" / "nlp.post-deploy.sh")], env=env, capture_output=True,
                         text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    # the env's Python reads it from sys.prefix/nltk_data; here NLTK_DATA stands for that prefix
    check = ("from compo.negatives.lexicon import wordnet, lexical_replacements;"
             "print(len(wordnet().synsets('dog')), lexical_replacements('red', 'ADJ')[:1])")
    read = subprocess.run([sys.executable, "-c", check], env={**env, "NLTK_DATA": str(prefix / "nltk_data")},
                          capture_output=True, text=True, check=False)
    assert read.returncode == 0, read.stderr[-2000:]
    assert int(read.stdout.split()[0]) > 0


@pytest.mark.slow
def test_a_rule_runs_compo_from_the_checkout_with_only_pythonpath(tmp_path: Path) -> None:
    """What a conda env or the container gives a rule: the dependencies, not the package. An interpreter whose
    only site is a venv holding the dependencies without compo's install (a path entry, so none of that folder's
    .pth files, the editable install among them, run) imports compo only through PYTHONPATH, as the Snakefile
    sets it, and runs a stage."""
    import json
    import os
    import subprocess
    import sys
    import sysconfig

    venv = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True,
                          text=True, check=True).stdout.strip()
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    missing = subprocess.run([str(python), "-c", "import compo"], env=bare, capture_output=True, text=True)
    assert missing.returncode != 0 and "No module named 'compo'" in missing.stderr
    world = json.dumps(yaml.safe_load((REPO / "config" / "config.yaml").read_text())["world"]
                       | {"splits": {"pretrain": 2, "finetune": 2, "long": 2, "eval": 2}})
    run = subprocess.run([str(python), "-m", "compo", "world", "--split", "eval", "--world", world, "--seed", "0",
                          "--out", str(tmp_path / "world")], env={**bare, "PYTHONPATH": str(REPO / "workflow")},
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "world" / "manifest.parquet").exists()


@pytest.mark.slow
@pytest.mark.parametrize("env", sorted(p.name for p in (REPO / "envs").glob("*.yaml")))
def test_an_env_files_pins_resolve_with_pip(env: str, tmp_path: Path) -> None:
    """What conda or mamba hands to pip when it creates the env: pip resolves the pinned list (from PyPI, as
    the env's creation would), with nothing of this venv counting as installed."""
    import subprocess
    import sys

    requirements = [r for entry in yaml.safe_load((REPO / "envs" / env).read_text())["dependencies"]
                    if isinstance(entry, dict) for r in entry["pip"]]
    run = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                          "--report", str(tmp_path / "report.json"), *requirements],
                         capture_output=True, text=True, check=False, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    import json

    chosen = {normalise(p["metadata"]["name"]): p["metadata"]["version"]
              for p in json.loads((tmp_path / "report.json").read_text())["install"]}
    for requirement in requirements:
        name, version = PIN.match(requirement).groups()
        assert chosen[normalise(name)].split("+")[0] == version, (env, name)  # a local build: 2.13.0+cpu
