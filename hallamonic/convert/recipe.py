"""Conversion recipes: one YAML file per base model, validated against a typed schema.

A recipe is a tree of small dataclasses. Loading one (file or bundled name) and applying
``--set key=value`` overrides both go through :func:`build_recipe`, which rejects unknown keys
(suggesting the closest known one), wrong types and out-of-range values, naming the key.
YAML is parsed with ``yaml.safe_load`` only.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"


class RecipeError(ValueError):
    """A recipe (or an override) is malformed; the message names the key."""


@dataclass
class BaseSection:
    model: str = "HuggingFaceTB/SmolLM2-135M"  # hub id, local folder, or .gguf file
    dtype: str = "float32"  # weights of teacher and student while converting: float32 | bfloat16


@dataclass
class HarmonicSection:
    timescale_bands: list = field(default_factory=lambda: [[1.0, 16.0], [16.0, 256.0], [256.0, 4096.0]])
    hierarchy: bool = True
    error_signal: bool = True
    gate_rank: int | None = None
    predictor_rank: int | None = None
    output_gate: bool = False
    output_gate_rank: int | None = None
    short_conv_size: int = 0  # > 0: causal depthwise conv of the value stream (identity at init)
    state_size: int | None = None  # numbers per channel per level: null = the teacher's head_dim (k/q start the maps); 1 = diagonal
    recompute_mixer: bool = False  # recompute each block in backward instead of storing its activations
    init_from_attention: bool = True  # v_proj / o_proj from the teacher's attention
    calibrate_norms: bool = True  # fit level-input norms and the output scale on real text


@dataclass
class DataSection:
    dataset: str = "HuggingFaceFW/fineweb-edu"  # hub dataset, streamed (ignored when `path` is set)
    config: str | None = "sample-10BT"
    split: str = "train"
    path: str | None = None  # local .txt / .jsonl / .parquet; replaces the hub dataset when set
    text_field: str = "text"
    heldout_fraction: float = 0.02  # share of documents never trained on (taken from the end)
    max_documents: int | None = None


@dataclass
class PhaseSection:
    steps: int = 100  # optimizer steps (0 skips the phase)
    seq_len: int = 512
    batch_size: int = 4  # sequences per optimizer step per process (before accumulation)
    lr: float = 1e-3
    warmup_steps: int = 10
    schedule: str = "cosine"  # cosine | linear | constant
    min_lr_ratio: float = 0.1


@dataclass
class Phase1Section(PhaseSection):
    normalize: bool = True  # per-layer MSE divided by the teacher output's mean square


@dataclass
class Phase2Section(PhaseSection):
    lr: float = 3e-4
    kl_weight: float = 0.0  # weight of KL(teacher || student) inside the teacher's window
    lora_rank: int = 0  # > 0: LoRA adapters (peft) on the frozen MLPs, merged at export
    lora_alpha: float = 16.0
    gradient_checkpointing: bool = False
    chunk_size: int = 0  # > 0: forward in chunks of this many tokens (carried states)


@dataclass
class TrainSection:
    grad_accum: int = 1
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    mixed_precision: str = "auto"  # auto (bf16 on CUDA, none on CPU) | no | bf16 | fp16
    on_nan: str = "stop"  # stop | skip: what a non-finite loss or gradient does
    log_every: int = 10


@dataclass
class CheckpointSection:
    every: int = 50  # optimizer steps between checkpoints (0 = only at the end of a phase)
    keep: int = 2  # checkpoints kept per phase


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
    phase1: Phase1Section = field(default_factory=Phase1Section)
    phase2: Phase2Section = field(default_factory=Phase2Section)
    train: TrainSection = field(default_factory=TrainSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    eval: EvalSection = field(default_factory=EvalSection)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


CHOICES = {
    "base.dtype": {"float32", "bfloat16"},
    "phase1.schedule": {"cosine", "linear", "constant"},
    "phase2.schedule": {"cosine", "linear", "constant"},
    "train.mixed_precision": {"auto", "no", "bf16", "fp16"},
    "train.on_nan": {"stop", "skip"},
}
POSITIVE = {"phase1.seq_len", "phase1.batch_size", "phase2.seq_len", "phase2.batch_size", "train.grad_accum"}
NON_NEGATIVE = {
    "phase1.steps", "phase2.steps", "phase1.warmup_steps", "phase2.warmup_steps", "checkpoint.every",
    "phase2.kl_weight", "phase2.lora_rank", "phase2.chunk_size", "train.weight_decay", "eval.max_windows",
    "harmonic.short_conv_size",
}


# --------------------------------------------------------------------------------------------
# Building and validating
# --------------------------------------------------------------------------------------------
def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _unknown_key(key: str, known: typing.Iterable[str]) -> RecipeError:
    close = difflib.get_close_matches(key.split(".")[-1], [k.split(".")[-1] for k in known], n=1)
    hint = ""
    if close:
        full = [k for k in known if k.split(".")[-1] == close[0]][0]
        hint = f" (did you mean `{full}`?)"
    return RecipeError(f"unknown recipe key `{key}`{hint}")


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    """Check ``value`` against a field's annotation (a string under ``from __future__``)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    optional = "None" in text
    if value is None:
        if optional:
            return None
        raise RecipeError(f"recipe key `{key}` must not be empty")
    base = text.replace("| None", "").replace("None |", "").strip()
    if base == "bool":
        if isinstance(value, bool):
            return value
        raise RecipeError(f"recipe key `{key}` must be true or false, got {value!r}")
    if base == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise RecipeError(f"recipe key `{key}` must be an integer, got {value!r}")
    if base == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise RecipeError(f"recipe key `{key}` must be a number, got {value!r}")
    if base == "str":
        if isinstance(value, str):
            return value
        raise RecipeError(f"recipe key `{key}` must be a string, got {value!r}")
    if base == "list":
        if isinstance(value, list):
            return value
        raise RecipeError(f"recipe key `{key}` must be a list, got {value!r}")
    raise RecipeError(f"recipe key `{key}` has an unsupported type {text}")  # pragma: no cover


