"""Config loading: schema errors name the key, inheritance resolves, cross-references are checked."""

from __future__ import annotations

import copy

import pytest

from compo.config import ConfigError, deep_merge, load_config, resolve_method, truncate_words, validate_config


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


@pytest.mark.parametrize(
    ("mutate", "key"),
    [
        (lambda c: c.update(unknown_key=1), "<top level>"),
        (lambda c: c["world"].update(image_size="big"), "world.image_size"),
        (lambda c: c["methods"]["negclip"].update(loss="nonsense"), "methods.negclip.loss"),
        (lambda c: c["methods"]["clip-ft"]["train"].update(lr=-1), "methods.clip-ft.train.lr"),
        (lambda c: c["negatives"]["swap"].update(k=0), "negatives.swap.k"),
        (lambda c: c["hard_negatives"].update(drop_true="yes"), "hard_negatives.drop_true"),
        (lambda c: c["study"].update(methods=["nope"]), "study.methods"),
        (lambda c: c["methods"]["negclip"].update(parent="ghost"), "methods.negclip.parent"),
        (lambda c: c["methods"]["negclip"].update(negatives="ghost"), "methods.negclip.negatives"),
        (lambda c: c["methods"]["clip-ft"].update(base="ghost"), "methods.clip-ft.base"),
        (lambda c: c["datasets"]["coco"].update(split="nowhere"), "datasets.coco.split"),
        (lambda c: c["memory_mb"]["train"].update(c2lip=0), "memory_mb.train.c2lip"),
        (lambda c: c["memory_mb"]["train"].pop("default"), "memory_mb.train"),
        (lambda c: c.update(overlap={"accept": [{"dataset": "coco", "benchmark": "ghost"}]}),
         "overlap.accept"),
        (lambda c: c.update(overlap={"accept": [{"dataset": "ghost", "benchmark": "sugarcrepe"}]}),
         "overlap.accept"),
        (lambda c: c.update(overlap={"accept": [{"dataset": "coco"}]}), "overlap.accept"),
    ],
)
def test_bad_config_names_the_key(config, mutate, key):
    bad = copy.deepcopy(config)
    mutate(bad)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.").replace("<", ".").replace(">", ".")):
        validate_config(bad)


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


def test_unknown_generator_and_bad_options_name_the_key(config):
    bad = copy.deepcopy(config)
    bad["negatives"]["swap"]["generator"] = "no-such-generator"
    with pytest.raises(ConfigError, match=r"negatives\.swap\.generator"):
        validate_config(bad)
    bad = copy.deepcopy(config)
    bad["negatives"]["swap"]["kinds"] = ["pronoun"]
    with pytest.raises(ConfigError, match=r"negatives\.swap"):
        validate_config(bad)


# --- configs that used to pass silently (issue 10.9) ----------------------------------------------------


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c["study"].update(methods=[]), r"^config key study\.methods: \[\] should be non-empty"),
        (lambda c: c["methods"]["degla"].update(k=5),
         r"^config key methods\.degla\.k: 5 negatives per caption, but negatives\.degla-rules writes only k = 4"),
        (lambda c: c["methods"]["clip-ft"].update(focal_gamma=2.0),
         r"^config key methods\.clip-ft\.focal_gamma: loss infonce does not use focal_gamma"),
        (lambda c: c["methods"]["clip-ft"].update(negatives="swap"),
         r"^config key methods\.clip-ft\.negatives: loss infonce reads no hard negatives; set negatives: null"),
        (lambda c: c["methods"]["degla"]["weights"].update(local=0.2),
         r"^config key methods\.degla\.weights\.local: not a key here \(known: igc, tgc, distill\)"),
        (lambda c: c["methods"]["cement"].update(ema=0.9),
         r"^config key methods\.cement\.ema: loss cement does not use ema"),
        (lambda c: c["methods"]["clip-ft"]["train"].update(warmup=351),
         r"^config key methods\.clip-ft\.train\.warmup: 351 warm-up steps exceed the 350 training steps"),
        (lambda c: c["methods"]["clip-ft"]["train"].update(accum_freq=3),
         r"^config key methods\.clip-ft\.train\.accum_freq: batch_size 64 does not split into 3 equal micro-batches"),
        (lambda c: c["bases"]["clip"]["train"].update(steps=10),
         r"^config key bases\.clip\.train\.warmup: 100 warm-up steps exceed the 10 training steps"),
        (lambda c: c.update(results=""), r"^config key results: '' is not a path"),
        (lambda c: c["memory_mb"]["train"].update(ghost=1000),
         r"^config key memory_mb\.train\.ghost: not a method \(expected default or a name under methods\)"),
        (lambda c: c["methods"]["negclip"].update(hard_images=0),
         r"^config key methods\.negclip\.hard_images: 0 is not a number of nearest images \(an integer >= 1\) "
         r"or 'random'"),
        (lambda c: c["methods"]["cement"].update(hard_images=3),
         r"^config key methods\.cement\.hard_images: loss cement needs batch parts the hard-image rows do not "
         r"carry \(cement_pairs\)"),
        (lambda c: c["study"].update(base_seeds=[0, 1]),  # seeds 0, 1, 2: two on base 0, one on base 1
         r"^config key study\.seeds: seed s fine-tunes base seed study\.base_seeds\[s mod 2\], which gives the "
         r"bases unequal numbers of seeds \(base seed 0: 2, base seed 1: 1\)"),
        (lambda c: c["study"].update(base_seeds=[3, 3]), r"^config key study\.base_seeds: \[3, 3\] repeats a seed"),
        (lambda c: c["study"].update(base_seeds=[0, 1], seeds=[0, 1]) or c["ablations"]["cement-margin"].update(
            seeds=[0]), r"^config key ablations\.cement-margin\.seeds: seed s fine-tunes base seed"),
    ],
)
def test_silent_configs_are_errors_naming_the_key(config, mutate, message):
    bad = copy.deepcopy(config)
    mutate(bad)
    with pytest.raises(ConfigError, match=message):
        validate_config(bad)


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
