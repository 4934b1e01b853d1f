"""The study's corpus: one text split by position into train / valid / test, as token ids.

Byte-level (``tokenizer: bytes``) is the enwik8 convention: every byte is a token, vocabulary 256,
and the reported unit is bits per byte. Any other value names a tokenizer (folder or hub id) and
the unit is bits per token. Splitting by position (not by shuffled documents) is how enwik8's
standard 90M / 5M / 5M split is made, and keeps the test text unseen and contiguous. A dataset
instead of a file (``data.dataset``: a hub id, or a builder such as ``json`` reading
``data.data_files``) is streamed and brings its own train / validation / test splits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hallamonic.data import DataError, record_texts, stream_dataset
from hallamonic.study.recipe import StudyDataSection


@dataclass
class StudyCorpus:
    train: np.ndarray  # (N_train,) token ids
    valid: np.ndarray
    test: np.ndarray
    vocab_size: int
    unit: str  # "bits per byte" | "bits per token"
    source: str


def _split(ids: np.ndarray, section: StudyDataSection) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = len(ids)
    n_test = int(n * section.test_fraction)
    n_valid = int(n * section.valid_fraction)
    n_train = n - n_test - n_valid
    return ids[:n_train], ids[n_train : n_train + n_valid], ids[n_train + n_valid :]


def _hub_texts(section: StudyDataSection) -> dict[str, str]:
    """The train / validation / test splits of a streamed dataset, each joined into one text."""
    splits = stream_dataset(section.dataset, section.config, data_files=section.data_files)
    names = {"train": "train", "valid": "validation", "test": "test"}
    missing = [hub for hub in names.values() if hub not in splits]
    if missing:
        raise DataError(
            f"dataset {section.dataset!r} has no {missing} split(s); give `data.data_files` one file per split "
            "({train: ..., validation: ..., test: ...}) or use a local `data.path` instead"
        )
    return {ours: "\n".join(record_texts(splits[hub], section.text_field, section.dataset)) for ours, hub in names.items()}


def _encode(text_or_bytes: bytes | str, tokenizer) -> np.ndarray:
    if tokenizer is None:
        raw = text_or_bytes if isinstance(text_or_bytes, bytes) else text_or_bytes.encode("utf-8")
        return np.frombuffer(raw, dtype=np.uint8).copy()
    text = text_or_bytes.decode("utf-8", errors="replace") if isinstance(text_or_bytes, bytes) else text_or_bytes
    return np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)


def load_study_corpus(section: StudyDataSection) -> StudyCorpus:
    """Read, tokenize and split the study's text; bad input raises DataError naming the problem."""
    tokenizer = None
    if section.tokenizer != "bytes":
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(section.tokenizer)
        except (OSError, ValueError) as err:
            raise DataError(f"cannot load tokenizer {section.tokenizer!r} (use `bytes` or a tokenizer folder): {err}") from None
    vocab_size = 256 if tokenizer is None else len(tokenizer)
    unit = "bits per byte" if tokenizer is None else "bits per token"
    if section.path is not None:
        path = Path(section.path).expanduser()
        if not path.is_file():
            raise DataError(f"study data file {path} does not exist")
        with path.open("rb") as handle:
            raw = handle.read(section.max_bytes) if section.max_bytes else handle.read()
        train, valid, test = _split(_encode(raw, tokenizer), section)
        source = str(path)
    else:
        texts = _hub_texts(section)
        train, valid, test = (_encode(texts[name], tokenizer) for name in ("train", "valid", "test"))
        source = f"hub:{section.dataset}"
    if len(train) == 0 or len(test) == 0:
        raise DataError(f"{source}: too little text to split into train and test")
    return StudyCorpus(train=train, valid=valid, test=test, vocab_size=vocab_size, unit=unit, source=source)
