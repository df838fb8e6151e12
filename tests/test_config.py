"""Config loading: schema errors name the key, inheritance resolves, cross-references are checked."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from compo.config import ConfigError, deep_merge, load_config, resolve_method, truncate_words, validate_config

REPO = Path(__file__).resolve().parents[1]


def test_default_config_is_valid(repo):
    config = load_config(repo / "config" / "config.yaml")
    assert {"clip-ft", "negclip", "degla", "fsc-clip", "c2lip", "slipform", "lss"} <= set(config["study"]["methods"])


def test_e2e_config_is_valid(repo):
    load_config(repo / "config" / "config.yaml", repo / "tests" / "e2e" / "config.yaml")


@pytest.mark.parametrize("name", ["quick.yaml", "controls-long.yaml", "controls-bases.yaml"])
def test_controls_configs_are_valid_and_measure_only_the_controls(repo, name):
    from compo.claim_specs import study_claims
    from compo.config import resolve_method

    config = load_config(repo / "config" / "config.yaml", repo / "config" / name)
    assert {c["role"] for c in study_claims(config)} == {"control"} and len(study_claims(config)) >= 4
    # the positive and negative controls train exactly as long as their reference
    steps = {m: resolve_method(config, m)["train"]["steps"] for m in ("clip-ft", "negclip", "negclip-random")}
    assert len(set(steps.values())) == 1, steps


@pytest.mark.parametrize("name", ["quick.yaml", "controls-bases.yaml"])
def test_controls_configs_measure_every_kind_of_effect(repo, name):
    """The quick study and the two-bases controls answer, for every kind in `effects`, whether this testbed
    detects it: a control added to a kind and not to these overlays would leave that kind "not measured"."""
    from compo.claim_specs import study_claims

    config = load_config(repo / "config" / "config.yaml", repo / "config" / name)
    named = {c for kind in config["effects"].values() for side in ("positive", "negative") for c in kind.get(side, [])}
    assert named and named <= {c["id"] for c in study_claims(config)}, named - {c["id"] for c in study_claims(config)}


def test_an_accepted_overlap_names_a_dataset_and_a_benchmark(config):
    good = copy.deepcopy(config)
    good["overlap"] = {"accept": [{"dataset": "coco", "benchmark": "sugarcrepe", "why": "a seed trained on it"}]}
    assert validate_config(good)["overlap"]["accept"][0]["benchmark"] == "sugarcrepe"


def test_resolve_method_inherits_and_overrides(config):
    recipe = resolve_method(config, "negclip")
    assert recipe["loss"] == "negclip"
    assert recipe["base"] == "clip"  # inherited from clip-ft
    assert recipe["train"] == config["methods"]["clip-ft"]["train"]
    assert "parent" not in recipe and recipe["name"] == "negclip"


def test_text_protocol_of_a_models_method(config):
    """LongCLIP-70 cuts texts to 70 words; plain fine-tuning and a base (not a method) keep whole texts."""
    assert truncate_words(config, "longclip-70") == 70
    assert truncate_words(config, "clip-ft") is None and truncate_words(config, "base-clip") is None


def test_benchmark_folder_is_the_released_path_or_the_worlds():
    from compo.layout import benchmark_dir

    assert benchmark_dir("results", {"source": "files", "kind": "sugarcrepe", "path": "data/sugarcrepe"}) == \
        "data/sugarcrepe"
    assert benchmark_dir("results", {"source": "world", "kind": "zeroshot", "attribute": "shape"}) == \
        "results/benchmarks/world/zeroshot-shape"


def test_the_study_wide_truth_filter_enters_the_recipes_that_read_a_negatives_table(config):
    assert config["hard_negatives"]["drop_true"] is True
    assert resolve_method(config, "negclip")["drop_true_negatives"] is True
    assert resolve_method(config, "cement")["drop_true_negatives"] is True
    # recipes without a table keep their identity (no key, so their saved runs stay valid)
    assert "drop_true_negatives" not in resolve_method(config, "clip-ft")
    assert "drop_true_negatives" not in resolve_method(config, "fsc-clip")
    config["hard_negatives"]["drop_true"] = False
    assert resolve_method(config, "negclip")["drop_true_negatives"] is False


def test_inheritance_cycle_is_an_error(config):
    config["methods"]["clip-ft"]["parent"] = "negclip"
    with pytest.raises(ConfigError, match="cycle"):
        resolve_method(config, "negclip")


def test_deep_merge_does_not_mutate_inputs():
    base = {"a": {"b": 1, "c": 2}}
    merged = deep_merge(base, {"a": {"b": 3}})
    assert merged == {"a": {"b": 3, "c": 2}} and base == {"a": {"b": 1, "c": 2}}


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="nothere.yaml"):
        load_config(tmp_path / "nothere.yaml")


# --- every config error that one overlay provokes: (overlay on config.yaml, key, message) ------------------------

CONFIG_ERRORS = [
    # schema: unknown keys and wrong types
    ({"unknown_key": 1}, "<top level>", r"Additional properties are not allowed \('unknown_key' was unexpected\)"),
    ({"world": {"image_size": "big"}}, "world.image_size", "'big' is not of type 'integer'"),
    ({"methods": {"clip-ft": {"train": {"lr": -1}}}}, "methods.clip-ft.train.lr", "-1 is less than or equal to"),
    ({"negatives": {"swap": {"k": 0}}}, "negatives.swap.k", "0 is less than the minimum of 1"),
    ({"hard_negatives": {"drop_true": "yes"}}, "hard_negatives.drop_true", "'yes' is not of type 'boolean'"),
    ({"memory_mb": {"train": {"c2lip": 0}}}, "memory_mb.train.c2lip", "0 is less than the minimum of 1"),
    ({"overlap": {"accept": [{"dataset": "coco"}]}}, "overlap.accept.0", "'benchmark' is a required property"),
    ({"results": ""}, "results", "'' is not a path"),
    ({"study": {"methods": []}}, "study.methods", r"\[\] should be non-empty"),
    # cross-references
    ({"methods": {"negclip": {"loss": "nonsense"}}}, "methods.negclip.loss", "unknown loss 'nonsense'; registered: "),
    ({"study": {"methods": ["nope"]}}, "study.methods", "'nope' is not defined under methods"),
    ({"methods": {"negclip": {"parent": "ghost"}}}, "methods.negclip.parent", "unknown method 'ghost'"),
    ({"methods": {"negclip": {"negatives": "ghost"}}}, "methods.negclip.negatives", "unknown generator 'ghost'"),
    ({"methods": {"clip-ft": {"base": "ghost"}}}, "methods.clip-ft.base", "unknown base 'ghost'"),
    ({"datasets": {"coco": {"split": "nowhere"}}}, "datasets.coco.split", "must name a world split"),
    ({"overlap": {"accept": [{"dataset": "coco", "benchmark": "ghost"}]}}, "overlap.accept[0].benchmark",
     "'ghost' is not defined under benchmarks"),
    ({"overlap": {"accept": [{"dataset": "ghost", "benchmark": "sugarcrepe"}]}}, "overlap.accept[0].dataset",
     "'ghost' is not defined under datasets"),
    ({"negatives": {"swap": {"generator": "no-such-generator"}}}, "negatives.swap.generator",
     "unknown generator 'no-such-generator'"),
    ({"negatives": {"swap": {"kinds": ["pronoun"]}}}, "negatives.swap",
     r"bad options for generator 'negclip-swap': kinds \['pronoun'\]: unknown"),
    ({"memory_mb": {"train": {"ghost": 1000}}}, "memory_mb.train.ghost",
     r"not a method \(expected default or a name under methods\)"),
    ({"composites": {"compositional": ["sugarcrep/overall"]}}, "composites.compositional",
     "'sugarcrep/overall': no benchmark"),
    ({"reported": [{"source": "s", "metrics": ["sugarcrepe/replace"], "rows": [{"row": "r", "method": "nope",
                                                                               "values": [1]}]}]},
     r"reported[0] (s).rows[0].method", ""),
    # a recipe's keys against its loss and its negatives (configs that used to pass silently, issue 10.9)
    ({"methods": {"degla": {"k": 5}}}, "methods.degla.k",
     "5 negatives per caption, but negatives.degla-rules writes only k = 4"),
    ({"methods": {"clip-ft": {"focal_gamma": 2.0}}}, "methods.clip-ft.focal_gamma", "loss infonce does not use "),
    ({"methods": {"clip-ft": {"negatives": "swap"}}}, "methods.clip-ft.negatives",
     "loss infonce reads no hard negatives; set negatives: null"),
    ({"methods": {"degla": {"weights": {"local": 0.2}}}}, "methods.degla.weights.local",
     r"not a key here \(known: igc, tgc, distill\)"),
    ({"methods": {"cement": {"ema": 0.9}}}, "methods.cement.ema", "loss cement does not use ema"),
    ({"methods": {"cement": {"margin": {"m_min": 3.0}}}}, "methods.cement.margin.m_min", "m_min 3.0 is above m_max"),
    ({"methods": {"negclip": {"hard_images": 0}}}, "methods.negclip.hard_images",
     r"0 is not a number of nearest images \(an integer >= 1\) or 'random'"),
    ({"methods": {"cement": {"hard_images": 3}}}, "methods.cement.hard_images",
     r"loss cement needs batch parts the hard-image rows do not carry \(cement_pairs\)"),
    ({"methods": {"longclip": {"text": {"context_length": 50}}}}, "methods.longclip.text.context_length",
     "50 must exceed the 77 positions of compo-tiny-clip"),
    ({"methods": {"longclip": {"text": {"keep_positions": 80}}}}, "methods.longclip.text.keep_positions",
     r"80 must be in \[0, 75\]"),
    ({"methods": {"longclip": {"text": {"freeze_positions": 300}}}}, "methods.longclip.text.freeze_positions",
     "300 exceeds the 248 positions"),
    # training settings
    ({"methods": {"clip-ft": {"train": {"warmup": 351}}}}, "methods.clip-ft.train.warmup",
     "351 warm-up steps exceed the 350 training steps"),
    ({"methods": {"clip-ft": {"train": {"accum_freq": 3}}}}, "methods.clip-ft.train.accum_freq",
     "batch_size 64 does not split into 3 equal micro-batches"),
    ({"bases": {"clip": {"train": {"steps": 10}}}}, "bases.clip.train.warmup",
     "100 warm-up steps exceed the 10 training steps"),
    ({"methods": {"clip-ft": {"train": {"val_every": 1, "val_benchmark": "nonesuch"}}}},
     "methods.clip-ft.train.val_benchmark", "'nonesuch'"),
    ({"methods": {"clip-ft": {"train": {"val_every": 1}}}}, "methods.clip-ft.train.val_every",
     "nothing to validate on"),
    ({"methods": {"clip-ft": {"train": {"val_every": "weekly", "val_holdout": 10}}}},
     "methods.clip-ft.train.val_every", ""),
    ({"methods": {"clip-ft": {"train": {"val_every": 1, "val_holdout": 1}}}}, "methods.clip-ft.train.val_holdout",
     ""),
    ({"methods": {"clip-ft": {"train": {"val_holdout": 10}}}}, "methods.clip-ft.train.val_holdout",
     "10 images held out of training for a validation that never runs"),
    # seeds, and entries given twice in a list of runs
    ({"study": {"base_seeds": [0, 1]}}, "study.seeds",  # seeds 0, 1, 2: two on base 0, one on base 1
     r"seed s fine-tunes base seed study.base_seeds\[s mod 2\], which gives the bases unequal numbers of seeds "
     r"\(base seed 0: 2, base seed 1: 1\)"),
    ({"study": {"base_seeds": [3, 3]}}, "study.base_seeds", r"\[3, 3\] repeats a seed"),
    ({"study": {"base_seeds": [0, 1], "seeds": [0, 1]}, "ablations": {"cement-margin": {"seeds": [0]}}},
     "ablations.cement-margin.seeds", "seed s fine-tunes base seed"),
    ({"study": {"seeds": [0, 1, 0]}}, "study.seeds", ".* is given twice"),
    ({"study": {"methods": ["clip-ft", "negclip", "clip-ft"]}}, "study.methods", ".* is given twice"),
    ({"study": {"benchmarks": ["sugarcrepe", "sugarcrepe"]}}, "study.benchmarks", ".* is given twice"),
    # a benchmark kind's own check (its declaration's `check`): a key its entry's other choices leave unused
    ({"benchmarks": {"linear_probe": {"solver": "adamw", "l2_grid": [1.0]}}}, "benchmarks.linear_probe.l2_grid",
     r"belongs to solver lbfgs \(adamw runs `epochs`\)"),
    ({"benchmarks": {"linear_probe": {"epochs": 3}}}, "benchmarks.linear_probe.epochs", "belongs to solver adamw"),
    ({"study": {"datasets": ["coco", "coco"]}}, "study.datasets", ".* is given twice"),
    ({"wiseft": {"alphas": [0.0, 0.5, 0.5, 1.0]}}, "wiseft.alphas", ".* is given twice"),
    ({"ablations": {"fsc-lora": {"seeds": [2, 2]}}}, "ablations.fsc-lora.seeds", ".* is given twice"),
    ({"ablations": {"fsc-lora": {"methods": ["fsc-clip", "fsc-clip"]}}}, "ablations.fsc-lora.methods",
     ".* is given twice"),
]


@pytest.mark.parametrize(("overlay", "key", "message"), CONFIG_ERRORS,
                         ids=[f"{key}-{i}" for i, (_, key, _) in enumerate(CONFIG_ERRORS)])
def test_a_bad_overlay_is_an_error_naming_the_key(repo, tmp_path, overlay, key, message):
    """config.yaml with `overlay` over it is refused at load: one line, `config key <key>: <message>`."""

    (tmp_path / "overlay.yaml").write_text(yaml.safe_dump(overlay))
    with pytest.raises(ConfigError, match=rf"^config key {re.escape(key)}: {message}"):
        load_config(repo / "config" / "config.yaml", tmp_path / "overlay.yaml")


def test_a_table_without_its_default_is_an_error_naming_it(config):
    """What no overlay can do (drop a key): memory_mb.train without `default`."""
    del config["memory_mb"]["train"]["default"]
    with pytest.raises(ConfigError, match=r"^config key memory_mb\.train"):
        validate_config(config)


def test_inherited_keys_count_for_the_childs_loss(config):
    """siglip-ft inherits clip-ft's `negatives: null`: a null key is no use of it."""
    config["methods"]["siglip-ft"]["negatives"] = None
    validate_config(config)


