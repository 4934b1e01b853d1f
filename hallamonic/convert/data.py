"""Training text -> a packed token stream.

Documents come from a local file (.txt, .jsonl with a text field, .parquet), a streamed `datasets`
dataset (a hub id, or a builder such as ``json`` reading ``data.data_files``) or the built-in
standard-library docstrings. Each is tokenized without special tokens and followed by the EOS token
(the document separator); :class:`hallamonic.training.packing.PackedBatches` cuts the stream
into fixed-length sequences.

A document is held out -- never trained on -- when a hash of (seed, its index) falls under
``heldout_fraction``: the split is stable whatever the stream length, and needs no second pass.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np

from hallamonic.convert.recipe import DataSection
from hallamonic.data import DataError, iter_texts, record_texts, stream_dataset
from hallamonic.tiny import BUILTIN_DATASET, stdlib_corpus


def _hub_documents(section: DataSection) -> Iterator[str]:
    stream = stream_dataset(section.dataset, section.config, split=section.split, data_files=section.data_files)
    return record_texts(stream, section.text_field, section.dataset)


def iter_documents(section: DataSection) -> Iterator[str]:
    """Every document of the configured source, in order."""
    if section.path:
        source = iter_texts(section.path, text_field=section.text_field)
    elif section.dataset == BUILTIN_DATASET:
        source = iter(stdlib_corpus())
    else:
        source = _hub_documents(section)
    for index, document in enumerate(source):
        if section.max_documents is not None and index >= section.max_documents:
            return
        yield document


def is_heldout(index: int, seed: int, fraction: float) -> bool:
    """Stable hash split: document ``index`` is held out for this seed with probability ``fraction``."""
    if fraction <= 0:
        return False
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64 < fraction


def tokenize_stream(tokenizer, section: DataSection, *, seed: int, max_tokens: int, heldout: bool = False) -> np.ndarray:
    """Tokens of the training (or, with ``heldout``, the held-out) documents, EOS-separated, up to
    ``max_tokens``. Returns an int32 array."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DataError("the tokenizer has no EOS token to separate documents")
    pieces: list[np.ndarray] = []
    total = 0
    batch: list[str] = []

    def flush() -> None:
        nonlocal total
        for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            pieces.append(np.asarray([*ids, eos], dtype=np.int32))
            total += len(ids) + 1
        batch.clear()

    for index, document in enumerate(iter_documents(section)):
        if is_heldout(index, seed, section.heldout_fraction) != heldout:
            continue
        batch.append(document)
        if len(batch) == 64:
            flush()
            if total >= max_tokens:
                break
    if batch and total < max_tokens:
        flush()
    if not pieces:
        return np.zeros(0, dtype=np.int32)
    return np.concatenate(pieces)[:max_tokens]
