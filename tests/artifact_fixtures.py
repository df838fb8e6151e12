"""Tiny stand-ins for the paper study's external models, built here in the layouts their libraries write
(no download): an open_clip checkpoint as open_clip's hub repositories hold it, a Hugging Face tokenizer, a
causal LM saved with `save_pretrained`, and an SDXL-style img2img pipeline. The LLM, diffusion and
artifact tests and the offline cluster test use them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch

SDXL_SIZE = 32  # the tiny pipeline's resolution (a multiple of 8; the VAE halves it once per block)


def build_tiny_lm(folder: Path, words: Iterable[str]) -> None:
    """A randomly initialised 1-layer GPT-2 with a word-level tokenizer of `words`."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from compo.llm.backends import import_transformers

    transformers = import_transformers()
    vocab = {w: i for i, w in enumerate(["[UNK]", "[PAD]", "[EOS]", *sorted(set(words))])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]",
                                                     eos_token="[EOS]")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=len(vocab), n_positions=512, n_embd=16, n_layer=1, n_head=2, eos_token_id=2, pad_token_id=1,
        bos_token_id=2))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def build_tiny_open_clip(folder: Path, model_name: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights of `model_name` saved as open_clip's hub repositories hold them
    (`open_clip_model.safetensors`); returns the state dict."""
    from safetensors.torch import save_file

    from compo.models import open_clip

    torch.manual_seed(seed)
    state = open_clip().create_model(model_name).state_dict()
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "open_clip_model.safetensors"))
    return state


def build_tiny_sdxl(folder: Path) -> None:
    """A randomly initialised SDXL img2img pipeline in the layout `from_pretrained` reads."""
    from compo.compat import declare_torchvision_ops

    declare_torchvision_ops()
    import transformers
    from diffusers import (
        AutoencoderKL,
        EulerAncestralDiscreteScheduler,
        StableDiffusionXLImg2ImgPipeline,
        UNet2DConditionModel,
    )

    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1, **{c: 2 + i for i, c in enumerate(letters)},
             **{f"{c}</w>": 28 + i for i, c in enumerate(letters)}}
    words = folder / "tokenizer-files"
    words.mkdir(parents=True)
    (words / "vocab.json").write_text(json.dumps(vocab))
    (words / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = transformers.CLIPTokenizer(vocab_file=str(words / "vocab.json"), merges_file=str(words / "merges.txt"),
                                           model_max_length=16)
    torch.manual_seed(0)
    text = transformers.CLIPTextConfig(bos_token_id=0, eos_token_id=1, pad_token_id=1, vocab_size=len(vocab),
                                       hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2,
                                       projection_dim=32, max_position_embeddings=16)
    unet = UNet2DConditionModel(
        sample_size=SDXL_SIZE // 2, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4), use_linear_projection=True, cross_attention_dim=64, norm_num_groups=16,
        transformer_layers_per_block=(1, 1), addition_embed_type="text_time", addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=6 * 8 + 32)  # 6 time ids (no aesthetic score) + pooled text
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(16, 32),
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        norm_num_groups=16, sample_size=SDXL_SIZE)
    scheduler = EulerAncestralDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                                timestep_spacing="trailing")  # SDXL-Turbo's scheduler
    pipeline = StableDiffusionXLImg2ImgPipeline(
        vae=vae, text_encoder=transformers.CLIPTextModel(text),
        text_encoder_2=transformers.CLIPTextModelWithProjection(text), tokenizer=tokenizer, tokenizer_2=tokenizer,
        unet=unet, scheduler=scheduler, requires_aesthetics_score=False)
    pipeline.save_pretrained(folder)
