"""Surgery: exact copies, frozen parameters, supported families, initialisation from attention."""

from __future__ import annotations

import pytest
import torch

from hallamonic.convert.recipe import HarmonicSection
from hallamonic.convert.surgery import (
    UnsupportedModelError, build_student, calibrate_blocks, is_carried_over, parameter_counts,
)
from hallamonic.tiny import build_tiny_llama


def test_student_copies_every_carried_tensor_exactly_and_freezes_it():
    teacher = build_tiny_llama(300, tie_word_embeddings=False)
    student = build_student(teacher, HarmonicSection())
    teacher_state = teacher.state_dict()
    copied = 0
    for name, param in student.named_parameters():
        if is_carried_over(name):
            assert torch.equal(param, teacher_state[name]), name
            assert not param.requires_grad, name
            copied += 1
        else:
            assert param.requires_grad, name
    assert copied == len([k for k in teacher_state if ".self_attn." not in k])
    for s_layer, t_layer in zip(student.model.layers, teacher.model.layers):
        assert torch.equal(s_layer.mixer.v_proj.weight, t_layer.self_attn.v_proj.weight)
        assert torch.equal(s_layer.mixer.o_proj.weight, t_layer.self_attn.o_proj.weight)
    counts = parameter_counts(teacher, student)
    print(counts)
    assert 0.75 < counts["student"] / counts["teacher"] < 1.25


def test_tied_embeddings_stay_tied():
    student = build_student(build_tiny_llama(300, tie_word_embeddings=True), HarmonicSection())
    assert student.lm_head.weight.data_ptr() == student.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_other_supported_families(family):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        family, vocab_size=200, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )
    teacher = AutoModelForCausalLM.from_config(config).eval()
    student = build_student(teacher, HarmonicSection())
    if family == "qwen2":  # q/k/v biases: the value bias is carried into the value stream
        assert torch.equal(student.model.layers[0].mixer.v_proj.bias, teacher.model.layers[0].self_attn.v_proj.bias)
    ids = torch.randint(0, 200, (1, 12))
    assert torch.isfinite(student(ids).logits).all()


def test_unsupported_family_names_what_is_supported():
    from transformers import GPT2Config, GPT2LMHeadModel

    teacher = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    with pytest.raises(UnsupportedModelError, match="cannot convert a `gpt2` model: supported families are llama, mistral, qwen2"):
        build_student(teacher, HarmonicSection())


def test_calibration_matches_scales_and_beats_predicting_zeros():
    from hallamonic.convert.phases import MixerStack, capture_attention_io

    teacher = build_tiny_llama(300)
    student = build_student(teacher, HarmonicSection())
    ids = torch.randint(0, 300, (2, 32))
    stats = calibrate_blocks(student, teacher, ids)
    assert len(stats) == 2
    for layer, stat in zip(student.model.layers, stats):
        for norm in layer.mixer.error_norms:
            assert torch.allclose(norm.weight, torch.full_like(norm.weight, stat["value_rms"]))
    inputs, targets = capture_attention_io(teacher, ids)
    with torch.no_grad():
        losses = MixerStack([layer.mixer for layer in student.model.layers])(inputs, targets)
    assert (losses <= 1.0 + 1e-4).all()  # never worse than an all-zero output
    torch.testing.assert_close(losses, torch.tensor([s["normalised_mse"] for s in stats]), atol=1e-4, rtol=1e-4)


