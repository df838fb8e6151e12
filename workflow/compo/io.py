"""Reading and writing the tables and files that rules exchange.

Every table has a contract in `workflow/schemas/tables/<name>.yaml`; `read_table` validates on read and
`write_table` on write, so a file that does not match fails with its path and the column named. Writes
go to a temporary name and are renamed on success: no partial output survives a failure.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from compo.processes import current_umask

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"


class ContractError(ValueError):
    """A file does not match the contract of the table it should hold."""


@cache
def table_contract(name: str) -> dict[str, Any]:
    path = SCHEMA_DIR / "tables" / f"{name}.yaml"
    if not path.exists():
        raise ContractError(f"no table contract named {name!r} (expected {path})")
    return yaml.safe_load(path.read_text())


_ARROW_TYPES = {"string": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}


def contract_schema(name: str) -> pa.Schema:
    """The arrow schema of contract `name` (its columns in order): what a table written in chunks is cast to, so
    that every chunk has the same types (a chunk whose lists are all empty would read as list<null>)."""
    def arrow(kind: str) -> pa.DataType:
        return pa.list_(arrow(kind[5:-1])) if kind.startswith("list<") else _ARROW_TYPES[kind]
    columns = table_contract(name)["columns"]
    return pa.schema([pa.field(c, arrow(spec["type"]), nullable=spec.get("nullable", False))
                      for c, spec in columns.items()])


def _arrow_matches(kind: str, arrow_type: pa.DataType) -> bool:
    if kind == "string":
        return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_null(
            arrow_type
        )
    if kind == "int":
        return pa.types.is_integer(arrow_type)
    if kind == "float":
        return pa.types.is_floating(arrow_type) or pa.types.is_integer(arrow_type) or pa.types.is_null(
            arrow_type
        )
    if kind == "bool":
        return pa.types.is_boolean(arrow_type)
    if kind.startswith("list<"):
        if pa.types.is_null(arrow_type):
            return True
        if not (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)):
            return False
        inner = arrow_type.value_type
        return pa.types.is_null(inner) or _arrow_matches(kind[5:-1], inner)
    raise ContractError(f"unknown column type {kind!r} in a table contract")


def validate_table(table: pa.Table, name: str, path: str | Path) -> None:
    """Check `table` against contract `name`; raise ContractError naming `path` and the column."""
    contract = table_contract(name)
    for column, spec in contract["columns"].items():
        if column not in table.column_names and not spec.get("required", True):
            continue  # an optional column is checked where a table has it
        if column not in table.column_names:
            raise ContractError(f"{path}: missing column {column!r} required by the {name} contract")
        field_type = table.schema.field(column).type
        if not _arrow_matches(spec["type"], field_type):
            raise ContractError(
                f"{path}: column {column!r} has type {field_type}, the {name} contract expects {spec['type']}"
            )
        col = table.column(column)
        if not spec.get("nullable", False) and col.null_count:
            raise ContractError(f"{path}: column {column!r} has {col.null_count} null values (not nullable)")
        if spec.get("unique", False) and len(pa.compute.unique(col)) != len(col):
            raise ContractError(f"{path}: column {column!r} must be unique but has duplicates")
        if spec.get("non_empty", False):
            blank = pa.compute.equal(pa.compute.utf8_length(pa.compute.utf8_trim_whitespace(col)), 0)
            n_blank = pa.compute.sum(blank).as_py() or 0
            if n_blank:
                first = pa.compute.index(blank, True).as_py()
                raise ContractError(f"{path}: column {column!r} has {n_blank} empty value(s) (first at row "
                                    f"{first}); the {name} contract requires non-empty text")


def _open_parquet(path: Path, contract: str, opener: Callable[[Path], Any]) -> Any:
    """`opener(path)` (pq.read_table, pq.ParquetFile); a missing or unreadable file is an error naming it."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: table not found (expected a {contract} table)")
    try:
        return opener(path)
    except (pa.ArrowInvalid, OSError) as error:
        raise ContractError(f"{path}: not a readable parquet file ({error})") from error


def read_table(path: str | Path, contract: str) -> pd.DataFrame:
    """Read a parquet table and validate it against `contract`."""
    path = Path(path)
    table = _open_parquet(path, contract, pq.read_table)
    validate_table(table, contract, path)
    return table.to_pandas()


class _Unique:
    """The values seen so far of a contract's unique columns, across the chunks of one table."""

    def __init__(self, contract: str) -> None:
        spec = table_contract(contract)["columns"]
        self.seen: dict[str, set[Any]] = {c: set() for c, column in spec.items() if column.get("unique", False)}

    def check(self, table: pa.Table, path: str | Path) -> None:
        for column, seen in self.seen.items():
            if column not in table.column_names:
                continue
            values = table.column(column).to_pylist()
            repeated = seen.intersection(values)
            if repeated:
                raise ContractError(f"{path}: column {column!r} must be unique but has duplicates (e.g. "
                                    f"{sorted(map(str, repeated))[0]!r})")
            seen.update(values)


