"""The study's architectures: parameter matching, ablation flags, seeded initialisation."""

from __future__ import annotations

import pytest
import torch

from hallamonic.study.models import ParameterMismatch, build_architectures, count_parameters
from hallamonic.study.recipe import ARCHITECTURES, StudyModelSection, context_bands

SHAPE = StudyModelSection(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=96)


def test_baselines_are_fitted_within_tolerance_and_counts_are_real():
    archs = build_architectures(SHAPE, 256, list(ARCHITECTURES), 256)
    target = archs["harmonic"].params
    for arch in archs.values():
        built = arch.build(0)
        assert sum(p.numel() for p in built.parameters()) == arch.params == count_parameters(arch.config)
        assert abs(arch.params - target) <= 0.05 * target
    assert archs["transformer"].config.model_type == "llama" and archs["mamba"].config.model_type == "mamba"
    assert archs["transformer"].config.hidden_size == SHAPE.hidden_size
    assert archs["mamba"].config.num_hidden_layers == 2 * SHAPE.num_layers
    assert archs["harmonic-no-hierarchy"].config.hierarchy is False
    assert archs["harmonic-raw-states"].config.error_signal is False
    assert archs["harmonic-output-gate"].config.output_gate is True
    assert archs["harmonic-output-gate"].params > archs["harmonic"].params  # an option with its own parameters
    assert archs["harmonic-short-conv"].config.short_conv_size == SHAPE.short_conv_size > 0
    assert archs["harmonic"].config.hierarchy and archs["harmonic"].config.error_signal
    assert archs["harmonic"].config.short_conv_size == 0
    assert not archs["harmonic"].config.output_gate


def test_a_tolerance_no_size_can_meet_is_refused():
    shape = StudyModelSection(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=96, param_tolerance=1e-7)
    with pytest.raises(ParameterMismatch, match="tolerance"):
        build_architectures(shape, 256, ["harmonic", "mamba"], 256)


def test_same_seed_same_weights_and_every_model_runs():
    archs = build_architectures(SHAPE, 256, list(ARCHITECTURES), 256)
    x = torch.randint(0, 256, (2, 40))
    for arch in archs.values():
        a, b = arch.build(3), arch.build(3)
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
        assert a(input_ids=x, use_cache=False).logits.shape == (2, 40, 256)


def test_the_recipes_initializer_range_scales_every_models_fresh_weights():
    defaults = build_architectures(SHAPE, 256, ["harmonic", "transformer", "mamba"], 256)
    assert defaults["harmonic"].config.initializer_range == 0.02  # null leaves each config's own default
    assert defaults["mamba"].config.initializer_range == 0.1
    wide = StudyModelSection(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=96, initializer_range=0.1)
    archs = build_architectures(wide, 256, ["harmonic", "transformer", "mamba"], 256)
    for name in ("harmonic", "transformer"):
        assert archs[name].config.initializer_range == 0.1
        assert archs[name].params == defaults[name].params  # a scale, not a shape
        narrow, broad = defaults[name].build(0), archs[name].build(0)
        embedding_std = lambda m: m.get_input_embeddings().weight.std().item()  # noqa: E731
        assert embedding_std(broad) == pytest.approx(0.1, rel=0.1)
        assert embedding_std(narrow) == pytest.approx(0.02, rel=0.1)


def test_context_bands_split_each_training_context_geometrically_and_short_conv_reaches_every_harmonic():
    shape = StudyModelSection(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=96,
                              timescale_bands="context", short_conv=True)
    names = ["harmonic", "harmonic-no-hierarchy", "harmonic-diagonal", "transformer"]
    at_256 = build_architectures(shape, 256, names, 1024, context=256)
    at_1024 = build_architectures(shape, 256, names, 1024)  # the context defaults to the longest
    flat = lambda bands: [tau for band in bands for tau in band]  # noqa: E731
    third, two_thirds = 256 ** (1 / 3), 256 ** (2 / 3)
    assert flat(at_256["harmonic"].config.timescale_bands) == pytest.approx([1, third, third, two_thirds, two_thirds, 256])
    assert context_bands(256)[1] == pytest.approx([6.35, 40.32], abs=0.01)  # the bands measured best at 256
    for name in names[:3]:
        assert flat(at_1024[name].config.timescale_bands) == pytest.approx(flat(context_bands(1024)))
        assert at_256[name].params == at_1024[name].params  # bands move the gates' biases only
        assert at_256[name].config.short_conv_size == shape.short_conv_size > 0
    assert at_256["transformer"].params == at_1024["transformer"].params
    fixed = build_architectures(SHAPE, 256, ["harmonic"], 1024, context=256)["harmonic"]
    assert fixed.config.timescale_bands == SHAPE.timescale_bands and fixed.config.short_conv_size == 0


