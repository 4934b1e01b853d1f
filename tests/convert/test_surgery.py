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
