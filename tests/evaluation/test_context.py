"""Bits per token by context length and position, on tiny Llama and Hallamonic models."""

from __future__ import annotations

import math

import pytest
import torch

from evaltiny import HELDOUT_FILE, build_tokenizer
from hallamonic.evaluation import context as ctxmod
from hallamonic.evaluation.context import bucket_edges, evaluate_context, token_stream, window_prefix


@pytest.fixture(scope="module")
def texts():
    return [HELDOUT_FILE.read_text()[:30_000]]


def independent_bits(model, windows):
    total, count = 0.0, 0
    for w in windows:
        ids = torch.tensor([w])
        with torch.no_grad():
            logp = model(ids).logits[0].double().log_softmax(-1)  # (L, V)
        total += -logp[:-1].gather(1, ids[0, 1:, None]).sum().item()
        count += len(w) - 1
    return total / count / math.log(2)


def test_bits_per_token_match_an_independent_computation(llama, tokenizer, texts):
    result = evaluate_context(llama, tokenizer, texts, [48, 16], limit=3, progress=False)
    stream, prefix = token_stream(tokenizer, texts), window_prefix(tokenizer)
    assert prefix == [tokenizer.bos_token_id]
    for length in (16, 48):
        body = length - 1
        windows = [prefix + stream[i * body : (i + 1) * body] for i in range(3)]
        assert result["tokens"][str(length)] == 3 * (length - 1)
        assert math.isclose(result["bits_per_token"][str(length)], independent_bits(llama, windows), rel_tol=1e-4)
    assert list(result["bits_per_token"]) == ["16", "48"] and result["not_run"] == {}


def test_loss_by_position_buckets_average_to_the_total(llama, tokenizer, texts):
    result = evaluate_context(llama, tokenizer, texts, [2100], limit=1, progress=False)
    buckets = result["by_position"]["2100"]
    assert list(buckets) == ["0-1024", "1024-2048", "2048-2100"]
    sizes = [1023, 1024, 52]  # predicted tokens sit at positions 1..L-1
    mean = sum(b * n for b, n in zip(buckets.values(), sizes)) / sum(sizes)
    assert math.isclose(mean, result["bits_per_token"]["2100"], rel_tol=1e-6)
    assert bucket_edges(8192) == [0, 1024, 2048, 4096, 8192]


def test_lengths_that_cannot_run_are_marked_not_crashed(llama, tokenizer, texts, monkeypatch):
    real = ctxmod.score_tokens

    def fake(model, ids, **kw):
        if ids.shape[1] > 32:
            raise RuntimeError("CUDA out of memory. Tried to allocate 64 GiB")
        return real(model, ids, **kw)

    monkeypatch.setattr(ctxmod, "score_tokens", fake)
    result = evaluate_context(llama, tokenizer, texts, [16, 64, 128, 10**7], limit=1, progress=False)
    assert list(result["bits_per_token"]) == ["16"]
    assert result["not_run"]["64"] == result["not_run"]["128"] == "out of memory"
    assert "only" in result["not_run"][str(10**7)]


def test_absolute_position_model_is_not_run_past_its_table(texts):
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = build_tokenizer(bos=False)
    assert window_prefix(tok) == []
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=32, n_embd=32, n_layer=1, n_head=2)).eval()
    result = evaluate_context(model, tok, texts, [32, 64], limit=1, progress=False)
    assert "32" in result["bits_per_token"] and "position embeddings" in result["not_run"]["64"]


def test_hallamonic_model_chunked_forward_gives_the_same_loss(tokenizer, texts, monkeypatch):
    modeling = pytest.importorskip("hallamonic.modeling")
    from hallamonic.evaluation import scoring

    torch.manual_seed(0)
    config = modeling.HallamonicConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    model = modeling.HallamonicForCausalLM(config).eval()
    whole = evaluate_context(model, tokenizer, texts, [100], limit=2, progress=False)
    monkeypatch.setattr(scoring, "RECURRENT_CHUNK", 16)
    chunked = evaluate_context(model, tokenizer, texts, [100], limit=2, progress=False)
    assert math.isclose(whole["bits_per_token"]["100"], chunked["bits_per_token"]["100"], rel_tol=1e-5)