def _build(cls, values: dict[str, Any], prefix: str = "", root=None):
    root = root or cls
    if not isinstance(values, dict):
        raise RecipeError(f"recipe section `{prefix.rstrip('.') or 'root'}` must be a mapping, got {values!r}")
    fields = _fields(cls)
    kwargs = {}
    for name, value in values.items():
        if name not in fields:
            raise _unknown_key(prefix + str(name), _all_keys(root))
        section = _section_class(fields[name])
        if section is not None:
            kwargs[name] = _build(section, value, prefix + name + ".", root)
        else:
            kwargs[name] = _coerce(prefix + name, value, fields[name].type)
    return cls(**kwargs)


def _section_class(f: dataclasses.Field):
    """The dataclass of a nested section, or None for a plain value."""
    factory = f.default_factory
    return factory if factory is not dataclasses.MISSING and dataclasses.is_dataclass(factory) else None


def _all_keys(cls=Recipe, prefix: str = "") -> list[str]:
    keys = []
    for name, f in _fields(cls).items():
        section = _section_class(f)
        if section is not None:
            keys.extend(_all_keys(section, prefix + name + "."))
        else:
            keys.append(prefix + name)
    return keys


def _validate(recipe: Recipe) -> None:
    flat = _flatten(recipe.to_dict())
    for key, allowed in CHOICES.items():
        if flat[key] not in allowed:
            raise RecipeError(f"recipe key `{key}` must be one of {sorted(allowed)}, got {flat[key]!r}")
    for key in POSITIVE:
        if flat[key] <= 0:
            raise RecipeError(f"recipe key `{key}` must be > 0, got {flat[key]!r}")
    for key in NON_NEGATIVE:
        if flat[key] < 0:
            raise RecipeError(f"recipe key `{key}` must be >= 0, got {flat[key]!r}")
    for key in ("phase1.lr", "phase2.lr"):
        if not flat[key] > 0:
            raise RecipeError(f"recipe key `{key}` must be > 0, got {flat[key]!r}")
    if not 0.0 <= recipe.data.heldout_fraction < 1.0:
        raise RecipeError(f"recipe key `data.heldout_fraction` must be in [0, 1), got {recipe.data.heldout_fraction!r}")
    state_size = recipe.harmonic.state_size
    if state_size is not None and state_size <= 0:
        raise RecipeError(f"recipe key `harmonic.state_size` must be > 0 or null (= the teacher's head_dim), got {state_size!r}")
    bands = recipe.harmonic.timescale_bands
    if not bands or not all(isinstance(b, list) and len(b) == 2 and 1 <= b[0] <= b[1] for b in bands):
        raise RecipeError(f"recipe key `harmonic.timescale_bands` must be a list of [tau_min, tau_max] with 1 <= tau_min <= tau_max, got {bands!r}")
    lengths = recipe.eval.context_lengths
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in lengths):
        raise RecipeError(f"recipe key `eval.context_lengths` must be positive integers, got {lengths!r}")


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, prefix + key + "."))
        else:
            flat[prefix + key] = value
    return flat


