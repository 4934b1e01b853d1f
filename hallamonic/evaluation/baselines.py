"""The fair alternatives a converted model is compared with: the teacher, and the teacher with
training-free RoPE scaling (dynamic NTK, YaRN).

A converted model that beats the raw teacher past its window only matters if it also beats
the free fixes for that window; so every run can carry those baselines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

BASELINES = ("teacher", "ntk", "yarn")
DEFAULT_NTK_FACTOR = 2.0  # the factor transformers' docs use for dynamic NTK


@dataclass
class Entry:
    """One model of a run: a name for tables, a spec to load, an optional RoPE scaling."""

    name: str
    spec: str
    rope: str | None = None  # None, "ntk" or "yarn"
    info: dict = field(default_factory=dict)


TEACHER_CONFIG_KEYS = ("hallamonic_base_model", "base_model_name_or_path")


def teacher_spec(model, explicit: str | None) -> str | None:
    """The teacher of `model`: --teacher, else the converted checkpoint's recorded base model."""
    recorded = (getattr(model.config, key, None) for key in TEACHER_CONFIG_KEYS)
    return explicit or next((r for r in recorded if r), None)


def baseline_entries(kinds: list[str], teacher: str, main_is_teacher: bool) -> list[Entry]:
    """Entries for the requested baselines; 'teacher' is dropped when the main model is it."""
    names = {"teacher": "teacher", "ntk": "teacher+ntk", "yarn": "teacher+yarn"}
    entries = []
    for kind in dict.fromkeys(kinds):  # keep order, drop repeats
        if kind == "teacher" and main_is_teacher:
            continue
        entries.append(Entry(names[kind], teacher, None if kind == "teacher" else kind))
    return entries


def rope_window(config) -> int:
    """The context length the model's RoPE was trained at."""
    params = getattr(config, "rope_parameters", None) or {}
    return int(params.get("original_max_position_embeddings") or config.max_position_embeddings)


def rope_scaling_parameters(config, kind: str, target_length: int, ntk_factor: float) -> dict:
    """transformers 5.x `rope_parameters` for dynamic NTK or YaRN on top of `config`'s RoPE.

    Dynamic NTK rescales the RoPE base from the current sequence length at every forward
    (no effect up to the window). YaRN is static: factor = target length / window, so it
    also changes (slightly) what happens inside the window; factor 1 is the plain teacher.
    """
    params = dict(getattr(config, "rope_parameters", None) or {})
    if "rope_theta" not in params:
        raise ValueError("model has no RoPE parameters; NTK/YaRN baselines need a RoPE model")
    if params.get("rope_type", "default") != "default":
        raise ValueError(f"teacher RoPE is already scaled ({params['rope_type']}); refusing to stack scalings")
    window = rope_window(config)
    if kind == "ntk":
        params.update(rope_type="dynamic", factor=float(ntk_factor))
    elif kind == "yarn":
        params.update(
            rope_type="yarn",
            factor=max(1.0, target_length / window),
            original_max_position_embeddings=window,
        )
    else:
        raise ValueError(f"unknown RoPE scaling {kind!r}; expected 'ntk' or 'yarn'")
    return params


def apply_rope_scaling(model: nn.Module, kind: str, target_length: int, ntk_factor: float = DEFAULT_NTK_FACTOR) -> dict:
    """Switch a loaded Llama-family model to NTK/YaRN RoPE in place; returns the new parameters.

    The rotary module computes its frequencies from the config at construction, so it is
    rebuilt from the updated config (weights are untouched).
    """
    params = rope_scaling_parameters(model.config, kind, target_length, ntk_factor)
    model.config.rope_parameters = params
    rebuilt = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if hasattr(child, "rope_type") and hasattr(child, "original_inv_freq"):
                device = child.inv_freq.device
                setattr(parent, name, type(child)(config=model.config).to(device))
                rebuilt += 1
    if not rebuilt:
        raise ValueError(f"no rotary embedding module found in {type(model).__name__}")
    return params
