"""The study's architectures, built from one shape and matched in parameter count.

- ``harmonic``: the Hallamonic decoder from scratch: embeddings, layers of (RMSNorm, HarmonicBlock,
  RMSNorm, SwiGLU MLP), final norm, LM head. The same layer as a converted checkpoint, so the study
  measures the block the converter ships.
  Its levels keep ``model.state_size`` numbers per channel (the expanded, selective state).
- ``harmonic-no-hierarchy`` / ``harmonic-raw-states``: the two ablations (one config flag each;
  identical parameter count). ``harmonic-diagonal``: the block with one number per channel
  (``state_size`` 1, no read/write maps): the block of the first studies, kept as a named row.
  ``harmonic-output-gate`` / ``harmonic-short-conv``: options beyond
  the seed design (a low-rank output gate, +2 x hidden x hidden/8 parameters per layer; a causal
  depthwise conv of the value stream, + hidden x taps). Not fitted: their counts are printed.
- ``harmonic-one-level``: no hierarchy at all: one level whose band spans all of the three
  levels' bands, the parameters the other two levels' gates and predictors held going to the MLP
  (its width is fitted to Harmonic's count). The seed's own no-hierarchy ablation keeps three
  levels and only shares their band; this row asks whether stacking levels pays for its parameters.
  ``harmonic-two-level``: the same span split geometrically into two levels (MLP fitted likewise):
  the hierarchy the SmolLM2 conversion recipe ships, so the study measures that block too;
  ``harmonic-two-level-no-hierarchy`` / ``-raw-states`` are its two ablations (both levels on the
  union band / the second level reading the first's output instead of its prediction error).
- ``transformer``: transformers' Llama with the same width, depth and heads; its MLP width is fitted
  so the parameter count matches (attention is 4 d^2 per layer, a HarmonicBlock ~3.3 d^2).
- ``mamba``: transformers' Mamba (its PyTorch path without CUDA kernels), ``mamba_layers`` blocks;
  its hidden size is fitted to match.
- ``mamba-llama-layout``: transformers' ``MambaMixer`` (``mamba_state_size``, ``mamba_expand``, Mamba's
  init) where Harmonic's block sits, in the Llama layout the converter keeps (the transformer's
  layers with the mixer in attention's place; MLP width fitted). Mamba's own layout (mixers only, no
  MLP) and Harmonic's differ, and at 1M parameters on enwik8 the layout is most of the gap between
  them: this row compares the mixers alone (evals/results/study-enwik8-cpu-layout).

Untied input and output embeddings everywhere, so no model gets a parameter discount.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cache

import torch
from torch import nn

from hallamonic.study.recipe import CONTEXT_BANDS, StudyModelSection, context_bands, split_span


class ParameterMismatch(ValueError):
    """A baseline cannot be sized within the recipe's tolerance of the Harmonic parameter count."""


@dataclass
class Architecture:
    name: str
    config: object  # a transformers PreTrainedConfig
    params: int

    def build(self, seed: int) -> nn.Module:
        """A freshly initialised model; the same seed gives the same weights."""
        torch.manual_seed(seed)
        return _model_class(self.config)(self.config)


def _model_class(config):
    from transformers import LlamaForCausalLM, MambaForCausalLM

    from hallamonic.modeling import HallamonicForCausalLM

    if has_mamba_mixers(config):
        return _llama_with_mamba_mixers()
    return {"hallamonic": HallamonicForCausalLM, "llama": LlamaForCausalLM, "mamba": MambaForCausalLM}[config.model_type]


def has_mamba_mixers(config) -> bool:
    """Whether ``config`` is ``mamba-llama-layout``'s: a Llama config marked by mamba_llama_layout_config."""
    return getattr(config, "mixer", None) == "mamba"


class MambaMixerInAttentionSlot(nn.Module):
    """transformers' MambaMixer called the way a Llama layer calls its attention."""

    def __init__(self, mamba_config, layer_idx: int):
        super().__init__()
        from transformers.models.mamba.modeling_mamba import MambaMixer

        self.mixer = MambaMixer(mamba_config, layer_idx)

    def forward(self, hidden_states: torch.Tensor, **_attention_kwargs) -> tuple[torch.Tensor, None]:
        return self.mixer(hidden_states), None  # (B, L, hidden); causal by construction, no mask needed

    @torch.no_grad()
    def reset_parameters(self, std: float) -> None:
        """Mamba's own init (MambaPreTrainedModel._init_weights): linears normal(0, std), then S4D-real
        A, D = 1, dt's bias over [dt_min, dt_max], kaiming conv and out_proj."""
        for module in self.mixer.modules():
            if isinstance(module, nn.Linear):
                module.weight.normal_(0.0, std)
                if module.bias is not None:
                    module.bias.zero_()
        self.mixer.init_mamba_weights()
        nn.init.kaiming_uniform_(self.mixer.conv1d.weight, a=math.sqrt(5))
        if self.mixer.conv1d.bias is not None:
            self.mixer.conv1d.bias.zero_()
        nn.init.kaiming_uniform_(self.mixer.out_proj.weight, a=math.sqrt(5))


