"""Progress bars go to the stage's log file (compo <stage> --log), not to the terminal."""

from __future__ import annotations

import logging

from compo.cli import _setup_logging
from compo.progress import progress


def test_progress_bar_is_written_to_the_log_file(tmp_path, capsys):
    log = tmp_path / "stage.log"
    _setup_logging(str(log))
    try:
        for _ in progress(range(3), desc="train demo", unit="step", mininterval=0):
            logging.getLogger("compo.test").info("a log line")
    finally:
        for handler in logging.getLogger().handlers[:]:
            handler.close()
            logging.getLogger().removeHandler(handler)
    text = log.read_text()
    assert "train demo: 100%" in text and "3/3" in text and text.count("a log line") == 3
    assert "train demo" not in capsys.readouterr().err  # the terminal gets the log lines only
