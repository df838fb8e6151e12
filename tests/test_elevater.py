"""ELEVATER's class names and templates (compo.evaluate.elevater), read from a prompts.py written in the
toolkit's layout (vision_benchmark/datasets/prompts.py: `<name>_classes` / `<name>_templates` lists, `class_map` /
`template_map` keyed by ELEVATER's dataset name) with made-up classes; the file is parsed, never run."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image
from test_benchmark_formats import write_image, zeroshot_loop

from compo.evaluate import BenchmarkError, benchmark_files, elevater, run_benchmark

PROMPTS = '''"""
A made-up prompts.py in the layout of Elevater_Toolkit_IC's vision_benchmark/datasets/prompts.py.
"""
raise SystemExit("this file must never run")

toy_classes = [
    'red blob',
    ['blue square', 'azure square'],
    'green dot',
]

toy_templates = [
    'a photo of a {}.',
    'a drawing of the {}.',
]

other_classes = ['cat', 'dog']
other_templates = ['itap of a {}.']
computed_classes = sorted(other_classes)

class_map = {
    'toy-3': toy_classes,
    'other': other_classes,
    'computed': computed_classes,
}

template_map = {
    'toy-3': toy_templates,
    'other': other_templates,
}
'''


def test_elevater_prompts_file_names_classes_and_templates(tmp_path: Path, loaded) -> None:
    prompts = tmp_path / "prompts.py"
    prompts.write_text(PROMPTS)
    assert elevater.class_names(prompts, "toy-3") == ["red blob", "blue square", "green dot"]  # first synonym
    assert elevater.templates(prompts, "toy-3") == ["a photo of a {}.", "a drawing of the {}."]
    root = tmp_path / "toy"
    folders = ["a_red", "b_blue", "c_green"]
    for k, folder in enumerate(folders):
        for i in range(2):
            write_image(root / folder / f"{i}.png", 10 * k + i)
    spec = {"kind": "zeroshot", "source": "files", "classnames": str(prompts), "templates": str(prompts),
            "dataset": "toy-3"}
    result = run_benchmark(loaded, spec, root, ["ignored {}"])
    images = [Image.open(root / folder / f"{i}.png").convert("RGB") for folder in folders for i in range(2)]
    expected = zeroshot_loop(loaded, images, [0, 0, 1, 1, 2, 2], ["red blob", "blue square", "green dot"],
                             ["a photo of a {}.", "a drawing of the {}."])
    assert result.metrics["top1"].value == pytest.approx(expected)
    assert benchmark_files("zeroshot", str(root), spec) == [str(prompts)]  # a rule input, once
    # two classes in the toolkit, three folders: the count is checked
    with pytest.raises(BenchmarkError, match=r"prompts\.py: expected 3 class names .* got 2"):
        run_benchmark(loaded, {**spec, "dataset": "other"}, root, None)


def test_elevater_prompts_file_errors(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.py"
    prompts.write_text(PROMPTS)
    with pytest.raises(BenchmarkError, match=r"class_map has no dataset 'cifar-10' \(has computed, other, toy-3\)"):
        elevater.class_names(prompts, "cifar-10")
    with pytest.raises(BenchmarkError, match="needs the benchmark key 'dataset'"):
        elevater.templates(prompts, None)
    with pytest.raises(BenchmarkError, match=r"class_map\['computed'\]: expected a list literal"):
        elevater.class_names(prompts, "computed")
    with pytest.raises(BenchmarkError, match="template_map has no dataset 'computed'"):
        elevater.templates(prompts, "computed")
    prompts.write_text("class_map = {'toy': missing_classes}\n")
    with pytest.raises(BenchmarkError, match="'missing_classes' is not assigned at the module's top level"):
        elevater.class_names(prompts, "toy")
    prompts.write_text("classes = ['a']\n")
    with pytest.raises(BenchmarkError, match="expected a module-level dict 'template_map'"):
        elevater.templates(prompts, "toy")
    with pytest.raises(BenchmarkError, match="ELEVATER prompts file not found"):
        elevater.templates(tmp_path / "absent.py", "toy")
