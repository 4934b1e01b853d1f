"""Recipes: bundled files load, every key is documented, bad keys and values are named."""

from __future__ import annotations

import re

import pytest
import yaml

from hallamonic.convert.recipe import bundled_conversion_recipes, load_recipe
from hallamonic.training.recipe import RecipeError

REQUIRED_KEYS = ("base.model", "data.path", "phase1.steps", "phase2.steps", "checkpoint.every", "seed")


@pytest.mark.parametrize("name", ["tiny", "smollm2-135m", "tinyllama-1.1b"])
def test_bundled_recipe_loads_and_has_the_documented_keys(name):
    assert name in bundled_conversion_recipes()
    recipe = load_recipe(name)
    flat = yaml.safe_load(bundled_conversion_recipes()[name].read_text())
    for key in REQUIRED_KEYS:
        node = flat
        for part in key.split("."):
            assert part in node, f"{name}: missing {key}"
            node = node[part]
    assert recipe.name == name


@pytest.mark.parametrize("name", ["tiny", "smollm2-135m", "tinyllama-1.1b"])
def test_every_recipe_key_is_commented(name):
    for line in bundled_conversion_recipes()[name].read_text().splitlines():
        if re.match(r"^\s*[a-z_0-9]+:\s*\S", line) and not line.strip().startswith("#"):
            assert "#" in line, f"{name}: undocumented line {line!r}"


def test_set_overrides_values_with_yaml_types():
    recipe = load_recipe("tiny", ["phase1.steps=3", "data.path=corpus.jsonl", "harmonic.output_gate=true", "phase1.lr=0.01"])
    assert recipe.phase1.steps == 3 and recipe.data.path == "corpus.jsonl"
    assert recipe.harmonic.output_gate is True and recipe.phase1.lr == 0.01


def test_exponent_without_a_dot_is_a_number():
    """YAML 1.1 reads `2e-4` as a string; for a number field it means the number."""
    recipe = load_recipe("tiny", ["phase2.lr=2e-4", "phase1.lr=1E3"])
    assert recipe.phase2.lr == 2e-4 and recipe.phase1.lr == 1000.0
    with pytest.raises(RecipeError, match=r"`phase2.lr` must be a number, got 'fast'"):
        load_recipe("tiny", ["phase2.lr=fast"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("phase1.stesp=3", r"unknown recipe key `phase1.stesp` \(did you mean `phase1.steps`\?\)"),
        ("phase1.recompute=true", r"recipe key `phase1.recompute` was removed: phase 1 now takes each block's gradients"),
        ("phase1.steps=three", r"`phase1.steps` must be an integer"),
        ("phase1.steps=-1", r"`phase1.steps` must be >= 0"),
        ("phase2.seq_len=0", r"`phase2.seq_len` must be > 0"),
        ("phase2.ce_weight=-1", r"`phase2.ce_weight` must be >= 0"),
        ("train.on_nan=ignore", r"`train.on_nan` must be one of"),
        ("harmonic.hierarchy=maybe", r"`harmonic.hierarchy` must be true or false"),
        ("copy_cache.orders=[1, 1]", r"`copy_cache.orders` must list distinct positive n-gram orders"),
        ("copy_cache.buckets=0", r"`copy_cache.buckets` must be an integer > 0"),
        ("copy_cache.seen=maybe", r"`copy_cache.seen` must be true or false"),
        ("copy_cache.seen=false", r"`copy_cache.prior` is a term of the context-word cue"),  # the tiny recipe has prior: true
        ("copy_cache.rate=sometimes", r"`copy_cache.rate` must be true or false"),
        ("copy_cache.count_cap=-2", r"`copy_cache.count_cap` must be an integer >= 0"),
        ("copy_cache.count_cap=1.5", r"`copy_cache.count_cap` must be an integer"),
        ("copy_cache.fit_text=held-out", r"`copy_cache.fit_text` must be one of phase2, unseen"),
        ("harmonic.feature_map=softmax", r"`harmonic.feature_map` must be one of \['hedgehog', 'identity', 'taylor'\]"),
        ("harmonic.taylor_layers=[-1]", r"`harmonic.taylor_layers` must list layer indices >= 0"),
        ("harmonic.taylor_dims=0", r"`harmonic.taylor_dims` must be an integer > 0"),
        ("eval.context_lengths=[1024, -5]", r"`eval.context_lengths` must be positive integers"),
        ("phase1.steps", r"--set expects key=value"),
        ("phase2.frozen_layers=[-1]", r"`phase2.frozen_layers` must list layer indices >= 0"),
        ("phase2.frozen_layers=3", r"`phase2.frozen_layers` must be a list"),
        ("phase1.teacher_dtype=float16", r"`phase1.teacher_dtype` must be null, 'float32', 'bfloat16' or 'native'"),
        ("phase2.teacher_dtype=half", r"`phase2.teacher_dtype` must be null, 'float32', 'bfloat16' or 'native'"),
        ("train.mixed_precision=bfloat16", r"`train.mixed_precision` must be one of \['auto', 'bf16', 'fp16', 'native', 'no'\]"),
        ("phase2.hidden_weight=-0.5", r"`phase2.hidden_weight` must be >= 0"),
        ("harmonic.hedgehog_layers=[-2]", r"`harmonic.hedgehog_layers` must list layer indices >= 0"),
        ("harmonic.delta_layers=[-1]", r"`harmonic.delta_layers` must list layer indices >= 0"),
        ("harmonic.recall_layers=[-1]", r"`harmonic.recall_layers` must list layer indices >= 0"),
        ("harmonic.recall_layers=[1]", r"`harmonic.recall_layers` needs `harmonic.recall_timescale_bands`"),
        ("harmonic.recall_timescale_bands=[[8, 2]]", r"`harmonic.recall_timescale_bands` must be a list of \[tau_min, tau_max\]"),
        ("harmonic.update_rule=replace", r"`harmonic.update_rule` must be one of \['delta', 'sum'\]"),
        ("phase2_data.heldout_fraction=1.0", r"`phase2_data.heldout_fraction` must be in \[0, 1\)"),
        ("phase2_data.pth=edu.txt", r"unknown recipe key `phase2_data.pth` \(did you mean `phase2_data.path`\?\)"),
    ],
)
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe("tiny", [override])


