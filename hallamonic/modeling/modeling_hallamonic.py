"""Hallamonic: a Llama decoder whose every attention layer is a HarmonicBlock.

A HarmonicBlock is attention-free. It reads a value stream v (the replaced attention's ``v_proj``
with GQA heads repeated) and runs three diagonal recurrences, fast to slow:

    h_l(t) = a_l(t) * h_l(t-1) + (1 - a_l(t)) * u_l(t),     log a_l(t) = -softplus(gate_l(u_l(t)))

* u_1 = v; u_{l+1} = RMSNorm(e_l) with the prediction error e_l = h_{l-1} - P_l(h_l) (h_0 = v):
  higher levels integrate what lower ones failed to predict.
* Each level's gate bias starts its channels' time constants tau = -1/log(a) log-uniformly over
  its own band (default [1,16], [16,256], [256,4096] tokens).
* ``(1 - a) * u`` makes every state a leaky average: bounded at any length, no positions anywhere.
* Output: o_proj(h_1 + h_2 + h_3), optionally gated; v optionally passes a short causal conv first.

With ``state_size`` N > 1 every level's state is expanded and selective: per head a (head_dim, N)
matrix S_l(t) = a_l(t) S_l(t-1) + (1 - a_l(t)) u_l(t) ⊗ k_t, read as y_l(t) = S_l(t) q_t / sqrt(N),
where k_t = state_write(x_t) and q_t = state_read(x_t) are shared by the levels; y_l takes h_l's
place everywhere above (predictors, errors, the sum into o_proj). The current token thereby chooses
what to store and what to retrieve (``hallamonic_selective_scan.py``).

Mamba's value path, for models trained from scratch (``value_activation="silu"``,
``maps_from_value=True``, ``value_skip=True``, usually with ``short_conv_init="random"``): the
levels read u = silu(conv(v)) instead of v, k_t and q_t are linear maps of u instead of x (as
Mamba's B and C come from its activated conv output), and o_proj receives sum_l y_l + D * u (Mamba's
D). A converted block cannot start that way (the teacher's k_proj / q_proj read x); from scratch it
is what closed most of the gap to Mamba (``evals/results/study-enwik8-cpu-gap``).

With ``update_rule="delta"`` those levels overwrite instead of adding (the gated delta rule,
``hallamonic_delta_scan.py``): S_l(t) = a_l(t) S_l(t-1) + beta_t (u_l(t) - a_l(t) S_l(t-1) k_t) k_t^T
with unit-norm k_t, a write strength beta_t = sigmoid(write_strength(x_t)) per head and one decay
per head (the mean of its channels' log a), so a key written again returns its new value.

With ``feature_map="hedgehog"`` (in every layer, or per layer) both vectors pass Hedgehog's map
phi(x) = [softmax(W x), softmax(-W x)] (per head, W learnable from the identity) and each level's
read-out is divided by the same recurrence run over ones: y_l(t) = sum_s w_ts u_l(s) / sum_s w_ts
with w_ts = decay(s..t) (1 - a_s) phi(q_t).phi(k_s) > 0, a weighted average that can be as peaked
as softmax attention. The numerator and denominator run as one scan over 2 x head_dim channels
per head and 2N features. ``feature_map="taylor"`` uses Based's map instead: phi(q).phi(k) =
1 + s + s^2/2 with s = (W q).(W k) / sqrt(N), W projecting each head's query / key to
``taylor_dims`` M dims (1 + M + M(M+1)/2 features; a conversion starts W at the principal
directions of the teacher's keys and queries), with the same normalised read-out.

Optionally (``copy_cache_orders``) an exact n-gram copy cache sits on the LM head: the token that
followed the last earlier occurrence of the current n tokens gets its logit raised by a fitted
amount gated by the model's entropy, its own log-probability of that token and whether a longer
order contradicts it (``CopyCacheHead``;
tables in ``hallamonic_copy_cache.py``, carried in the generation cache). The blocks do not copy verbatim; this recalls exact repeats at any distance.
With ``copy_cache_seen`` it also raises every token already in the context, by a gate on the
model's log-probability of it and its count so far (one count per vocabulary entry carried).
With ``copy_cache_continuation`` each order's gate also reads whether the copied token continues a
word (a table over the vocabulary, built from the tokenizer at conversion and saved with the weights).

Cost is O(L) time and memory per layer in training and O(1) per generated token: generation keeps
one (batch, levels [+ conv taps - 1], channels [, N]) fp32 state per layer in a linear-attention cache
(with a feature map: 2 x channels rows of its F features).

This file is the remote code shipped inside every checkpoint: it imports only torch, transformers,
the standard library and its siblings, and does no I/O.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration_hallamonic import HallamonicConfig
from .hallamonic_copy_cache import CopyCacheState, advance_counts, context_counts, copy_predictions
from .hallamonic_delta_scan import delta_scan, delta_step
from .hallamonic_scan import scan, scan_step
from .hallamonic_selective_scan import MAX_DECAY_RATE, selective_scan, selective_step


DENOMINATOR_FLOOR = 1e-6  # a Hedgehog read-out's denominator is clamped here (it is > 0 by construction)

# --------------------------------------------------------------------------------------------
# Small building blocks
# --------------------------------------------------------------------------------------------
class HallamonicRMSNorm(nn.Module):
    """Llama's RMSNorm (computed in fp32), so teacher norms copy over unchanged."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class LevelInputNorm(HallamonicRMSNorm):
    """RMSNorm of a level's input (the previous level's prediction error).

    Its gain starts at the value stream's expected RMS, ``initializer_range * sqrt(hidden_size)``
    (v = v_proj(x) of a unit-RMS x), so every level integrates inputs on the first level's scale.
    With a gain of 1 the slow levels start 1/initializer_range/sqrt(hidden) times louder than the
    first and their near-constant states drown the token stream: from scratch on enwik8 that cost
    0.37 bits per byte (study-enwik8-cpu, context 256). Conversion re-fits the gain on real text.
    """