def test_converted_block_starts_as_decayed_linear_attention_over_the_teachers_qkv():
    """One constant decay a, no hierarchy (one level): the converted block computes
    o_proj(sum_s (1 - a) a^(t-s) (q_t . k_s / sqrt(d)) v_s) with q, k, v from the teacher
    attention's own projections (GQA repeated, no RoPE) -- the initialisation is wired right."""
    teacher = build_tiny_llama(300, tie_word_embeddings=False)
    tau = 6.0
    student = build_student(teacher, HarmonicSection(timescale_bands=[[tau, tau]], hierarchy=False))
    config = student.config
    assert config.state_size == config.head_dim
    attention = teacher.model.layers[0].self_attn
    mixer = student.model.layers[0].mixer
    heads, kv_heads, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    torch.manual_seed(0)
    x = torch.randn(2, 29, config.hidden_size)
    with torch.no_grad():
        y, _ = mixer(x)
        repeat = lambda t: t.view(2, 29, kv_heads, 1, d).expand(-1, -1, -1, heads // kv_heads, -1).reshape(2, 29, heads, d)  # noqa: E731
        q = attention.q_proj(x).view(2, 29, heads, d)
        k, v = repeat(attention.k_proj(x)), repeat(attention.v_proj(x))
        a = torch.exp(torch.tensor(-1.0 / tau, dtype=torch.float64))
        t = torch.arange(29)
        weights = ((1 - a) * a ** (t[:, None] - t[None, :]).clamp_min(0) * (t[:, None] >= t[None, :])).float()
        scores = torch.einsum("bthd,bshd->bhts", q, k) / d**0.5  # (B, H, L, L)
        expected = attention.o_proj(torch.einsum("bhts,bshd->bthd", scores * weights, v).reshape(2, 29, heads * d))
    torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-4)


def test_hedgehog_block_starts_from_the_teachers_qkv_through_identity_feature_maps():
    """With Hedgehog features the converted block still takes k_proj / q_proj / v_proj / o_proj, and
    its feature maps start as the identity, so phi sees the teacher's own keys and queries."""
    teacher = build_tiny_llama(300, tie_word_embeddings=False)
    student = build_student(teacher, HarmonicSection(feature_map="hedgehog"))
    assert student.config.feature_map == "hedgehog"
    for student_layer, teacher_layer in zip(student.model.layers, teacher.model.layers):
        mixer, attention = student_layer.mixer, teacher_layer.self_attn
        assert torch.equal(mixer.state_write.weight, attention.k_proj.weight)
        assert torch.equal(mixer.state_read.weight, attention.q_proj.weight)
        eye = torch.eye(student.config.state_size)
        assert torch.equal(mixer.write_features.weight, eye.expand_as(mixer.write_features.weight))
        assert torch.equal(mixer.read_features.weight, eye.expand_as(mixer.read_features.weight))
        assert mixer.write_features.weight.requires_grad
    ids = torch.randint(0, 300, (2, 19))
    assert torch.isfinite(student(ids).logits).all()


def test_taylor_layers_start_at_the_principal_directions_of_the_teachers_keys_and_queries():
    """taylor_layers gives those blocks Taylor features beside Hedgehog / identity ones; the
    calibration replaces the maps' first-coordinates start with the top principal directions of the
    block's keys and queries (the teacher's k_proj / q_proj) on the calibration text."""
    teacher = build_tiny_llama(300, tie_word_embeddings=False)
    student = build_student(teacher, HarmonicSection(taylor_layers=[0], hedgehog_layers=[1], taylor_dims=4))
    assert student.config.feature_map == ["taylor", "hedgehog"] and student.config.taylor_dims == 4
    mixer = student.model.layers[0].mixer
    assert mixer.normalised and mixer.features == 1 + 4 + 10
    assert torch.equal(mixer.state_write.weight, teacher.model.layers[0].self_attn.k_proj.weight)
    ids = torch.randint(0, 300, (2, 32))
    calibrate_blocks(student, teacher, ids)
    from hallamonic.convert.phases import capture_attention_io

    x = capture_attention_io(teacher, ids)[0][0]  # layer 0's attention input
    keys = mixer.state_write(x).reshape(-1, mixer.num_kv_heads, mixer.state_size)  # (T, Hkv, N)
    for h in range(mixer.num_kv_heads):
        weight = mixer.write_features.weight[h]  # (M, N)
        torch.testing.assert_close(weight @ weight.T, torch.eye(4), atol=1e-5, rtol=0)
        kept = (keys[:, h] @ weight.T).pow(2).sum() / keys[:, h].pow(2).sum()  # share of the keys' energy in the M dims
        first = keys[:, h, :4].pow(2).sum() / keys[:, h].pow(2).sum()  # the start's share: the first 4 coordinates
        assert kept > first
        for head in range(h * mixer.kv_groups, (h + 1) * mixer.kv_groups):  # its query heads read through the same basis
            assert torch.equal(mixer.read_features.weight[head], weight)
    assert torch.isfinite(student(ids).logits).all()