def test_phase2_reads_data_unless_phase2_data_names_a_source():
    recipe = load_recipe("tiny", ["data.path=web.jsonl"])
    assert recipe.phase2_source() is recipe.data
    local = load_recipe("tiny", ["data.path=web.jsonl", "phase2_data.path=edu.txt"])
    assert local.phase2_source() is local.phase2_data and local.phase2_source().path == "edu.txt"
    hub = load_recipe("tiny", ["phase2_data.dataset=HuggingFaceFW/fineweb-edu", "phase2_data.config=sample-10BT"])
    assert hub.phase2_source().dataset == "HuggingFaceFW/fineweb-edu" and hub.data.dataset == "builtin:stdlib-docs"


def test_a_layer_has_one_feature_map():
    with pytest.raises(RecipeError, match=r"`harmonic.hedgehog_layers` and `harmonic.taylor_layers` both list layer\(s\) \[1\]"):
        load_recipe("tiny", ["harmonic.taylor_layers=[0, 1]", "harmonic.hedgehog_layers=[1]"])
    with pytest.raises(RecipeError, match=r"`harmonic.taylor_layers` needs the expanded state"):
        load_recipe("tiny", ["harmonic.taylor_layers=[1]", "harmonic.state_size=1"])


def test_hedgehog_needs_the_expanded_state():
    with pytest.raises(RecipeError, match=r"`harmonic.feature_map: hedgehog` needs the expanded state"):
        load_recipe("tiny", ["harmonic.feature_map=hedgehog", "harmonic.state_size=1"])
    with pytest.raises(RecipeError, match=r"`harmonic.hedgehog_layers` needs the expanded state"):
        load_recipe("tiny", ["harmonic.hedgehog_layers=[1]", "harmonic.state_size=1"])
    with pytest.raises(RecipeError, match=r"`harmonic.update_rule: delta` needs the expanded state"):
        load_recipe("tiny", ["harmonic.update_rule=delta", "harmonic.state_size=1"])
    with pytest.raises(RecipeError, match=r"`harmonic.delta_layers` needs the expanded state"):
        load_recipe("tiny", ["harmonic.delta_layers=[0]", "harmonic.state_size=1"])


def test_refit_needs_layers_and_no_lora():
    with pytest.raises(RecipeError, match=r"`phase2.refit_layers` must list layer indices"):
        load_recipe("tiny", ["phase2.refit_steps=10"])
    with pytest.raises(RecipeError, match=r"`phase2.refit_pool` and `phase2.refit_lr` must be > 0"):
        load_recipe("tiny", ["phase2.refit_steps=10", "phase2.refit_layers=[1]", "phase2.refit_pool=0"])
    with pytest.raises(RecipeError, match=r"needs `phase2.lora_rank: 0`"):
        load_recipe("tiny", ["phase2.refit_steps=10", "phase2.refit_layers=[1]", "phase2.lora_rank=4"])
    assert load_recipe("tiny", ["phase2.refit_steps=10", "phase2.refit_layers=[1]"]).phase2.refit_layers == [1]


def test_focus_needs_layers():
    with pytest.raises(RecipeError, match=r"`phase1.focus_layers` must list layer indices"):
        load_recipe("tiny", ["phase1.focus_steps=10"])
    with pytest.raises(RecipeError, match=r"`phase1.focus_steps` must be >= 0"):
        load_recipe("tiny", ["phase1.focus_steps=-1"])
    assert load_recipe("tiny", ["phase1.focus_steps=10", "phase1.focus_layers=[0, 1]"]).phase1.focus_layers == [0, 1]


def test_phase2_needs_a_loss_term():
    with pytest.raises(RecipeError, match="phase 2 has nothing to learn from"):
        load_recipe("tiny", ["phase2.ce_weight=0", "phase2.kl_weight=0"])
    assert load_recipe("tiny", ["phase2.ce_weight=0", "phase2.kl_weight=0", "phase2.steps=0"]).phase2.steps == 0
    assert load_recipe("tiny", ["phase2.ce_weight=0", "phase2.kl_weight=0", "phase2.hidden_weight=1"]).phase2.hidden_weight == 1


def test_unknown_key_in_a_file_is_rejected(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("seed: 1\nphase1:\n  stpes: 4\n")
    with pytest.raises(RecipeError, match=r"unknown recipe key `phase1.stpes` \(did you mean `phase1.steps`\?\)"):
        load_recipe(str(path))


def test_unknown_recipe_name_suggests_the_closest():
    with pytest.raises(RecipeError, match="did you mean `tiny`"):
        load_recipe("tiyn")


def test_yaml_is_loaded_safely(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("seed: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe(str(path))
