"""One containment rule (compo.paths), links followed, where names read from files become paths (prefetch --from,
the model cache's manifest), and the shared checks for repeated entries and text that renders as nothing (issue 43)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compo.artifacts import CACHE_ENV, MANIFEST, resolve
from compo.images import OutsideRoot, item_path
from compo.paths import OutsideRootError, contained, has_visible_text, repeated

REPO = Path(__file__).resolve().parents[1]


# --- one containment rule, links followed ---------------------------------------------------------------


def test_the_rule_follows_links_and_keeps_the_joined_form(tmp_path: Path) -> None:
    shared = tmp_path / "shared" / "images"
    shared.mkdir(parents=True)
    (shared / "a.jpg").write_bytes(b"x")
    (tmp_path / "outside.jpg").write_bytes(b"x")
    root = tmp_path / "bench" / "images"
    root.parent.mkdir()
    root.symlink_to(shared)  # a root that is a link to shared storage is fine
    (shared / "escape.jpg").symlink_to(tmp_path / "outside.jpg")  # a link inside it pointing out is not
    assert contained(root, "a.jpg", source="f", entry="e") == root / "a.jpg"  # joined, not resolved
    assert item_path(root, "sub/../a.jpg") == root / "sub/../a.jpg"
    for parts in (("escape.jpg",), ("../../outside.jpg",), (str(tmp_path / "outside.jpg"),)):
        assert isinstance(item_path(root, *parts), OutsideRoot), parts
    with pytest.raises(OutsideRootError, match=rf"^list.json: item 7: path 'escape.jpg' resolves to "
                                               rf"{tmp_path / 'outside.jpg'}, outside {root}; refused"):
        contained(root, "escape.jpg", source="list.json", entry="item 7")


def test_prefetch_from_refuses_a_model_name_leaving_the_folder(tmp_path: Path) -> None:
    """`org/../../outside/x` once copied files from outside --from into a folder outside the model cache
    and recorded that path in the manifest."""
    from compo.prefetch import prefetch

    source = tmp_path / "shared-models"
    (source / "org").mkdir(parents=True)
    victim = tmp_path / "outside" / "x"
    victim.mkdir(parents=True)
    (victim / "config.json").write_text("{}")  # a file the llm patterns would copy
    name = "org/../../outside/x"
    config = {"negatives": {"llm": {"generator": "degla-llm", "backend": "transformers", "model": name}}}
    cache = tmp_path / "cache"
    with pytest.raises(OutsideRootError, match=rf"^--from {source}: llm:{name}: path '{name}' resolves to "
                                               rf"{victim}, outside {source}"):
        prefetch(config, cache, source_dir=source, log=lambda line: None)
    assert not (cache / MANIFEST).exists() and not (tmp_path / "x").exists()

    (source / "org" / "m").mkdir()  # a file linked in from outside is refused too
    (source / "org" / "m" / "config.json").symlink_to(victim / "config.json")
    config["negatives"]["llm"]["model"] = "org/m"
    with pytest.raises(OutsideRootError, match=rf"llm:org/m: path 'config.json' resolves to {victim}"):
        prefetch(config, cache, source_dir=source, log=lambda line: None)


@pytest.mark.parametrize("how", ["dotdot", "link"])
def test_a_manifest_entry_outside_the_cache_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         how: str) -> None:
    """A manifest entry `../outside/weights.pt` was followed: a base's weights read from outside the cache."""
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    (outside / "weights.pt").write_bytes(b"not the cache's")
    cache.mkdir()
    path = "../outside/weights.pt"
    if how == "link":
        (cache / "weights.pt").symlink_to(outside / "weights.pt")
        path = "weights.pt"
    entry = {"kind": "llm", "source": "org/m", "path": path, "files": {}, "bytes": 0}
    (cache / MANIFEST).write_text(json.dumps({"artifacts": {"llm:org/m": entry}}))
    monkeypatch.setenv(CACHE_ENV, str(cache))
    with pytest.raises(OutsideRootError, match=rf"^{cache / MANIFEST}: artifact 'llm:org/m': path '{path}' "
                                               rf"resolves to {outside / 'weights.pt'}, outside {cache}"):
        resolve("llm", "org/m")


# --- the shared checks ----------------------------------------------------------------------------------


def test_repeated_counts_entries_given_twice_and_visible_text_needs_a_visible_letter() -> None:
    assert repeated(["a", "b", "a", "c", "a", "b"]) == {"a": 3, "b": 2}
    assert repeated([1, 2, 3]) == {}
    for text in ("a red cube", "7", "日本", "\u200ba"):
        assert has_visible_text(text), text
    for text in ("", " ", "\u200b\u200c\u200d", "\u202e\u2066", "\ufeff", "\x00\x00", "...", "\u00a0\t"):
        assert not has_visible_text(text), repr(text)


def test_letters_that_render_as_nothing_are_no_text() -> None:
    """Issue 59: U+3164 (HANGUL FILLER, a letter: category Lo) passed as text. The letters Unicode marks
    Default_Ignorable_Code_Point are exactly compo.paths.INVISIBLE_LETTERS (checked against the `regex`
    module's property table), and a caption of them, or of the braille blank, holds no text."""
    import sys
    import unicodedata

    from compo.paths import INVISIBLE_LETTERS

    regex = pytest.importorskip("regex")
    ignorable = regex.compile(r"\p{Default_Ignorable_Code_Point}")
    letters = {chr(c) for c in range(sys.maxunicode + 1)
               if ignorable.match(chr(c)) and unicodedata.category(chr(c))[0] in "LN"}
    assert letters == INVISIBLE_LETTERS
    for text in ("\u3164", "\u115f\u1160", "\uffa0 \u3164\u200b", "\u2800\u2800", "\u3164."):
        assert not has_visible_text(text), repr(text)
    for text in ("\u3164a", "a\u2800b", "\u1100"):  # a visible letter beside them; a Hangul jamo that renders
        assert has_visible_text(text), repr(text)
