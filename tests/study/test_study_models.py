"""The study's architectures: parameter matching, ablation flags, seeded initialisation."""

from __future__ import annotations

import pytest
import torch

from hallamonic.study.models import ParameterMismatch, build_architectures, count_parameters
from hallamonic.study.recipe import ARCHITECTURES, StudyModelSection

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