def test_duplicate_yaml_key_names_key_and_lines(tmp_path, repo):
    text = (repo / "config" / "config.yaml").read_text() + "seed: 7\n"
    (tmp_path / "config.yaml").write_text(text)
    line = text.count("\n")
    with pytest.raises(ConfigError, match=rf"config\.yaml line {line}: duplicate key 'seed' \(first given on "
                                          r"line 5\)"):
        load_config(tmp_path / "config.yaml")


def test_nested_duplicate_and_tab_indentation_name_the_line(tmp_path):
    (tmp_path / "dup.yaml").write_text("methods:\n  a: {loss: infonce}\n  b: {}\n  a: {loss: negclip}\n")
    with pytest.raises(ConfigError, match=r"dup\.yaml line 4: duplicate key 'a' \(first given on line 2\)"):
        load_config(tmp_path / "dup.yaml")
    (tmp_path / "tab.yaml").write_text("seed: 0\nworld:\n\timage_size: 64\n")
    with pytest.raises(ConfigError, match=r"tab\.yaml line 3 column 1: .*tab"):
        load_config(tmp_path / "tab.yaml")
    (tmp_path / "latin1.yaml").write_bytes("seed: 0 # caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1\.yaml: not UTF-8"):
        load_config(tmp_path / "latin1.yaml")