def test_mambas_value_path_reaches_every_harmonic_but_not_the_diagonal_maps():
    shape = StudyModelSection(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=96, state_size=8, short_conv=True,
                              short_conv_init="random", value_activation="silu", maps_from_value=True, value_skip=True)
    archs = build_architectures(shape, 256, ["harmonic", "harmonic-no-hierarchy", "harmonic-diagonal", "mamba"], 256)
    for name in ("harmonic", "harmonic-no-hierarchy"):
        config = archs[name].config
        assert (config.short_conv_init, config.value_activation, config.maps_from_value, config.value_skip) == ("random", "silu", True, True)
    diagonal = archs["harmonic-diagonal"].config
    assert diagonal.state_size == 1 and not diagonal.maps_from_value and diagonal.value_skip  # no maps to move
    plain = build_architectures(SHAPE, 256, ["harmonic"], 256)["harmonic"].config
    assert (plain.short_conv_init, plain.value_activation, plain.maps_from_value, plain.value_skip) == ("identity", "identity", False, False)


def test_one_level_spans_every_band_and_spends_the_saved_parameters_on_the_mlp():
    shape = StudyModelSection(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=96, state_size=8,
                              timescale_bands="context", param_tolerance=0.02)
    archs = build_architectures(shape, 256, ["harmonic", "harmonic-one-level"], 512)
    one, full = archs["harmonic-one-level"], archs["harmonic"]
    assert one.config.timescale_bands == [[1.0, 512.0]] and len(full.config.timescale_bands) == 3
    assert one.config.intermediate_size > full.config.intermediate_size
    assert abs(one.params - full.params) <= 0.02 * full.params and one.params == count_parameters(one.config)


def test_two_level_splits_the_span_geometrically_with_the_mlp_fitted():
    shape = StudyModelSection(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=96, state_size=8,
                              timescale_bands="context", param_tolerance=0.02)
    names = ["harmonic", "harmonic-two-level", "harmonic-two-level-no-hierarchy", "harmonic-two-level-raw-states"]
    archs = build_architectures(shape, 256, names, 256)
    two, full, shared, raw = (archs[name] for name in ("harmonic-two-level", "harmonic", names[2], names[3]))
    assert two.config.error_signal and not raw.config.error_signal and raw.params == two.params
    assert two.config.timescale_bands == [[1.0, 16.0], [16.0, 256.0]]  # edges 1, sqrt(256), 256
    assert two.config.hierarchy and not shared.config.hierarchy  # the ablation: both levels on [1, 256]
    assert shared.config.timescale_bands == two.config.timescale_bands and shared.params == two.params
    assert full.config.intermediate_size < two.config.intermediate_size
    assert abs(two.params - full.params) <= 0.02 * full.params and two.params == count_parameters(two.config)


def test_mamba_llama_layout_puts_mambas_own_mixer_in_every_attention_slot():
    """The mixer-only comparison: Llama's layers and MLP (fitted), Mamba's mixer and init, no attention, causal."""
    archs = build_architectures(SHAPE, 256, ["harmonic", "transformer", "mamba-llama-layout"], 256)
    arch = archs["mamba-llama-layout"]
    assert arch.config.intermediate_size != archs["transformer"].config.intermediate_size  # fitted on its own
    model = arch.build(0)
    assert len(model.model.layers) == SHAPE.num_layers
    for layer in model.model.layers:
        mixer = layer.self_attn.mixer
        assert type(mixer).__name__ == "MambaMixer" and not hasattr(layer.self_attn, "q_proj")
        assert mixer.intermediate_size == SHAPE.mamba_expand * SHAPE.hidden_size
        assert torch.allclose(mixer.A_log.exp()[0], torch.arange(1.0, SHAPE.mamba_state_size + 1))  # S4D-real A
        assert torch.equal(mixer.D, torch.ones_like(mixer.D))
    x = torch.randint(0, 256, (1, 24))
    changed = x.clone()
    changed[:, 16:] = (changed[:, 16:] + 1) % 256
    before, after = (model(input_ids=ids, use_cache=False).logits for ids in (x, changed))
    assert torch.equal(before[:, :16], after[:, :16])  # nothing reads the future
    assert not torch.equal(before[:, 16:], after[:, 16:])
