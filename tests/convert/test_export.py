"""The exported checkpoint's names and model card (hallamonic/convert/export.py)."""

from __future__ import annotations

from hallamonic.convert import export
from hallamonic.modeling.configuration_hallamonic import HallamonicConfig


def test_public_names_keep_hub_ids_and_drop_local_paths(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"")
    assert export.public_name("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"
    assert export.public_name("builtin:tiny-llama") == "builtin:tiny-llama"
    assert export.public_name(str(tmp_path / "model.gguf")) == "model.gguf"
    assert export.public_name(str(tmp_path) + "/") == tmp_path.name


def test_the_card_describes_the_block_that_was_exported():
    diagonal = export.block_description(HallamonicConfig(state_size=1))
    hedgehog = export.block_description(HallamonicConfig(state_size=64, feature_map="hedgehog"))
    assert "diagonal state (one number per channel per level)" in diagonal and diagonal.startswith("3-level")
    assert "64 numbers per channel per level" in hedgehog and "Hedgehog feature maps" in hedgehog
    mixed = export.block_description(HallamonicConfig(state_size=64, num_hidden_layers=3, feature_map=["identity", "hedgehog", "identity"]))
    assert "q.k linear attention; in layer(s) 1 Hedgehog feature maps" in mixed
    assert "additive writes" in mixed and "delta" not in mixed
    taylor = export.block_description(HallamonicConfig(state_size=64, num_hidden_layers=3, feature_map=["identity", "hedgehog", "taylor"]))
    assert "in layer(s) 1 Hedgehog feature maps, normalised read-out; in layer(s) 2 Taylor feature maps (1 + s + s^2/2 on 16-dim projections)" in taylor
    levels = export.block_description(HallamonicConfig(state_size=1, num_hidden_layers=3, timescale_bands=[[[1, 64]], [[1, 64]], [[1, 8], [8, 64]]]))
    assert levels.startswith("1-level (2-level in layer(s) 2) hierarchical")


def test_the_card_names_the_layers_that_write_with_the_delta_rule():
    config = HallamonicConfig(state_size=64, num_hidden_layers=4, update_rule=["sum", "sum", "delta", "delta"])
    assert "q.k linear attention; additive writes; in layer(s) 2, 3 the gated delta rule" in export.block_description(config)
    everywhere = HallamonicConfig(state_size=64, num_hidden_layers=2, update_rule="delta")
    assert "(q.k linear attention; the gated delta rule" in export.block_description(everywhere)


def test_generate_gets_a_repetition_penalty_only_with_a_copy_cache():
    """The copy cache makes greedy decoding loop; the exported generation config counters it by
    default, leaves a cacheless model and the teacher's own config untouched, and keeps a penalty
    the teacher already sets."""
    from types import SimpleNamespace

    from transformers import GenerationConfig

    teacher = SimpleNamespace(generation_config=GenerationConfig(bos_token_id=1, eos_token_id=2))
    plain, cached = SimpleNamespace(copy_cache=None), SimpleNamespace(copy_cache=object())
    assert export.generation_config_for(plain, teacher) is teacher.generation_config
    generation = export.generation_config_for(cached, teacher)
    assert generation.repetition_penalty == export.COPY_CACHE_REPETITION_PENALTY > 1.0
    assert generation.eos_token_id == 2 and teacher.generation_config.repetition_penalty in (None, 1.0)
    assert export.generation_config_for(cached, SimpleNamespace()).repetition_penalty == export.COPY_CACHE_REPETITION_PENALTY
    teacher.generation_config.repetition_penalty = 1.1
    assert export.generation_config_for(cached, teacher).repetition_penalty == 1.1
