"""Surgery: a Hallamonic student with the teacher's widths, weights and a HarmonicBlock per layer.

Everything but attention is copied bit for bit (embeddings, norms, MLPs, LM head) and frozen;
each HarmonicBlock starts from its layer's attention and is the only thing that trains (plus
optional LoRA adapters in phase 2): v_proj and o_proj always, and with the expanded state
(``state_size`` = head_dim, the default) k_proj -> the write map and q_proj -> the read map, so the
block starts as a decayed linear attention over the teacher's own queries, keys and values.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

from hallamonic.convert.recipe import HarmonicSection
from hallamonic.modeling import HallamonicConfig, HallamonicForCausalLM

T = TypeVar("T")  # a per-layer setting's value: a feature map or rule name, a band list

SUPPORTED_FAMILIES = ("llama", "mistral", "qwen2")


class UnsupportedModelError(ValueError):
    """The base model's architecture cannot be converted."""


def check_supported(teacher: nn.Module) -> None:
    model_type = getattr(teacher.config, "model_type", None)
    if model_type not in SUPPORTED_FAMILIES:
        raise UnsupportedModelError(
            f"cannot convert a `{model_type}` model: supported families are "
            f"{', '.join(SUPPORTED_FAMILIES)} (Llama, TinyLlama, SmolLM2, Llama 2/3, Mistral, Qwen2)"
        )


def student_config(teacher: nn.Module, harmonic: HarmonicSection, base_spec: str | None = None) -> HallamonicConfig:
    """The Hallamonic config that mirrors ``teacher``'s widths and vocabulary."""
    check_supported(teacher)
    tc = teacher.config
    attention_bias = bool(getattr(tc, "attention_bias", False))
    qwen2 = tc.model_type == "qwen2"
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    return HallamonicConfig(
        vocab_size=tc.vocab_size,
        hidden_size=tc.hidden_size,
        intermediate_size=tc.intermediate_size,
        num_hidden_layers=tc.num_hidden_layers,
        num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=getattr(tc, "num_key_value_heads", None) or tc.num_attention_heads,
        head_dim=head_dim,
        hidden_act=tc.hidden_act,
        rms_norm_eps=float(tc.rms_norm_eps),
        mlp_bias=bool(getattr(tc, "mlp_bias", False)),
        value_bias=True if qwen2 else attention_bias,
        output_bias=False if qwen2 else attention_bias,
        # more levels where the teacher recalls: SmolLM2's layers 20-24 fit their attention better with
        # three levels than two (evals/results/smollm2-135m-layer-swap/recall_probe.jsonl)
        timescale_bands=_per_layer(harmonic.timescale_bands, tc.num_hidden_layers, harmonic.recall_timescale_bands, harmonic.recall_layers),
        hierarchy=harmonic.hierarchy,
        error_signal=harmonic.error_signal,
        gate_rank=harmonic.gate_rank,
        predictor_rank=harmonic.predictor_rank,
        output_gate=harmonic.output_gate,
        output_gate_rank=harmonic.output_gate_rank,
        short_conv_size=harmonic.short_conv_size,
        state_size=harmonic.state_size or head_dim,
        feature_map=_feature_maps(harmonic, tc.num_hidden_layers),
        taylor_dims=harmonic.taylor_dims,
        update_rule=_per_layer(harmonic.update_rule, tc.num_hidden_layers, "delta", harmonic.delta_layers),
        recompute_mixer=harmonic.recompute_mixer,
        tie_word_embeddings=bool(getattr(tc, "tie_word_embeddings", False)),
        bos_token_id=tc.bos_token_id,
        eos_token_id=tc.eos_token_id,
        pad_token_id=tc.pad_token_id,
        base_model_name_or_path=base_spec,
        teacher_max_position_embeddings=getattr(tc, "max_position_embeddings", None),
    )


def _per_layer(default: T, layers: int, special: T, chosen: list[int]) -> T | list[T]:
    """``default`` for every layer, or one entry per layer with ``special`` in the ``chosen`` ones
    (``convert`` refuses indices past the model's layers before it builds anything)."""
    if not chosen:
        return default
    return [special if i in chosen else default for i in range(layers)]