@cache  # one class, so every model built is an instance of the same type
def _llama_with_mamba_mixers():
    from transformers import LlamaForCausalLM, MambaConfig

    class LlamaWithMambaMixers(LlamaForCausalLM):
        """The Llama layout with every attention replaced by a Mamba mixer (``mamba-llama-layout``)."""

        def __init__(self, config):
            super().__init__(config)
            mamba_config = MambaConfig(
                hidden_size=config.hidden_size, state_size=config.mamba_state_size, expand=config.mamba_expand,
                num_hidden_layers=config.num_hidden_layers, initializer_range=config.initializer_range,
                use_mambapy=True,  # parallel scan in PyTorch for training without CUDA kernels
            )
            for index, layer in enumerate(self.model.layers):
                layer.self_attn = MambaMixerInAttentionSlot(mamba_config, index)
                if not layer.self_attn.mixer.A_log.is_meta:  # count_parameters builds on the meta device
                    layer.self_attn.reset_parameters(config.initializer_range)

    return LlamaWithMambaMixers


def count_parameters(config) -> int:
    """Parameters of a model built from ``config`` (on the meta device: no memory, no init)."""
    with torch.device("meta"):
        model = _model_class(config)(config)
    return sum(p.numel() for p in model.parameters())


def _init_scale(shape: StudyModelSection) -> dict:
    """The recipe's initializer_range for a config, or nothing (the config's own default).

    One scale for every model, because it moves them all: at 1M parameters on enwik8 (context 256,
    test bits) 0.1 instead of Llama's 0.02 takes Harmonic from 3.24 to 2.86 and the transformer from
    3.84 to 3.43; Mamba's config already defaults to 0.1 (evals/results/study-enwik8-cpu-init)."""
    return {} if shape.initializer_range is None else {"initializer_range": shape.initializer_range}


def harmonic_config(
    shape: StudyModelSection, vocab_size: int, context: int, *, hierarchy: bool = True, error_signal: bool = True,
    output_gate: bool = False, short_conv: bool = False, diagonal: bool = False, levels: int | None = None,
):
    """A Harmonic model of the study's shape for training at ``context`` (which sets the timescale
    bands when the recipe says ``timescale_bands: context``; nothing else depends on it). ``levels``
    re-splits the span of the recipe's bands geometrically into that many levels."""
    from hallamonic.modeling import HallamonicConfig

    bands = context_bands(context) if shape.timescale_bands == CONTEXT_BANDS else shape.timescale_bands
    if levels is not None:
        bands = split_span(min(lo for lo, _ in bands), max(hi for _, hi in bands), levels)
    return HallamonicConfig(
        vocab_size=vocab_size, hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers, num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_heads,
        timescale_bands=bands, hierarchy=hierarchy, error_signal=error_signal, output_gate=output_gate,
        short_conv_size=shape.short_conv_size if short_conv or shape.short_conv else 0,
        state_size=1 if diagonal else shape.state_size,
        recompute_mixer=shape.recompute_mixer, short_conv_init=shape.short_conv_init,
        value_activation=shape.value_activation, maps_from_value=shape.maps_from_value and not diagonal,
        value_skip=shape.value_skip,
        gate_rank=shape.gate_rank, predictor_rank=shape.predictor_rank, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, **_init_scale(shape),
    )


def transformer_config(shape: StudyModelSection, vocab_size: int, intermediate_size: int, max_length: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=shape.hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=shape.num_layers, num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_heads,
        max_position_embeddings=max_length, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
        attn_implementation="sdpa", **_init_scale(shape),
    )


def mamba_llama_layout_config(shape: StudyModelSection, vocab_size: int, intermediate_size: int, max_length: int):
    """The transformer's config, marked for Mamba mixers in its attention slots (``mamba-llama-layout``)."""
    config = transformer_config(shape, vocab_size, intermediate_size, max_length)
    config.mixer, config.mamba_state_size, config.mamba_expand = "mamba", shape.mamba_state_size, shape.mamba_expand
    return config


