"""Parsing and validation of LLM outputs into negative captions; every rejection has a reason.

`clean_output` removes any reasoning block first (`<think> ... </think>`, as Qwen3 writes it; an
unclosed `<think>` drops the rest, a lone `</think>` what precedes it), then keeps the first non-empty
line of the completion, drops a leading "Output:" / "Rewritten text:" label and surrounding quotes.
`validate` then rejects, in this order:
  empty               nothing left
  prompt_echo         the text repeats prompt scaffolding ("Input:", "Keyword:", "**Task**", "rewrite rule",
                      "Here are the examples") or is a verbatim slice of the prompt other than the caption
  identical_to_caption  equal to the caption up to case, spacing and final punctuation
  keyword_unchanged   a targeted keyword still occurs as often as in the caption (ConcretePlant)
  too_short/too_long  word count outside [min_ratio, max_ratio] x the caption's word count
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ECHO_MARKERS = ("input:", "keyword:", "**task**", "**instruction**", "rewrite rule", "here are the examples",
                "input text:")
REJECTION_REASONS = ("empty", "prompt_echo", "identical_to_caption", "keyword_unchanged", "too_short",
                     "too_long")
_LABEL = re.compile(r"^\s*(output|rewritten text|rewritten caption|negative caption|new caption)\s*:\s*",
                    re.IGNORECASE)


@dataclass(frozen=True)
class Bounds:
    min_ratio: float = 0.5
    max_ratio: float = 2.0


_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)


def strip_thinking(raw: str) -> str:
    """`raw` without reasoning blocks (module docstring)."""
    text = _THINK.sub("", raw)
    lowered = text.lower()
    if "</think>" in lowered:  # the template opened the block: the completion starts inside it
        text = text[lowered.rindex("</think>") + len("</think>"):]
        lowered = text.lower()
    if "<think>" in lowered:  # cut off while thinking: no answer
        text = text[: lowered.index("<think>")]
    return text


def clean_output(raw: str) -> str:
    lines = [line.strip() for line in strip_thinking(raw).strip().splitlines() if line.strip()]
    text = _LABEL.sub("", lines[0]) if lines else ""
    return text.strip().strip("\"'`").strip()


def _norm(text: str) -> str:
    return " ".join(re.findall(r"[\w'-]+", text.lower()))


def _count(word: str, text: str) -> int:
    return len(re.findall(rf"(?<![\w-]){re.escape(word.lower())}(?![\w-])", text.lower()))


def validate(raw: str, caption: str, prompt: str, keyword: str | None = None,
             bounds: Bounds = Bounds()) -> tuple[str | None, str]:
    """(negative text, 'ok') or (None, rejection reason) for one completion."""
    text = clean_output(raw)
    if not _norm(text):
        return None, "empty"
    lowered = text.lower()
    if any(marker in lowered for marker in ECHO_MARKERS) or (
            len(text) > 20 and text in prompt.replace(caption, "") and _norm(text) != _norm(caption)):
        return None, "prompt_echo"
    if _norm(text) == _norm(caption):
        return None, "identical_to_caption"
    if keyword and _count(keyword, text) >= _count(keyword, caption) > 0:
        return None, "keyword_unchanged"
    n_caption, n_text = len(_norm(caption).split()), len(_norm(text).split())
    if n_text < bounds.min_ratio * n_caption:
        return None, "too_short"
    if n_text > bounds.max_ratio * n_caption:
        return None, "too_long"
    return text, "ok"
