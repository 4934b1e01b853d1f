"""Recipe schema machinery, and the recipe sections every training run shares.

A recipe of any kind (conversion, study) is a tree of small dataclasses. Loading one (file or
bundled name) and applying ``--set key=value`` overrides both go through :func:`build_schema`,
which rejects unknown keys (suggesting the closest known one), wrong types and empty values,
naming the key; range checks are each kind's own. YAML is parsed with ``yaml.safe_load`` only.

The sections here describe what :func:`hallamonic.training.trainer.run_phase` needs: a phase's
optimizer steps, batch shape and learning-rate schedule, the optimizer and loop settings, and how
often to checkpoint.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"  # bundled recipes: conversion here, study in study/


class RecipeError(ValueError):
    """A recipe (or an override) is malformed; the message names the key."""


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
class TrainSection:
    grad_accum: int = 1
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    mixed_precision: str = "auto"  # auto (bf16 on CUDA, none on CPU) | native (bf16 where the hardware has it) | no | bf16 | fp16
    on_nan: str = "stop"  # stop | skip: what a non-finite loss or gradient does
    log_every: int = 10


@dataclass
class CheckpointSection:
    every: int = 50  # optimizer steps between checkpoints (0 = only at the end of a phase)
    keep: int = 2  # checkpoints kept per phase


# --------------------------------------------------------------------------------------------
# Building and validating
# --------------------------------------------------------------------------------------------
def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


# Keys that recipes once had, and why they went: an old recipe gets the reason, not a guess.
REMOVED_KEYS = {
    "phase1.recompute": "phase 1 now takes each block's gradients right after its forward, so one block's "
    "activations are live at a time without recomputing them; delete the key",
}


def _unknown_key(key: str, known: typing.Iterable[str]) -> RecipeError:
    if key in REMOVED_KEYS:
        return RecipeError(f"recipe key `{key}` was removed: {REMOVED_KEYS[key]}")
    close = difflib.get_close_matches(key.split(".")[-1], [k.split(".")[-1] for k in known], n=1)
    hint = ""
    if close:
        section = key.rpartition(".")[0]
        matches = [k for k in known if k.split(".")[-1] == close[0]]
        full = min(matches, key=lambda k: k.rpartition(".")[0] != section)  # the key's own section first
        hint = f" (did you mean `{full}`?)"
    return RecipeError(f"unknown recipe key `{key}`{hint}")


# Plain value types a recipe field may have: (check, what the error says it must be).
_TYPES: dict[str, tuple[typing.Callable[[Any], bool], str]] = {
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "float": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "dict": (lambda v: isinstance(v, dict), "a mapping"),
}


_FLOAT_LITERAL = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    """Check ``value`` against a field's annotation (a string under ``from __future__``), e.g.
    ``int``, ``int | None`` or ``str | dict | None``: the first type that accepts it wins."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    options = [t.strip() for t in text.split("|")]
    if value is None:
        if "None" in options:
            return None
        raise RecipeError(f"recipe key `{key}` must not be empty")
    options = [t for t in options if t != "None"]
    unsupported = [t for t in options if t not in _TYPES]
    if unsupported:  # pragma: no cover - a schema bug, not a user error
        raise RecipeError(f"recipe key `{key}` has an unsupported type {text}")
    for option in options:
        if _TYPES[option][0](value):
            return float(value) if option == "float" else value
        if option == "int" and isinstance(value, float) and value.is_integer():
            return int(value)
        if option == "float" and isinstance(value, str) and _FLOAT_LITERAL.fullmatch(value.strip()):
            return float(value)  # YAML 1.1 reads 2e-4 (no dot) as a string; a user means the number
    wanted = " or ".join(_TYPES[t][1] for t in options)
    raise RecipeError(f"recipe key `{key}` must be {wanted}, got {value!r}")


def _build(cls, values: dict[str, Any], prefix: str = "", root=None):
    root = root or cls
    if not isinstance(values, dict):
        raise RecipeError(f"recipe section `{prefix.rstrip('.') or 'root'}` must be a mapping, got {values!r}")
    fields = _fields(cls)
    kwargs = {}
    for name, value in values.items():
        if name not in fields:
            raise _unknown_key(prefix + str(name), all_keys(root))
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


def all_keys(cls, prefix: str = "") -> list[str]:
    """Every leaf key of the schema ``cls``, dotted (``phase1.steps``)."""
    keys = []
    for name, f in _fields(cls).items():
        section = _section_class(f)
        if section is not None:
            keys.extend(all_keys(section, prefix + name + "."))
        else:
            keys.append(prefix + name)
    return keys


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested dict as ``{"section.key": value}``."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, prefix + key + "."))
        else:
            flat[prefix + key] = value
    return flat


def _apply_override(tree: dict[str, Any], assignment: str, root) -> None:
    if "=" not in assignment:
        raise RecipeError(f"--set expects key=value, got {assignment!r}")
    key, raw = assignment.split("=", 1)
    key = key.strip()
    known = all_keys(root)
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
def bundled_recipes(folder: Path) -> dict[str, Path]:
    """Bundled recipe name -> file, for the recipes in ``folder``."""
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def resolve_recipe_path(name_or_path: str, *folders: Path) -> Path:
    """A YAML file by path, or a bundled recipe by name from the first of ``folders`` that has it."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    bundled: dict[str, Path] = {}
    for folder in reversed(folders):  # the first folder wins a name clash
        bundled.update(bundled_recipes(folder))
    if name_or_path in bundled:
        return bundled[name_or_path]
    hint = difflib.get_close_matches(name_or_path, list(bundled), n=1)
    suggestion = f" (did you mean `{hint[0]}`?)" if hint else ""
    raise RecipeError(
        f"recipe {name_or_path!r} is neither a file nor a bundled recipe{suggestion}; "
        f"bundled: {', '.join(sorted(bundled)) or 'none'}"
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
