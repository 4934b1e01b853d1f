"""Conversion recipes: one YAML file per base model, validated against a typed schema.

A recipe is a tree of small dataclasses, built and checked by the schema machinery shared with
the study (:func:`hallamonic.training.recipe.build_schema`: unknown keys with the closest known
one, types, ``--set key=value`` overrides, safe YAML); this module adds the conversion's own
sections and range checks. The optimizer / schedule / checkpoint sections are training's.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hallamonic.training.recipe import (
    RECIPES_DIR,
    CheckpointSection,
    PhaseSection,
    RecipeError,
    TrainSection,
    build_schema,
    bundled_recipes,
    flatten,
    read_yaml,
    resolve_recipe_path,
)


@dataclass
class BaseSection:
    model: str = "HuggingFaceTB/SmolLM2-135M"  # hub id, local folder, or .gguf file
    dtype: str = "float32"  # weights of teacher and student while converting: float32 | bfloat16


@dataclass
class HarmonicSection:
    timescale_bands: list = field(default_factory=lambda: [[1.0, 16.0], [16.0, 256.0], [256.0, 4096.0]])
    recall_layers: list = field(default_factory=list)  # layers whose blocks take recall_timescale_bands instead
    recall_timescale_bands: list | None = None  # their levels' bands (null = timescale_bands): more levels where recall lives
    hierarchy: bool = True
    error_signal: bool = True
    gate_rank: int | None = None
    predictor_rank: int | None = None
    output_gate: bool = False
    output_gate_rank: int | None = None
    short_conv_size: int = 0  # > 0: causal depthwise conv of the value stream (identity at init)
    state_size: int | None = None  # numbers per channel per level: null = the teacher's head_dim (k/q start the maps); 1 = diagonal
    feature_map: str = "identity"  # identity (q.k linear attention) | hedgehog (softmax features) | taylor (Based's 1 + s + s^2/2), both normalised
    hedgehog_layers: list = field(default_factory=list)  # layers whose blocks use hedgehog whatever feature_map says
    taylor_layers: list = field(default_factory=list)  # layers whose blocks use taylor whatever feature_map says (not hedgehog_layers)
    taylor_dims: int = 16  # dims a Taylor map projects each query / key to: 1 + M + M(M+1)/2 features
    delta_layers: list = field(default_factory=list)  # layers whose blocks use the delta rule whatever update_rule says (not Hedgehog ones)
    update_rule: str = "sum"  # sum (decayed linear attention) | delta (gated delta rule: writes overwrite along unit keys; Hedgehog layers keep sum)
    recompute_mixer: bool = False  # recompute each block in backward instead of storing its activations
    init_from_attention: bool = True  # v_proj / o_proj from the teacher's attention
    calibrate_norms: bool = True  # fit level-input norms and the output scale on real text


@dataclass
class DataSection:
    dataset: str = "HuggingFaceFW/fineweb-edu"  # hub dataset or `datasets` builder (json, parquet, text), streamed (ignored when `path` is set)
    config: str | None = "sample-10BT"
    split: str = "train"
    data_files: str | dict | None = None  # files the dataset reads (path / glob, or {split: files}), e.g. with dataset `json`
    path: str | None = None  # local .txt / .jsonl / .parquet; replaces the hub dataset when set
    text_field: str = "text"
    heldout_fraction: float = 0.02  # share of documents never trained on (taken from the end)
    max_documents: int | None = None


@dataclass
class Phase2DataSection(DataSection):
    """A second text source for phase 2 and its refit, used when it names one (``dataset`` or
    ``path``). Why: measured on SmolLM2, attention transfer on FineWeb text and phase 2 on the
    evaluation's own kind of text recalled best (LAMBADA 0.151 / 1,000 vs 0.134 both on FineWeb and
    0.120 both on FineWeb-Edu): evals/results/smollm2-135m-phase2-sweep/lambada-1000. The held-out
    text of the transfer probes and the model card still comes from ``data``."""

    dataset: str | None = None  # unset by default: phase 2 reads `data`
    config: str | None = None


@dataclass
class Phase1Section(PhaseSection):
    normalize: bool = True  # per-layer MSE divided by the teacher output's mean square
    teacher_pool: int = 0  # > 0: train on at most this many sequences, the teacher's attention I/O captured once each
    focus_layers: list = field(default_factory=list)  # layers that get focus_steps more steps alone after phase 1
    focus_steps: int = 0  # > 0: that many extra attention-transfer steps on focus_layers only ("phase1-focus")
    focus_lr: float = 1e-3  # their peak learning rate (warm-up 10% of focus_steps, then phase1.schedule)
    focus_pool: int = 48  # sequences of phase1.seq_len they cycle over, the teacher's I/O captured once each
    focus_inputs: str = "teacher"  # teacher = the teacher's residual stream | converted = the converted model's (blocks elsewhere)
    teacher_dtype: str | None = None  # dtype of the teacher pass that feeds attention transfer (null = base.dtype; native = bfloat16 where the hardware has it)
    compile: bool = False  # torch.compile the blocks that attention transfer trains (phase 1, its focus, the phase-2 refit)


@dataclass
class Phase2Section(PhaseSection):
    lr: float = 3e-4
    kl_weight: float = 0.0  # weight of KL(teacher || student) inside the teacher's window
    ce_weight: float = 1.0  # weight of the next-token cross-entropy (0 with kl_weight > 0: pure distillation)
    lora_rank: int = 0  # > 0: LoRA adapters (peft) on the frozen MLPs, merged at export
    lora_alpha: float = 16.0
    gradient_checkpointing: bool = False
    chunk_size: int = 0  # > 0: forward in chunks of this many tokens (carried states)
    frozen_layers: list = field(default_factory=list)  # layers whose mixers phase 2 leaves as phase 1 made them
    hidden_weight: float = 0.0  # weight of the per-token normalised MSE to the teacher's residual stream after every layer
    teacher_dtype: str | None = None  # dtype of the teacher pass behind kl_weight / hidden_weight (null = base.dtype; native as phase1)
    refit_layers: list = field(default_factory=list)  # layers whose blocks get refit_steps of attention transfer after phase 2
    refit_steps: int = 0  # > 0: that many steps on refit_layers, on the converted model's own inputs ("phase2-refit")
    refit_lr: float = 1e-3  # their peak learning rate (warm-up 10% of refit_steps, then phase1.schedule)
    refit_pool: int = 192  # sequences of phase1.seq_len they cycle over, each one's I/O captured once
    compile: bool = False  # torch.compile the blocks phase 2 trains, in place for the phase (the first layer's stays eager)

    @property
    def distils(self) -> bool:
        """Whether phase 2 runs the teacher (KL or hidden-state terms), in ``teacher_dtype``."""
        return self.kl_weight > 0 or self.hidden_weight > 0


COPY_CACHE_FIT_TEXTS = ("phase2", "unseen")


@dataclass
class CopyCacheSection:
    """The copy cache (exact n-gram recall over token ids, ``hallamonic_copy_cache.py``), attached
    after phase 2 with its gate fitted on text no phase trained on. Why: the blocks do not copy;
    measured on SmolLM2 (evals/results/smollm2-135m-induction-cache) it brings passkey and
    verbatim copying back and lowers held-out bits; it cannot recall what is asked in other words."""

    orders: list = field(default_factory=list)  # n-gram orders ([] = no cache)
    buckets: int = 65536  # hash-table entries per order (state: 2 x orders x buckets int64 per sequence)
    seen: bool = False  # the context-word cue: every token already in the context raised by a gate on log p and its count (ignored without orders)
    continuation: bool = False  # each order's gate also reads whether the copied token continues a word (ignored without orders)
    prior: bool = False  # the context-word cue also reads each token's log unigram frequency in the run's training streams (needs seen)
    rate: bool = False  # the context-word cue also reads q log t, t the tokens so far: counts read as rates (needs seen)
    count_cap: int = 0  # the context-word cue reads log min(count, count_cap) (0 = no cap; needs seen)
    fit_text: str = "unseen"  # what the gate is fitted on: "unseen" (`data` past what phase 1 read) or "phase2" (phase-2 training text)
    fit_windows: int = 48  # windows of that text the gate is fitted on
    fit_length: int = 1024  # tokens per window
    fit_steps: int = 400  # Adam steps of the fit (4 numbers per order; seconds once the windows are scored)
    fit_lr: float = 0.05  # its learning rate


@dataclass
class EvalSection:
    context_lengths: list = field(default_factory=lambda: [1024])  # held-out bits/token for the card
    max_windows: int = 4  # windows per length (0 = skip the evaluation)


@dataclass
class Recipe:
    name: str = "custom"
    description: str = ""
    seed: int = 0
    base: BaseSection = field(default_factory=BaseSection)
    harmonic: HarmonicSection = field(default_factory=HarmonicSection)
    data: DataSection = field(default_factory=DataSection)
    phase2_data: Phase2DataSection = field(default_factory=Phase2DataSection)
    phase1: Phase1Section = field(default_factory=Phase1Section)
    phase2: Phase2Section = field(default_factory=Phase2Section)
    train: TrainSection = field(default_factory=TrainSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    copy_cache: CopyCacheSection = field(default_factory=CopyCacheSection)
    eval: EvalSection = field(default_factory=EvalSection)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def phase2_source(self) -> DataSection:
        """The text phase 2 and its refit train on: ``phase2_data`` when it names a source, else ``data``."""
        return self.phase2_data if self.phase2_data.dataset or self.phase2_data.path else self.data


CHOICES = {
    "base.dtype": {"float32", "bfloat16"},
    "harmonic.feature_map": {"identity", "hedgehog", "taylor"},
    "harmonic.update_rule": {"sum", "delta"},
    "phase1.schedule": {"cosine", "linear", "constant"},
    "phase1.focus_inputs": {"teacher", "converted"},
    "phase2.schedule": {"cosine", "linear", "constant"},
    "train.mixed_precision": {"auto", "native", "no", "bf16", "fp16"},
    "train.on_nan": {"stop", "skip"},
}
POSITIVE = {"phase1.seq_len", "phase1.batch_size", "phase2.seq_len", "phase2.batch_size", "train.grad_accum"}
NON_NEGATIVE = {
    "phase1.focus_steps", "phase2.refit_steps",
    "phase1.steps", "phase2.steps", "phase1.warmup_steps", "phase2.warmup_steps", "checkpoint.every",
    "phase2.kl_weight", "phase2.ce_weight", "phase2.hidden_weight", "phase2.lora_rank", "phase1.teacher_pool", "phase2.chunk_size", "train.weight_decay", "eval.max_windows",
    "harmonic.short_conv_size",
}


def _layer_indices(layers: list) -> bool:
    return all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers)


def _validate_extra_transfer(flat: dict[str, Any], prefix: str) -> None:
    """``PREFIX_steps`` > 0 (phase1.focus_*, phase2.refit_*) needs layers, a pool and a learning rate."""
    if flat[f"{prefix}_steps"] <= 0:
        return
    layers = flat[f"{prefix}_layers"]
    if not layers or not _layer_indices(layers):
        raise RecipeError(f"recipe key `{prefix}_layers` must list layer indices >= 0 when `{prefix}_steps` > 0, got {layers!r}")
    if flat[f"{prefix}_pool"] <= 0 or not flat[f"{prefix}_lr"] > 0:
        raise RecipeError(f"recipe keys `{prefix}_pool` and `{prefix}_lr` must be > 0 when `{prefix}_steps` > 0")


def _validate(recipe: Recipe) -> None:
    flat = flatten(recipe.to_dict())
    for key, allowed in CHOICES.items():
        if flat[key] not in allowed:
            raise RecipeError(f"recipe key `{key}` must be one of {sorted(allowed)}, got {flat[key]!r}")
    for key in POSITIVE:
        if flat[key] <= 0:
            raise RecipeError(f"recipe key `{key}` must be > 0, got {flat[key]!r}")
    for key in NON_NEGATIVE:
        if flat[key] < 0:
            raise RecipeError(f"recipe key `{key}` must be >= 0, got {flat[key]!r}")
    for extra in ("phase1.focus", "phase2.refit"):  # the extra attention-transfer runs on chosen layers
        _validate_extra_transfer(flat, extra)
    if recipe.phase2.refit_steps > 0 and recipe.phase2.lora_rank > 0:  # its inputs come from the teacher's MLPs
        raise RecipeError("recipe key `phase2.refit_steps` > 0 needs `phase2.lora_rank: 0`: the refit runs the blocks among the teacher's own MLPs")
    for key in ("phase1.teacher_dtype", "phase2.teacher_dtype"):
        if flat[key] not in (None, "float32", "bfloat16", "native"):
            raise RecipeError(f"recipe key `{key}` must be null, 'float32', 'bfloat16' or 'native', got {flat[key]!r}")
    for key in ("phase2.frozen_layers", "harmonic.hedgehog_layers", "harmonic.taylor_layers", "harmonic.delta_layers", "harmonic.recall_layers"):
        if not _layer_indices(flat[key]):
            raise RecipeError(f"recipe key `{key}` must list layer indices >= 0, got {flat[key]!r}")
    for key in ("phase1.lr", "phase2.lr"):
        if not flat[key] > 0:
            raise RecipeError(f"recipe key `{key}` must be > 0, got {flat[key]!r}")
    p2 = recipe.phase2
    if p2.steps > 0 and p2.ce_weight == 0 and p2.kl_weight == 0 and p2.hidden_weight == 0:
        raise RecipeError("phase 2 has nothing to learn from: set `phase2.ce_weight`, `phase2.kl_weight` or `phase2.hidden_weight` above 0 (or phase2.steps=0)")
    for key in ("data.heldout_fraction", "phase2_data.heldout_fraction"):
        if not 0.0 <= flat[key] < 1.0:
            raise RecipeError(f"recipe key `{key}` must be in [0, 1), got {flat[key]!r}")
    state_size = recipe.harmonic.state_size
    if state_size is not None and state_size <= 0:
        raise RecipeError(f"recipe key `harmonic.state_size` must be > 0 or null (= the teacher's head_dim), got {state_size!r}")
    needs_expanded_state = (  # (what the recipe asks for, whether it does)
        (f"harmonic.feature_map: {recipe.harmonic.feature_map}", recipe.harmonic.feature_map != "identity"),
        (f"harmonic.update_rule: {recipe.harmonic.update_rule}", recipe.harmonic.update_rule != "sum"),
        ("harmonic.delta_layers", bool(recipe.harmonic.delta_layers)),
        ("harmonic.hedgehog_layers", bool(recipe.harmonic.hedgehog_layers)),
        ("harmonic.taylor_layers", bool(recipe.harmonic.taylor_layers)),
    )
    overlap = sorted(set(recipe.harmonic.hedgehog_layers) & set(recipe.harmonic.taylor_layers))
    if overlap:
        raise RecipeError(f"recipe keys `harmonic.hedgehog_layers` and `harmonic.taylor_layers` both list layer(s) {overlap}: a block has one feature map")
    if not isinstance(recipe.harmonic.taylor_dims, int) or recipe.harmonic.taylor_dims <= 0:
        raise RecipeError(f"recipe key `harmonic.taylor_dims` must be an integer > 0, got {recipe.harmonic.taylor_dims!r}")
    for what, asked in needs_expanded_state:
        if asked and state_size == 1:
            raise RecipeError(f"recipe key `{what}` needs the expanded state (`harmonic.state_size` null or > 1)")
    for key, optional in (("harmonic.timescale_bands", False), ("harmonic.recall_timescale_bands", True)):
        bands = flat[key]
        if optional and bands is None:
            continue
        if not bands or not all(isinstance(b, list) and len(b) == 2 and 1 <= b[0] <= b[1] for b in bands):
            raise RecipeError(f"recipe key `{key}` must be a list of [tau_min, tau_max] with 1 <= tau_min <= tau_max, got {bands!r}")
    if recipe.harmonic.recall_layers and recipe.harmonic.recall_timescale_bands is None:
        raise RecipeError("recipe key `harmonic.recall_layers` needs `harmonic.recall_timescale_bands`: the bands those layers take")
    cache = recipe.copy_cache
    if not isinstance(cache.orders, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in cache.orders) \
            or len(set(cache.orders)) != len(cache.orders):
        raise RecipeError(f"recipe key `copy_cache.orders` must list distinct positive n-gram orders, got {cache.orders!r}")
    if cache.orders:
        for key in ("buckets", "fit_windows", "fit_length", "fit_steps"):
            value = getattr(cache, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise RecipeError(f"recipe key `copy_cache.{key}` must be an integer > 0 when `copy_cache.orders` is set, got {value!r}")
        if not cache.fit_lr > 0:
            raise RecipeError(f"recipe key `copy_cache.fit_lr` must be > 0, got {cache.fit_lr!r}")
    for key in ("seen", "continuation", "prior", "rate"):
        if not isinstance(getattr(cache, key), bool):
            raise RecipeError(f"recipe key `copy_cache.{key}` must be true or false, got {getattr(cache, key)!r}")
    cap = cache.count_cap
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 0:
        raise RecipeError(f"recipe key `copy_cache.count_cap` must be an integer >= 0 (0 = no cap), got {cap!r}")
    for key in ("prior", "rate", "count_cap"):
        if getattr(cache, key) and cache.orders and not cache.seen:
            raise RecipeError(f"recipe key `copy_cache.{key}` is a term of the context-word cue: set `copy_cache.seen: true` with it")
    if cache.fit_text not in COPY_CACHE_FIT_TEXTS:
        raise RecipeError(f"recipe key `copy_cache.fit_text` must be one of {', '.join(COPY_CACHE_FIT_TEXTS)}, got {cache.fit_text!r}")
    lengths = recipe.eval.context_lengths
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in lengths):
        raise RecipeError(f"recipe key `eval.context_lengths` must be positive integers, got {lengths!r}")


def build_recipe(tree: dict[str, Any] | None, overrides: typing.Sequence[str] = ()) -> Recipe:
    """A validated Recipe from a parsed YAML tree plus ``key=value`` overrides."""
    recipe = build_schema(Recipe, tree, overrides)
    _validate(recipe)
    return recipe


def bundled_conversion_recipes() -> dict[str, Path]:
    """Bundled conversion recipe name -> file (``recipes/NAME.yaml``; study recipes are in ``recipes/study``)."""
    return bundled_recipes(RECIPES_DIR)


def load_recipe(name_or_path: str, overrides: typing.Sequence[str] = ()) -> Recipe:
    """Load a bundled recipe by name or a YAML file by path, then apply overrides."""
    path = resolve_recipe_path(name_or_path, RECIPES_DIR)
    recipe = build_recipe(read_yaml(path), overrides)
    if recipe.name == "custom":
        recipe.name = path.stem
    return recipe


def recipe_to_yaml(recipe: Recipe) -> str:
    return yaml.safe_dump(recipe.to_dict(), sort_keys=False)