def test_yaml_merge_keys_are_not_duplicates(tmp_path):
    from compo.config import load_yaml

    (tmp_path / "merge.yaml").write_text("a: &x {b: 1}\nc:\n  <<: *x\n  d: 2\n")
    assert load_yaml(tmp_path / "merge.yaml") == {"a": {"b": 1}, "c": {"b": 1, "d": 2}}


def test_a_fine_tunes_memory_is_its_methods_entry_else_the_default_else_none(config):
    from compo.config import train_mem_mb

    assert train_mem_mb(config, "c2lip") == config["memory_mb"]["train"]["c2lip"]
    assert train_mem_mb(config, "clip-ft") == config["memory_mb"]["train"]["default"]
    assert train_mem_mb({k: v for k, v in config.items() if k != "memory_mb"}, "c2lip") is None


def test_a_recipe_both_studies_share_has_one_home_config_recipes_yaml(repo):
    """config/recipes.yaml holds the recipes config.yaml and paper.yaml share; neither study file gives one of them
    again (half a recipe in each file), nor a recipe of its own that the other gives alike (a second copy)."""
    from compo.config import SHARED_RECIPES, load_yaml

    shared = load_yaml(SHARED_RECIPES)["methods"]
    default = load_yaml(repo / "config" / "config.yaml")["methods"]
    paper = load_yaml(repo / "config" / "paper.yaml")["methods"]
    assert SHARED_RECIPES == repo / "config" / "recipes.yaml"
    assert not set(shared) & set(default) and not set(shared) & set(paper)
    assert [name for name in default if paper.get(name) == default[name]] == []
    # each study resolves every shared recipe on its own parents: paper's negclip is its own clip-ft's
    for study in ("config.yaml", "paper.yaml"):
        config = load_config(repo / "config" / study)
        parent = resolve_method(config, "clip-ft")
        assert all(name in config["methods"] for name in shared)
        assert resolve_method(config, "negclip")["train"] == parent["train"]