def iter_arrow(path: str | Path, contract: str, rows: int) -> Iterator[pa.Table]:
    """A parquet table as arrow tables of at most `rows` rows, each checked against `contract` on its own (a unique
    column is unique within a chunk; across chunks it is the caller's to check); a table with no rows yields one
    empty table, still checked (its columns and types)."""
    path = Path(path)
    # pre_buffer (pyarrow's default) keeps every column chunk read so far until the iteration ends: the whole file's
    # compressed bytes by the last chunk (132 MB of a 1 M-caption parse table), not one chunk's
    source = _open_parquet(path, contract, lambda p: pq.ParquetFile(p, pre_buffer=False))
    empty = True
    for batch in source.iter_batches(batch_size=rows):
        table = pa.Table.from_batches([batch])
        validate_table(table, contract, path)
        empty = False
        yield table
    if empty:
        table = source.schema_arrow.empty_table()
        validate_table(table, contract, path)
        yield table


def iter_table(path: str | Path, contract: str, rows: int) -> Iterator[pd.DataFrame]:
    """A parquet table in chunks of at most `rows` rows, each checked against `contract` (a unique column across
    the chunks): a stage that reads a table of millions of rows this way holds one chunk at a time."""
    unique = _Unique(contract)
    for table in iter_arrow(path, contract, rows):
        unique.check(table, path)
        yield table.to_pandas()


@contextlib.contextmanager
def table_writer(path: str | Path, contract: str) -> Iterator[Callable[[pd.DataFrame], None]]:
    """Write a parquet table chunk by chunk (one row group each), each chunk checked against `contract` (a unique
    column across the chunks); the file appears whole when the block succeeds, or not at all. Yields the function
    that writes a chunk; a table no chunk was written to is not created (write an empty frame for an empty one)."""
    unique, schema = _Unique(contract), contract_schema(contract)
    with atomic_path(path) as tmp:
        writer: pq.ParquetWriter | None = None
        try:
            def write(frame: pd.DataFrame) -> None:
                nonlocal writer
                table = pa.Table.from_pandas(frame, preserve_index=False)
                validate_table(table, contract, path)
                unique.check(table, path)
                if writer is None:  # the contract's columns this table has (an optional one may be absent)
                    kept = pa.schema([f for f in schema if f.name in table.column_names])
                    writer = pq.ParquetWriter(tmp, kept)
                writer.write_table(table.select(writer.schema.names).cast(writer.schema))
            yield write
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            raise ValueError(f"{path}: no chunk written (write an empty frame for an empty table)")


def is_disk_full(error: BaseException) -> bool:
    """An OSError saying the file system is full (pyarrow's carry the errno only in their message)."""
    return isinstance(error, OSError) and (error.errno == errno.ENOSPC or "No space left on device" in str(error))


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to `path`; rename it onto `path` only if the block succeeds.

    A full disk becomes an OSError(ENOSPC) naming `path` and how much of it was written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp makes the file 0600 and the rename keeps that mode: give it the mode a plain open() would,
    # so a group-readable umask (e.g. 002 on a shared cluster filesystem) gives group-readable results
    tmp_path.chmod(0o666 & ~current_umask())
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    except OSError as error:
        if not is_disk_full(error) or error.filename == str(path):
            raise
        written = tmp_path.stat().st_size if tmp_path.exists() else 0
        raise OSError(errno.ENOSPC, f"No space left on device ({written / 2**20:.1f} MB written before it "
                                    "filled up)", str(path)) from error
    finally:
        tmp_path.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty folder `.{name}.partial` next to `path`; it becomes `path` (replacing any old one)
    only if the block succeeds. A run killed inside the block leaves only the partial folder, which the
    next run clears first, so `path` is complete or absent."""
    path = Path(path)
    partial = path.parent / f".{path.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        yield partial
        shutil.rmtree(path, ignore_errors=True)
        os.replace(partial, path)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def write_table(frame: pd.DataFrame, path: str | Path, contract: str) -> None:
    """Validate `frame` against `contract` and write it as parquet, atomically."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    validate_table(table, contract, path)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def write_json(obj: Any, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def write_text(text: str, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def read_json(path: str | Path, what: str = "JSON file") -> Any:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: {what} not found")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise ContractError(f"{path}: not UTF-8 text ({error})") from error
    except json.JSONDecodeError as error:
        raise ContractError(f"{path}: not valid JSON ({error})") from error


@contextlib.contextmanager
def atomic_folder(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary folder next to `path`; it replaces `path` only if the block succeeds.

    So `path` holds either the complete new contents or what it held before, never a mix: a consumer
    that sees the folder sees every file of it. (An empty folder at `path`, as workflow engines create
    before a job, is replaced in one rename; a non-empty one is moved aside first.)"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        tmp.chmod(0o777 & ~current_umask())  # mkdtemp makes it private; the result should read like any folder
        yield tmp
        try:
            os.replace(tmp, path)
        except OSError:  # a non-empty folder is in the way: move it aside, then swap
            aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, aside / path.name)
            os.replace(tmp, path)
            shutil.rmtree(aside, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
