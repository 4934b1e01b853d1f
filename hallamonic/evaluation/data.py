"""Evaluation text: local files (txt / jsonl with a `text` field / parquet) or the default hub datasets.

Local files make every number reproducible offline; the hub defaults are the published
datasets the numbers are meant to be comparable with. Files are read, and datasets streamed,
by :mod:`hallamonic.data` (shared with the conversion and the study).
"""

from __future__ import annotations

from pathlib import Path

from hallamonic.data import DataError, iter_texts, record_texts, stream_dataset

LAMBADA_HUB = "EleutherAI/lambada_openai"
FINEWEB_EDU_HUB = "HuggingFaceFW/fineweb-edu"
# Held-out slice of FineWeb-Edu sample-10BT: skip the head (the first ~1M characters are the
# shared training/dev text), then take documents from here on.
FINEWEB_EDU_SKIP_DOCS = 10_000


def read_texts(path: str | Path, *, lines_are_records: bool) -> list[str]:
    """Texts from a local file: JSONL records (or parquet rows), or a plain-text file.

    Plain text is one record per non-empty line when `lines_are_records` (LAMBADA passages),
    otherwise one document (a held-out stream for the context task).
    """
    texts = list(iter_texts(path, plain_text="lines" if lines_are_records else "whole"))
    if not any(t.strip() for t in texts):
        raise DataError(f"{path}: no text")
    return texts


def lambada_texts(path: str | Path | None, limit: int | None) -> list[str]:
    """LAMBADA passages: a local file, or the OpenAI test split from the hub."""
    if path is not None:
        texts = read_texts(path, lines_are_records=True)
    else:
        texts = list(record_texts(stream_dataset(LAMBADA_HUB, "default", split="test"), "text", LAMBADA_HUB))
    return texts[:limit] if limit else texts


def heldout_texts(path: str | Path | None, min_chars: int) -> list[str]:
    """Held-out documents: a local file, or a FineWeb-Edu slice of at least `min_chars`."""
    if path is not None:
        return read_texts(path, lines_are_records=False)
    stream = stream_dataset(FINEWEB_EDU_HUB, "sample-10BT", split="train")
    texts, total = [], 0
    for text in record_texts(stream.skip(FINEWEB_EDU_SKIP_DOCS), "text", FINEWEB_EDU_HUB):
        texts.append(text)
        total += len(text)
        if total >= min_chars:
            break
    return texts
