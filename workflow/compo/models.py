"""Models: creating, saving and loading open_clip models, and their token-level features.

A model directory (`results/models/{method}/{dataset}/seed{seed}/`) holds `checkpoint.pt` (a plain
state dict) and `model.json` (`{"model_name": ..., "model_config": {...}, "preprocess_cfg": {...}}`, the
last the image mean, std and resize its weights expect, and the provenance: `checkpoint_sha256`, checked at
every load, `compo_version` and `code_sha256`, compo.provenance). Plain open_clip loads it:

    open_clip.add_model_config("model.json's folder")  # only for compo's own tiny configs
    model = open_clip.create_model(model_name, pretrained="checkpoint.pt", force_preprocess_cfg=preprocess_cfg)

`load_model` does exactly that. compo's own configs live in `compo/model_configs/*.json`.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import tempfile
import types
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.checkpoint import checkpoint

from compo.architectures import COMPO_CONFIGS, hf_tokenizer_of, open_clip
from compo.config_names import safe_name_problem
from compo.devices import autocast, eval_precision, resolve_device
from compo.io import atomic_path, write_json
from compo.layout import CHECKPOINT, MODEL_JSON
from compo.provenance import CHECKPOINT_KEY, code_record, file_sha256

MODEL_CONFIG_DIR = COMPO_CONFIGS

def model_config(model_name: str) -> dict[str, Any]:
    config = open_clip().get_model_config(model_name)
    if config is None:
        raise ValueError(f"unknown open_clip model {model_name!r} (not in open_clip nor {MODEL_CONFIG_DIR})")
    return config


def create_model(model_name: str, init: str = "scratch", seed: int = 0, hub: str | None = None,
                 file: str | None = None, weights: str | None = None, where: str = "") -> torch.nn.Module:
    """A fresh model: random init seeded by `seed`, or open_clip pretrained weights named by `init` (or the
    `file` of the hub repository `hub`, or the local file `weights`), read from the model cache
    (compo.artifacts: jobs never download). open_clip reads its own tags' files; a released checkpoint (`hub` or
    `weights`) is read by `load_released` (open_clip_train's layout: a `state_dict` entry, `module.` prefixes at
    any depth, each mismatch named with the file and `where`, its config key). The tag's image preprocessing
    (e.g. SigLIP's mean and std of 0.5, squashed resize) is kept on the model (`model.visual.preprocess_cfg`), as
    open_clip keeps it when it downloads the weights itself."""
    torch.manual_seed(seed)
    if init == "scratch":
        return compute_pooled_text_only(open_clip().create_model(model_name))
    path = base_weights_path(model_name, init, hub, file, weights)
    where = f"{path} ({where or 'the weights of ' + model_name})"
    try:
        if hub or weights:
            model = open_clip().create_model(model_name, force_preprocess_cfg=tag_preprocess(model_name, init))
            load_released(model, model_name, path, where)
        else:
            model = open_clip().create_model(model_name, pretrained=str(path),
                                             force_preprocess_cfg=tag_preprocess(model_name, init))
    except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile) as error:  # without torch's weights_only advice
        raise CheckpointError(f"{where}: cannot be read as the weights of {model_name} ({_load_error(error)}); "
                              "fetch the file again (compo prefetch) or name another") from None
    except RuntimeError as error:  # open_clip's strict load of a tag's file: torch's message names no file
        raise CheckpointError(f"{where}: the weights do not fit open_clip model {model_name!r} "
                              f"({' '.join(str(error).split())[:400]})") from None
    return compute_pooled_text_only(model)


WRAPPER_PREFIX = "module."  # what DistributedDataParallel (and DataParallel) put before every key it saves
MISMATCH_EXAMPLES = 3


def released_state_dict(path: Path, where: str) -> dict[str, torch.Tensor]:
    """The state dict of a released checkpoint: a .safetensors file, or a torch file holding the state dict, a
    `state_dict` entry (open_clip_train's checkpoints) or a TorchScript model. A `module.` prefix on every key,
    at any depth (a model saved from inside DDP, once or twice wrapped), is stripped; one on some keys only, or
    at different depths, is refused: such a file mixes two models' keys. `where` names the file and config key."""
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            checkpoint: Any = load_file(path, device="cpu")
        except (SafetensorError, OSError) as error:
            raise CheckpointError(f"{where}: cannot be read as safetensors ({error})") from None
    else:
        checkpoint = load_state(path, "fetch the file again (compo prefetch) or name another")
    if isinstance(checkpoint, torch.jit.ScriptModule):
        checkpoint = {k: v for k, v in checkpoint.state_dict().items()
                      if k not in ("input_resolution", "context_length", "vocab_size")}
    state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict) or not state or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        found = sorted(checkpoint)[:8] if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise CheckpointError(f"{where}: expected a state dict (parameter name -> tensor) or a 'state_dict' entry "
                              f"holding one, found {found}")
    return strip_wrapper_prefix(state, where)


def strip_wrapper_prefix(state: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """`state` without the `module.` prefix DDP wrapping put on each of its keys (any depth, the same on every
    key); keys prefixed at different depths are an error naming examples of each."""
    def depth(key: str) -> int:
        count = 0
        while key.startswith(WRAPPER_PREFIX * (count + 1)):
            count += 1
        return count

    by_depth: dict[int, list[str]] = {}
    for key in state:
        by_depth.setdefault(depth(key), []).append(key)
    if len(by_depth) > 1:
        kinds = "; ".join(f"{len(keys)} with {d} x {WRAPPER_PREFIX!r} (e.g. {', '.join(keys[:MISMATCH_EXAMPLES])})"
                          for d, keys in sorted(by_depth.items()))
        raise CheckpointError(f"{where}: the keys carry the {WRAPPER_PREFIX!r} prefix of a DDP-wrapped model at "
                              f"different depths ({kinds}); expected it on every key or on none (a file mixing two "
                              "models' keys is not loaded)")
    cut = len(WRAPPER_PREFIX) * next(iter(by_depth))
    return {key[cut:]: value for key, value in state.items()} if cut else state


def check_state_fits(model: torch.nn.Module, model_name: str, state: dict[str, torch.Tensor], where: str) -> None:
    """`state` holds exactly `model`'s parameters and buffers, each of its shape; otherwise an error naming
    `where` and the first few keys missing, unexpected (unmerged LoRA adapters named as such) or of another
    shape (torch's own message names no file)."""
    own = model.state_dict()
    missing = [key for key in own if key not in state]
    unexpected = [key for key in state if key not in own]
    shapes = [f"{key} {tuple(state[key].shape)} (the model's: {tuple(own[key].shape)})" for key in own
              if key in state and state[key].shape != own[key].shape]
    if not (missing or unexpected or shapes):
        return
    parts = [f"{len(found)} {what} (e.g. {', '.join(found[:MISMATCH_EXAMPLES])})"
             for what, found in (("missing", missing), ("unexpected", unexpected), ("of another shape", shapes))
             if found]
    lora = [key for key in unexpected if "lora" in key.lower()]
    hint = (f"; {len(lora)} unexpected keys are LoRA adapters: merge them into the weights they adapt first"
            if lora else "")
    raise CheckpointError(f"{where}: the state dict does not fit open_clip model {model_name!r}: "
                          f"{'; '.join(parts)}{hint}")


def load_released(model: torch.nn.Module, model_name: str, path: Path, where: str) -> None:
    """A released checkpoint's weights (`released_state_dict`) into `model`, checked key by key first."""
    state = released_state_dict(path, where)
    check_state_fits(model, model_name, state, where)
    model.load_state_dict(state, strict=True)


def base_weights_path(model_name: str, init: str, hub: str | None = None, file: str | None = None,
                      weights: str | None = None) -> Path:
    """The local file of a base's weights: `weights` as it is, else the cached file of `hub` / `file` or of
    open_clip's pretrained tag `init` (compo.artifacts.resolve: named with the prefetch command if missing)."""
    from compo.artifacts import is_local, recorded_sha256, refetch_hint, resolve

    if weights:
        return resolve("open_clip", weights)
    source = pretrained_weights_source(model_name, init, hub, file)
    path = resolve("open_clip", *source)
    if not is_local(source[0]):  # from the model cache: the bytes prefetch hashed (a local path is used as it is)
        expected, manifest = recorded_sha256("open_clip", *source)
        verify_sha256(path, expected, manifest, refetch_hint(path))
    return path


LONGCLIP_KEEP = 20  # Long-CLIP's text positions < 20 come from positional_embedding, the rest from its _res twin


def longclip_state_dict(checkpoint: Any, where: str) -> dict[str, torch.Tensor]:
    """An open_clip state dict from a checkpoint in Long-CLIP's own layout (github.com/beichenzbc/Long-CLIP,
    model/model_longclip.py): OpenAI CLIP's keys, with two [248, D] text position tables that its text tower
    adds under fixed masks, rows < 20 from `positional_embedding` and the others from
    `positional_embedding_res`; here they become one table. `where` names the file in errors."""
    state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict) or "positional_embedding_res" not in state:
        raise ValueError(f"{where}: not a Long-CLIP checkpoint (format longclip): no positional_embedding_res")
    state = {key: value for key, value in strip_wrapper_prefix(state, where).items()
             if key not in ("input_resolution", "context_length", "vocab_size")}
    low, high = state.pop("positional_embedding"), state.pop("positional_embedding_res")
    if low.shape != high.shape or low.shape[0] <= LONGCLIP_KEEP:
        raise ValueError(f"{where}: positional_embedding {tuple(low.shape)} and positional_embedding_res "
                         f"{tuple(high.shape)} must be one [L > {LONGCLIP_KEEP}, D] shape")
    state["positional_embedding"] = torch.cat([low[:LONGCLIP_KEEP], high[LONGCLIP_KEEP:]])
    return state


def context_model_name(model_name: str, context_length: int) -> str:
    """The open_clip config `<model>-ctx<L>`: `model_name`'s with a text context of `context_length` tokens,
    registered (so the tokenizer pads to L and model.json carries the config)."""
    if context_length == model_config(model_name)["text_cfg"].get("context_length", 77):
        return model_name
    config = copy.deepcopy(model_config(model_name))
    config["text_cfg"]["context_length"] = context_length
    name = f"{model_name}-ctx{context_length}"
    register_model_config(name, config)
    return name


def create_base(base: dict[str, Any], seed: int = 0, name: str | None = None) -> tuple[torch.nn.Module, str]:
    """A base model (config `bases.<name>`; `name` names it in errors) and its open_clip config name:
    `create_model`, or for a released checkpoint in Long-CLIP's layout (`format: longclip`) the model under a
    config with its context length."""
    model_name, init = base["model"], base["init"]
    where = f"config key bases.{name or '<name>'}.{weights_key(base)}"
    if base.get("format", "open_clip") == "open_clip" or init == "scratch":
        return create_model(model_name, init, seed, hub=base.get("hub"), file=base.get("file"),
                            weights=base.get("weights"), where=where), model_name
    path = base_file(base)
    where = f"{path} ({where})"
    state = longclip_state_dict(released_state_dict(path, where), where)
    name = context_model_name(model_name, state["positional_embedding"].shape[0])
    torch.manual_seed(seed)
    model = compute_pooled_text_only(open_clip().create_model(name))
    check_state_fits(model, model_name, state, f"{where}, format longclip")
    model.load_state_dict(state, strict=True)
    model.visual.preprocess_cfg = {**model.visual.preprocess_cfg, **tag_preprocess(model_name, init)}
    return model, name


def base_file(base: dict[str, Any]) -> Path:
    """The weights file of a base (config `bases.<name>` keys: model, init, weights or hub/file)."""
    return base_weights_path(base["model"], base["init"], base.get("hub"), base.get("file"), base.get("weights"))


def weights_key(base: dict[str, Any]) -> str:
    """The key of a base's entry that names its weights file."""
    return "weights" if base.get("weights") else "file" if base.get("hub") else "init"


def pretrained_weights_source(model_name: str, tag: str, hub: str | None = None,
                              file: str | None = None) -> tuple[str, str | None]:
    """(hub repository, file) of open_clip model `model_name`'s weights pretrained as `tag`, from open_clip's
    registry, or the repository `hub` names (`file` in it; None: open_clip's default names, safetensors first)."""
    if hub:
        return hub, file
    cfg = open_clip().get_pretrained_cfg(model_name, tag)
    if not cfg.get("hf_hub"):
        known = ", ".join(open_clip().list_pretrained_tags_by_model(model_name)) or "none"
        raise ValueError(f"open_clip has no hub weights tagged {tag!r} for {model_name!r} (its tags: {known}); "
                         "name the repository of the weights in bases.<name>.hub")
    repo, file = os.path.split(cfg["hf_hub"])  # "org/name/file", or "org/name/": open_clip's default names
    return repo, file or None


# Texts of a batch are encoded in groups of similar length (`length_buckets`): each group padded by at most
# this fraction of its longest text, a group at least MIN_BUCKET texts (fewer would run below GEMM speed).
BUCKET_SLACK = 0.3
MIN_BUCKET = 32


# Texts of a batch are encoded in one pass when the model has static shapes (`set_static_shapes`): the
# batch's token ids are already cut to a multiple of this width on the CPU (`compo.batches`).
PAD_MULTIPLE = 16


def set_static_shapes(model: torch.nn.Module, static: bool) -> torch.nn.Module:
    """How `model`'s text path and the losses shape their tensors (the `train.shapes` setting, compo.devices).

    static: one text-tower pass over the token ids as given (the trainer's batches cut them to a multiple
    of PAD_MULTIPLE on the CPU), masked slots computed and masked out: no value is read back to the host
    mid-step and a step is one graph for torch.compile. Otherwise (dynamic, the default) causal towers run
    per length group, each trimmed to its longest text, and masked slots are left out: the least work,
    at the price of host reads and per-batch shapes. Both give the same values up to float rounding."""
    model.compo_static_shapes = bool(static)
    return model


def static_shapes(model: torch.nn.Module) -> bool:
    return bool(getattr(model, "compo_static_shapes", False))


def token_lengths(text: torch.Tensor) -> torch.Tensor:
    """Each text's token length: up to its last non-zero id (open_clip's SimpleTokenizer pads with 0 after the
    end token). Not a count of non-zero ids: 0 is also the token "!", which a caption may hold."""
    positions = torch.arange(1, text.shape[1] + 1, device=text.device)
    return ((text != 0) * positions).amax(dim=1)


def real_tokens(text: torch.Tensor) -> torch.Tensor:
    """The mask of each text's tokens, padding excluded ([B, L], `token_lengths`)."""
    return torch.arange(text.shape[1], device=text.device) < token_lengths(text)[:, None]


def _text_input(model: torch.nn.Module, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The text tower's input (token + position embeddings), the token ids and the attention mask: for a
    causal tower over the texts' real token length only (with static shapes: the width given), for a tower
    without a mask over its whole context."""
    if model.attn_mask is None or static_shapes(model):
        length = text.shape[1]
    else:
        length = max(int(token_lengths(text).max()), 1)
        text = text[:, :length]
    cast_dtype = model.transformer.get_cast_dtype()
    x = model.token_embedding(text).to(cast_dtype) + model.positional_embedding[:length].to(cast_dtype)
    mask = None if model.attn_mask is None else model.attn_mask[:length, :length]
    return x, text, mask


def _text_states_trimmed(model: torch.nn.Module, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The causal text tower's states after ln_final over the batch's real token length (not the full
    context), and the trimmed token ids."""
    x, text, mask = _text_input(model, text)
    return model.ln_final(model.transformer(x, attn_mask=mask)), text


def length_buckets(text: torch.Tensor) -> list[torch.Tensor]:
    """Row indices of `text` grouped by token length, longest first: a group holds the texts whose length
    is above (1 - BUCKET_SLACK) times its longest, so trimming a group to its longest pads each text by at
    most that fraction (one group when that holds for the whole batch)."""
    lengths = token_lengths(text)
    order = torch.argsort(lengths, descending=True, stable=True)
    sorted_lengths = lengths[order].tolist()
    groups, start = [], 0
    while start < len(order):
        floor = sorted_lengths[start] * (1 - BUCKET_SLACK)
        end = start + 1
        while end < len(order) and sorted_lengths[end] > floor:
            end += 1
        if len(order) - end < MIN_BUCKET:  # a tail too small for an efficient pass joins this group
            end = len(order)
        groups.append(order[start:end])
        start = end
    return groups


def _text_states_bucketed(model: torch.nn.Module, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`_text_states_trimmed` run per length group (`length_buckets`): states [N, L, D] and token ids
    [N, L], L the longest text's length; a group's positions beyond its own longest text are zeros."""
    groups = length_buckets(text)
    if len(groups) == 1:
        return _text_states_trimmed(model, text)
    parts = [_text_states_trimmed(model, text[rows]) for rows in groups]
    width = parts[0][0].shape[1]  # the first group holds the longest texts
    states = torch.cat([F.pad(x, (0, 0, 0, width - x.shape[1])) for x, _ in parts])
    tokens = torch.cat([F.pad(t, (0, width - t.shape[1])) for _, t in parts])
    inverse = torch.argsort(torch.cat(groups))
    return states[inverse], tokens[inverse]


def _run_text_blocks(model: torch.nn.Module, x: torch.Tensor, attn_mask: torch.Tensor | None,
                     blocks: list[torch.nn.Module]) -> torch.Tensor:
    """open_clip's `Transformer.forward` over some of its blocks (x batch-first), gradient checkpointing
    included (`set_grad_checkpointing`)."""
    transformer = model.transformer
    if not transformer.batch_first:
        x = x.transpose(0, 1)
    for block in blocks:
        if transformer.grad_checkpointing and torch.is_grad_enabled():
            x = checkpoint(block, x, None, None, attn_mask, use_reentrant=False)
        else:
            x = block(x, attn_mask=attn_mask)
    return x if transformer.batch_first else x.transpose(0, 1)


def _block_output_at(block: torch.nn.Module, x: torch.Tensor, position: torch.Tensor,
                     hidden_keys: torch.Tensor | None) -> torch.Tensor:
    """A residual block's output [N, D] at one position per text (`position` [N]) from its input x [N, L, D]:
    that position is the only query, every position still gives keys and values, so the output equals the
    full block's there. `hidden_keys` [N, L] (True = hidden) is the full block's mask on that query's row."""
    query = x[torch.arange(len(x), device=x.device), position].unsqueeze(1)  # [N, 1, D]
    q, kv = block.ln_1(query), block.ln_1(x)
    if not block.attn.batch_first:
        q, kv = q.transpose(0, 1), kv.transpose(0, 1)
    attended = block.attn(q, kv, kv, need_weights=False, key_padding_mask=hidden_keys)[0]
    if not block.attn.batch_first:
        attended = attended.transpose(0, 1)
    out = query + block.ls_1(attended)
    out = out + block.ls_2(block.mlp(block.ln_2(out)))
    return out[:, 0]


def _pooled_text_group(model: torch.nn.Module, text: torch.Tensor) -> torch.Tensor:
    """The pooled text feature after ln_final (before the projection) [N, D] of a group of texts.

    Causal towers (argmax/EOT pooling) run over the group's real token length only; last-token towers over
    their full context (a non-causal tower's last position sees every pad). Either way the last block runs
    only at the pooled position: the other positions' outputs of the last block reach nothing.
    """
    blocks = list(model.transformer.resblocks)
    x, text, attn_mask = _text_input(model, text)
    length = text.shape[1]
    if attn_mask is not None:  # causal: pool at EOT (the largest id), hide the keys after it
        position = text.argmax(dim=-1)
        hidden_keys = torch.arange(length, device=text.device).unsqueeze(0) > position.unsqueeze(1)
    else:  # "last" pooling, no mask
        position, hidden_keys = torch.full((len(text),), length - 1, device=text.device), None
    x = _run_text_blocks(model, x, attn_mask, blocks[:-1])
    return model.ln_final(_block_output_at(blocks[-1], x, position, hidden_keys))


def _encode_text_pooled(model: torch.nn.Module, text: torch.Tensor, normalize: bool = False) -> torch.Tensor:
    """open_clip's CLIP.encode_text, with its last block computed only at the pooled position and, for a
    causal tower, each text only over its real token length, in length groups (`length_buckets`)."""
    if model.attn_mask is None or static_shapes(model):
        groups = [text]
    else:
        groups = length_buckets(text)
    if len(groups) == 1:
        x = _pooled_text_group(model, text)
    else:
        x = torch.cat([_pooled_text_group(model, text[rows]) for rows in groups])[torch.argsort(torch.cat(groups))]
    x = _project(x, model.text_projection)
    return F.normalize(x, dim=-1) if normalize else x


def _is_trimmed(model: torch.nn.Module) -> bool:
    return "encode_text" in vars(model) and model.attn_mask is not None


def text_width_multiple(model: torch.nn.Module) -> int | None:
    """With static shapes, the multiple the trainer's batches cut their token ids to (compo.batches
    `cut_token_width`): PAD_MULTIPLE for a causal tower encoded here (one whose end token sees no padding);
    None, keep the whole context, otherwise."""
    return PAD_MULTIPLE if static_shapes(model) and _is_trimmed(model) else None


def _pools_one_position(model: torch.nn.Module) -> bool:
    """open_clip's own text tower (plain residual blocks) pooling one position: causal with EOT (argmax)
    pooling, or without a mask pooling the last position."""
    if not hasattr(model, "token_embedding") or not hasattr(model, "transformer"):
        return False
    plain = all(type(block) is open_clip().transformer.ResidualAttentionBlock and not hasattr(block, "ln_1_kv")
                for block in model.transformer.resblocks)
    causal = getattr(model, "attn_mask", None) is not None
    pool = getattr(model, "text_pool_type", None)
    return plain and ((causal and pool == "argmax") or (not causal and pool == "last"))


def compute_pooled_text_only(model: torch.nn.Module) -> torch.nn.Module:
    """Make `model.encode_text` compute only what the pooled embedding reads.

    * A causal tower with EOT (argmax) pooling (CLIP) runs each text only up to its length (rounded up within
      its length group): a position after a caption's EOT never reaches its pooled feature, and padding
      positions get no gradient either way. Short captions use ~20 of the 77 positions; grouping texts by
      length (`length_buckets`) halves it again for batches of captions and their negatives, whose lengths
      vary 2-4x.
    * For that tower and a last-token tower without a mask (SigLIP-style; its last position sees every pad,
      so its context is kept), the last block runs only at the pooled position (its keys and values still
      from every position), about a fifth of a 4-block tower's work.

    Both change only the order of float sums (values agree to ~1e-7). Any other text tower is left as it is.
    """
    if _pools_one_position(model):
        model.encode_text = types.MethodType(_encode_text_pooled, model)
    return model


def get_tokenizer(model_name: str):  # noqa: ANN201 - open_clip tokenizer callable
    """open_clip's tokenizer of `model_name`; a Hugging Face tokenizer the config names (SigLIP's) is read
    from the model cache (compo.artifacts), never downloaded."""
    oc = open_clip()
    text_cfg = copy.deepcopy(model_config(model_name).get("text_cfg", {}))
    name = text_cfg.get("hf_tokenizer_name")
    if not name:
        return oc.get_tokenizer(model_name)
    from compo.artifacts import resolve

    return oc.tokenizer.HFTokenizer(str(resolve("tokenizer", name)), context_length=text_cfg.get("context_length", 77),
                                    tokenizer_mode=text_cfg.get("tokenizer_mode"),
                                    **text_cfg.get("tokenizer_kwargs", {}))


# The image preprocessing an open_clip pretrained tag sets (mean, std, resize); kept in model.json.
PREPROCESS_KEYS = ("mean", "std", "interpolation", "resize_mode")


def tag_preprocess(model_name: str, tag: str) -> dict[str, Any]:
    """The image preprocessing open_clip's registry gives pretrained tag `tag` of `model_name` ({} if none)."""
    cfg = open_clip().get_pretrained_cfg(model_name, tag)
    return {key: cfg[key] for key in PREPROCESS_KEYS if key in cfg}


def preprocess_settings(model: torch.nn.Module) -> dict[str, Any]:
    """The model's image preprocessing (open_clip's `visual.preprocess_cfg`: mean, std, resize)."""
    cfg = getattr(model.visual, "preprocess_cfg", None) or {}
    return {key: list(cfg[key]) if isinstance(cfg[key], tuple) else cfg[key] for key in PREPROCESS_KEYS if key in cfg}


def image_transform(model: torch.nn.Module):  # noqa: ANN201 - torchvision transform
    """open_clip's evaluation preprocessing for `model` (resize, centre crop or squash, normalise with the
    mean and std its weights were trained with: `preprocess_settings`)."""
    settings = preprocess_settings(model)
    return open_clip().image_transform(model.visual.image_size, is_train=False, mean=settings.get("mean"),
                                       std=settings.get("std"), interpolation=settings.get("interpolation"),
                                       resize_mode=settings.get("resize_mode"))


def hf_tokenizer_name(model_name: str) -> str | None:
    """The Hugging Face tokenizer `model_name`'s open_clip config names (SigLIP's), or None; open_clip's registry
    included (compo.architectures.model_config reads the config files alone)."""
    return hf_tokenizer_of(model_config(model_name))


def register_model_config(model_name: str, config: dict[str, Any]) -> None:
    """Make `model_name` known to open_clip (e.g. a config a recipe derived, such as a longer context)."""
    problem = safe_name_problem(model_name)
    if problem is not None:  # open_clip names a config after its file: the name must be a plain file name
        raise ValueError(f"model name {problem}")
    oc = open_clip()
    if oc.get_model_config(model_name) == config:
        return
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{model_name}.json"  # open_clip names a config after its file
        path.write_text(json.dumps(config))
        oc.add_model_config(path)


def save_checkpoint(
    model: torch.nn.Module, model_name: str, out_dir: str | Path, config: dict[str, Any] | None = None
) -> None:
    """Write `checkpoint.pt` (state dict) and `model.json` ({model_name, model_config, preprocess_cfg} and the
    provenance: the checkpoint's sha256, the package version and code hash, compo.provenance) to `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_state(model.state_dict(), out_dir / CHECKPOINT)
    config = config if config is not None else model_config(model_name)
    write_json({"model_name": model_name, "model_config": config, "preprocess_cfg": preprocess_settings(model),
                CHECKPOINT_KEY: file_sha256(out_dir / CHECKPOINT), **code_record()}, out_dir / MODEL_JSON)


class CheckpointError(ValueError):
    """A model folder's file cannot be read; the message names the file and what to do."""


def rebuild_hint(model_dir: str | Path) -> str:
    return f"delete {model_dir} and rerun the workflow to rebuild it"


def read_model_json(model_dir: str | Path) -> dict[str, Any]:
    """A model folder's model.json ({model_name, model_config}); its model_name is a safe name (it names a
    file when the config is registered with open_clip). Errors name the file."""
    model_dir = Path(model_dir)
    path = model_dir / MODEL_JSON
    if not path.exists() or not (model_dir / CHECKPOINT).exists():
        raise FileNotFoundError(f"{model_dir}: expected {MODEL_JSON} and {CHECKPOINT}")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: not readable JSON ({error}); {rebuild_hint(model_dir)}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("model_config"), dict):
        raise CheckpointError(f"{path}: expected {{\"model_name\": ..., \"model_config\": {{...}}}}; "
                              f"{rebuild_hint(model_dir)}")
    problem = safe_name_problem(meta.get("model_name"))
    if problem is not None:
        raise CheckpointError(f"{path}: model_name {problem}; {rebuild_hint(model_dir)}")
    return meta


def verify_sha256(path: str | Path, expected: str | None, recorded_in: str | Path, hint: str) -> str:
    """The sha256 of the checkpoint `path`, which must equal `expected` (what `recorded_in` records when the
    file was written): every checkpoint load checks here. A mismatch or a missing record is a CheckpointError
    naming the file, both hashes and what to do (`hint`). Hashes the file once, streaming."""
    if not isinstance(expected, str):
        raise CheckpointError(f"{recorded_in}: records no {CHECKPOINT_KEY} for {path} (written before checkpoints "
                              f"were hashed, or edited); {hint}")
    actual = file_sha256(path)
    if actual != expected.lower():
        raise CheckpointError(f"{path}: sha256 {actual} differs from {expected}, recorded in {recorded_in} when it "
                              f"was written: the file was changed or replaced since; {hint}")
    return actual


def verify_model_checkpoint(model_dir: str | Path, meta: dict[str, Any]) -> str:
    """`verify_sha256` of a model folder's checkpoint against its model.json (`meta`, `read_model_json`)."""
    model_dir = Path(model_dir)
    return verify_sha256(model_dir / CHECKPOINT, meta.get(CHECKPOINT_KEY), model_dir / MODEL_JSON,
                         rebuild_hint(model_dir))


# What in model.json describes the architecture (the rest is provenance: hashes, version)
ARCHITECTURE_KEYS = ("model_name", "model_config", "preprocess_cfg")


def architecture(meta: dict[str, Any]) -> dict[str, Any]:
    return {key: meta.get(key) for key in ARCHITECTURE_KEYS}


def _file_identity(path: Path) -> tuple[int, int, int, int]:
    stat = path.stat()
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def _load_error(error: Exception) -> str:
    """What went wrong reading a checkpoint, in one short clause (torch's own advice is left out: it
    suggests weights_only=False, which would run whatever code the file holds)."""
    if isinstance(error, pickle.UnpicklingError):
        return "it holds objects other than tensors and plain containers, which are never unpickled"
    first = str(error).strip().split(". ")[0].splitlines()[0] if str(error).strip() else type(error).__name__
    return first[:200]


def load_state(path: str | Path, hint: str, map_location: Any = "cpu", mmap: bool = False) -> Any:
    """torch.load(weights_only=True) of a file compo wrote; a file that cannot be read is a CheckpointError
    naming it and saying what to do (`hint`). mmap: map the tensors instead of reading them (a cheap check
    that the file opens)."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except (pickle.UnpicklingError, EOFError, OSError, RuntimeError, ValueError, zipfile.BadZipFile) as error:
        raise CheckpointError(f"{path}: cannot be read as a checkpoint ({_load_error(error)}); {hint}") from None


def save_state(state: Any, path: str | Path) -> None:
    """torch.save `state` to `path` atomically and reproducibly: the same state gives the same bytes.

    torch.save names the zip archive's root folder after the file it is given; saving through an open
    handle names it "archive" instead of the random temporary name, so equal states are equal files."""
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        torch.save(state, handle)


@dataclass
class LoadedModel:
    """A model ready to encode: on `device`, encoding under autocast for `precision` (compo.devices);
    `workers` DataLoader processes decode image files for it (0: the calling process)."""

    model: torch.nn.Module
    model_name: str
    tokenizer: Any
    preprocess: Any
    device: torch.device = torch.device("cpu")
    precision: str = "fp32"
    workers: int = 0
    checkpoint_sha256: str | None = None  # of the file loaded (checked against model.json)


def load_model(model_dir: str | Path, device: str = "cpu", precision: str = "auto",
               key: str = "evaluate.device") -> LoadedModel:
    """Load a model directory with plain open_clip (create_model + pretrained=checkpoint).

    device: auto | cpu | cuda (`key` names the setting in errors); precision: the encoding precision,
    auto = amp on a GPU, fp32 on the CPU (compo.devices). The checkpoint's sha256 is checked against
    model.json's (`verify_sha256`); a file replaced while it loads is an error."""
    target = resolve_device(device, key)  # first: a job without its GPU stops before reading anything
    model_dir = Path(model_dir)
    meta = read_model_json(model_dir)
    model_name = meta["model_name"]
    oc = open_clip()
    register_model_config(model_name, meta["model_config"])
    checkpoint = model_dir / CHECKPOINT
    before = _file_identity(checkpoint)
    load_state(checkpoint, rebuild_hint(model_dir), mmap=True)  # opens, or an error naming it
    sha256 = verify_model_checkpoint(model_dir, meta)  # and holds the bytes written
    model = oc.create_model(model_name, pretrained=str(checkpoint), device=target,
                            force_preprocess_cfg=meta.get("preprocess_cfg") or None)
    if _file_identity(checkpoint) != before:  # open_clip read it by path: the bytes hashed must be those loaded
        raise CheckpointError(f"{checkpoint}: replaced or changed while it was loaded; run again once the job "
                              "writing it has finished")
    return _ready(compute_pooled_text_only(model), model_name, target, precision, sha256)


def _ready(model: torch.nn.Module, model_name: str, target: torch.device, precision: str,
           sha256: str | None) -> LoadedModel:
    model = model.to(target)
    model.eval()
    return LoadedModel(model, model_name, open_clip().get_tokenizer(model_name), image_transform(model), target,
                       eval_precision(precision, target), checkpoint_sha256=sha256)


def check_weights_file(path: str | Path, what: str) -> Path:
    """`path` as a weights file that opens: a safetensors file, or one torch.load reads with weights_only
    (open_clip's state dicts, open_clip_train's checkpoints, the seeds' releases). A missing, unreadable or
    foreign file is a CheckpointError naming it and `what` (the option or key that names it); the tensors are
    mapped, not read, where the format allows, so the check is cheap."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise CheckpointError(f"{what}: {path}: no such file")
    if not os.access(path, os.R_OK):
        raise CheckpointError(f"{what}: {path}: not readable (permissions)")
    hint = f"{what}: expected an open_clip state dict, an open_clip_train checkpoint or a safetensors file"
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as handle:
                handle.keys()
        except (SafetensorError, OSError) as error:
            raise CheckpointError(f"{path}: cannot be read as a safetensors file ({error}); {hint}") from None
        return path
    load_state(path, hint, mmap=zipfile.is_zipfile(path))  # torch's older (non-zip) format cannot be mapped
    return path


def load_base(base: dict[str, Any], device: str = "cpu", precision: str = "auto",
              key: str = "evaluate.device") -> LoadedModel:
    """A base (config `bases.<name>` keys: model, init, weights or hub/file, format) as `create_base` builds it,
    ready to encode as `load_model` makes a model folder; its checkpoint_sha256 is the weights file's."""
    target = resolve_device(device, key)
    sha256 = file_sha256(base_file(base))
    model, model_name = create_base(base)
    return _ready(model, model_name, target, precision, sha256)


class NonFiniteEmbeddings(ValueError):
    """A model's embeddings hold NaN or infinity (its weights diverged): no score is made of them, since a NaN
    comparison is neither a win nor a loss and a scorer counting `not (neg > pos)` would count it right."""


def finite(embedded: torch.Tensor, what: str) -> torch.Tensor:
    """`embedded`, or NonFiniteEmbeddings naming how many of its rows hold NaN or infinity."""
    bad = ~torch.isfinite(embedded)
    if bad.any():
        rows = int(bad.reshape(len(embedded), -1).any(dim=1).sum())
        raise NonFiniteEmbeddings(f"{rows} of {len(embedded)} {what} embeddings are NaN or infinite: the model's "
                                  "weights diverged, so nothing is scored")
    return embedded


@torch.no_grad()
def encode_image_batch(loaded: LoadedModel, batch: torch.Tensor) -> torch.Tensor:
    """L2-normalised embeddings (float32, on the CPU) of preprocessed images [N, 3, H, W], computed on the
    model's device under its precision's autocast (as CLIP_benchmark encodes); NonFiniteEmbeddings for NaN."""
    batch = batch.to(loaded.device, non_blocking=True)
    with autocast(loaded.device, loaded.precision):
        embedded = loaded.model.encode_image(batch, normalize=True)
    return finite(embedded.float().cpu(), "image")


@torch.no_grad()
def encode_images(loaded: LoadedModel, images: list[Image.Image], batch_size: int = 256) -> torch.Tensor:
    """L2-normalised image embeddings [N, D] (float32, CPU)."""
    out = []
    for start in range(0, len(images), batch_size):
        batch = torch.stack([loaded.preprocess(im.convert("RGB")) for im in images[start : start + batch_size]])
        out.append(encode_image_batch(loaded, batch))
    return torch.cat(out) if out else torch.empty(0, 0)


@torch.no_grad()
def encode_texts(loaded: LoadedModel, texts: list[str], batch_size: int = 512) -> torch.Tensor:
    """L2-normalised text embeddings [N, D] (float32, CPU), on the model's device under autocast."""
    out = []
    for start in range(0, len(texts), batch_size):
        tokens = loaded.tokenizer(texts[start : start + batch_size]).to(loaded.device, non_blocking=True)
        with autocast(loaded.device, loaded.precision):
            embedded = loaded.model.encode_text(tokens, normalize=True)
        out.append(finite(embedded.float().cpu(), "text"))
    return torch.cat(out) if out else torch.empty(0, 0)


def _project(x: torch.Tensor, projection: torch.Tensor | torch.nn.Module | None) -> torch.Tensor:
    if projection is None:
        return x
    if isinstance(projection, torch.nn.Module):
        return projection(x)
    return x @ projection


def text_token_features(
    model: torch.nn.Module, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pooled text embedding (normalised), per-token features after ln_final and the text projection
    (not normalised), and the mask of real tokens (padding excluded). Shapes [B,D], [B,L,D], [B,L]."""
    if _is_trimmed(model):  # causal CLIP: each text up to its length group's longest (L = the longest)
        x, tokens = (_text_states_trimmed if static_shapes(model) else _text_states_bucketed)(model, tokens)
        pooled = _project(open_clip().transformer.text_global_pool(x, tokens, model.text_pool_type),
                          model.text_projection)
        return F.normalize(pooled, dim=-1), _project(x, model.text_projection), real_tokens(tokens)
    out = model.forward_intermediates(text=tokens, text_indices=1, normalize_intermediates=True)
    token_feats = _project(out["text_intermediates"][-1], getattr(model, "text_projection", None))
    return out["text_features"], token_feats, real_tokens(tokens)


def image_patch_features(model: torch.nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pooled image embedding (normalised) and per-patch features in the embedding space (not normalised).
    Shapes [B,D], [B,P,D].

    ViT: the patch tokens after ln_post and the visual projection, class token excluded. CLIP's
    ModifiedResNet: each cell of the last feature map (H x W cells, with its positional embedding) through
    the attention pool's value and output projections alone, the dense reading of CLIP-RN's pooled feature
    (MaskCLIP, Zhou et al. 2022): the pool's output is an attention-weighted mean of exactly these vectors.
    """
    if _is_modified_resnet(model.visual):
        return _resnet_cell_features(model, images)
    out = model.forward_intermediates(
        image=images,
        image_indices=1,
        normalize_intermediates=True,
        image_output_fmt="NLC",
        image_output_extra_tokens=True,
    )
    patches = _project(out["image_intermediates"][-1], getattr(model.visual, "proj", None))
    return out["image_features"], patches


def _is_modified_resnet(visual: torch.nn.Module) -> bool:
    return type(visual).__name__ == "ModifiedResNet"


def _resnet_cell_features(model: torch.nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    visual = model.visual
    out = visual.forward_intermediates(images, indices=1)
    grid = out["image_intermediates"][-1]  # [B, C, H, W], the input of the attention pool
    pool = visual.attnpool
    cells = grid.flatten(2).transpose(1, 2) + pool.positional_embedding[1:].to(grid.dtype)  # [B, HW, C]
    patches = pool.c_proj(pool.v_proj(cells))
    return F.normalize(out["image_features"], dim=-1), patches


def normalized(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x, dim=-1)
