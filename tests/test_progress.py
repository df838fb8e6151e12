"""Progress bars go to the stage's log file (`compo <stage> --log FILE` sends the stage's stderr there)."""

from __future__ import annotations

import logging

from compo.cli import _setup_logging, _stderr_to
from compo.progress import progress


def test_progress_bar_is_written_to_the_log_file(tmp_path):
    log = tmp_path / "stage.log"
    with _stderr_to(str(log)):
        _setup_logging()
        for _ in progress(range(3), desc="train demo", unit="step", mininterval=0):
            logging.getLogger("compo.test").info("a log line")
        logging.getLogger().handlers.clear()
    text = log.read_text()
    assert "train demo: 100%" in text and "3/3" in text and text.count("a log line") == 3
