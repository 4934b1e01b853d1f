"""Fixtures for evaluation tests (builders live in evaltiny.py)."""

from __future__ import annotations

import pytest
import torch

from evaltiny import LAMBADA_FILE, build_llama, build_tokenizer


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from threads, and on a shared CPU thread pools thrash."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def llama(tokenizer):
    return build_llama(len(tokenizer))


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory, tokenizer, llama):
    """The tiny Llama and its tokenizer saved as a safetensors folder."""
    path = tmp_path_factory.mktemp("tiny-llama")
    llama.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def lambada_file(tmp_path):
    """Eight real LAMBADA passages (short ones, so forwards stay tiny)."""
    import json

    lines = [line for line in LAMBADA_FILE.read_text().splitlines() if len(line) < 400][:8]
    path = tmp_path / "lambada8.jsonl"
    path.write_text("\n".join(json.dumps({"text": json.loads(line)["text"]}) for line in lines) + "\n")
    return path
