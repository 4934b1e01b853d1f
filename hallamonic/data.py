"""Text sources shared by the conversion, the study and the evaluation: one error type, one reader
of local files, one way to stream a `datasets` dataset.

Local files: ``.jsonl`` / ``.json`` (one JSON object a line, the text in ``text_field``),
``.parquet`` (the ``text_field`` column), or plain text (``.txt``, ``.text``, ``.md``,
``.tokens``, ``.raw`` or no suffix), cut into paragraphs, lines or kept whole as the caller needs.
Datasets: a hub id, or one of `datasets`' own builders (``json``, ``parquet``, ``text``, ``csv``)
reading ``data_files``, always opened with ``streaming=True`` so nothing is downloaded up front.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

JSON_SUFFIXES = (".jsonl", ".json")
TEXT_SUFFIXES = (".txt", ".text", ".md", ".tokens", ".raw", "")
PLAIN_TEXT_SPLITS = ("paragraphs", "lines", "whole")


class DataError(ValueError):
    """Data that cannot be used (missing, malformed, too small); the message names the source and the problem."""


def _plain_texts(path: Path, split: str) -> Iterator[str]:
    text = path.read_text(encoding="utf-8-sig", errors="replace")
    if split == "whole":
        yield text
    elif split == "lines":
        yield from (line for line in text.splitlines() if line.strip())
    else:  # plain text has no document boundaries: paragraphs stand in for documents
        yield from (paragraph for paragraph in text.split("\n\n") if paragraph.strip())


def _jsonl_texts(path: Path, text_field: str) -> Iterator[str]:
    with path.open(encoding="utf-8-sig") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{number}: not valid JSON ({err.msg})") from None
            if not isinstance(record, dict) or text_field not in record:
                keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise DataError(f"{path}:{number}: no `{text_field}` field (found {keys})")
            if not isinstance(record[text_field], str):
                raise DataError(f"{path}:{number}: the `{text_field}` field is not a string ({type(record[text_field]).__name__})")
            yield record[text_field]


def _parquet_texts(path: Path, text_field: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    if text_field not in table.column_names:
        raise DataError(f"{path}: no `{text_field}` column (found {table.column_names})")
    for value in table.column(text_field).to_pylist():
        yield str(value)


def iter_texts(path: str | Path, *, text_field: str = "text", plain_text: str = "paragraphs") -> Iterator[str]:
    """The texts of a local file, lazily and in order.

    ``text_field`` names the text of JSONL records and parquet rows; ``plain_text`` says how a
    plain-text file is cut: ``paragraphs`` (blank-line separated, the conversion's documents),
    ``lines`` (one record per non-empty line) or ``whole`` (one text). Bad input raises DataError
    naming the file (and the line).
    """
    if plain_text not in PLAIN_TEXT_SPLITS:
        raise ValueError(f"plain_text must be one of {PLAIN_TEXT_SPLITS}, got {plain_text!r}")
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix in JSON_SUFFIXES:
        return _jsonl_texts(path, text_field)
    if suffix == ".parquet":
        return _parquet_texts(path, text_field)
    if suffix in TEXT_SUFFIXES:
        return _plain_texts(path, plain_text)
    raise DataError(f"{path}: unsupported data file type {suffix!r}; use .txt (plain text), .jsonl or .parquet")


def stream_dataset(name: str, config: str | None = None, *, split: str | None = None, data_files=None):
    """A `datasets` dataset opened with ``streaming=True``: records arrive as they are read.

    ``name`` is a hub id, or a builder such as ``json`` / ``parquet`` / ``text`` that reads
    ``data_files`` (a path or glob, a list, or ``{split: files}``; local or remote). Without
    ``split`` every split comes back (an ``IterableDatasetDict``). Failures -- no hub access, an
    unknown dataset, config or split -- raise DataError naming the dataset.
    """
    import datasets

    try:
        return datasets.load_dataset(name, config, split=split, data_files=data_files, streaming=True)
    except Exception as err:  # noqa: BLE001 - surfaced with the dataset name
        given = (("config", config), ("split", split), ("data_files", data_files))
        where = ", ".join(f"{key} {value!r}" for key, value in given if value is not None)
        raise DataError(
            f"cannot stream dataset {name!r}{f' ({where})' if where else ''}: {err}. "
            "Without hub access, use a local file instead (data.path)"
        ) from None


def record_texts(records: Iterable[dict], text_field: str, source: str) -> Iterator[str]:
    """The ``text_field`` of every record of a dataset, in order; ``source`` names it in errors."""
    for record in records:
        if text_field not in record:
            raise DataError(f"dataset {source!r} has no `{text_field}` field (found {sorted(record)})")
        yield str(record[text_field])