def test_shared_recipes_go_under_the_study_and_its_overlays_keys_win(repo, tmp_path):
    """The shared recipes are loaded first: an overlay's key of a shared recipe wins, key by key, and the rest of
    the config keeps its order (the Snakefile applies `with_shared_recipes` to what Snakemake loaded)."""
    from compo.config import with_shared_recipes

    (tmp_path / "overlay.yaml").write_text("methods:\n  negclip: {hard_images: 5}\n")
    config = load_config(repo / "config" / "config.yaml", tmp_path / "overlay.yaml")
    assert config["methods"]["negclip"] == {"parent": "clip-ft", "loss": "negclip", "negatives": "swap", "k": 1,
                                            "hard_images": 5}
    study = {"seed": 3, "methods": {"negclip": {"k": 2}, "mine": {"parent": "clip-ft"}}, "results": "r"}
    merged = with_shared_recipes(study)
    assert list(merged) == ["seed", "methods", "results"]
    assert merged["methods"]["negclip"]["k"] == 2 and merged["methods"]["negclip"]["loss"] == "negclip"
    assert "mine" in merged["methods"] and "degla-cn" in merged["methods"] and study["methods"]["negclip"] == {"k": 2}


def test_a_malformed_shared_recipes_file_is_an_error_naming_it(repo, tmp_path, monkeypatch):
    import compo.config

    bad = tmp_path / "recipes.yaml"
    bad.write_text("methods:\n  negclip: {k: 1}\nseed: 3\n")
    monkeypatch.setattr(compo.config, "SHARED_RECIPES", bad)
    with pytest.raises(ConfigError, match=f"config file {bad}: expected one top-level key, `methods`"):
        load_config(repo / "config" / "config.yaml")


