"""Evaluation text: local files (txt / jsonl with a `text` field) or the default hub datasets.

Local files make every number reproducible offline; the hub defaults are the published
datasets the numbers are meant to be comparable with.
"""

from __future__ import annotations

import json
from pathlib import Path

LAMBADA_HUB = "EleutherAI/lambada_openai"
FINEWEB_EDU_HUB = "HuggingFaceFW/fineweb-edu"
# Held-out slice of FineWeb-Edu sample-10BT: skip the head (the first ~1M characters are the
# shared training/dev text), then take documents from here on.
FINEWEB_EDU_SKIP_DOCS = 10_000


class DataError(ValueError):
    """A data file that cannot be used; the message names the file and the problem."""


def read_jsonl_texts(path: Path) -> list[str]:
    """The `text` field of every non-empty line of a JSONL file."""
    texts = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{lineno}: not valid JSON ({err.msg})") from err
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise DataError(f"{path}:{lineno}: no string field 'text'")
            texts.append(record["text"])
    if not texts:
        raise DataError(f"{path}: no records")
    return texts


def read_texts(path: str | Path, *, lines_are_records: bool) -> list[str]:
    """Texts from a local file: JSONL records, or a plain-text file.

    Plain text is one record per non-empty line when `lines_are_records` (LAMBADA passages),
    otherwise one document (a held-out stream for the context task).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    if path.suffix.lower() in (".jsonl", ".json"):
        return read_jsonl_texts(path)
    text = path.read_text(encoding="utf-8-sig")
    texts = [line for line in text.splitlines() if line.strip()] if lines_are_records else [text]
    if not any(t.strip() for t in texts):
        raise DataError(f"{path}: empty")
    return texts


def lambada_texts(path: str | Path | None, limit: int | None) -> list[str]:
    """LAMBADA passages: a local file, or the OpenAI test split from the hub."""
    if path is not None:
        texts = read_texts(path, lines_are_records=True)
    else:
        from datasets import load_dataset

        texts = list(load_dataset(LAMBADA_HUB, "default", split="test")["text"])
    return texts[:limit] if limit else texts


def heldout_texts(path: str | Path | None, min_chars: int) -> list[str]:
    """Held-out documents: a local file, or a FineWeb-Edu slice of at least `min_chars`."""
    if path is not None:
        return read_texts(path, lines_are_records=False)
    from datasets import load_dataset

    stream = load_dataset(FINEWEB_EDU_HUB, name="sample-10BT", split="train", streaming=True)
    texts, total = [], 0
    for record in stream.skip(FINEWEB_EDU_SKIP_DOCS):
        texts.append(record["text"])
        total += len(record["text"])
        if total >= min_chars:
            break
    return texts
