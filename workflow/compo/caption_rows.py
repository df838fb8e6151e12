"""A table's rows by caption_id, read on demand from a memory-mapped copy: training's parse lookup.

A Python dict of one row per caption (what training held before) costs ~4 KB a parsed caption in every rank and,
page by page as reference counts are touched, in every DataLoader worker: ~12 GB a rank for cc3m-dreamlip's 2.8 M
long captions. `CaptionRows` instead copies the columns a run reads, once, into an uncompressed Arrow IPC file in a
private node-local folder, and an index of the caption ids (their 64-bit hashes, sorted, with the row of each) into
two .npy files; all three are memory-mapped. The ranks of a job (and their forked workers) share the pages through
the page cache, which the kernel can drop and read back; what a process holds of its own does not grow with the
table. The copy is made under a file lock (the first rank makes it, the others wait and reuse it) and renamed into
place whole, keyed by the source's path, size and modification time and the columns kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import socket
import tempfile
import weakref
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from compo.io import ContractError, contract_schema, iter_arrow
from compo.paths import private_dir

log = logging.getLogger(__name__)

KEY = "caption_id"
CHUNK_ROWS = 10_000  # rows read, checked and copied at a time: the copy's memory, whatever the table's size
FORMAT = 2  # bump when the copy's layout changes: an older copy is then not reused


def caption_hashes(caption_ids: Iterable[str]) -> np.ndarray:
    """uint64 hashes of caption ids, the same in every process (BLAKE2b, 8 bytes; ~1 us an id, also for one id)."""
    digests = b"".join(hashlib.blake2b(caption_id.encode(), digest_size=8).digest() for caption_id in caption_ids)
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_folder(folder: str, owner: int) -> None:
    if os.getpid() == owner:  # never from a forked DataLoader worker while its parent reads the copy
        shutil.rmtree(folder, ignore_errors=True)


class CaptionRows:
    """The rows of table `path` (contract `contract`) by caption_id, restricted to `columns` (caption_id always).

    folder: a node-local folder of this user's (made private, `compo.paths.private_dir`) where the copy is made
    or found; the ranks of one job pass the same folder to share one copy. None: a temporary folder of this
    process, removed when the object is collected. The whole table is read once, a chunk at a time, checked
    against the contract (caption_id unique across the whole table).
    """

    def __init__(self, path: str | Path, contract: str, columns: Sequence[str], folder: str | Path | None = None,
                 *, chunk: int = CHUNK_ROWS) -> None:
        self.path, self.contract, self.chunk = Path(path), contract, chunk
        schema = contract_schema(contract)
        unknown = sorted(set(columns) - set(schema.names))
        if unknown:
            raise ValueError(f"columns {unknown} are not in the {contract} contract ({schema.names})")
        self.columns = [KEY, *dict.fromkeys(c for c in columns if c != KEY)]
        if folder is None:
            folder = tempfile.mkdtemp(prefix="compo-rows-")
            weakref.finalize(self, _remove_folder, folder, os.getpid())
        folder = private_dir(folder)
        info = self.path.stat() if self.path.exists() else None
        identity = f"{FORMAT}\0{self.path.resolve()}\0{info and info.st_size}\0{info and info.st_mtime_ns}\0" \
                   f"{contract}\0{self.columns}"
        self.stem = folder / f"{contract}-{hashlib.sha256(identity.encode()).hexdigest()[:20]}"
        with _locked(self.stem.with_name(f"{self.stem.name}.lock")):
            if not self._files()[-1].exists():  # the row index is renamed into place last
                self._copy(schema)
        self._open()

    def _files(self) -> tuple[Path, Path, Path]:
        name = self.stem.name
        return (self.stem.with_name(f"{name}.arrow"), self.stem.with_name(f"{name}.hashes.npy"),
                self.stem.with_name(f"{name}.rows.npy"))

    def _copy(self, schema: pa.Schema) -> None:
        """Read the table a chunk at a time (each checked), write the kept columns and the index."""
        arrow, hashes_path, rows_path = self._files()
        kept = pa.schema([schema.field(c) for c in self.columns])
        writer_id = f"{socket.gethostname()}.{os.getpid()}"  # nodes sharing a folder never share a partial file
        partial = arrow.with_name(f".{arrow.name}.{writer_id}.partial")
        hashes = []
        try:
            with pa.OSFile(str(partial), "wb") as sink, pa.ipc.new_file(sink, kept) as writer:
                for chunk in iter_arrow(self.path, self.contract, self.chunk):
                    table = chunk.select(self.columns).cast(kept)
                    writer.write_table(table)
                    hashes.append(caption_hashes(table.column(KEY).to_pylist()))
            os.replace(partial, arrow)
        finally:
            partial.unlink(missing_ok=True)
        # the index: 8 bytes a caption each of hashes and rows (24 at the peak, in the process that copies)
        every = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64)
        del hashes
        order = np.argsort(every, kind="stable")
        every = every[order]
        self._check_unique(every, order, arrow)
        for path, values in ((hashes_path, every), (rows_path, order)):
            partial = path.with_name(f".{path.name}.{writer_id}.partial.npy")
            np.save(partial, values)
            os.replace(partial, path)
        pa.default_memory_pool().release_unused()  # the chunks' buffers, else kept by arrow's allocator
        log.info("%s: %d rows, columns %s, copied to %s (%.1f MB, memory-mapped)", self.path, len(order),
                 self.columns, arrow, arrow.stat().st_size / 2**20)

    def _check_unique(self, sorted_hashes: np.ndarray, order: np.ndarray, arrow: Path) -> None:
        # a chunk checked its own rows; across chunks two rows with one id have one hash (equal hashes of two
        # different ids, ~n^2 / 2^65, are told apart by their ids); a refused copy is removed, never reused
        repeated = np.flatnonzero(sorted_hashes[1:] == sorted_hashes[:-1])
        if not len(repeated):
            return
        ids = pa.ipc.open_file(pa.memory_map(str(arrow), "r")).read_all().column(KEY)
        for position in repeated:
            caption_id = ids[int(order[position])].as_py()
            if caption_id == ids[int(order[position + 1])].as_py():
                del ids
                arrow.unlink()
                raise ContractError(f"{self.path}: column {KEY!r} must be unique but has duplicates (e.g. "
                                    f"{caption_id!r})")

    def _open(self) -> None:
        arrow, hashes_path, rows_path = self._files()
        self._table = pa.ipc.open_file(pa.memory_map(str(arrow), "r")).read_all()  # zero-copy: pages of the file
        self._ids = self._table.column(KEY)
        self._hashes = np.load(hashes_path, mmap_mode="r")
        self._rows = np.load(rows_path, mmap_mode="r")

    # a DataLoader worker started by spawn gets the file names and maps them itself, not a copy of the table
    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "contract": self.contract, "columns": self.columns, "stem": self.stem,
                "chunk": self.chunk}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open()

    def __len__(self) -> int:
        return len(self._table)

    def row_of(self, caption_id: str) -> int | None:
        """The table row of `caption_id`, None when the table has none."""
        target = caption_hashes([caption_id])[0]
        start = int(np.searchsorted(self._hashes, target, side="left"))
        stop = int(np.searchsorted(self._hashes, target, side="right"))
        for position in range(start, stop):
            row = int(self._rows[position])
            if self._ids[row].as_py() == caption_id:
                return row
        return None

    def __contains__(self, caption_id: object) -> bool:
        return isinstance(caption_id, str) and self.row_of(caption_id) is not None

    def get(self, caption_id: str) -> dict[str, Any] | None:
        """The caption's row ({column: value}, lists as Python lists), None when the table has none."""
        row = self.row_of(caption_id)
        return None if row is None else self._table.slice(row, 1).to_pylist()[0]

    def column_chunks(self, column: str) -> Iterator[list[Any]]:
        """The values of `column` in table order, one chunk (as written) at a time: for what needs every row
        (a vocabulary of all tokens) without holding the column as Python objects."""
        for chunk in self._table.column(column).chunks:
            yield chunk.to_pylist()