# --- known at DAG build -----------------------------------------------------------------------------


def test_unknown_base_model_is_a_config_error(config: dict) -> None:
    config["bases"]["clip"]["model"] = "compo-tiny-clipp"
    with pytest.raises(ConfigError) as caught:
        validate_config(config)
    message = str(caught.value)
    assert message.startswith("config key bases.clip.model: 'compo-tiny-clipp' is not an open_clip model config"), \
        message
    assert "compo-tiny-clip," in message and len(message) < 600  # a near name, not every model open_clip has


def test_lora_targets_matching_no_weight_are_found_before_training(config: dict) -> None:
    from compo.config import check_before_compute

    config["methods"]["fsc-clip-lora"]["lora"]["targets"] = ["*attn.in_proj_weight", "visual.transformer.*"]
    validate_config(config)  # the cheap checks pass; this one reads the model's parameter names
    with pytest.raises(ConfigError, match=r"^config key methods\.fsc-clip-lora\.lora\.targets: 'visual\.transformer"
                                          r"\.\*' matches no weight matrix or square convolution kernel of "
                                          r"compo-tiny-clip"):
        check_before_compute(config)
    config["methods"]["fsc-clip-lora"]["lora"]["targets"] = ["*attn.in_proj_weight"]
    check_before_compute(config)


def test_weight_names_are_cached_so_the_next_dag_build_imports_no_torch(tmp_path: Path) -> None:
    # the LoRA target check too: its pattern matching (compo.lora_patterns) is torch-free (~2 s per dry run)
    code = ("import sys; from compo.architectures import weight_shapes; "
            "from compo.config import check_lora_targets, load_config; "
            "check_lora_targets(load_config('config/config.yaml')); "
            "print(len(weight_shapes('compo-tiny-clip')), 'torch' in sys.modules)")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    runs = [subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                           check=True).stdout for _ in range(2)]
    assert runs == ["120 True\n", "120 False\n"]
    assert len(list((tmp_path / "compo-study" / "weight-shapes").glob("compo-tiny-clip-*.json"))) == 1
