"""Local data files named in their errors: an empty file, a malformed JSON Lines row (file and line), a Parquet or
CSV file that cannot be read.

`datasets` reports these without the file ("An error occurred while generating the dataset", a bare
`StopIteration`, "Parquet magic bytes not found"). `check_not_empty` runs before a file is handed to `datasets`; the
other checks run only after `datasets` has failed, to say where (a correct file is never read twice).
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
from collections.abc import Iterator
from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["check_not_empty", "explain_read_error", "read_jsonl"]

_OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


def check_not_empty(path: str) -> None:
    """Raise `ValueError` when `path` holds nothing but whitespace (compressed files are read through).

    Args:
        path (`str`): A local data file.
    """
    if os.path.getsize(path) > 0:
        opener = _opener(path)
        if opener is None:
            return  # a compression the standard library cannot read (.zst, .lz4): left to `datasets`
        with opener(path, "rb") as handle:
            while chunk := handle.read(1 << 16):
                if chunk.strip():
                    return
    raise ValueError(f"data file {path!r} is empty (no rows, or only blank lines): fill it, or give another file.")


def explain_read_error(paths: list[str], suffix: str, error: BaseException) -> ValueError | None:
    """Why `datasets` could not read `paths`, naming the file (and, for JSON, the line), or `None` if not found.

    Args:
        paths (`list[str]`): The files of the split that failed to load.
        suffix (`str`): Their format: `".jsonl"`, `".json"`, `".csv"`, `".tsv"` or `".parquet"`.
        error (`BaseException`): What `datasets` raised.

    Returns:
        A `ValueError` to raise from `error`, or `None` when no file shows what went wrong.
    """
    if suffix in (".jsonl", ".json"):
        for path in paths:
            problem = _json_problem(path, suffix)
            if problem is not None:
                return ValueError(problem)
        return None
    if suffix == ".parquet":
        for path in paths:
            try:
                pq.read_metadata(path)
            except (pa.ArrowException, OSError) as err:
                return ValueError(
                    f"data file {path!r} is not a readable Parquet file ({err}); it may be truncated (an "
                    "interrupted copy or download): write or copy it again."
                )
        return None
    cause = _root_cause(error)
    named = paths[0] if len(paths) == 1 else f"one of {paths}"
    return ValueError(
        f"cannot read {named!r} as {'tab-separated' if suffix == '.tsv' else 'comma-separated'} text: "
        f"{type(cause).__name__}: {cause}. Check its quoting and column count (TSV files are read without quoting)."
    )


def read_jsonl(path: str | os.PathLike) -> Iterator[dict]:
    """The rows of a JSON Lines file (blank lines skipped); a malformed line raises `ValueError` naming file and line.

    Args:
        path (`str` or `os.PathLike`): The file (optionally `.gz`, `.bz2` or `.xz`).

    Yields:
        `dict`: One JSON object per non-blank line.
    """
    with _open_text(str(path)) as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield _parse_line(str(path), number, line)


def _json_problem(path: str, suffix: str) -> str | None:
    """The first thing in a JSON / JSON Lines file that is not a JSON object per line (or one JSON document)."""
    if _opener(path) is None:
        return None
    try:
        with _open_text(path) as handle:
            text = handle.read()
    except UnicodeDecodeError as err:
        return f"data file {path!r} is not UTF-8 text (byte {err.start} of the file): save it as UTF-8."
    except OSError as err:
        return f"data file {path!r} cannot be read: {err}"
    if suffix == ".json" and text.lstrip()[:1] in ("[", "{"):
        try:
            json.loads(text)
            return None  # one JSON document: the problem is its structure, not its syntax
        except json.JSONDecodeError as err:
            if err.msg != "Extra data":  # else several objects, one per line: JSON Lines in a .json file
                return (
                    f"data file {path!r}, line {err.lineno}, column {err.colno}: not valid JSON ({err.msg}); fix "
                    "the file there."
                )
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                _parse_line(path, number, line)
            except ValueError as err:
                return str(err)
    return None


def _parse_line(path: str, number: int, line: str) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"data file {path!r}, line {number}: not valid JSON ({err.msg}, column {err.colno}); each line of a "
            "JSON Lines file must be one complete JSON object: fix or remove that line."
        ) from None
    if not isinstance(row, dict):
        raise ValueError(
            f"data file {path!r}, line {number}: a JSON Lines row must be an object such as "
            f'{{"source": ..., "target": ...}}, got {type(row).__name__} {line.strip()[:40]!r}.'
        )
    return row


def _opener(path: str):
    for suffix, opener in _OPENERS.items():
        if path.lower().endswith(suffix):
            return opener
    if path.lower().endswith((".zst", ".lz4")):
        return None
    return open


def _open_text(path: str) -> IO[str]:
    opener = _opener(path)
    if opener is None:
        raise ValueError(f"{path!r}: zstd and lz4 files are read by `datasets` only; decompress it first.")
    return opener(path, "rt", encoding="utf-8")


def _root_cause(error: BaseException) -> BaseException:
    while (error.__cause__ or error.__context__) is not None:
        error = error.__cause__ or error.__context__
    return error
