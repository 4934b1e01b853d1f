"""Study recipes: one YAML file per study, validated against a typed schema.

The schema machinery (unknown keys with suggestions, types, ``--set`` overrides, safe YAML) is
training's (:func:`hallamonic.training.recipe.build_schema`), shared with the conversion recipes;
this module adds the study's sections and range checks. Bundled study recipes live in ``recipes/study/``.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path

from hallamonic.training.recipe import RECIPES_DIR, RecipeError, build_schema, bundled_recipes, read_yaml, resolve_recipe_path

STUDY_RECIPES_DIR = RECIPES_DIR / "study"
# The summary's three architectures, its two ablations, and two options beyond the seed design.
ARCHITECTURES = (
    "harmonic", "transformer", "mamba", "harmonic-no-hierarchy", "harmonic-raw-states",
    "harmonic-output-gate", "harmonic-short-conv", "harmonic-diagonal", "harmonic-one-level",
    "harmonic-two-level", "harmonic-two-level-no-hierarchy", "harmonic-two-level-raw-states", "mamba-llama-layout",
)
# `model.timescale_bands: context`: at every training context C, three levels with edges at C^(1/3)
# and C^(2/3). Why: at 256, [[1, 6], [6, 40], [40, 256]] beat the fixed [[1, 16], [16, 256],
# [256, 4096]] (valid 2.960 vs 2.976; evals/results/study-enwik8-cpu-init, "Small gains together"),
# and a band past the context trains nothing the test windows can use.
CONTEXT_BANDS = "context"


def split_span(lo: float, hi: float, levels: int) -> list[list[float]]:
    """[lo, hi] cut into ``levels`` timescale bands with geometric edges."""
    edges = [lo * (hi / lo) ** (level / levels) for level in range(levels + 1)]
    return [[edges[level], edges[level + 1]] for level in range(levels)]


def context_bands(context: int, levels: int = 3) -> list[list[float]]:
    """Timescale bands splitting [1, context] geometrically into ``levels`` bands."""
    return split_span(1.0, float(context), levels)


@dataclass
class StudyDataSection:
    path: str | None = None  # local text file (e.g. enwik8); split by position into train / valid / test
    dataset: str | None = None  # hub dataset or `datasets` builder (json, text, ...) used when `path` is empty (its train/validation/test splits)
    config: str | None = None  # hub dataset config
    data_files: str | dict | None = None  # files the dataset reads, e.g. {train: a.jsonl, validation: b.jsonl, test: c.jsonl}
    text_field: str = "text"  # field of the hub records holding the text
    tokenizer: str = "bytes"  # bytes (vocab 256, bits per byte) or a tokenizer folder / hub id
    max_bytes: int | None = None  # read only the first N bytes of `path`
    valid_fraction: float = 0.05  # share of the file (by position, before the test part) for validation
    test_fraction: float = 0.05  # share of the file (by position, at its end) for test


@dataclass
class StudyModelSection:
    hidden_size: int = 128  # width of the Harmonic model (the transformer uses it too)
    num_layers: int = 4  # Harmonic / transformer layers
    num_heads: int = 4  # heads (state channels = hidden_size for Harmonic; attention heads for the transformer)
    intermediate_size: int = 352  # MLP width of the Harmonic model; the transformer's is fitted to match parameters
    timescale_bands: list | str = field(default_factory=lambda: [[1.0, 16.0], [16.0, 256.0], [256.0, 4096.0]])  # or "context": three bands splitting [1, context] geometrically
    gate_rank: int | None = None  # low-rank size of the Harmonic decay gates (null = hidden // 8)
    predictor_rank: int | None = None  # low-rank size of the inter-level predictors (null = hidden // 8)
    state_size: int = 1  # numbers per channel per level of the Harmonic state (1 = the diagonal block; > 1 selective)
    recompute_mixer: bool = False  # Harmonic: recompute each block in backward (training memory of its input only)
    short_conv_size: int = 4  # taps of the causal stream conv of `harmonic-short-conv` (and of every Harmonic model with short_conv)
    short_conv: bool = False  # every Harmonic model filters its v / k / q streams with that conv (harmonic-short-conv always does)
    short_conv_init: str = "identity"  # Harmonic's short conv at the start: identity (the current input only) | random (as nn.Conv1d)
    value_activation: str = "identity"  # Harmonic: identity | silu on the filtered value stream u (as Mamba after its conv)
    maps_from_value: bool = False  # Harmonic: write / read vectors are maps of u instead of x (as Mamba's B / C)
    value_skip: bool = False  # Harmonic: add D * u to the mixer output (Mamba's D)
    mamba_layers: int | None = None  # Mamba blocks (null = 2 x num_layers: a Mamba block has no MLP)
    mamba_state_size: int = 16  # Mamba's SSM state per channel (N); also mamba-llama-layout's mixers
    mamba_expand: int = 2  # Mamba's inner width factor; its hidden size is fitted to match parameters; mamba-llama-layout's mixers expand alike
    param_tolerance: float = 0.05  # baselines must be within this fraction of the Harmonic parameter count
    initializer_range: float | None = None  # std of every freshly drawn weight of all three models (null = each config's default: 0.02 Harmonic / Llama, 0.1 Mamba)


@dataclass
class StudyTrainSection:
    tokens: int = 196_608  # training tokens per run (one model at one context), the same for every model
    batch_tokens: int = 2048  # tokens per optimizer step (sequences per step = batch_tokens / context)
    micro_batch_tokens: int | None = None  # tokens per forward/backward (gradient accumulation up to batch_tokens; null = batch_tokens)
    lr: float = 3.0e-3  # peak learning rate (AdamW, betas 0.9/0.95)
    warmup_steps: int = 10  # linear warm-up steps
    schedule: str = "cosine"  # cosine | linear | constant decay after warm-up
    min_lr_ratio: float = 0.1  # final lr as a fraction of the peak
    max_grad_norm: float = 1.0  # gradient clipping (0 = off)
    weight_decay: float = 0.1  # AdamW weight decay
    mixed_precision: str = "auto"  # auto (bf16 on CUDA, off on CPU) | no | bf16
    on_nan: str = "stop"  # stop | skip: what a non-finite loss or gradient does
    log_every: int = 5  # steps between metrics lines
    checkpoint_every: int = 50  # steps between resumable checkpoints inside a run (0 = none)
    save_weights: bool = True  # keep each trained model's weights (safetensors) beside its result


@dataclass
class StudyEvalSection:
    tokens: int = 32_768  # test tokens scored at every context (tokens / context windows, the same for every model)


@dataclass
class StudyMemorySection:
    lengths: list = field(default_factory=lambda: [1024, 4096, 16384, 65536])  # sequence lengths of one training step
    batch_size: int = 1  # sequences per measured step
    limit_gb: float = 8.0  # CPU: lengths predicted (from the last two) to need more memory are not run
    max_step_seconds: float = 120.0  # lengths predicted to need longer for one step are not run (quadratic attention)


@dataclass
class StudyRecipe:
    name: str = "custom"
    description: str = ""
    seed: int = 0
    models: list = field(default_factory=lambda: list(ARCHITECTURES[:5]))  # which of the architectures to train
    contexts: list = field(default_factory=lambda: [256, 512, 1024, 2048])  # training (and test) context lengths
    data: StudyDataSection = field(default_factory=StudyDataSection)
    model: StudyModelSection = field(default_factory=StudyModelSection)
    train: StudyTrainSection = field(default_factory=StudyTrainSection)
    eval: StudyEvalSection = field(default_factory=StudyEvalSection)
    memory: StudyMemorySection = field(default_factory=StudyMemorySection)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def steps(self) -> int:
        """Optimizer steps of every run."""
        return self.train.tokens // self.train.batch_tokens


def _positive_ints(key: str, values) -> None:
    if not isinstance(values, list) or not values or not all(
        isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in values
    ):
        raise RecipeError(f"recipe key `{key}` must be a non-empty list of positive integers, got {values!r}")


def _validate(recipe: StudyRecipe) -> None:
    unknown = [m for m in recipe.models if m not in ARCHITECTURES]
    if unknown or not recipe.models or len(set(recipe.models)) != len(recipe.models):
        raise RecipeError(f"recipe key `models` must list distinct names among {list(ARCHITECTURES)}, got {recipe.models!r}")
    _positive_ints("contexts", recipe.contexts)
    _positive_ints("memory.lengths", recipe.memory.lengths)
    m, t = recipe.model, recipe.train
    for key, value in {
        "model.hidden_size": m.hidden_size, "model.num_layers": m.num_layers, "model.num_heads": m.num_heads,
        "model.intermediate_size": m.intermediate_size, "model.mamba_state_size": m.mamba_state_size,
        "model.short_conv_size": m.short_conv_size, "model.state_size": m.state_size,
        "model.mamba_expand": m.mamba_expand, "train.tokens": t.tokens, "train.batch_tokens": t.batch_tokens,
        "eval.tokens": recipe.eval.tokens, "memory.batch_size": recipe.memory.batch_size,
    }.items():
        if value <= 0:
            raise RecipeError(f"recipe key `{key}` must be > 0, got {value!r}")
    if m.hidden_size % m.num_heads:
        raise RecipeError(f"recipe key `model.hidden_size` ({m.hidden_size}) must be a multiple of `model.num_heads` ({m.num_heads})")
    for key, value in (("model.gate_rank", m.gate_rank), ("model.predictor_rank", m.predictor_rank)):
        if value is not None and value <= 0:
            raise RecipeError(f"recipe key `{key}` must be > 0 or null, got {value!r}")
    if not 0 <= t.min_lr_ratio <= 1:
        raise RecipeError(f"recipe key `train.min_lr_ratio` must be in [0, 1], got {t.min_lr_ratio!r}")
    if m.mamba_layers is not None and m.mamba_layers <= 0:
        raise RecipeError(f"recipe key `model.mamba_layers` must be > 0 or null, got {m.mamba_layers!r}")
    if not 0 < m.param_tolerance < 1:
        raise RecipeError(f"recipe key `model.param_tolerance` must be in (0, 1), got {m.param_tolerance!r}")
    from hallamonic.modeling.configuration_hallamonic import SHORT_CONV_INITS, VALUE_ACTIVATIONS

    for key, value, allowed in (
        ("model.short_conv_init", m.short_conv_init, SHORT_CONV_INITS), ("model.value_activation", m.value_activation, VALUE_ACTIVATIONS),
    ):
        if value not in allowed:
            raise RecipeError(f"recipe key `{key}` must be one of {list(allowed)}, got {value!r}")
    if m.maps_from_value and m.state_size == 1:
        raise RecipeError("recipe key `model.maps_from_value` needs the expanded state (`model.state_size` > 1)")
    bands = m.timescale_bands
    if bands != CONTEXT_BANDS and (not bands or not all(isinstance(b, list) and len(b) == 2 and 1 <= b[0] <= b[1] for b in bands)):
        raise RecipeError(
            f"recipe key `model.timescale_bands` must be a list of [tau_min, tau_max] with 1 <= tau_min <= tau_max, "
            f"or {CONTEXT_BANDS!r} (bands fitted to each context), got {bands!r}"
        )
    bad = [c for c in recipe.contexts if t.batch_tokens % c]
    if bad:
        raise RecipeError(
            f"recipe key `train.batch_tokens` ({t.batch_tokens}) must be a multiple of every context; not of {bad} "
            "(every run takes the same tokens per step)"
        )
    micro = t.micro_batch_tokens
    if micro is not None:
        bad = [c for c in recipe.contexts if micro % c]
        if micro <= 0 or t.batch_tokens % micro or bad:
            raise RecipeError(
                f"recipe key `train.micro_batch_tokens` ({micro}) must divide `train.batch_tokens` ({t.batch_tokens}) "
                f"and be a multiple of every context{f'; not of {bad}' if bad else ''}"
            )
    if recipe.steps < 1:
        raise RecipeError(f"recipe key `train.tokens` ({t.tokens}) is less than one step of `train.batch_tokens` ({t.batch_tokens})")
    if not t.lr > 0 or t.warmup_steps < 0 or t.max_grad_norm < 0 or t.weight_decay < 0 or t.checkpoint_every < 0:
        raise RecipeError("recipe keys `train.lr` must be > 0 and `train.warmup_steps`, `train.max_grad_norm`, "
                          "`train.weight_decay`, `train.checkpoint_every` >= 0")
    for key, value, allowed in (
        ("train.schedule", t.schedule, {"cosine", "linear", "constant"}),
        ("train.mixed_precision", t.mixed_precision, {"auto", "no", "bf16"}),
        ("train.on_nan", t.on_nan, {"stop", "skip"}),
    ):
        if value not in allowed:
            raise RecipeError(f"recipe key `{key}` must be one of {sorted(allowed)}, got {value!r}")
    d = recipe.data
    if not (0 <= d.valid_fraction < 1 and 0 < d.test_fraction < 1 and d.valid_fraction + d.test_fraction < 1):
        raise RecipeError("recipe keys `data.valid_fraction` (>= 0) and `data.test_fraction` (> 0) must sum to less than 1")
    if d.path is None and d.dataset is None:
        raise RecipeError("the study needs text: set `data.path` (a local file) or `data.dataset` (a hub dataset)")
    if recipe.memory.limit_gb <= 0 or recipe.memory.max_step_seconds <= 0:
        raise RecipeError("recipe keys `memory.limit_gb` and `memory.max_step_seconds` must be > 0")


def build_study_recipe(tree: dict | None, overrides: typing.Sequence[str] = ()) -> StudyRecipe:
    recipe = build_schema(StudyRecipe, tree, overrides)
    _validate(recipe)
    return recipe


def bundled_study_recipes() -> dict[str, Path]:
    return bundled_recipes(STUDY_RECIPES_DIR)


def load_study_recipe(name_or_path: str, overrides: typing.Sequence[str] = ()) -> StudyRecipe:
    """A bundled study recipe by name (``recipes/study/NAME.yaml``) or a YAML file, plus overrides."""
    path = resolve_recipe_path(name_or_path, STUDY_RECIPES_DIR)
    recipe = build_study_recipe(read_yaml(path), overrides)
    if recipe.name == "custom":
        recipe.name = path.stem
    return recipe