def _feature_maps(harmonic: HarmonicSection, layers: int) -> str | list[str]:
    """``feature_map`` for every layer, with Hedgehog in ``hedgehog_layers`` and Taylor in ``taylor_layers``."""
    if not harmonic.taylor_layers:
        return _per_layer(harmonic.feature_map, layers, "hedgehog", harmonic.hedgehog_layers)
    hedgehog, taylor = set(harmonic.hedgehog_layers), set(harmonic.taylor_layers)  # disjoint (the recipe checks)
    return ["taylor" if i in taylor else "hedgehog" if i in hedgehog else harmonic.feature_map for i in range(layers)]


def is_carried_over(name: str) -> bool:
    """Student parameters that come from the teacher unchanged (everything outside the mixers)."""
    return ".mixer." not in name


@torch.no_grad()
def build_student(
    teacher: nn.Module, harmonic: HarmonicSection, *, seed: int = 0, base_spec: str | None = None
) -> HallamonicForCausalLM:
    """The student: teacher weights copied exactly, mixers initialised (from attention by default),
    everything but the mixers frozen."""
    config = student_config(teacher, harmonic, base_spec)
    torch.manual_seed(seed)
    student = HallamonicForCausalLM(config)
    dtype = next(teacher.parameters()).dtype
    student.to(dtype)

    teacher_state = teacher.state_dict()
    for name, param in student.named_parameters():
        if not is_carried_over(name):
            continue
        if name not in teacher_state:
            raise UnsupportedModelError(f"the teacher has no tensor `{name}` to copy into the student")
        source = teacher_state[name]
        if source.shape != param.shape:
            raise UnsupportedModelError(f"`{name}`: teacher shape {tuple(source.shape)} != student {tuple(param.shape)}")
        param.copy_(source)
    if config.tie_word_embeddings:
        student.tie_weights()

    if harmonic.init_from_attention:
        for student_layer, teacher_layer in zip(student.model.layers, teacher.model.layers):
            student_layer.mixer.init_from_attention(teacher_layer.self_attn)

    for name, param in student.named_parameters():
        param.requires_grad_(not is_carried_over(name))
    return student


def parameter_counts(teacher: nn.Module, student: nn.Module) -> dict[str, int]:
    unique = lambda model: sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())  # noqa: E731
    return {
        "teacher": unique(teacher),
        "student": unique(student),
        "student_trainable": sum(p.numel() for p in student.parameters() if p.requires_grad),
    }


@torch.no_grad()
def calibrate_blocks(student: HallamonicForCausalLM, teacher: nn.Module, input_ids: torch.Tensor) -> list[dict[str, float]]:
    """Data-dependent initialisation of every HarmonicBlock on a sample of real text.

    1. Level-input norms: levels above the first read RMS-normalised prediction errors (RMS 1 x
       weight). Its from-scratch init assumes a unit-RMS input to v_proj (initializer_range *
       sqrt(hidden)); a teacher's v_proj has its own scale, so the weight is set to the value
       stream's RMS measured on real text. Taylor feature maps start at the principal directions
       of the block's own keys and queries on the same text (``fit_taylor_directions``), so their
       M-dim logits keep most of q . k.
    2. Output scale: a leaky average of v is much louder than the teacher's attention output
       (heads park most of their weight on sink tokens whose values are small), so o_proj is
       scaled by the least-squares factor s = <m, y> / <m, m> between the block's output m and the
       attention output y. Phase 1 then starts no worse than predicting zeros.
    Returns per layer the value RMS, the output scale and the normalised MSE after calibration.
    """
    from hallamonic.convert.phases import capture_attention_io

    inputs, targets = capture_attention_io(teacher, input_ids)
    stats = []
    for index, (layer, x, y) in enumerate(zip(student.model.layers, inputs, targets)):
        mixer = layer.mixer
        x = x.to(mixer.v_proj.weight.dtype)
        rms = mixer.value_stream(x).float().pow(2).mean().sqrt().item()
        for norm in mixer.error_norms:
            norm.weight.fill_(rms)
        if student.config.layer_feature_map(index) == "taylor":
            mixer.fit_taylor_directions(x)
        m = mixer(x)[0].float()
        y = y.float()
        scale = (m * y).sum().item() / max((m * m).sum().item(), 1e-12)
        mixer.o_proj.weight.mul_(scale)
        if mixer.o_proj.bias is not None:
            mixer.o_proj.bias.mul_(scale)
        error = (m * scale - y).pow(2).mean().item() / max(y.pow(2).mean().item(), 1e-12)
        stats.append({"value_rms": rms, "output_scale": scale, "normalised_mse": error})
    return stats
