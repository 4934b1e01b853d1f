"""Study recipes: bundled files load and are documented; bad keys and values are named."""

from __future__ import annotations

import re

import pytest

from hallamonic.training.recipe import RecipeError
from hallamonic.study.models import build_architectures
from hallamonic.study.recipe import bundled_study_recipes, load_study_recipe

BUNDLED = ["study-ci", "study-enwik8-cpu", "study-enwik8-28m"]


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_study_recipe_loads_every_key_commented_and_sizes_match(name):
    assert name in bundled_study_recipes()
    recipe = load_study_recipe(name)
    assert recipe.name == name
    for line in bundled_study_recipes()[name].read_text().splitlines():
        if re.match(r"^\s*[a-z_0-9]+:\s*\S", line):
            assert "#" in line, f"{name}: undocumented line {line!r}"
    archs = build_architectures(recipe.model, 256, recipe.models, max(recipe.contexts))
    target = archs["harmonic"].params
    for arch in archs.values():
        if arch.name == "harmonic-diagonal":  # the earlier block, same shape without the maps: a named row, smaller
            assert arch.params <= target
            continue
        assert abs(arch.params - target) <= recipe.model.param_tolerance * target, (arch.name, arch.params, target)


def test_the_28m_recipe_is_about_28m_parameters():
    recipe = load_study_recipe("study-enwik8-28m")
    params = build_architectures(recipe.model, 256, ["harmonic"], 1024)["harmonic"].params
    assert 26e6 <= params <= 30e6, params


def test_the_cpu_recipe_has_1_to_3m_parameter_models_and_contexts_256_to_2k():
    recipe = load_study_recipe("study-enwik8-cpu")
    params = build_architectures(recipe.model, 256, ["harmonic"], 2048)["harmonic"].params
    assert 1e6 <= params <= 3e6 and recipe.contexts[0] == 256 and recipe.contexts[-1] == 2048


@pytest.mark.parametrize(
    "override, message",
    [
        ("models=[harmonic, gpt]", "distinct names"),
        ("contexts=[256, 0]", "positive integers"),
        ("train.batch_tokens=1000", "multiple of every context"),
        ("train.tokens=10", "less than one step"),
        ("train.schedule=exponential", "one of"),
        ("model.hidden_size=33", "multiple of `model.num_heads`"),
        ("data.test_fraction=0.99", "sum to less than 1"),
        ("model.param_tolerance=0", "(0, 1)"),
        ("train.lr=0", "train.lr"),
        ("train.tokns=5", "did you mean `train.tokens`"),
        ("model.timescale_bands=wide", "or 'context'"),
        ("model.timescale_bands=[[4, 2]]", "1 <= tau_min <= tau_max"),
        ("model.value_activation=relu", "model.value_activation` must be one of"),
        ("model.short_conv_init=zeros", "model.short_conv_init` must be one of"),
    ],
)
def test_bad_values_are_named(override, message):
    with pytest.raises(RecipeError, match=re.escape(message)):
        load_study_recipe("study-ci", [override])


def test_the_value_path_needs_the_expanded_state():
    with pytest.raises(RecipeError, match="needs the expanded state"):
        load_study_recipe("study-ci", ["model.maps_from_value=true", "model.state_size=1"])


def test_unknown_recipe_name_suggests_the_closest():
    with pytest.raises(RecipeError, match="study-enwik8-cpu"):
        load_study_recipe("study-enwik8-cp")
