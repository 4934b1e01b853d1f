"""A tiny, fully local teacher: random Llama + a real BPE tokenizer trained on local text.

Used by the `tiny` recipe (a complete conversion in seconds on any machine, no network, no data
file) and by the tests. The text is the standard library's own docstrings: real English prose
that every Python installation carries, so nothing is downloaded or shipped.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from collections.abc import Iterable, Sequence
from functools import lru_cache

import torch

# Modules with long, plain-English docstrings; all ship with CPython.
_CORPUS_MODULES = (
    "abc", "argparse", "asyncio", "base64", "bisect", "calendar", "collections", "contextlib",
    "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "email", "enum", "fractions",
    "functools", "heapq", "hmac", "html", "http", "inspect", "io", "itertools", "json", "logging",
    "math", "operator", "os", "pathlib", "pickle", "pprint", "queue", "random", "re", "shutil",
    "socket", "statistics", "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap",
    "threading", "timeit", "typing", "unittest", "urllib", "uuid", "warnings", "weakref", "zipfile",
)


@lru_cache(maxsize=1)
def stdlib_corpus() -> tuple[str, ...]:
    """Docstrings of standard-library modules and their public members, one document each."""
    documents = []
    with warnings.catch_warnings():  # some public names are deprecated aliases (typing.io, ...)
        warnings.simplefilter("ignore")
        for name in _CORPUS_MODULES:
            try:
                module = importlib.import_module(name)
            except ImportError:  # pragma: no cover - a trimmed Python build
                continue
            members = [getattr(module, attr) for attr in sorted(dir(module)) if not attr.startswith("_")]
            for obj in [module, *members]:
                documented = inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isfunction(obj)
                doc = inspect.getdoc(obj) if documented else None
                if doc and len(doc) > 200 and doc not in documents:
                    documents.append(doc)
    return tuple(documents)


def build_tiny_tokenizer(
    vocab_size: int = 512, *, texts: Iterable[str] | None = None, specials: Sequence[str] = ("<|endoftext|>",),
    bos_prefix: bool = False,
):
    """A byte-level BPE tokenizer trained on ``texts`` (default :func:`stdlib_corpus`), as a
    PreTrainedTokenizerFast -- the one tiny tokenizer of the built-in teacher and of the tests.

    ``specials`` take the first ids: one token is BOS, EOS, UNK and padding at once (GPT-2 style,
    the default); three are UNK, BOS and EOS (Llama style: ids 0, 1, 2). ``bos_prefix`` prepends
    BOS to every encoding, as Llama's tokenizer does.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if len(specials) not in (1, 3):
        raise ValueError(f"specials: one token (bos = eos = unk = pad) or three (unk, bos, eos), got {list(specials)}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(stdlib_corpus() if texts is None else texts, trainer=trainer)
    unk, bos, eos = (specials * 3) if len(specials) == 1 else specials
    if bos_prefix:
        tokenizer.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, specials.index(bos))])
    names = dict(bos_token=bos, eos_token=eos, unk_token=unk) | ({"pad_token": bos} if len(specials) == 1 else {})
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **names)


def build_tiny_llama(
    vocab_size: int,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 256,
    tie_word_embeddings: bool = True,
    seed: int = 0,
):
    """A randomly initialised LlamaForCausalLM (GQA, tied embeddings, short RoPE window)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


BUILTIN_TEACHER = "builtin:tiny-llama"
BUILTIN_DATASET = "builtin:stdlib-docs"


def load_builtin_teacher(spec: str, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) for ``builtin:tiny-llama``: a random tiny Llama with the local tokenizer."""
    if spec != BUILTIN_TEACHER:
        raise ValueError(f"unknown built-in model {spec!r}; the only one is {BUILTIN_TEACHER!r}")
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_llama(len(tokenizer)).to(dtype)
    return model, tokenizer