def mamba_config(shape: StudyModelSection, vocab_size: int, hidden_size: int):
    from transformers import MambaConfig

    return MambaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=shape.mamba_layers or 2 * shape.num_layers,
        state_size=shape.mamba_state_size, expand=shape.mamba_expand, tie_word_embeddings=False,
        use_mambapy=True,  # parallel scan in PyTorch for training without CUDA kernels (mambapy package)
        bos_token_id=None, eos_token_id=None, pad_token_id=None, **_init_scale(shape),
    )


# Harmonic and its ablations / options: the harmonic_config flags each one sets.
HARMONIC_VARIANTS = {
    "harmonic": {},
    "harmonic-no-hierarchy": {"hierarchy": False},
    "harmonic-raw-states": {"error_signal": False},
    "harmonic-output-gate": {"output_gate": True},
    "harmonic-short-conv": {"short_conv": True},
    "harmonic-diagonal": {"diagonal": True},
    "harmonic-one-level": {"levels": 1},
    "harmonic-two-level": {"levels": 2},
    "harmonic-two-level-no-hierarchy": {"levels": 2, "hierarchy": False},
    "harmonic-two-level-raw-states": {"levels": 2, "error_signal": False},
}
# Variants whose MLP width is fitted to Harmonic's count: those with fewer levels (the parameters they drop go to the MLP).
MLP_FITTED_VARIANTS = tuple(name for name, flags in HARMONIC_VARIANTS.items() if "levels" in flags)


def _fit(make, candidates: range, target: int) -> tuple[object, int]:
    """The config among ``make(c)`` whose parameter count is closest to ``target``.

    Parameter counts grow monotonically with the fitted width, so a bisection finds the crossing.
    """
    lo, hi = 0, len(candidates) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count_parameters(make(candidates[mid])) < target:
            lo = mid
        else:
            hi = mid
    options = [make(candidates[i]) for i in (lo, hi)]
    return min(((config, count_parameters(config)) for config in options), key=lambda pair: abs(pair[1] - target))


def build_architectures(
    shape: StudyModelSection, vocab_size: int, names: list[str], max_length: int, context: int | None = None
) -> dict[str, Architecture]:
    """Configs and parameter counts of ``names`` for training at ``context`` (default
    ``max_length``, the longest sequence any model sees); baselines fitted to the Harmonic count.

    Raises ParameterMismatch when the closest fit is outside ``shape.param_tolerance``.
    """
    context = context or max_length
    target = count_parameters(harmonic_config(shape, vocab_size, context))
    archs: dict[str, Architecture] = {}
    for name in names:
        fitted = name not in HARMONIC_VARIANTS or name in MLP_FITTED_VARIANTS
        if name in MLP_FITTED_VARIANTS:
            flags, widths = HARMONIC_VARIANTS[name], range(8, 4 * shape.intermediate_size + 8)
            config, params = _fit(
                lambda w: harmonic_config(replace(shape, intermediate_size=w), vocab_size, context, **flags), widths, target
            )
        elif name in HARMONIC_VARIANTS:  # flags of one model: same count, or an option's own parameters
            config = harmonic_config(shape, vocab_size, context, **HARMONIC_VARIANTS[name])
            params = target if name == "harmonic" else count_parameters(config)
        elif name in ("transformer", "mamba-llama-layout"):  # the Llama layout, MLP width fitted
            make = transformer_config if name == "transformer" else mamba_llama_layout_config
            widths = range(8, 16 * shape.intermediate_size + 8, 8)
            config, params = _fit(lambda w: make(shape, vocab_size, w, max_length), widths, target)
        elif name == "mamba":
            widths = range(2, 4 * shape.hidden_size + 2, 2)
            config, params = _fit(lambda w: mamba_config(shape, vocab_size, w), widths, target)
        else:
            raise ValueError(f"unknown architecture {name!r}")
        if fitted and abs(params - target) > shape.param_tolerance * target:
            raise ParameterMismatch(
                f"{name}: closest size has {params:,} parameters vs Harmonic's {target:,} "
                f"({100 * (params / target - 1):+.1f}%, tolerance {100 * shape.param_tolerance:.0f}%); change the model shape"
            )
        archs[name] = Architecture(name, config, params)
    return archs
