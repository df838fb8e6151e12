"""SugarCrepe's reader (compo.evaluate.sugarcrepe): an id given twice is an error naming the file (issue 43)."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_a_sugarcrepe_id_given_twice_is_an_error(tmp_path: Path) -> None:
    """json kept the last of a repeated key: an item was dropped unseen."""
    from compo.evaluate.files import BenchmarkError
    from compo.evaluate.sugarcrepe import load_subset

    path = tmp_path / "add_obj.json"
    item = '{"filename": "1.jpg", "caption": "a red cube", "negative_caption": "a blue cube"}'
    path.write_text(f'{{"0": {item}, "1": {item}, "0": {item}}}')
    with pytest.raises(BenchmarkError, match=r"add_obj\.json: key\(s\) '0' given more than once in one object"):
        load_subset(path)