class HallamonicMLP(nn.Module):
    """Llama's SwiGLU MLP with Llama's parameter names (copied, frozen, from the teacher)."""

    def __init__(self, config: HallamonicConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class ZeroInitLinear(nn.Linear):
    """A Linear initialised to zero, so a low-rank branch starts as an exact no-op."""


class StateMap(nn.Linear):
    """A write (key-like) or read (query-like) map of the selective state.

    From scratch its weights start at std 1/sqrt(hidden), so on a unit-RMS input every entry of
    k_t and q_t has unit variance and q_t . k_s / sqrt(N) starts O(1), like attention's scores.
    """


class WriteStrength(nn.Linear):
    """beta_t = sigmoid(W x_t + c), one write strength per head for the delta rule.

    Starts data-independent at beta = 1/2 (W = 0, c = 0): every write moves the state halfway to
    the new value along its key, and training makes the strength depend on the token.
    """


class HedgehogFeatureMap(nn.Module):
    """phi(x) = [softmax(W_h x), softmax(-W_h x)] per head: 2N positive features (Hedgehog, LoLCATs).

    phi(q) . phi(k) is positive and, once W has grown, as peaked as softmax attention's weights, so a
    normalised read-out can pick out a few earlier tokens. W starts as the identity: the map then
    sees the teacher's own query / key. It runs in fp32 also under autocast: once W has grown the
    softmax is peaked, and bf16 logits (~3 significant digits) would move its largest weights.
    """

    def __init__(self, heads: int, size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.eye(size).repeat(heads, 1, 1))  # (h, N, N)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, L, h, N) fp32 -> (B, L, h, 2N)."""
        with torch.autocast(x.device.type, enabled=False):
            z = torch.einsum("blhn,hmn->blhm", x.float(), self.weight.float())  # (B, L, h, N)
        return torch.cat([z.softmax(-1), (-z).softmax(-1)], dim=-1)


class TaylorFeatureMap(nn.Module):
    """phi(x) = [1, z, z (x) z / sqrt 2] with z = W_h x / N^(1/4) per head (Based): phi(q) . phi(k) =
    1 + s + s^2 / 2, the second-order Taylor expansion of exp(s), s = (W q) . (W k) / sqrt(N).

    The kernel is positive (its minimum is 1/2 at s = -1) and grows like s^2, so a normalised
    read-out weighs tokens whose keys match the query far above the rest: sharper than q . k, and
    close to softmax for the moderate logits it sees most. W (M x N per head) projects the N-dim
    query / key to M dims first: 1 + M + M(M+1)/2 features (M = 16: 153), not the ~N^2 / 2 of the
    full expansion. W starts as the first M coordinates; a conversion's calibration replaces it by
    the top principal directions of the teacher's keys and queries (``principal_directions``).
    fp32 also under autocast, as Hedgehog.
    """

    def __init__(self, heads: int, size: int, dims: int):
        super().__init__()
        self.weight = nn.Parameter(torch.eye(size)[:dims].repeat(heads, 1, 1))  # (h, M, N)

    @staticmethod
    def size(dims: int) -> int:
        """Features per head for an M-dim projection."""
        return 1 + dims + dims * (dims + 1) // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, L, h, N) fp32 -> (B, L, h, 1 + M + M(M+1)/2)."""
        with torch.autocast(x.device.type, enabled=False):
            z = torch.einsum("blhn,hmn->blhm", x.float(), self.weight.float()) * x.shape[-1] ** -0.25  # (B, L, h, M)
            # The M(M+1)/2 distinct products z_i z_j, i <= j (built here, not kept as buffers: from_pretrained
            # leaves non-persistent buffers uninitialised). z_i^2 counts once, z_i z_j (i < j) twice in
            # (z . z')^2, so weights 1/sqrt 2 and 1 give the 1/2.
            rows, cols = torch.triu_indices(z.shape[-1], z.shape[-1], device=z.device)
            weight = torch.where(rows == cols, 0.5**0.5, 1.0).to(z.dtype)
            pairs = z[..., rows] * z[..., cols] * weight  # (B, L, h, M(M+1)/2)
            return torch.cat([torch.ones_like(z[..., :1]), z, pairs], dim=-1)

    @staticmethod
    @torch.no_grad()
    def principal_directions(write: torch.Tensor, read: torch.Tensor, dims: int) -> torch.Tensor:
        """The top-M eigenvectors of each kv group's second moment of keys and queries, each set
        scaled to unit mean norm: the M directions that keep most of q . k.
        write: (T, Hkv, N), read: (T, H, N) with H = G * Hkv -> (Hkv, M, N) orthonormal rows."""
        kv_heads, size = write.shape[1], write.shape[2]
        read = read.reshape(read.shape[0], kv_heads, -1, size)  # (T, Hkv, G, N)
        bases = []
        for h in range(kv_heads):
            keys, queries = write[:, h].float(), read[:, h].reshape(-1, size).float()
            both = torch.cat([keys / keys.norm(dim=-1).mean(), queries / queries.norm(dim=-1).mean()])  # (T', N)
            bases.append(torch.linalg.eigh(both.T @ both)[1][:, -dims:].T)  # (M, N), largest eigenvalues last
        return torch.stack(bases)


class TimescaleLinear(nn.Linear):
    """The up-projection of a decay gate; its bias sets the level's initial time constants.

    softplus(bias_c) = 1 / tau_c with tau_c log-uniform in [tau_min, tau_max], spread over the
    channels of every head (so each head sees every timescale), gives a_c = exp(-1/tau_c).
    """

    def __init__(self, rank: int, width: int, band: list[float], head_dim: int):
        super().__init__(rank, width, bias=True)
        self.band = (float(band[0]), float(band[1]))
        self.head_dim = head_dim

    def timescales(self) -> torch.Tensor:
        lo, hi = self.band
        position = torch.arange(self.out_features, dtype=torch.float64) % self.head_dim  # (D,)
        fraction = position / max(self.head_dim - 1, 1)
        return lo * (hi / lo) ** fraction  # (D,) tokens

    def timescale_bias(self) -> torch.Tensor:
        rate = 1.0 / self.timescales()  # softplus(bias) = 1/tau
        return torch.log(torch.expm1(rate)).float()  # inverse softplus


class LowRank(nn.Module):
    """x -> up(down(x)): a rank-r linear map whose up-projection starts at zero."""

    def __init__(self, in_features: int, rank: int, out_features: int):
        super().__init__()
        self.down = nn.Linear(in_features, rank, bias=False)
        self.up = ZeroInitLinear(rank, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.down(x))


class ShortConv(nn.Module):
    """Causal depthwise convolution over time with ``taps`` taps, identity at initialisation.

    Gives every level exact access to the last few inputs (a leaky average blurs them). Its
    last ``taps - 1`` inputs are the carried state, so chunked forward and generation match a
    single pass.
    """

    def __init__(self, channels: int, taps: int):
        super().__init__()
        self.taps = taps
        self.weight = nn.Parameter(torch.zeros(channels, taps))  # tap taps-1 multiplies the current input

    def forward(self, v: torch.Tensor, tail: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """v: (B, L, C), tail: (B, taps-1, C) earlier inputs or None -> (B, L, C) and the new tail."""
        if tail is None:
            tail = v.new_zeros(v.shape[0], self.taps - 1, v.shape[2])
        seq = torch.cat([tail.to(v.dtype), v], dim=1)  # (B, taps-1+L, C)
        out = F.conv1d(seq.transpose(1, 2), self.weight.to(v.dtype).unsqueeze(1), groups=v.shape[2])  # (B, C, L)
        return out.transpose(1, 2), seq[:, seq.shape[1] - (self.taps - 1) :]


class ValueSkip(nn.Module):
    """Mamba's D: y + D * u, a per-channel direct path for the current (filtered) value; D starts at 1."""

    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, mixed: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return mixed + self.weight.to(mixed.dtype) * value.to(mixed.dtype)


class DecayGate(nn.Module):
    """log a(t) = -softplus(up(down(u(t)))+bias) in fp32, also under autocast: in bf16, a = 0.999
    would round to 1, and the logits of a slow channel (~ -8) would be off by ~0.03."""

    def __init__(self, width: int, rank: int, band: list[float], head_dim: int):
        super().__init__()
        self.down = nn.Linear(width, rank, bias=False)
        self.up = TimescaleLinear(rank, width, band, head_dim)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        with torch.autocast(u.device.type, enabled=False):
            low = F.linear(u.float(), self.down.weight.float())  # (B, L, rank)
            z = F.linear(low, self.up.weight.float(), self.up.bias.float())  # (B, L, D)
        return -F.softplus(z)


# --------------------------------------------------------------------------------------------
# The HarmonicBlock
# --------------------------------------------------------------------------------------------
class HarmonicBlock(nn.Module):
    """Attention-free hierarchical mixer; see the module docstring for the equations."""

    def __init__(self, config: HallamonicConfig, layer_idx: int = 0):
        super().__init__()
        self.layer_idx = layer_idx
        level_bands = config.layer_level_bands(layer_idx)
        self.num_levels = len(level_bands)
        self.error_signal = config.error_signal
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.kv_groups = config.num_attention_heads // config.num_key_value_heads
        width = config.state_width

        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * config.head_dim, bias=config.value_bias)
        self.o_proj = nn.Linear(width, config.hidden_size, bias=config.output_bias)
        self.gates = nn.ModuleList(
            DecayGate(width, config.gate_rank, band, config.head_dim) for band in level_bands
        )
        self.predictors = nn.ModuleList(  # P_l maps h_l to a prediction of h_{l-1}
            LowRank(width, config.predictor_rank, width) for _ in range(self.num_levels - 1)
        )
        self.error_norms = nn.ModuleList(
            LevelInputNorm(width, config.rms_norm_eps) for _ in range(self.num_levels - 1)
        )
        self.output_gate = (
            LowRank(config.hidden_size, config.output_gate_rank, width) if config.output_gate else None
        )
        self.state_size = config.state_size
        self.maps_from_value = config.maps_from_value
        self.value_activation = config.value_activation
        self.value_skip = ValueSkip(width) if config.value_skip else None
        if config.state_size > 1:  # the expanded, selective state: shapes of k_proj / q_proj at N = head_dim
            map_input = width if config.maps_from_value else config.hidden_size  # read from u, or from x
            self.state_write = StateMap(map_input, config.num_key_value_heads * config.state_size, bias=config.value_bias)
            self.state_read = StateMap(map_input, config.num_attention_heads * config.state_size, bias=config.value_bias)
        feature_map = config.layer_feature_map(layer_idx)
        self.normalised = feature_map != "identity"  # Hedgehog and Taylor read out a weighted average
        self.delta = config.layer_update_rule(layer_idx) == "delta"
        if self.delta:
            self.write_strength = WriteStrength(config.hidden_size, config.num_attention_heads)
        if feature_map == "hedgehog":
            self.write_features = HedgehogFeatureMap(config.num_key_value_heads, config.state_size)
            self.read_features = HedgehogFeatureMap(config.num_attention_heads, config.state_size)
        elif feature_map == "taylor":
            self.write_features = TaylorFeatureMap(config.num_key_value_heads, config.state_size, config.taylor_dims)
            self.read_features = TaylorFeatureMap(config.num_attention_heads, config.state_size, config.taylor_dims)
        # Numbers per value channel and level: N, or with a feature map its F features for a
        # numerator and a denominator each (stored as 2 x head_dim rows per head). Hedgehog: F = 2N.
        self.features = {
            "identity": config.state_size,
            "hedgehog": 2 * config.state_size,
            "taylor": TaylorFeatureMap.size(config.taylor_dims),
        }[feature_map]
        kv_width = config.num_key_value_heads * config.head_dim
        # The short conv filters every stream read from x: v, and with the expanded state k and q too
        # (unless they are read from the filtered value stream).
        self.conv_widths = [kv_width]
        if config.state_size > 1 and not config.maps_from_value:
            self.conv_widths += [self.state_write.out_features, self.state_read.out_features]
        self.short_conv = ShortConv(sum(self.conv_widths), config.short_conv_size) if config.short_conv_size > 0 else None

    def value_stream(self, x: torch.Tensor) -> torch.Tensor:
        """v_proj with GQA heads repeated exactly as Llama's repeat_kv does (before any short conv)."""
        return self._repeat_kv(self.v_proj(x))

    def _repeat_kv(self, v: torch.Tensor) -> torch.Tensor:
        batch, length, _ = v.shape
        v = v.view(batch, length, self.num_kv_heads, 1, self.head_dim)  # (B, L, Hkv, 1, d)
        v = v.expand(batch, length, self.num_kv_heads, self.kv_groups, self.head_dim)  # (B, L, Hkv, G, d)
        return v.reshape(batch, length, -1)  # (B, L, D)

    @staticmethod
    def _recur(a: torch.Tensor, b: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor:
        if a.shape[1] == 1:  # one generated token: a single fused step, no scan machinery
            prev = state if state is not None else torch.zeros_like(b[:, 0])
            return scan_step(a[:, 0], b[:, 0], prev).unsqueeze(1)
        return scan(a, b, state)

    def forward(
        self,
        x: torch.Tensor,
        state: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """
        Args:
            x: (B, L, hidden) the normalised residual stream.
            state: fp32 states before x, or None for zeros: (B, levels [+ taps - 1], D) when
                ``state_size`` is 1, (B, levels [+ taps - 1], D, N) otherwise (with Hedgehog
                or Taylor features (B, levels [+ taps - 1], 2D, F): numerator and denominator rows per head). With a short conv, the
                rows after the levels hold its last inputs (first kv-width channels, state index 0).
            mask: (B, L) bool, False at padding: there the state neither decays nor takes input.
        Returns:
            y: (B, L, hidden) and the new state, shaped like ``state``.
        """
        streams = [self.v_proj(x)]  # v: (B, L, Dkv)
        if self.state_size > 1 and not self.maps_from_value:
            streams += [self.state_write(x), self.state_read(x)]  # k: (B, L, Hkv*N), q: (B, L, H*N)
        tail = None
        if self.short_conv is not None:
            joined = torch.cat(streams, dim=-1) if len(streams) > 1 else streams[0]  # (B, L, W)
            if mask is not None:  # padding enters the conv as zeros (left padding: a fresh start)
                joined = joined * mask.unsqueeze(-1).to(joined.dtype)
            joined, tail = self.short_conv(joined, self._conv_rows(state))  # (B, L, W), (B, taps-1, W)
            streams = list(joined.split(self.conv_widths, dim=-1))
        value = F.silu(streams[0]) if self.value_activation == "silu" else streams[0]
        u = self._repeat_kv(value)  # h_0 = u = act(conv(v)): (B, L, D)
        if self.state_size == 1:
            maps = None
        elif self.maps_from_value:  # Mamba's layout: B and C read the filtered, activated value stream
            maps = self._state_maps(self.state_write(u), self.state_read(u))
        else:
            maps = self._state_maps(streams[1], streams[2])
        if self.delta:
            beta = torch.sigmoid(self.write_strength(x).float())  # (B, L, H)
            if mask is not None:  # padding writes nothing
                beta = beta * mask.unsqueeze(-1)
            maps = (*maps, beta)
        below = level_input = u
        total = None
        finals = []
        for level, gate in enumerate(self.gates):
            log_a = gate(level_input)  # (B, L, D) fp32
            h, final = self._level(log_a, level_input, maps, state[:, level] if state is not None else None, mask)
            finals.append(final)
            total = h if total is None else total + h
            if level + 1 < self.num_levels:
                h_low = h.to(x.dtype)
                signal = below - self.predictors[level](h_low) if self.error_signal else h_low
                below, level_input = h_low, self.error_norms[level](signal)
        mixed = total.to(x.dtype)  # (B, L, D)
        if self.value_skip is not None:
            mixed = self.value_skip(mixed, u)
        if self.output_gate is not None:
            mixed = mixed * (2.0 * torch.sigmoid(self.output_gate(x)))
        new_state = torch.stack(finals, dim=1)  # (B, levels, D [, N]) fp32
        if tail is not None:  # the conv's last inputs, flattened into rows shaped like a level's state
            rows = new_state.new_zeros(new_state.shape[0], tail.shape[1], *new_state.shape[2:])
            rows.view(*rows.shape[:2], -1)[..., : tail.shape[-1]] = tail.float()
            new_state = torch.cat([new_state, rows], dim=1)
        return self.o_proj(mixed), new_state

    def _conv_rows(self, state: torch.Tensor | None) -> torch.Tensor | None:
        """The short conv's carried inputs (B, taps-1, W) from the rows after the levels."""
        if state is None:
            return None
        rows = state[:, self.num_levels :]
        return rows.reshape(*rows.shape[:2], -1)[..., : sum(self.conv_widths)]

    def _state_maps(self, write: torch.Tensor, read: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write and read vectors of every head, shared by the levels: (B, L, H, F) each, fp32
        (F = N, 2N Hedgehog or 1 + M + M(M+1)/2 Taylor features). Write vectors have the kv heads' count and are repeated
        like GQA keys."""
        batch, length, _ = write.shape
        write = write.float().view(batch, length, self.num_kv_heads, self.state_size)  # (B, L, Hkv, N)
        read = read.float().view(batch, length, -1, self.state_size)  # (B, L, H, N)
        if self.normalised:
            write, read = self.write_features(write), self.read_features(read)  # (B, L, *, F)
        else:
            read = read * self.state_size**-0.5
        if self.delta:  # the delta rule overwrites along unit keys
            write = F.normalize(write, dim=-1)
        features = write.shape[-1]
        write = write.unsqueeze(3).expand(-1, -1, -1, self.kv_groups, -1).reshape(batch, length, -1, features)
        return write, read

    def _level(self, log_a, level_input, maps, state, mask) -> tuple[torch.Tensor, torch.Tensor]:
        """One level's recurrence: its outputs (B, L, D) fp32 and final state (B, D [, N]) fp32
        (with a feature map (B, 2D, F): per head the numerator rows, then the denominator rows)."""
        if maps is not None:
            log_a = log_a.clamp_min(-MAX_DECAY_RATE)  # the chunked path's range (a >= 0.05)
        if mask is not None:  # padding: a = 1, b = 0, the state passes through unchanged
            log_a = torch.where(mask.unsqueeze(-1), log_a, torch.zeros_like(log_a))
        if self.delta:
            return self._delta_level(log_a, level_input, maps, state)
        rate = -torch.expm1(log_a)  # 1 - a, exact for a near 1 (0 at padding): (B, L, D)
        b = rate * level_input.float()  # (B, L, D)
        if maps is None:  # state_size 1: h itself is the output
            h = self._recur(log_a.exp(), b, state)  # (B, L, D) fp32
            return h, h[:, -1]
        batch, length, width = b.shape
        heads = width // self.head_dim
        split = lambda t: t.view(batch, length, heads, -1)  # noqa: E731 - (B, L, H, P)
        b, log_a = split(b), split(log_a)
        if self.normalised:  # a second P channels per head: the same recurrence over ones
            b = torch.cat([b, split(rate)], dim=-1)  # (B, L, H, 2P)
            log_a = torch.cat([log_a, log_a], dim=-1)  # (B, L, H, 2P)
        write, read = maps
        rows = b.shape[-1]
        prev = state.view(batch, heads, rows, self.features) if state is not None else None
        if length == 1:  # one generated token: a single step, no chunk machinery
            if prev is None:
                prev = b.new_zeros(batch, heads, rows, self.features)
            new, y = selective_step(b[:, 0], log_a[:, 0], write[:, 0], read[:, 0], prev)
            y = y.unsqueeze(1)
        else:
            y, new = selective_scan(b, log_a, write, read, prev)  # (B, L, H, rows), (B, H, rows, F)
        if self.normalised:  # numerator / denominator: a weighted average of the level's inputs
            y = y[..., : self.head_dim] / y[..., self.head_dim :].clamp_min(DENOMINATOR_FLOOR)
        return y.reshape(batch, length, width), new.reshape(batch, heads * rows, self.features)

    def _delta_level(self, log_a, level_input, maps, state) -> tuple[torch.Tensor, torch.Tensor]:
        """One level under the gated delta rule: (B, L, D) fp32 outputs and (B, D, N) final state."""
        batch, length, width = level_input.shape
        heads = width // self.head_dim
        write, read, beta = maps  # (B, L, H, N) unit rows, (B, L, H, N), (B, L, H)
        head_log_a = log_a.view(batch, length, heads, self.head_dim).mean(-1)  # (B, L, H): one decay per head
        values = level_input.float().view(batch, length, heads, self.head_dim)  # (B, L, H, P)
        prev = state.view(batch, heads, self.head_dim, self.state_size) if state is not None else None
        if length == 1:  # one generated token
            if prev is None:
                prev = values.new_zeros(batch, heads, self.head_dim, self.state_size)
            new, y = delta_step(values[:, 0], head_log_a[:, 0], write[:, 0], read[:, 0], beta[:, 0], prev)
            y = y.unsqueeze(1)
        else:
            y, new = delta_scan(values, head_log_a, write, read, beta, prev)  # (B, L, H, P), (B, H, P, N)
        return y.reshape(batch, length, width), new.reshape(batch, width, self.state_size)

    # ---- initialisation from the attention this block replaces ----------------------------
    @torch.no_grad()
    def fit_taylor_directions(self, x: torch.Tensor) -> None:
        """Start a Taylor block's projections at the principal directions of its own keys and
        queries on real text x (B, L, hidden), so the M-dim s keeps most of the teacher's q . k
        (``TaylorFeatureMap.principal_directions``): each kv group's basis goes to its write map and
        to the read maps of its G query heads. Called by a conversion's calibration."""
        if not isinstance(getattr(self, "write_features", None), TaylorFeatureMap):
            raise ValueError("fit_taylor_directions: this block has no Taylor feature map")
        write = self.state_write(x).float().reshape(-1, self.num_kv_heads, self.state_size)  # (T, Hkv, N)
        read = self.state_read(x).float().reshape(-1, self.num_kv_heads * self.kv_groups, self.state_size)  # (T, H, N)
        bases = TaylorFeatureMap.principal_directions(write, read, self.write_features.weight.shape[1])  # (Hkv, M, N)
        self.write_features.weight.copy_(bases)
        self.read_features.weight.copy_(bases.repeat_interleave(self.kv_groups, dim=0))  # (H, M, N)

    @torch.no_grad()
    def init_from_attention(self, attention: nn.Module) -> None:
        """Copy v_proj and o_proj from a Llama/Mistral/Qwen2 attention module (GQA kept as is:
        the value stream repeats kv heads at run time exactly like ``repeat_kv``); with the expanded
        state also k_proj -> ``state_write`` and q_proj -> ``state_read`` (no RoPE), so the block
        starts as a decayed linear attention over the teacher's own queries, keys and values."""
        if self.maps_from_value:
            raise ValueError(
                "init_from_attention: this block reads its write/read vectors from the value stream "
                "(maps_from_value), so it cannot start from the teacher's k_proj / q_proj; convert with maps_from_value false"
            )
        pairs = [("v_proj", "v_proj"), ("o_proj", "o_proj")]
        if self.state_size > 1:
            pairs += [("k_proj", "state_write"), ("q_proj", "state_read")]
        for source_name, target_name in pairs:
            source, target = getattr(attention, source_name), getattr(self, target_name)
            if source.weight.shape != target.weight.shape:
                hint = " (the expanded state starts from the teacher's keys and queries only when state_size == head_dim)"
                raise ValueError(
                    f"init_from_attention: {source_name} has shape {tuple(source.weight.shape)}, "
                    f"the HarmonicBlock's {target_name} expects {tuple(target.weight.shape)}"
                    + (hint if target_name.startswith("state_") else "")
                )
            target.weight.copy_(source.weight)
            if target.bias is not None:
                if source.bias is None:
                    target.bias.zero_()
                else:
                    target.bias.copy_(source.bias)
        if self.value_skip is not None:  # D = 0: the converted block starts as the linear attention alone
            self.value_skip.weight.zero_()


# --------------------------------------------------------------------------------------------
# Decoder layer and models
# --------------------------------------------------------------------------------------------
RECOMPUTE_SEGMENT = 2048  # tokens per recomputed piece of a mixer (``recompute_mixer``)


class HallamonicDecoderLayer(GradientCheckpointingLayer):
    """Llama's pre-norm layer with the attention replaced by a HarmonicBlock named ``mixer``."""

    def __init__(self, config: HallamonicConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = HallamonicRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mixer = HarmonicBlock(config, layer_idx)
        self.recompute_mixer = config.recompute_mixer
        self.post_attention_layernorm = HallamonicRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = HallamonicMLP(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        state: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        normed = self.input_layernorm(hidden_states)
        if self.recompute_mixer and self.training and torch.is_grad_enabled():
            mixed, new_state = self._recomputed_mixer(normed, state, mask)
        else:
            mixed, new_state = self.mixer(normed, state, mask)
        hidden_states = hidden_states + mixed
        hidden_states = hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states, new_state

    def _recomputed_mixer(self, x, state, mask):
        """The mixer under activation checkpointing, one segment of RECOMPUTE_SEGMENT tokens at a
        time with the state carried: only the block's input is kept, and the backward rebuilds one
        segment's activations at a time, so even its transient memory is bounded by the segment."""
        outputs = []
        for start in range(0, x.shape[1], RECOMPUTE_SEGMENT):
            part = mask[:, start : start + RECOMPUTE_SEGMENT] if mask is not None else None
            y, state = checkpoint(self.mixer, x[:, start : start + RECOMPUTE_SEGMENT], state, part, use_reentrant=False)
            outputs.append(y)
        return (outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)), state


class HallamonicPreTrainedModel(PreTrainedModel):
    config_class = HallamonicConfig
    config: HallamonicConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["HallamonicDecoderLayer"]
    _supports_sdpa = False
    _is_stateful = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, ShortConv):
            if self.config.short_conv_init == "random":  # as nn.Conv1d draws a depthwise conv (fan-in = taps)
                bound = module.weight.shape[-1] ** -0.5
                init.uniform_(module.weight, -bound, bound)
            else:
                identity = torch.zeros_like(module.weight)
                identity[:, -1] = 1.0  # the current input only: a converted block starts exactly as without it
                init.copy_(module.weight, identity)
        elif isinstance(module, ValueSkip):
            init.ones_(module.weight)
        elif isinstance(module, TimescaleLinear):
            init.zeros_(module.weight)  # gates start data-independent, at their band's timescales
            init.copy_(module.bias, module.timescale_bias())
        elif isinstance(module, HedgehogFeatureMap):
            init.copy_(module.weight, torch.eye(module.weight.shape[-1]).expand_as(module.weight))
        elif isinstance(module, TaylorFeatureMap):  # the first M coordinates
            heads, dims, size = module.weight.shape
            init.copy_(module.weight, torch.eye(size)[:dims].expand(heads, dims, size))
        elif isinstance(module, WriteStrength):
            init.zeros_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, StateMap):
            init.normal_(module.weight, mean=0.0, std=module.in_features**-0.5)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, ZeroInitLinear):
            init.zeros_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, LevelInputNorm):
            init.constant_(module.weight, std * math.sqrt(self.config.hidden_size))
        elif isinstance(module, HallamonicRMSNorm):
            init.ones_(module.weight)
        elif isinstance(module, CopyCacheHead):
            init.copy_(module.gate, torch.tensor([COPY_CACHE_GATE_INIT[: module.gate.shape[1]]] * module.gate.shape[0]))
            if module.seen_gate is not None:
                init.copy_(module.seen_gate, torch.tensor(COPY_CACHE_SEEN_INIT[: module.seen_gate.shape[0]]))


class HallamonicModel(HallamonicPreTrainedModel):
    def __init__(self, config: HallamonicConfig):
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList(HallamonicDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = HallamonicRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.embed_tokens = value

    @staticmethod
    def _read_states(cache: Cache | None, num_layers: int) -> list[torch.Tensor | None]:
        if cache is None:
            return [None] * num_layers
        states = []
        for i in range(num_layers):
            layer = cache.layers[i]
            initialized = getattr(layer, "is_recurrent_states_initialized", {}).get(0, False)
            states.append(layer.recurrent_states[0] if initialized else None)
        return states

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        chunk_size: int | None = None,
        keep_last: int = 0,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """Run the stack; with a ``cache`` the recurrent states continue from where it left off.

        ``keep_last=k`` returns only the last k positions' hidden states (0 = all).

        ``chunk_size`` (default ``config.forward_chunk_size``; 0 = whole input at once) processes
        the input in chunks of that many tokens through all layers, carrying the states, so that
        activation memory is bounded by the chunk, not the length. Results equal the one-shot pass.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("HallamonicModel: pass exactly one of `input_ids` or `inputs_embeds`")
        length = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        output_hidden_states = bool(output_hidden_states)

        mask = None
        if attention_mask is not None:
            if attention_mask.dim() != 2:
                raise ValueError("HallamonicModel: `attention_mask` must be 2-D (batch, length) with 1 = token, 0 = padding")
            mask = attention_mask[:, -length:].bool()  # generate() passes the whole history
            if bool(mask.all()):
                mask = None

        states = self._read_states(cache, len(self.layers))
        chunk = chunk_size if chunk_size is not None else self.config.forward_chunk_size
        chunk = chunk if chunk and chunk > 0 else length
        first_kept = length - keep_last if 0 < keep_last < length else 0
        outputs, all_hidden = [], []
        for start in range(0, length, chunk):
            # Embedding chunk by chunk keeps memory bounded by the chunk, not the input length.
            if inputs_embeds is not None:
                hidden = inputs_embeds[:, start : start + chunk]
            else:
                hidden = self.embed_tokens(input_ids[:, start : start + chunk])  # (B, C, H)
            chunk_mask = mask[:, start : start + chunk] if mask is not None else None
            layer_hidden = [hidden] if output_hidden_states else None
            for i, layer in enumerate(self.layers):
                hidden, states[i] = layer(hidden, states[i], chunk_mask)
                if output_hidden_states:
                    layer_hidden.append(hidden)
            if start + hidden.shape[1] > first_kept:  # only the positions the caller asked for
                outputs.append(self.norm(hidden[:, max(first_kept - start, 0) :]))
            if output_hidden_states:
                all_hidden.append(layer_hidden)
        last_hidden = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)  # (B, L', H)

        if use_cache:
            for i, state in enumerate(states):
                cache.update_recurrent_state(state, i)
                cache.layers[i].has_previous_state[0] = True
        hidden_states = None
        if output_hidden_states:
            hidden_states = tuple(
                torch.cat([chunk_states[j] for chunk_states in all_hidden], dim=1)
                for j in range(len(self.layers) + 1)
            )
        return BaseModelOutputWithPast(
            last_hidden_state=last_hidden, cache=cache if use_cache else None, hidden_states=hidden_states
        )


# --------------------------------------------------------------------------------------------
# Copy cache (optional): exact n-gram recall over token ids on top of the LM head
# --------------------------------------------------------------------------------------------
COPY_CACHE_GATE_INIT = (-10.0, 0.0, 0.0, 0.0, 0.0)  # softplus(-10) = 5e-5 nats: off until fitted
COPY_CACHE_LOGP_FLOOR = -30.0  # log p below this reads as this: no boost grows without bound
COPY_CACHE_SEEN_INIT = (-10.0, 0.0, 0.0, 0.0, 0.0, 0.0)  # the context-word cue (c, d, e, g[, h][, q]): off until fitted


class CopyCacheHead(nn.Module):
    """Raises, for each order n, the logit of the token v_n the copy cache predicts by

        beta_n(t) = softplus(a_n + b_n H_t + f_n log p_t(v_n) + o_n [a longer order predicts another token]),

    H_t the entropy (nats) of the model's own next-token distribution p_t and log p_t(v_n) its own
    log-probability of the copied token. Why these cues: how far to trust an exact earlier match depends
    on how sure the model is, and on whether it already expects the token. Fitted on SmolLM2, f_n < 0:
    a copied token the model finds unlikely (a name, a number) is raised more, as an interpolated
    cache LM would (f_n = -1 makes the token's probability independent of the model's);
    the log-probability term alone took the held-out bits from 5.416 to 5.386 and passkey from
    4-6/10 to 5-8/10. The last term is a soft PPM backoff: a short context whose token a longer
    matching context contradicts (after "... is", order 1 recalls " the" where orders 2-4 recall
    the pass key's first digit) is raised less, o_n -> -inf dropping it
    (evals/results/smollm2-135m-induction-cache). ``gate`` (orders, 4) holds (a_n, b_n, f_n, o_n);
    a conversion fits it on text no phase trained on.

    With ``vocab_size`` (``copy_cache_continuation``) the gate has a fifth column, + w_n [v_n
    continues a word]: after a word's first piece (" Kar") its earlier spelling ("ou") is the best
    guess, where an order-1 copy after a whole word (" the") is not; ``continues_word`` (V,) says
    which tokens continue a word (built from the tokenizer by the conversion, saved as a weight).

    With ``prior_size`` (``copy_cache_prior``) the context-word cue reads a fifth number, + h log
    prior(v), the token's log unigram frequency in the conversion's training text (``log_prior``
    (V,), saved as a weight): see ``seen_boosts``. With ``rate`` (``copy_cache_rate``) it reads one more,
    + q log t, t the tokens so far; with ``count_cap`` (``copy_cache_count_cap``) it reads counts up to that cap."""

    def __init__(
        self, orders: list[int], seen: bool = False, vocab_size: int | None = None, prior_size: int | None = None, rate: bool = False,
        count_cap: int = 0,
    ):
        super().__init__()
        self.orders = list(orders)  # a list, not a buffer: nothing for loading on the meta device to leave uninitialised
        columns = len(COPY_CACHE_GATE_INIT) if vocab_size else len(COPY_CACHE_GATE_INIT) - 1
        self.gate = nn.Parameter(torch.tensor([COPY_CACHE_GATE_INIT[:columns]] * len(orders)))  # (K, 4 or 5)
        if (prior_size or rate) and not seen:
            raise ValueError("CopyCacheHead: the prior and the rate are terms of the context-word cue; they need seen=True")
        if count_cap and not seen:
            raise ValueError("CopyCacheHead: the count cap is the context-word cue's; it needs seen=True")
        self.rate, self.count_cap = rate, count_cap
        # The context-word cue (``copy_cache_seen``): (c, d, e, g[, h][, q]), see ``seen_boosts``.
        seen_init = COPY_CACHE_SEEN_INIT[: 4 + bool(prior_size) + rate]
        self.seen_gate = nn.Parameter(torch.tensor(seen_init)) if seen else None  # (4 to 6,)
        # Tables saved with the weights (a checkpoint always holds them), so loading fills them.
        self.register_buffer("continues_word", torch.zeros(vocab_size, dtype=torch.bool) if vocab_size else None)  # (V,)
        self.register_buffer("log_prior", torch.zeros(prior_size) if prior_size else None)  # (V,)

    def continuation(self, predictions: torch.Tensor) -> torch.Tensor | None:
        """(..., K) float: 1 where the predicted token continues a word (None without the table)."""
        if self.continues_word is None:
            return None
        return (self.continues_word[predictions.clamp(min=0)] & (predictions >= 0)).float()

    @staticmethod
    def entropy(logits: torch.Tensor) -> torch.Tensor:
        """(...) entropy in nats of the next-token distributions of logits (..., V), in fp32."""
        log_p = torch.log_softmax(logits.float(), dim=-1)
        return -(log_p.exp() * log_p).sum(-1)

    def overruled(self, predictions: torch.Tensor) -> torch.Tensor:
        """(..., K) bool: order k predicts a token and some longer order predicts a different one."""
        order = torch.tensor(self.orders, device=predictions.device)
        longer = order[None, :] > order[:, None]  # (K, K): [k, j] order j is longer than order k
        valid = predictions >= 0  # (..., K)
        differ = predictions[..., :, None] != predictions[..., None, :]  # (..., K, K): [k, j]
        return valid & (differ & valid[..., None, :] & longer).any(-1)

    def boosts(
        self, entropy: torch.Tensor, log_p: torch.Tensor, overruled: torch.Tensor, continues: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(..., K) per-order boosts at positions whose entropy is (...), whose log-probabilities
        of the K predicted tokens are (..., K), whose overruled orders are (..., K) and, with the
        fifth gate column, whose predicted tokens continue a word (..., K) (``continuation``)."""
        a, b, f, o = self.gate[:, :4].unbind(-1)  # (K,) each
        log_p = log_p.float().clamp(min=COPY_CACHE_LOGP_FLOOR)
        x = a + b * entropy[..., None].float() + f * log_p + o * overruled.float()
        if self.gate.shape[1] > 4:
            x = x + self.gate[:, 4] * continues
        return F.softplus(x)

    def seen_boosts(
        self, entropy: torch.Tensor, log_p: torch.Tensor, counts: torch.Tensor, log_prior: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(..., S) boosts of tokens already in the context, at positions whose entropy is (...), for
        tokens whose log-probabilities and counts so far are (..., S) (0 where a count is 0):

            gamma_t(v) = softplus(c + d H_t + e log p_t(v) + g log min(count_t(v), cap) [+ h log prior(v)] [+ q log t]),

        the prior's term with the prior: its (..., S) values given, else the (V,) table (S = V); the
        last with the rate, t = the counts' sum, the tokens so far (every one of them is in a slot).

        Why: LAMBADA's target word occurs earlier in most passages, but rarely after the same token
        (evals/results/smollm2-135m-induction-cache/seen_probe.py): the n-gram orders cannot find it,
        a cue on every context word can. Reading log p and the count lets the fit choose which words
        to raise: on SmolLM2 e, g < 0, the unlikely ones seen few times (LAMBADA 0.177 -> 0.190).
        The prior tells a bursty word (a name: rare overall, so seen once it is likely again) from a
        function word the model already weighs: fitted h < 0 (evals/results/smollm2-135m-induction-cache/prior_probe.py).
        Fitted on 4,096-token windows a cue of fixed strength is an average over their positions; the
        rate lets it weaken as the context grows (fitted q = -0.24 / -0.35 against g = +0.76 / +0.61 on
        two SmolLM2 runs: more sightings still raise a word, but less per sighting late in a long text)
        and so be stronger in a short passage (LAMBADA).
        The cap (none at 0) bounds what a count can add: passkey's filler words, seen 167 times in 4K
        tokens, outbid the key's first token, seen twice, without it."""
        c, d, e, g = self.seen_gate[:4].unbind()
        x = c + d * entropy[..., None].float() + e * log_p.float().clamp(min=COPY_CACHE_LOGP_FLOOR)
        x = x + g * counts.float().clamp(min=1, max=self.count_cap or None).log()
        if self.log_prior is not None:
            x = x + self.seen_gate[4] * (self.log_prior if log_prior is None else log_prior)
        if self.rate:
            x = x + self.seen_gate[-1] * counts.sum(-1, keepdim=True).float().clamp(min=1).log()  # (..., 1): log t
        return F.softplus(x) * (counts > 0)

    def forward(self, logits: torch.Tensor, predictions: torch.Tensor, counts: torch.Tensor | None = None) -> torch.Tensor:
        """logits (B, S, V), the cache's (B, S, K) predicted ids (-1 = none) and, with the
        context-word cue, the (B, S, V) counts of each token so far -> fp32 logits."""
        logits = logits.float()
        log_p = torch.log_softmax(logits, dim=-1)  # (B, S, V)
        entropy = -(log_p.exp() * log_p).sum(-1)  # (B, S)
        tokens = predictions.clamp(min=0)  # (B, S, K)
        boost = self.boosts(entropy, log_p.gather(-1, tokens), self.overruled(predictions), self.continuation(predictions))
        boost = boost * (predictions >= 0)
        out = logits.scatter_add(-1, tokens, boost)  # orders agreeing on a token add up
        if self.seen_gate is not None:
            if counts is None:
                raise ValueError("CopyCacheHead: the context-word cue needs the counts of the tokens so far")
            out = out + self.seen_boosts(entropy, log_p, counts)
        return out


def _copy_cache_layer(cache: Cache):
    """The cache layer whose second recurrent slot holds the copy cache's state (layer 0's).

    Why there: transformers' linear-attention cache layers already reorder (beam search), reset and
    move every slot they own, so the tables follow the batch like the blocks' states do."""
    layer = cache.layers[0]
    if layer.number_of_states < 2:
        layer.number_of_states = 2
        for slots, empty in (
            (layer.conv_states, None), (layer.recurrent_states, None), (layer.conv_kernel_size, None),
            (layer.is_conv_states_initialized, False), (layer.is_recurrent_states_initialized, False),
            (layer.has_previous_state, False),
        ):
            slots.setdefault(1, empty)
    return layer


def _pack_copy_state(state: CopyCacheState, counts: torch.Tensor | None = None) -> torch.Tensor:
    """(B, R + 2 K M [+ V]) int64, every id + 1 so that a zeroed (reset) slot reads as empty; the
    context-word cue's (B, V) counts, when there are any, at the end."""
    batch = state.tail.shape[0]
    parts = [state.tail, state.keys.reshape(batch, -1), state.successors.reshape(batch, -1)]
    return torch.cat(parts + ([counts] if counts is not None else []), dim=1) + 1


def _unpack_copy_state(packed: torch.Tensor, orders: int, buckets: int, vocab: int = 0) -> tuple[CopyCacheState, torch.Tensor | None]:
    """The state and the (B, V) counts (None when vocab is 0: no context-word cue)."""
    values = packed - 1
    counts = values[:, values.shape[1] - vocab :].clamp(min=0) if vocab else None  # a reset slot reads -1: none
    values = values[:, : values.shape[1] - vocab]
    width = values.shape[1] - 2 * orders * buckets
    tables = values[:, width:].reshape(values.shape[0], 2, orders, buckets)
    return CopyCacheState(values[:, :width], tables[:, 0], tables[:, 1]), counts


class HallamonicForCausalLM(HallamonicPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: HallamonicConfig):
        super().__init__(config)
        self.model = HallamonicModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.copy_cache = (
            CopyCacheHead(
                config.copy_cache_orders, config.copy_cache_seen,
                config.vocab_size if config.copy_cache_continuation else None,
                config.vocab_size if config.copy_cache_prior else None,
                getattr(config, "copy_cache_rate", False),
                getattr(config, "copy_cache_count_cap", 0),
            )
            if config.copy_cache_orders
            else None
        )
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.lm_head = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache: Cache | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        logits_to_keep: int = 0,
        chunk_size: int | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Next-token logits (and the shifted cross-entropy when ``labels`` are given; -100 ignored).

        ``logits_to_keep=k`` computes logits for the last k positions only (0 = all): at 64K tokens
        full-vocabulary logits would dwarf the model's own activations.
        """
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            cache=cache,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            chunk_size=chunk_size,
            keep_last=logits_to_keep,
        )
        hidden = outputs.last_hidden_state  # (B, logits_to_keep or L, H)
        logits = self.lm_head(hidden)  # (B, L', V)
        if self.copy_cache is not None:  # continues from a given cache's tables; updates them when the trunk updates its states
            tables = outputs.cache if outputs.cache is not None else cache
            tokens = self._copy_cache_tokens(input_ids, attention_mask)
            state, carried = self._copy_cache_state(tables)  # unpacked once: the counts and the predictions read it
            kept = logits.shape[1]
            counts = None
            if self.config.copy_cache_seen:
                counts = context_counts(tokens, self.config.vocab_size, tokens.shape[1] - kept, None, carried)
            predictions = self._advance_copy_cache(tokens, state, carried, tables if outputs.cache is not None else None)
            logits = self.copy_cache(logits, predictions[:, -kept:], counts)  # predictions: (B, L, K)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                labels[:, -logits.shape[1] :][:, 1:].reshape(-1),
                ignore_index=-100,
            )
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, cache=outputs.cache, hidden_states=outputs.hidden_states
        )

    def _copy_cache_tokens(self, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """input_ids with padding (mask 0) as -1: padding forms no n-grams and is not counted."""
        if input_ids is None:
            raise ValueError("HallamonicForCausalLM: the copy cache reads token ids; pass `input_ids`, not `inputs_embeds`")
        if attention_mask is not None:
            return torch.where(attention_mask[:, -input_ids.shape[1] :].bool(), input_ids, -1)
        return input_ids

    def _copy_cache_state(self, cache: Cache | None) -> tuple[CopyCacheState | None, torch.Tensor | None]:
        """The copy cache's tables and counts carried in ``cache`` (None, None before the first chunk)."""
        if cache is None:
            return None, None
        layer = _copy_cache_layer(cache)
        if not layer.is_recurrent_states_initialized[1]:
            return None, None
        config = self.config
        vocab = config.vocab_size if config.copy_cache_seen else 0
        return _unpack_copy_state(layer.recurrent_states[1], len(config.copy_cache_orders), config.copy_cache_buckets, vocab)

    def copy_cache_predictions(
        self,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        update: bool = True,
    ) -> torch.Tensor:
        """(B, L, K) the copy cache's predicted next ids for input_ids (-1 = none), continuing from
        ``cache``'s tables when one is given (and, with ``update``, writing them back, with the
        context-word cue's counts advanced too). Padding (mask 0) forms no n-grams."""
        tokens = self._copy_cache_tokens(input_ids, attention_mask)
        state, counts = self._copy_cache_state(cache)
        return self._advance_copy_cache(tokens, state, counts, cache if update else None)

    def _advance_copy_cache(
        self, tokens: torch.Tensor, state: CopyCacheState | None, counts: torch.Tensor | None, cache: Cache | None
    ) -> torch.Tensor:
        """(B, L, K) predictions for tokens from the carried state; with ``cache``, the advanced
        tables (and the context-word cue's counts) are written back into it."""
        config = self.config
        predictions, state = copy_predictions(tokens, config.copy_cache_orders, config.copy_cache_buckets, state)
        if cache is not None:
            if config.copy_cache_seen:
                if counts is None:
                    counts = torch.zeros(tokens.shape[0], config.vocab_size, dtype=torch.long, device=tokens.device)
                counts = advance_counts(counts, tokens)
            cache.update_recurrent_state(_pack_copy_state(state, counts), 0, state_idx=1)
        return predictions

    def copy_cache_counts(
        self,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        start: int = 0,
        stop: int | None = None,
    ) -> torch.Tensor:
        """(B, stop - start, V) how many times each token has occurred up to each position
        start .. stop-1 of input_ids, counting what ``cache`` carries from earlier chunks (the
        context-word cue's input; it does not advance the cache: copy_cache_predictions does)."""
        tokens = self._copy_cache_tokens(input_ids, attention_mask)
        _, carried = self._copy_cache_state(cache)
        return context_counts(tokens, self.config.vocab_size, start, stop, carried)


HallamonicConfig.register_for_auto_class()
HallamonicModel.register_for_auto_class("AutoModel")
HallamonicForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = [
    "HallamonicConfig",
    "HallamonicForCausalLM",
    "HallamonicModel",
    "HallamonicPreTrainedModel",
    "HarmonicBlock",
]