def _apply_override(tree: dict[str, Any], assignment: str, root=None) -> None:
    if "=" not in assignment:
        raise RecipeError(f"--set expects key=value, got {assignment!r}")
    key, raw = assignment.split("=", 1)
    key = key.strip()
    known = _all_keys(root or Recipe)
    if key not in known:
        raise _unknown_key(key, known)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as err:
        raise RecipeError(f"--set {key}: cannot parse value {raw!r}: {err}") from None
    node = tree
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------
def bundled_recipes(folder: Path = RECIPES_DIR) -> dict[str, Path]:
    """Bundled recipe name -> file (conversion recipes; study recipes live in ``recipes/study``)."""
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def resolve_recipe_path(name_or_path: str, folder: Path = RECIPES_DIR) -> Path:
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    bundled = bundled_recipes(folder)
    if name_or_path in bundled:
        return bundled[name_or_path]
    hint = difflib.get_close_matches(name_or_path, list(bundled), n=1)
    suggestion = f" (did you mean `{hint[0]}`?)" if hint else ""
    raise RecipeError(
        f"recipe {name_or_path!r} is neither a file nor a bundled recipe{suggestion}; "
        f"bundled: {', '.join(bundled) or 'none'}"
    )


def build_schema(root, tree: dict[str, Any] | None, overrides: typing.Sequence[str] = ()):
    """An instance of the dataclass tree ``root`` from a parsed YAML tree plus ``key=value``
    overrides: unknown keys (with the closest known one), wrong types and empty values rejected.
    Shared by every recipe kind (conversion, study); range checks are each kind's own."""
    tree = dict(tree or {})
    tree = {k: (dict(v) if isinstance(v, dict) else v) for k, v in tree.items()}
    for assignment in overrides:
        _apply_override(tree, assignment, root)
    return _build(root, tree)


def read_yaml(path: Path) -> Any:
    """A YAML file parsed with ``yaml.safe_load`` (no object tags), or a one-line RecipeError."""
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: not valid YAML: {err}") from None


def build_recipe(tree: dict[str, Any] | None, overrides: typing.Sequence[str] = ()) -> Recipe:
    """A validated Recipe from a parsed YAML tree plus ``key=value`` overrides."""
    recipe = build_schema(Recipe, tree, overrides)
    _validate(recipe)
    return recipe


def load_recipe(name_or_path: str, overrides: typing.Sequence[str] = ()) -> Recipe:
    """Load a bundled recipe by name or a YAML file by path, then apply overrides."""
    path = resolve_recipe_path(name_or_path)
    recipe = build_recipe(read_yaml(path), overrides)
    if recipe.name == "custom":
        recipe.name = path.stem
    return recipe


def recipe_to_yaml(recipe: Recipe) -> str:
    return yaml.safe_dump(recipe.to_dict(), sort_keys=False)
