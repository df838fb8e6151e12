"""Progress bars for the long stages (training, evaluation, negatives), written to the stage's log file.

`compo <stage> --log FILE` sends the stage's stderr (its log lines) to FILE, and the bar goes with it, so
`tail -f` on a rule's log shows how far a job is while Snakemake's terminal (and `scripts/study.sh`) stays
one line per job. A logging FileHandler, where one is set up, gets the bar too; otherwise stderr does.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Any, TextIO, TypeVar

from tqdm import tqdm

T = TypeVar("T")


def log_stream() -> TextIO:
    """The stream of the root logger's log file, or stderr when the stage logs to no file."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and handler.stream is not None:
            return handler.stream
    return sys.stderr


def progress(iterable: Iterable[T] | None, **kwargs: Any) -> tqdm:
    """`tqdm(iterable)` on the log file: fixed width and ASCII (a file has no terminal), updated at most
    every 5 s; keyword arguments go to tqdm (desc, total, unit, initial, disable, ...). `iterable` None:
    a bar the caller moves with `update()`."""
    options = {"file": log_stream(), "mininterval": 5.0, "ncols": 100, "ascii": True, **kwargs}
    return tqdm(iterable, **options)