def test_hedgehog_layers_give_those_blocks_hedgehog_and_the_rest_the_recipes_map():
    teacher = build_tiny_llama(300, tie_word_embeddings=False)
    student = build_student(teacher, HarmonicSection(hedgehog_layers=[1]))
    assert student.config.feature_map == ["identity", "hedgehog"]
    first, second = (layer.mixer for layer in student.model.layers)
    assert not first.normalised and not hasattr(first, "write_features")
    assert second.normalised and second.features == 2 * student.config.state_size
    assert torch.equal(second.state_read.weight, teacher.model.layers[1].self_attn.q_proj.weight)


def test_delta_layers_give_those_blocks_the_delta_rule_and_the_rest_the_recipes_rule():
    teacher = build_tiny_llama(300, tie_word_embeddings=False)
    student = build_student(teacher, HarmonicSection(delta_layers=[1]))
    assert student.config.update_rule == ["sum", "delta"]
    first, second = (layer.mixer for layer in student.model.layers)
    assert not first.delta and second.delta
    assert torch.equal(second.state_write.weight, teacher.model.layers[1].self_attn.k_proj.weight)
    assert build_student(teacher, HarmonicSection()).config.update_rule == "sum"  # no list unless asked


def test_recall_layers_get_the_recall_bands_and_the_rest_the_recipes_bands():
    teacher = build_tiny_llama(300, tie_word_embeddings=False)
    three = [[1.0, 16.0], [16.0, 256.0], [256.0, 4096.0]]
    student = build_student(teacher, HarmonicSection(timescale_bands=[[1.0, 64.0], [64.0, 4096.0]], recall_layers=[1],
                                                     recall_timescale_bands=three))
    assert student.config.timescale_bands == [[[1.0, 64.0], [64.0, 4096.0]], three]
    first, second = (layer.mixer for layer in student.model.layers)
    assert (first.num_levels, second.num_levels) == (2, 3)
    assert torch.equal(second.state_read.weight, teacher.model.layers[1].self_attn.q_proj.weight)
    ids = torch.randint(0, 300, (2, 19))
    assert torch.isfinite(student(ids).logits).all()
    plain = build_student(teacher, HarmonicSection(timescale_bands=[[1.0, 64.0], [64.0, 4096.0]]))
    assert plain.config.timescale_bands == [[1.0, 64.0], [64.0, 4096.0]]  # no per-layer list unless asked


def test_delta_rule_blocks_start_from_the_teachers_queries_and_keys_with_half_strength_writes():
    teacher = build_tiny_llama(300, tie_word_embeddings=False)
    student = build_student(teacher, HarmonicSection(update_rule="delta", hedgehog_layers=[1]))
    assert student.config.update_rule == "delta"
    first, second = (layer.mixer for layer in student.model.layers)
    assert first.delta and not second.delta  # the Hedgehog layer keeps the sum
    attention = teacher.model.layers[0].self_attn
    assert torch.equal(first.state_write.weight, attention.k_proj.weight)
    assert torch.equal(first.state_read.weight, attention.q_proj.weight)
    assert not first.write_strength.weight.any() and not first.write_strength.bias.any()  # beta = 1/2, data-independent
    ids = torch.randint(0, 300, (2, 19))
    assert torch.isfinite(student(ids).logits).all()
