"""Configuration of a Hallamonic model: a Llama decoder whose attention is a HarmonicBlock.

Everything a Llama has (widths, vocabulary, norms, MLP) keeps its Llama name and meaning, so a
converted checkpoint is described by the teacher's numbers plus the HarmonicBlock's own knobs.
Values are validated here, before any weight is built: a checkpoint's config is untrusted input.
"""

from __future__ import annotations

from transformers import PreTrainedConfig

DEFAULT_TIMESCALE_BANDS = ((1.0, 16.0), (16.0, 256.0), (256.0, 4096.0))
FEATURE_MAPS = ("identity", "hedgehog", "taylor")  # how the expanded state scores write against read vectors
UPDATE_RULES = ("sum", "delta")  # how an expanded level writes: add to its state, or overwrite (delta rule)
SHORT_CONV_INITS = ("identity", "random")  # the short conv's start: the current input only, or drawn like nn.Conv1d
VALUE_ACTIVATIONS = ("identity", "silu")  # applied to the (conv-filtered) value stream before the levels


class HallamonicConfig(PreTrainedConfig):
    r"""
    Args (beyond a Llama's):
        num_attention_heads / num_key_value_heads / head_dim: the replaced attention's geometry. The
            value stream is ``v_proj`` (``num_key_value_heads * head_dim`` wide) with its GQA heads
            repeated to ``num_attention_heads * head_dim`` channels -- the HarmonicBlock's state width.
        timescale_bands: per level ``[tau_min, tau_max]`` in tokens; each level's channels start with
            time constants tau = -1/log(a) spread log-uniformly over its band (fast -> slow). A list
            with one such band list per layer sets each layer's levels (``layer_timescale_bands``):
            layers that must recall over long spans can keep more levels than the rest.
        hierarchy: ``False`` is the "no hierarchy" ablation: every level gets the union band
            ``[min tau_min, max tau_max]`` instead of its own.
        error_signal: ``False`` is the "raw states" ablation: level l+1 reads h_l instead of the
            prediction error e_l = h_{l-1} - P_l(h_l).
        gate_rank / predictor_rank / output_gate_rank: ranks of the low-rank decay gates, the
            inter-level predictors P_l and the optional output gate (default ``hidden_size // 8``,
            which keeps the block within a few percent of the attention's parameter count).
        output_gate: multiply the summed states by ``2 * sigmoid(low_rank(x))`` before ``o_proj``
            (identity at initialisation). An option beyond the seed design.
        short_conv_size: when > 0, a causal depthwise convolution of this many taps on the value
            stream before the levels -- and, with the expanded state, on the write and read vectors
            too, as Mamba's conv1d precedes its B and C (identity at initialisation; its last k-1
            inputs are carried in the recurrent state). An option beyond the seed design, like Mamba's conv1d. Padding
            must be on the left (as for generation): padded positions enter the conv as zeros.
        short_conv_init: ``"identity"`` (the default; what conversion needs: a converted block starts
            exactly as without the conv) or ``"random"``: taps drawn uniformly in +-1/sqrt(taps), as
            nn.Conv1d draws its weights and Mamba its conv1d. From scratch the random start is much
            better at a short budget (study, context 256: 2.790 vs 2.884 validation bits).
        value_activation: ``"identity"`` (the default) or ``"silu"``: u = act(conv(v)) is the
            value stream the levels read, as Mamba activates its conv's output.
        maps_from_value: the write and read vectors are linear maps of u (``state_width`` wide), not
            of x, as Mamba computes B and C from its activated conv output; only v then passes through
            the short conv. A from-scratch layout: a converted block cannot start from the teacher's
            k_proj / q_proj, which read x (``init_from_attention`` refuses it). Only with
            ``state_size`` > 1.
        value_skip: add D * u to the summed levels before ``o_proj`` (D per channel, 1 at the
            start): Mamba's D, a direct path for the filtered, activated current token.
        state_size: N, the numbers each level keeps per value channel. 1 (the default) is the diagonal
            block: one leaky average per channel, read back unchanged. N > 1 is the expanded,
            selective state: per head, every level holds a (head_dim, N) matrix written through a
            write vector k_t = ``state_write(x_t)`` (``num_key_value_heads`` heads, repeated like GQA)
            and read through q_t = ``state_read(x_t)`` (``num_attention_heads`` heads), both shared by
            the levels: y_l = S_l q_t / sqrt(N) takes h_l's place everywhere downstream. With N =
            head_dim the two maps have the shapes of the teacher's ``k_proj`` / ``q_proj``, so a
            converted block starts as a gated linear attention over the teacher's queries and keys.
        feature_map: how the expanded state scores a write vector against a read vector.
            ``"identity"`` (the default): the plain dot product q_t . k_s / sqrt(N), an unnormalised
            linear attention. ``"hedgehog"``: Hedgehog's map phi(x) = [softmax(W x), softmax(-W x)]
            per head (W learnable, identity at start; 2N features) on both vectors, and every
            level's read-out divided by the same recurrence run over ones, so each y_l is a
            weighted average of its inputs with weights decay x phi(q_t) . phi(k_s): a normalised
            linear attention that can be as peaked as softmax. Doubles the state (2N features, a
            numerator and a denominator per value channel). Only with ``state_size`` > 1. A list
            with one entry per layer sets each layer's map: a few layers that must recall can use
            Hedgehog while the rest keep the cheaper identity (``layer_feature_map``). ``"taylor"``:
            Based's second-order Taylor map, phi(q).phi(k) = 1 + s + s^2/2 with s = (W q).(W k) / sqrt(N)
            and W a learnable per-head projection to ``taylor_dims`` dims, same normalised read-out
            (1 + M + M(M+1)/2 features): sharper recall than q.k at a state of 153 features for M = 16.
        taylor_dims: M, the dims a Taylor feature map projects each query / key to (default 16).
        update_rule: how the levels of an expanded block (identity features) write. ``"sum"`` (the
            default): S_t = a_t S_{t-1} + (1 - a_t) u_t k_t^T, a decayed sum. ``"delta"``: the gated
            delta rule S_t = a_t S_{t-1} + beta_t (u_t - a_t S_{t-1} k_t) k_t^T with unit-norm k_t,
            a write strength beta_t = sigmoid(``write_strength``(x_t)) per head and one decay per
            head (the mean of its channels' log a): a write replaces what the state returned for
            k_t, so a key written again returns its new value instead of a blur of both. Layers
            with a feature map (Hedgehog, Taylor) keep the sum. Only with ``state_size`` > 1.
        recompute_mixer: in training, keep only each block's input and recompute the block in the
            backward pass (activation checkpointing of the mixer): training memory per token drops to
            a few hidden-size vectors per layer for about one extra mixer forward.
        value_bias / output_bias: biases on ``v_proj`` / ``o_proj`` (Qwen2 has a v bias); ``value_bias``
            also puts biases on ``state_write`` / ``state_read`` (Qwen2's k / q biases).
        forward_chunk_size: when > 0, forward processes long inputs in chunks of this many tokens,
            carrying the recurrent states, so activation memory depends on the chunk, not the length.
        copy_cache_orders: n-gram orders of the copy cache (``hallamonic_copy_cache.py``; empty = none):
            for each order n, the token that followed the last earlier occurrence of the current n
            tokens gets its logit raised by a learned amount gated by the model's entropy, its own
            probability of that token and whether a longer order predicts another one. Why: the blocks do not copy (evals/results/smollm2-135m-copy);
            exact-match recall over token ids does, in constant memory. An option beyond the seed
            design, fitted after conversion.
        copy_cache_buckets: entries of the cache's hash table per order (the recurrent state holds
            2 x orders x buckets int64 per sequence; collisions forget older n-grams).
        copy_cache_seen: the copy cache's context-word cue: every token already in the sequence gets
            its logit raised by softplus(c + d H + e log p + g log count), so a word the context holds
            can win where no n-gram leads to it (LAMBADA). Its state: one count per vocabulary entry.
        copy_cache_continuation: each order's gate also reads whether the copied token continues a
            word (a fifth gate column and a (V,) table from the tokenizer, saved with the weights): a
            name's second piece copied after its first is trusted more than an order-1 copy after a
            whole word.
        copy_cache_prior: the context-word cue also reads each token's log unigram frequency in the
            conversion's training text (a sixth cue number and a (V,) table saved with the weights):
            a name seen once is likelier again than a function word seen once (burstiness).
        copy_cache_rate: the context-word cue also reads q log t, t the tokens so far (one more cue
            number, no more state): with q near -g the count is read as a rate in the context, so
            the cue does not grow with length, and a word seen in a short passage is raised more.
        copy_cache_count_cap: the context-word cue reads log min(count, cap) (0 = no cap): past a
            few dozen sightings a word's count says nothing more about whether it comes next, and an
            unbounded count lets filler repeated thousands of times outbid one fact seen once.
        base_model_name_or_path: the teacher this model was converted from (for evaluations).
    """

    model_type = "hallamonic"
    keys_to_ignore_at_inference = ["cache"]

    def __init__(
        self,
        vocab_size: int = 32000,
        hidden_size: int = 2048,
        intermediate_size: int = 5632,
        num_hidden_layers: int = 22,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        hidden_act: str = "silu",
        rms_norm_eps: float = 1e-5,
        initializer_range: float = 0.02,
        mlp_bias: bool = False,
        value_bias: bool = False,
        output_bias: bool = False,
        timescale_bands=DEFAULT_TIMESCALE_BANDS,
        hierarchy: bool = True,
        error_signal: bool = True,
        gate_rank: int | None = None,
        predictor_rank: int | None = None,
        output_gate: bool = False,
        output_gate_rank: int | None = None,
        short_conv_size: int = 0,
        short_conv_init: str = "identity",
        value_activation: str = "identity",
        maps_from_value: bool = False,
        value_skip: bool = False,
        state_size: int = 1,
        feature_map: str | list[str] = "identity",
        taylor_dims: int = 16,
        update_rule: str = "sum",
        recompute_mixer: bool = False,
        forward_chunk_size: int = 0,
        copy_cache_orders: list[int] | None = None,
        copy_cache_buckets: int = 65536,
        copy_cache_seen: bool = False,
        copy_cache_continuation: bool = False,
        copy_cache_prior: bool = False,
        copy_cache_rate: bool = False,
        copy_cache_count_cap: int = 0,
        base_model_name_or_path: str | None = None,
        tie_word_embeddings: bool = False,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads if num_key_value_heads is not None else num_attention_heads
        self.head_dim = head_dim if head_dim is not None else hidden_size // max(num_attention_heads, 1)
        self.hidden_act = hidden_act
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.mlp_bias = mlp_bias
        self.value_bias = value_bias
        self.output_bias = output_bias
        self.timescale_bands = _bands(timescale_bands)
        self.hierarchy = hierarchy
        self.error_signal = error_signal
        default_rank = max(1, hidden_size // 8)
        self.gate_rank = gate_rank if gate_rank is not None else default_rank
        self.predictor_rank = predictor_rank if predictor_rank is not None else default_rank
        self.output_gate = output_gate
        self.output_gate_rank = output_gate_rank if output_gate_rank is not None else default_rank
        self.short_conv_size = short_conv_size
        self.short_conv_init = short_conv_init
        self.value_activation = value_activation
        self.maps_from_value = maps_from_value
        self.value_skip = value_skip
        self.state_size = state_size
        self.feature_map = list(feature_map) if isinstance(feature_map, (list, tuple)) else feature_map
        self.taylor_dims = taylor_dims
        self.update_rule = list(update_rule) if isinstance(update_rule, (list, tuple)) else update_rule
        self.recompute_mixer = recompute_mixer
        self.forward_chunk_size = forward_chunk_size
        self.copy_cache_orders = list(copy_cache_orders) if copy_cache_orders else []
        self.copy_cache_buckets = copy_cache_buckets
        self.copy_cache_seen = copy_cache_seen
        self.copy_cache_continuation = copy_cache_continuation
        self.copy_cache_prior = copy_cache_prior
        self.copy_cache_rate = copy_cache_rate
        self.copy_cache_count_cap = copy_cache_count_cap
        self.base_model_name_or_path = base_model_name_or_path
        self.tie_word_embeddings = tie_word_embeddings
        self.use_cache = use_cache
        self._validate_hallamonic()
        super().__init__(
            pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id, **kwargs
        )

    @property
    def layer_types(self) -> list[str]:
        """Every layer keeps a fixed-size recurrent state: generate() builds a linear-attention cache."""
        return ["linear_attention"] * self.num_hidden_layers

    def layer_feature_map(self, layer_idx: int) -> str:
        """The feature map of one layer's block: ``feature_map`` itself, or its entry for that layer."""
        return _entry(self.feature_map, layer_idx)

    def layer_update_rule(self, layer_idx: int) -> str:
        """How one layer's levels write: ``update_rule`` (or its entry for that layer), except that
        layers with a feature map (Hedgehog, Taylor) keep the sum."""
        return "sum" if self.layer_feature_map(layer_idx) != "identity" else _entry(self.update_rule, layer_idx)

    @property
    def state_width(self) -> int:
        """Channels of every level's state: the value stream after GQA heads are repeated."""
        return self.num_attention_heads * self.head_dim

    @property
    def per_layer_bands(self) -> bool:
        """Whether ``timescale_bands`` holds one band list per layer rather than one for all."""
        return _is_per_layer(self.timescale_bands)

    def layer_timescale_bands(self, layer_idx: int) -> list[list[float]]:
        """One layer's bands, one [tau_min, tau_max] per level: ``timescale_bands`` or its entry."""
        return self.timescale_bands[layer_idx] if self.per_layer_bands else self.timescale_bands

    def layer_level_bands(self, layer_idx: int) -> list[list[float]]:
        """The band each of one layer's levels is initialised in (all equal when hierarchy is off)."""
        bands = self.layer_timescale_bands(layer_idx)
        if self.hierarchy:
            return bands
        lo = min(band[0] for band in bands)
        hi = max(band[1] for band in bands)
        return [[lo, hi] for _ in bands]

    def _validate_hallamonic(self) -> None:
        def positive_int(name: str) -> None:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"HallamonicConfig: `{name}` must be a positive integer, got {value!r}")

        for name in (
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "state_size", "taylor_dims", "gate_rank", "predictor_rank", "output_gate_rank",
        ):
            positive_int(name)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"HallamonicConfig: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if not isinstance(self.short_conv_size, int) or isinstance(self.short_conv_size, bool) or self.short_conv_size < 0:
            raise ValueError(f"HallamonicConfig: `short_conv_size` must be an integer >= 0, got {self.short_conv_size!r}")
        for name, allowed in (("short_conv_init", SHORT_CONV_INITS), ("value_activation", VALUE_ACTIVATIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"HallamonicConfig: `{name}` must be one of {allowed}, got {getattr(self, name)!r}")
        for name in ("maps_from_value", "value_skip"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"HallamonicConfig: `{name}` must be true or false, got {getattr(self, name)!r}")
        if self.maps_from_value and self.state_size == 1:
            raise ValueError("HallamonicConfig: `maps_from_value` needs the expanded state (`state_size` > 1)")
        for name, allowed, plain in (("feature_map", FEATURE_MAPS, "identity"), ("update_rule", UPDATE_RULES, "sum")):
            value = getattr(self, name)
            if isinstance(value, list) and len(value) != self.num_hidden_layers:
                raise ValueError(
                    f"HallamonicConfig: a per-layer `{name}` needs one entry per layer ({self.num_hidden_layers}), got {len(value)}"
                )
            for entry in value if isinstance(value, list) else [value]:
                if entry not in allowed:
                    raise ValueError(f"HallamonicConfig: `{name}` must be one of {allowed}, got {entry!r}")
                if entry != plain and self.state_size == 1:
                    raise ValueError(f"HallamonicConfig: `{name}` {entry!r} needs the expanded state (`state_size` > 1)")
        maps = self.feature_map if isinstance(self.feature_map, list) else [self.feature_map]
        if "taylor" in maps and self.taylor_dims > self.state_size:
            raise ValueError(
                f"HallamonicConfig: `taylor_dims` ({self.taylor_dims}) cannot exceed `state_size` ({self.state_size}): "
                "a Taylor map projects each N-dim query / key down to taylor_dims"
            )
        orders = self.copy_cache_orders
        if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in orders) or len(set(orders)) != len(orders):
            raise ValueError(f"HallamonicConfig: `copy_cache_orders` must list distinct positive n-gram orders, got {orders!r}")
        if orders:
            positive_int("copy_cache_buckets")
        for name in ("copy_cache_seen", "copy_cache_continuation"):
            value = getattr(self, name)
            if not isinstance(value, bool) or (value and not orders):
                raise ValueError(f"HallamonicConfig: `{name}` must be a bool, true only with `copy_cache_orders`, got {value!r}")
        for name in ("copy_cache_prior", "copy_cache_rate"):  # terms of the context-word cue
            value = getattr(self, name)
            if not isinstance(value, bool) or (value and not self.copy_cache_seen):
                raise ValueError(f"HallamonicConfig: `{name}` must be a bool, true only with `copy_cache_seen`, got {value!r}")
        cap = self.copy_cache_count_cap
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 0 or (cap and not self.copy_cache_seen):
            raise ValueError(f"HallamonicConfig: `copy_cache_count_cap` must be an integer >= 0, > 0 only with `copy_cache_seen`, got {cap!r}")
        if not isinstance(self.forward_chunk_size, int) or self.forward_chunk_size < 0:
            raise ValueError(f"HallamonicConfig: `forward_chunk_size` must be an integer >= 0, got {self.forward_chunk_size!r}")
        if self.per_layer_bands and len(self.timescale_bands) != self.num_hidden_layers:
            raise ValueError(
                f"HallamonicConfig: a per-layer `timescale_bands` needs one band list per layer ({self.num_hidden_layers}), "
                f"got {len(self.timescale_bands)}"
            )
        for layer_bands in self.timescale_bands if self.per_layer_bands else [self.timescale_bands]:
            if len(layer_bands) < 1:
                raise ValueError("HallamonicConfig: `timescale_bands` needs at least one [tau_min, tau_max] band per layer")
            for i, (lo, hi) in enumerate(layer_bands):
                if not (1.0 <= lo <= hi) or hi != hi or hi == float("inf"):
                    raise ValueError(
                        f"HallamonicConfig: timescale band {i} must satisfy 1 <= tau_min <= tau_max < inf, got [{lo}, {hi}]"
                    )
        if not (isinstance(self.rms_norm_eps, float) and self.rms_norm_eps > 0):
            raise ValueError(f"HallamonicConfig: `rms_norm_eps` must be a positive float, got {self.rms_norm_eps!r}")


def _is_per_layer(bands) -> bool:
    """A per-layer band list nests one level deeper: its entries are lists of [lo, hi] pairs."""
    return len(bands) > 0 and isinstance(bands[0], (list, tuple)) and len(bands[0]) > 0 and isinstance(bands[0][0], (list, tuple))


def _bands(bands) -> list:
    """Bands as floats, keeping their shape: [[lo, hi], ...] or, per layer, [[[lo, hi], ...], ...]."""
    def one(layer_bands) -> list[list[float]]:
        if not all(isinstance(band, (list, tuple)) and len(band) == 2 for band in layer_bands):
            raise ValueError(f"HallamonicConfig: `timescale_bands` must hold [tau_min, tau_max] pairs, got {layer_bands!r}")
        return [[float(lo), float(hi)] for lo, hi in layer_bands]

    if not isinstance(bands, (list, tuple)):
        raise ValueError(f"HallamonicConfig: `timescale_bands` must be a list of [tau_min, tau_max] pairs, got {bands!r}")
    return [one(layer_bands) for layer_bands in bands] if _is_per_layer(bands) else one(bands)


def _entry(value: str | list[str], layer_idx: int) -> str:
    """A per-layer setting's value for one layer: the list's entry, or the one value for all."""
    return value[layer_idx] if isinstance(value, list) else value
