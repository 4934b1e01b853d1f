"""Training text -> a packed token stream -> deterministic batches.

Documents come from a local file (.txt, .jsonl with a text field, .parquet) or a streamed Hugging
Face dataset. Each is tokenized without special tokens and followed by the EOS token (the
document separator), and the stream is cut into fixed-length sequences.

A document is held out -- never trained on -- when a hash of (seed, its index) falls under
``heldout_fraction``: the split is stable whatever the stream length, and needs no second pass.
The batch of optimizer step s is a pure function of (seed, s): an interrupted run resumes on
exactly the batches it would have seen.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from hallamonic.convert.recipe import DataSection
from hallamonic.tiny import BUILTIN_DATASET, stdlib_corpus


class DataError(ValueError):
    """The training data cannot be read or is too small; the message names the file."""


def _local_documents(path: Path, text_field: str) -> Iterator[str]:
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix in (".txt", ".text", ".md"):
        text = path.read_text(encoding="utf-8", errors="replace")
        # Plain text has no document boundaries: paragraphs stand in for documents.
        for paragraph in text.split("\n\n"):
            if paragraph.strip():
                yield paragraph
    elif suffix in (".jsonl", ".json"):
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DataError(f"{path}:{number}: not valid JSON ({err.msg})") from None
                if not isinstance(record, dict) or text_field not in record:
                    keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                    raise DataError(f"{path}:{number}: no `{text_field}` field (found {keys}); set data.text_field")
                yield str(record[text_field])
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        if text_field not in table.column_names:
            raise DataError(f"{path}: no `{text_field}` column (found {table.column_names}); set data.text_field")
        for value in table.column(text_field).to_pylist():
            yield str(value)
    else:
        raise DataError(f"{path}: unsupported data file type {suffix!r}; use .txt, .jsonl or .parquet")


def _hub_documents(section: DataSection) -> Iterator[str]:
    import datasets

    try:
        stream = datasets.load_dataset(section.dataset, section.config, split=section.split, streaming=True)
    except Exception as err:  # noqa: BLE001 - surfaced with the dataset name
        raise DataError(
            f"cannot stream dataset {section.dataset!r} (config {section.config!r}, split {section.split!r}): {err}. "
            "Without hub access, point the recipe at a local file with --set data.path=FILE"
        ) from None
    for record in stream:
        if section.text_field not in record:
            raise DataError(f"dataset {section.dataset!r} has no `{section.text_field}` field; set data.text_field")
        yield str(record[section.text_field])


def iter_documents(section: DataSection) -> Iterator[str]:
    """Every document of the configured source, in order."""
    if section.path:
        source = _local_documents(Path(section.path).expanduser(), section.text_field)
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


class PackedBatches:
    """Fixed-length sequences cut from a token stream, served as deterministic batches."""

    def __init__(self, tokens: np.ndarray, seq_len: int, *, seed: int, source: str = "the training data"):
        n_sequences = len(tokens) // seq_len
        if n_sequences == 0:
            raise DataError(
                f"{source} has {len(tokens)} tokens, fewer than one sequence of {seq_len}; "
                "add data or lower the phase's seq_len"
            )
        self.sequences = torch.from_numpy(tokens[: n_sequences * seq_len].astype(np.int64)).view(n_sequences, seq_len)
        self.seed = seed
        self._orders: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self.sequences.shape[0]

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._orders:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._orders[epoch] = torch.randperm(len(self), generator=generator)
        return self._orders[epoch]

    def batch(self, step: int, micro: int, batch_size: int, grad_accum: int, rank: int = 0, world: int = 1) -> torch.Tensor:
        """Sequences (batch_size, seq_len) for one micro-batch of one process at optimizer step ``step``.

        The global batch of a step holds batch_size * grad_accum * world sequences; epoch e visits
        the sequences in the order of a permutation seeded by (seed, e).
        """
        per_step = batch_size * grad_accum * world
        first = step * per_step + (micro * world + rank) * batch_size
        rows = []
        for g in range(first, first + batch_size):
            epoch, offset = divmod(g, len(self))
            rows.append(self._order(epoch)[offset])
        return self.sequences[torch.stack(rows)]
