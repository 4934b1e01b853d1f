"""The Hallamonic HF model: equivalences between forward paths, generation, caching, ablations."""

from __future__ import annotations

import math

import pytest
import torch

from hallamonic.modeling import HallamonicConfig, HallamonicForCausalLM, HarmonicBlock
from hallamonic.modeling.modeling_hallamonic import TaylorFeatureMap


# Mamba's data path from scratch: u = silu(conv(v)), B / C (write / read) and the gates read u, D skip.
MAMBA_VALUE_PATH = {"short_conv_init": "random", "value_activation": "silu", "maps_from_value": True, "value_skip": True}


def tiny_config(**overrides) -> HallamonicConfig:
    values = dict(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
        bos_token_id=0, eos_token_id=1, pad_token_id=0,
    )
    values.update(overrides)
    return HallamonicConfig(**values)


def stateful_model(seed: int = 0, **overrides) -> HallamonicForCausalLM:
    """A tiny model whose mixers matter: random perturbations of every weight, mixers scaled up.

    A freshly initialised tiny model with tied embeddings mostly predicts from the current token,
    so tests of state handling would pass even with a broken state. Perturbing the zero-initialised
    branches and scaling the mixers makes the recurrent state drive the logits.
    """
    torch.manual_seed(seed)
    model = HallamonicForCausalLM(tiny_config(**overrides)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".mixer." in name and not name.endswith("up.bias"):  # keep the timescales
                param.add_(torch.randn_like(param) * 0.3)
            if "mixer.o_proj" in name or "mixer.v_proj" in name:
                param.mul_(4.0)
        if model.copy_cache is not None:  # a closed gate would hide a broken cache: open it wide
            opened = torch.zeros(model.copy_cache.gate.shape[1])
            opened[0] = 2.0
            model.copy_cache.gate.copy_(torch.randn_like(model.copy_cache.gate) * 0.3 + opened)
            if model.copy_cache.continues_word is not None:  # a made-up table: every third id continues a word
                model.copy_cache.continues_word.copy_(torch.arange(model.config.vocab_size) % 3 == 0)
            if model.copy_cache.seen_gate is not None:  # (c, d, e, g[, h][, q])
                model.copy_cache.seen_gate.copy_(torch.tensor([1.0, 0.2, 0.3, 0.7, -0.2, -0.4])[: model.copy_cache.seen_gate.shape[0]])
            if model.copy_cache.log_prior is not None:  # a made-up prior over the vocabulary
                model.copy_cache.log_prior.copy_(-torch.rand(model.config.vocab_size) * 10)
    return model


@pytest.fixture(
    scope="module",
    params=[
        (0, 1, "identity"), (4, 1, "identity"), (0, 8, "identity"), (4, 8, "identity"), (0, 8, "hedgehog"),
        (4, 8, "hedgehog"), (4, 8, ["hedgehog", "identity"]), (0, 8, "identity", "delta"), (4, 8, ["hedgehog", "identity"], "delta"),
        (4, 8, "identity", ["delta", "sum"]), (4, 8, "identity", "sum", MAMBA_VALUE_PATH),
        (4, 8, "identity", ["delta", "sum"], {"timescale_bands": [[[1, 16], [16, 256], [256, 4096]], [[1, 64], [64, 4096]]]}),
        (0, 8, "taylor", "sum", {"taylor_dims": 4}), (4, 8, ["taylor", "identity"], ["sum", "delta"], {"taylor_dims": 3}),
        (4, 8, "identity", "sum", {"copy_cache_orders": [1, 2], "copy_cache_buckets": 8}),
        (0, 8, "identity", "sum", {"copy_cache_orders": [1, 3], "copy_cache_buckets": 8, "copy_cache_seen": True, "copy_cache_prior": True,
                                "copy_cache_rate": True, "copy_cache_count_cap": 2}),
        (0, 8, "identity", "sum", {"copy_cache_orders": [1, 2], "copy_cache_buckets": 8, "copy_cache_continuation": True}),
    ],
    ids=[
        "plain", "short-conv", "selective", "selective-short-conv", "hedgehog", "hedgehog-short-conv", "per-layer-maps",
        "delta", "delta-short-conv-beside-hedgehog", "per-layer-rules", "mamba-value-path", "per-layer-levels",
        "taylor", "taylor-short-conv-beside-delta", "copy-cache", "copy-cache-context-words-prior-rate-cap", "copy-cache-continuation",
    ],
)
def model(request) -> HallamonicForCausalLM:
    """Every state test runs without and with the short conv (whose inputs are carried state too),
    with the diagonal state (N = 1), the expanded selective one (N = head_dim = 8), that one with
    Hedgehog features and a normalised read-out (numerator and denominator states), and a model whose
    layers differ (Hedgehog in one, identity in the other: states of two shapes in one cache), and
    the delta rule's levels (alone, in a layer beside a Hedgehog one that keeps the sum, and chosen
    per layer beside a summing one), and Mamba's value path (write/read vectors from the activated,
    filtered value stream, with its D skip; only v then goes through the conv), and layers with
    different numbers of levels (three, then two: states of two level counts in one cache), and
    Taylor features (alone, and beside a delta-rule layer: 1 + M + M(M+1)/2 features per row), and
    the copy cache (its n-gram tables carried in the cache beside the blocks' states; 8 buckets, so
    collisions happen), and with its context-word cue (one count per vocabulary entry carried too),
    and with its word-continuation term (a table over the vocabulary, a fifth gate column)."""
    short_conv_size, state_size, feature_map, *rest = request.param
    return stateful_model(
        short_conv_size=short_conv_size, state_size=state_size, feature_map=feature_map,
        update_rule=rest[0] if rest else "sum", **(rest[1] if len(rest) > 1 else {}),
    )


def test_state_drives_the_logits(model):
    """Sanity of the fixture itself: the same last token after different histories differs."""
    ids_a = torch.tensor([[5, 6, 7, 8, 9, 10, 42]])
    ids_b = torch.tensor([[70, 71, 72, 73, 74, 75, 42]])
    with torch.no_grad():
        la, lb = model(ids_a).logits[0, -1], model(ids_b).logits[0, -1]
    assert (la - lb).abs().max() > 1e-2


def test_chunked_forward_equals_full_forward(model):
    ids = torch.randint(0, 97, (2, 53))
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        for chunk in (1, 7, 16, 64):
            chunked = model(ids, use_cache=False, chunk_size=chunk).logits
            torch.testing.assert_close(chunked, full, atol=1e-5, rtol=1e-5)


def test_prefill_then_steps_equals_full_forward(model):
    ids = torch.randint(0, 97, (2, 40))
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        out = model(ids[:, :25], use_cache=True)
        cache, per_step = out.cache, [out.logits]
        for t in range(25, 40):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            per_step.append(out.logits)
    torch.testing.assert_close(torch.cat(per_step, dim=1), full, atol=1e-5, rtol=1e-5)


def test_a_given_cache_is_continued_and_left_alone_without_use_cache(model):
    """use_cache=False with a cache continues from it (blocks' states and copy-cache tables alike)
    and writes nothing back, so a later step still continues from the prefill."""
    ids = torch.randint(0, 97, (2, 30))
    with torch.no_grad():
        cache = model(ids[:, :20], use_cache=True).cache
        peek = model(ids[:, 20:25], cache=cache, use_cache=False).logits
        step = model(ids[:, 20:25], cache=cache, use_cache=True).logits
        full = model(ids[:, :25], use_cache=False).logits[:, 20:]
    torch.testing.assert_close(peek, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)


def test_greedy_generate_equals_argmax_loop(model):
    prompt = torch.tensor([[3, 14, 15, 9, 26]])
    with torch.no_grad():
        generated = model.generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
        ids = prompt
        for _ in range(12):
            next_id = model(ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, next_id], dim=1)
    assert torch.equal(generated, ids)


def test_left_padded_batch_equals_unpadded_rows(model):
    rows = [torch.tensor([5, 8, 13, 21, 34, 55, 89 % 97]), torch.tensor([2, 7, 1, 8])]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = row
        mask[i, width - len(row) :] = 1
    with torch.no_grad():
        batched = model(ids, attention_mask=mask, use_cache=False).logits
        gen_batched = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
        for i, row in enumerate(rows):
            alone = model(row[None], use_cache=False).logits[0]
            torch.testing.assert_close(batched[i, width - len(row) :], alone, atol=1e-5, rtol=1e-5)
            gen_alone = model.generate(row[None], max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
            assert torch.equal(gen_batched[i, width:], gen_alone[0, len(row) :])


def test_beam_search_scores_match_full_forward(model):
    prompt = torch.tensor([[4, 8, 15, 16, 23, 42]])
    with torch.no_grad():
        out = model.generate(
            prompt, max_new_tokens=5, num_beams=3, do_sample=False, eos_token_id=None, pad_token_id=0,
            length_penalty=0.0, output_scores=True, return_dict_in_generate=True,
        )
        best = out.sequences[0:1]
        logprobs = model(best, use_cache=False).logits.log_softmax(-1)[0, :-1]  # (T-1, V)
        targets = best[0, 1:]
        new = slice(prompt.shape[1] - 1, best.shape[1] - 1)
        expected = logprobs[new].gather(-1, targets[new, None]).sum()
    assert math.isclose(out.sequences_scores[0].item(), expected.item(), abs_tol=1e-3)


def test_sampling_runs_and_respects_seed(model):
    prompt = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        torch.manual_seed(7)
        a = model.generate(prompt, max_new_tokens=8, do_sample=True, top_k=20, eos_token_id=None, pad_token_id=0)
        torch.manual_seed(7)
        b = model.generate(prompt, max_new_tokens=8, do_sample=True, top_k=20, eos_token_id=None, pad_token_id=0)
    assert a.shape == (1, 11) and torch.equal(a, b)


def test_cache_size_is_constant_in_generated_length(model):
    def cache_bytes(n_new: int) -> int:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([[1, 2, 3]]), max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                eos_token_id=None, pad_token_id=0, return_dict_in_generate=True,
            )
        cache = out.cache
        assert out.sequences.shape[1] == 3 + n_new
        return sum(t.numel() * t.element_size() for layer in cache.layers for t in layer.recurrent_states.values() if t is not None)

    # 400 steps: far past the copy cache's 8 buckets per order and any order's window, so a table or
    # buffer that grew per token would show; 2,000 took ~4 min over the 17 fixtures on a 2-core AVX2 CPU
    short, long = cache_bytes(10), cache_bytes(400)
    taps = max(model.config.short_conv_size - 1, 0)  # rows after the levels: the conv's carried inputs
    # per layer: (levels + taps) rows * channels (4 heads x 8) * F features * fp32 bytes, with F = N, or with a feature
    # map 2x the rows (numerator and denominator) of 2N Hedgehog or 1 + M + M(M+1)/2 Taylor features
    m = model.config.taylor_dims
    features = {"identity": model.config.state_size, "hedgehog": 4 * model.config.state_size, "taylor": 2 * (1 + m + m * (m + 1) // 2)}
    expected = sum(
        (len(model.config.layer_timescale_bands(i)) + taps) * 32 * features[model.config.layer_feature_map(i)] * 4 for i in range(2)
    )
    orders = model.config.copy_cache_orders
    if orders:  # the last max(orders) tokens and, per order, each bucket's hash and successor: int64
        expected += (max(orders) + 2 * len(orders) * model.config.copy_cache_buckets) * 8
        expected += model.config.vocab_size * 8 * model.config.copy_cache_seen  # the context-word cue's counts
    assert short == long == expected


@pytest.mark.parametrize(
    "state_size, feature_map, update_rule, value_path",
    [(1, "identity", "sum", {}), (8, "identity", "sum", {}), (8, "hedgehog", "sum", {}), (8, "identity", "delta", {}),
     (8, "identity", "sum", MAMBA_VALUE_PATH), (8, "taylor", "sum", {"taylor_dims": 4})],
    ids=["diagonal", "selective", "hedgehog", "delta", "mamba-value-path", "taylor"],
)
@pytest.mark.parametrize("short_conv_size", [0, 4])
def test_gradients_flow_through_every_mixer_parameter(short_conv_size, state_size, feature_map, update_rule, value_path):
    model = stateful_model(
        short_conv_size=short_conv_size, state_size=state_size, feature_map=feature_map, update_rule=update_rule, **value_path
    ).train()
    ids = torch.randint(0, 97, (2, 45))
    model(ids, labels=ids).loss.backward()
    for name, param in model.named_parameters():
        if ".mixer." in name:
            assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_short_conv_starts_as_identity_and_stays_causal():
    ids = torch.randint(0, 97, (1, 40))
    base = stateful_model(seed=5)
    conv = HallamonicForCausalLM(tiny_config(short_conv_size=4)).eval()
    missing, _ = conv.load_state_dict(base.state_dict(), strict=False)
    assert sorted(missing) == [f"model.layers.{i}.mixer.short_conv.weight" for i in range(2)]
    with torch.no_grad():
        torch.testing.assert_close(conv(ids).logits, base(ids).logits)  # identity taps: the same model
        for layer in conv.model.layers:
            layer.mixer.short_conv.weight.normal_()
        logits = conv(ids).logits
        assert (logits - base(ids).logits).abs().max() > 1e-3
        changed = ids.clone()
        changed[0, 20] = (changed[0, 20] + 1) % 97
        after = conv(changed).logits
    torch.testing.assert_close(after[:, :20], logits[:, :20])  # nothing leaks from the future
    assert (after[:, 20:24] - logits[:, 20:24]).abs().max() > 1e-4


@pytest.mark.parametrize("flag", [{"hierarchy": False}, {"error_signal": False}, {"output_gate": True}])
def test_ablation_flags_change_the_computation(flag):
    ids = torch.randint(0, 97, (1, 40))
    base, ablated = stateful_model(seed=3), stateful_model(seed=3, **flag)
    ablated.load_state_dict(base.state_dict(), strict=False)  # identical shared weights
    if flag.get("output_gate"):
        with torch.no_grad():
            for layer in ablated.model.layers:
                layer.mixer.output_gate.up.weight.normal_()
    if "hierarchy" in flag:  # the gate biases are the hierarchy: re-initialise them for the ablation
        for layer in ablated.model.layers:
            for gate in layer.mixer.gates:
                gate.up.bias.data.copy_(gate.up.timescale_bias())
    with torch.no_grad():
        assert (base(ids).logits - ablated(ids).logits).abs().max() > 1e-3


def test_timescales_spread_over_each_levels_band():
    config = tiny_config()
    block = HallamonicForCausalLM(config).model.layers[0].mixer
    for gate, (lo, hi) in zip(block.gates, config.layer_level_bands(0), strict=True):
        tau = -1.0 / (-torch.nn.functional.softplus(gate.up.bias.double()))  # tau = -1/log a
        assert tau.min().item() == pytest.approx(lo, rel=1e-3)
        assert tau.max().item() == pytest.approx(hi, rel=1e-3)
    flat = HallamonicConfig(**{**tiny_config().to_dict(), "hierarchy": False})
    assert all(band == [1.0, 4096.0] for band in flat.layer_level_bands(1))


def test_per_layer_bands_give_each_layer_its_own_levels_and_survive_a_save(tmp_path):
    """``timescale_bands`` with one band list per layer: each block gets that layer's number of
    levels (gates, predictors, norms) with its own timescales, and the config round-trips."""
    bands = [[[1, 16], [16, 256], [256, 4096]], [[2, 64], [64, 1024]]]
    model = HallamonicForCausalLM(tiny_config(timescale_bands=bands))
    first, second = (layer.mixer for layer in model.model.layers)
    assert (first.num_levels, len(first.predictors), len(first.error_norms)) == (3, 2, 2)
    assert (second.num_levels, len(second.predictors), len(second.error_norms)) == (2, 1, 1)
    tau = -1.0 / (-torch.nn.functional.softplus(second.gates[0].up.bias.double()))
    assert (tau.min().item(), tau.max().item()) == pytest.approx((2.0, 64.0), rel=1e-3)
    model.save_pretrained(tmp_path)
    loaded = HallamonicForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.timescale_bands == [[[float(lo), float(hi)] for lo, hi in layer] for layer in bands]
    assert loaded.model.layers[1].mixer.num_levels == 2


@pytest.mark.parametrize(
    "bands, message",
    [
        ([[[1, 16]], [[1, 16]], [[1, 16]]], "one band list per layer"),
        ([[[1, 16]], []], "at least one"),
        ([[[1, 16]], [[0.5, 16]]], "1 <= tau_min"),
        ([[1, 16, 64]], "pairs"),
    ],
)
def test_bad_per_layer_bands_are_rejected(bands, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(timescale_bands=bands)


@pytest.mark.parametrize("part", ["decay-gate", "hedgehog-map"])
def test_decay_gates_and_feature_maps_stay_fp32_under_bf16_autocast(part):
    """Mixed-precision training runs the blocks under bf16 autocast; the decay gates opt out (a
    slow channel's logit ~ -8 would move by ~0.03 with bf16 operands) and so do Hedgehog's feature
    maps (a peaked softmax of bf16 logits), so their outputs equal the fp32 ones exactly, forward
    and backward."""
    if part == "decay-gate":
        module = stateful_model(state_size=8).model.layers[0].mixer.gates[2]
        u = torch.randn(2, 9, module.down.in_features, requires_grad=True)
    else:
        module = stateful_model(state_size=8, feature_map="hedgehog").model.layers[0].mixer.write_features
        with torch.no_grad():
            module.weight.add_(torch.randn_like(module.weight))  # a trained map, not the identity
        u = torch.randn(2, 9, *module.weight.shape[:2], requires_grad=True)  # (B, L, h, N)
    exact = module(u)
    (grad_exact,) = torch.autograd.grad(exact.pow(2).sum(), u)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = module(u)
    (grad_mixed,) = torch.autograd.grad(mixed.pow(2).sum(), u)
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed, exact, rtol=0, atol=0)
    torch.testing.assert_close(grad_mixed, grad_exact, rtol=0, atol=0)


def test_level_inputs_start_on_the_value_streams_scale():
    """From scratch, every level's input norm starts at the RMS the value stream has at init, so
    slow levels do not start louder than the first (conversion re-fits these gains on real text)."""
    torch.manual_seed(0)
    config = tiny_config(hidden_size=256, num_attention_heads=8, num_key_value_heads=8, intermediate_size=64)
    model = HallamonicForCausalLM(config)
    block = model.model.layers[0].mixer
    x = torch.randn(4, 64, 256)  # unit RMS, like the normalised residual stream
    value_rms = block.value_stream(x).pow(2).mean().sqrt().item()
    for norm in block.error_norms:
        assert torch.all(norm.weight == norm.weight[0])
        assert norm.weight[0].item() == pytest.approx(value_rms, rel=0.1)
    assert torch.all(model.model.layers[0].input_layernorm.weight == 1.0)


def test_value_stream_repeats_kv_heads_like_llama():
    from transformers.models.llama.modeling_llama import repeat_kv

    block = HarmonicBlock(tiny_config())
    x = torch.randn(2, 5, 32)
    v = block.v_proj(x).view(2, 5, 2, 8).transpose(1, 2)  # (B, Hkv, L, d)
    expected = repeat_kv(v, 2).transpose(1, 2).reshape(2, 5, 32)
    torch.testing.assert_close(block.value_stream(x), expected)


def test_parameter_count_matches_the_attention_it_replaces():
    """At TinyLlama's widths (hidden 2048, 32 heads, 4 KV heads) the block stays within +-25%."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention

    llama = LlamaConfig(hidden_size=2048, num_attention_heads=32, num_key_value_heads=4, intermediate_size=5632)
    attention = sum(p.numel() for p in LlamaAttention(llama, 0).parameters())
    config = HallamonicConfig(hidden_size=2048, num_attention_heads=32, num_key_value_heads=4, intermediate_size=5632)
    harmonic = sum(p.numel() for p in HarmonicBlock(config).parameters())
    print(f"attention {attention:,} parameters, HarmonicBlock {harmonic:,} ({harmonic / attention:.3f}x)")
    assert 0.75 <= harmonic / attention <= 1.25


def test_init_from_attention_copies_value_and_output_maps():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention

    attention = LlamaAttention(LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2), 0)
    block = HarmonicBlock(tiny_config())
    block.init_from_attention(attention)
    assert torch.equal(block.v_proj.weight, attention.v_proj.weight)
    assert torch.equal(block.o_proj.weight, attention.o_proj.weight)
    wrong = LlamaAttention(LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=4), 0)
    with pytest.raises(ValueError, match="v_proj"):
        block.init_from_attention(wrong)


def test_init_from_attention_starts_the_value_skip_at_zero():
    """A converted block with Mamba's D skip starts as the linear attention alone (D = 0), not with
    the from-scratch start D = 1."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention

    attention = LlamaAttention(LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2), 0)
    plain, skipped = HarmonicBlock(tiny_config(state_size=8)), HarmonicBlock(tiny_config(state_size=8, value_skip=True))
    assert torch.equal(skipped.value_skip.weight, torch.ones(32))
    skipped.load_state_dict(plain.state_dict(), strict=False)
    for block in (plain, skipped):
        block.init_from_attention(attention)
    assert torch.equal(skipped.value_skip.weight, torch.zeros(32))
    x = torch.randn(2, 11, 32)
    with torch.no_grad():
        torch.testing.assert_close(skipped(x)[0], plain(x)[0])


@pytest.mark.parametrize(
    "bad", [{"hidden_size": 0}, {"num_key_value_heads": 3}, {"timescale_bands": [[0.5, 4.0]]}, {"forward_chunk_size": -1}]
)
def test_invalid_config_values_are_rejected(bad):
    with pytest.raises(ValueError, match="HallamonicConfig"):
        tiny_config(**bad)


def test_long_sequence_is_finite_in_fp32_and_bf16():
    model = stateful_model()
    ids = torch.randint(0, 97, (1, 8192))
    with torch.no_grad():
        for dtype in (torch.float32, torch.bfloat16):
            logits = model.to(dtype)(ids, use_cache=False, chunk_size=2048, logits_to_keep=16).logits
            assert logits.shape == (1, 16, 97) and torch.isfinite(logits.float()).all()


def test_checkpoint_from_before_state_size_loads_with_identical_logits():
    """A diagonal-state checkpoint saved by the code before ``state_size`` existed (its config has no
    such key) loads as ``state_size = 1`` and gives the logits that code computed."""
    import json
    from pathlib import Path

    folder = Path(__file__).parent / "data" / "diagonal-v0"
    assert "state_size" not in json.loads((folder / "config.json").read_text())
    expected = json.loads((folder / "expected.json").read_text())
    model = HallamonicForCausalLM.from_pretrained(folder).eval()
    assert model.config.state_size == 1
    with torch.no_grad():
        logits = model(torch.tensor(expected["input_ids"])).logits[0]
    torch.testing.assert_close(logits, torch.tensor(expected["logits"]), atol=1e-5, rtol=1e-5)


def test_selective_state_is_a_decayed_linear_attention():
    """With one constant decay and one level, an expanded block is y_t = sum_s (1-a) a^(t-s) (q_t.k_s/sqrt N) v_s."""
    config = tiny_config(state_size=8, timescale_bands=[[4.0, 4.0]])
    torch.manual_seed(1)
    block = HarmonicBlock(config).eval()
    HallamonicForCausalLM(config)._init_weights(block.gates[0].up)
    x = torch.randn(2, 37, 32)
    with torch.no_grad():
        y, _ = block(x)
        a = math.exp(-1 / 4.0)
        v = block.value_stream(x).view(2, 37, 4, 8)  # (B, L, H, P)
        k = block.state_write(x).view(2, 37, 2, 1, 8).expand(-1, -1, -1, 2, -1).reshape(2, 37, 4, 8)
        q = block.state_read(x).view(2, 37, 4, 8)
        scores = torch.einsum("bthn,bshn->bhts", q, k) / math.sqrt(8)  # (B, H, L, L)
        t = torch.arange(37)
        weights = (1 - a) * a ** (t[:, None] - t[None, :]).clamp_min(0).double() * (t[:, None] >= t[None, :])
        mixed = torch.einsum("bhts,bshp->bthp", scores * weights.float(), v).reshape(2, 37, 32)
        torch.testing.assert_close(y, block.o_proj(mixed), atol=1e-5, rtol=1e-4)


def test_hedgehog_state_is_a_normalised_linear_attention():
    """With one constant decay and one level, a Hedgehog block's read-out is the weighted average
    y_t = sum_s w_ts v_s / sum_s w_ts, w_ts = (1-a) a^(t-s) phi(q_t).phi(k_s),
    phi(x) = [softmax(Wx), softmax(-Wx)] per head."""
    config = tiny_config(state_size=8, timescale_bands=[[4.0, 4.0]], feature_map="hedgehog")
    torch.manual_seed(1)
    block = HarmonicBlock(config).eval()
    HallamonicForCausalLM(config)._init_weights(block.gates[0].up)
    with torch.no_grad():  # a learned-looking W, not the identity it starts from
        block.write_features.weight.add_(torch.randn_like(block.write_features.weight) * 0.5)
        block.read_features.weight.add_(torch.randn_like(block.read_features.weight) * 0.5)
    x = torch.randn(2, 37, 32)

    def phi(z, weight):  # (B, L, h, N) -> (B, L, h, 2N)
        z = torch.einsum("blhn,hmn->blhm", z, weight)
        return torch.cat([z.softmax(-1), (-z).softmax(-1)], -1)

    with torch.no_grad():
        y, _ = block(x)
        a = math.exp(-1 / 4.0)
        v = block.value_stream(x).view(2, 37, 4, 8)  # (B, L, H, P)
        k = phi(block.state_write(x).view(2, 37, 2, 8), block.write_features.weight)  # (B, L, Hkv, 16)
        k = k.unsqueeze(3).expand(-1, -1, -1, 2, -1).reshape(2, 37, 4, 16)
        q = phi(block.state_read(x).view(2, 37, 4, 8), block.read_features.weight)
        t = torch.arange(37)
        decay = (1 - a) * a ** (t[:, None] - t[None, :]).clamp_min(0).double() * (t[:, None] >= t[None, :])
        weights = torch.einsum("bthn,bshn->bhts", q, k) * decay.float()  # (B, H, L, L)
        mixed = torch.einsum("bhts,bshp->bthp", weights, v) / weights.sum(-1).transpose(1, 2).unsqueeze(-1)
        torch.testing.assert_close(y, block.o_proj(mixed.reshape(2, 37, 32)), atol=1e-5, rtol=1e-4)


def test_taylor_state_is_a_normalised_linear_attention_with_the_second_order_exp_kernel():
    """With one constant decay and one level, a Taylor block's read-out is the weighted average
    y_t = sum_s w_ts v_s / sum_s w_ts, w_ts = (1-a) a^(t-s) (1 + s_ts + s_ts^2 / 2),
    s_ts = (W q_t).(W k_s) / sqrt(N): Based's kernel, computed here without any feature vector."""
    config = tiny_config(state_size=8, timescale_bands=[[4.0, 4.0]], feature_map="taylor", taylor_dims=3)
    torch.manual_seed(2)
    block = HarmonicBlock(config).eval()
    HallamonicForCausalLM(config)._init_weights(block.gates[0].up)
    with torch.no_grad():  # projections other than the first coordinates it starts from
        block.write_features.weight.normal_()
        block.read_features.weight.normal_()
    x = torch.randn(2, 37, 32)
    with torch.no_grad():
        y, _ = block(x)
        a = math.exp(-1 / 4.0)
        v = block.value_stream(x).view(2, 37, 4, 8)  # (B, L, H, P)
        k = torch.einsum("blhn,hmn->blhm", block.state_write(x).view(2, 37, 2, 8), block.write_features.weight)  # (B, L, Hkv, 3)
        k = k.repeat_interleave(2, dim=2)  # GQA: kv head h serves query heads 2h, 2h+1
        q = torch.einsum("blhn,hmn->blhm", block.state_read(x).view(2, 37, 4, 8), block.read_features.weight)  # (B, L, H, 3)
        s = torch.einsum("bthm,bshm->bhts", q, k) / 8**0.5  # (B, H, L, L)
        t = torch.arange(37)
        decay = (1 - a) * a ** (t[:, None] - t[None, :]).clamp_min(0).double() * (t[:, None] >= t[None, :])
        weights = (1 + s + s * s / 2) * decay.float()
        mixed = torch.einsum("bhts,bshp->bthp", weights, v) / weights.sum(-1).transpose(1, 2).unsqueeze(-1)
        torch.testing.assert_close(y, block.o_proj(mixed.reshape(2, 37, 32)), atol=1e-5, rtol=1e-4)


def test_taylor_directions_are_the_principal_ones_of_keys_and_queries():
    """Keys and queries that live in a 2-dim subspace of each kv group's 8 dims: the M = 2 directions
    found per group are orthonormal and span that subspace."""
    g = torch.Generator().manual_seed(0)
    planes = [torch.linalg.qr(torch.randn(8, 2, generator=g))[0] for _ in range(2)]  # (N, 2) per kv group
    coords = torch.randn(500, 2, 2, generator=g)  # (T, Hkv, 2)
    write = torch.stack([coords[:, h] @ planes[h].T for h in range(2)], 1)  # (T, Hkv, N)
    read = torch.stack([write[:, h] * 3.0 for h in (0, 0, 1, 1)], 1)  # (T, H, N): query head i reads kv group i // 2
    bases = TaylorFeatureMap.principal_directions(write, read, dims=2)  # (Hkv, M, N)
    assert bases.shape == (2, 2, 8)
    for group, weight in enumerate(bases):
        torch.testing.assert_close(weight @ weight.T, torch.eye(2), atol=1e-5, rtol=0)  # orthonormal rows
        torch.testing.assert_close(weight.T @ weight, planes[group] @ planes[group].T, atol=1e-5, rtol=0)  # the plane


def test_taylor_dims_cannot_exceed_the_state():
    with pytest.raises(ValueError, match="taylor_dims"):
        tiny_config(state_size=8, feature_map="taylor", taylor_dims=9)


def test_hedgehog_needs_the_expanded_state():
    with pytest.raises(ValueError, match="feature_map"):
        tiny_config(state_size=1, feature_map="hedgehog")
    with pytest.raises(ValueError, match="feature_map"):
        tiny_config(state_size=8, feature_map="softmax")
    with pytest.raises(ValueError, match="one entry per layer"):
        tiny_config(state_size=8, feature_map=["hedgehog"])
    with pytest.raises(ValueError, match="feature_map"):
        tiny_config(state_size=8, feature_map=["hedgehog", "softmax"])


@pytest.mark.parametrize(
    "state_size, feature_map, update_rule", [(1, "identity", "sum"), (8, "identity", "sum"), (8, "hedgehog", "sum"), (8, "identity", "delta")]
)
def test_recomputed_mixer_gives_the_same_loss_and_gradients(monkeypatch, state_size, feature_map, update_rule):
    """recompute_mixer (segment by segment, state carried) is a memory trade, not a different model."""
    from hallamonic.modeling import modeling_hallamonic

    monkeypatch.setattr(modeling_hallamonic, "RECOMPUTE_SEGMENT", 16)  # 45 tokens: three segments
    ids = torch.randint(0, 97, (2, 45))
    grads = []
    for recompute in (False, True):
        model = stateful_model(
            state_size=state_size, feature_map=feature_map, update_rule=update_rule, short_conv_size=4, recompute_mixer=recompute
        ).train()
        loss = model(ids, labels=ids).loss
        loss.backward()
        grads.append((loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (loss_a, grad_a), (loss_b, grad_b) = grads
    torch.testing.assert_close(loss_b, loss_a, atol=1e-5, rtol=1e-5)
    assert grad_a.keys() == grad_b.keys()
    for name in grad_a:
        torch.testing.assert_close(grad_b[name], grad_a[name], atol=1e-4, rtol=1e-4)


def test_delta_rule_block_overwrites_along_its_own_keys():
    """One level at a fixed timescale: the block equals the gated delta rule written out token by
    token over its own projections (unit keys, beta = 1/2 at initialisation, one decay per head)."""
    torch.manual_seed(0)
    config = tiny_config(state_size=8, timescale_bands=[[4.0, 4.0]], update_rule="delta")
    block = HallamonicForCausalLM(config).model.layers[0].mixer
    x = torch.randn(2, 11, 32)
    with torch.no_grad():
        got = block(x)[0]
        v = block.value_stream(x).view(2, 11, 4, 8)  # (B, L, H, P)
        k = block.state_write(x).view(2, 11, 2, 1, 8).expand(-1, -1, -1, 2, -1).reshape(2, 11, 4, 8)
        k = torch.nn.functional.normalize(k, dim=-1)
        q = block.state_read(x).view(2, 11, 4, 8) / math.sqrt(8)
        a, beta = math.exp(-1 / 4), 0.5
        state = torch.zeros(2, 4, 8, 8)  # (B, H, P, N)
        outputs = []
        for t in range(11):
            decayed = a * state
            state = decayed + beta * (v[:, t] - torch.einsum("bhpn,bhn->bhp", decayed, k[:, t])).unsqueeze(-1) * k[:, t].unsqueeze(2)
            outputs.append(torch.einsum("bhpn,bhn->bhp", state, q[:, t]))
        want = block.o_proj(torch.stack(outputs, 1).reshape(2, 11, 32))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_delta_rule_needs_the_expanded_state():
    with pytest.raises(ValueError, match="update_rule"):
        tiny_config(state_size=1, update_rule="delta")
    with pytest.raises(ValueError, match="update_rule"):
        tiny_config(state_size=8, update_rule="replace")
    config = tiny_config(state_size=8, update_rule="delta", feature_map=["hedgehog", "identity"])
    assert [config.layer_update_rule(i) for i in range(2)] == ["sum", "delta"]  # Hedgehog layers keep the sum
    config = tiny_config(state_size=8, update_rule=["delta", "sum"])
    assert [config.layer_update_rule(i) for i in range(2)] == ["delta", "sum"]
    with pytest.raises(ValueError, match="one entry per layer"):
        tiny_config(state_size=8, update_rule=["delta"])
    with pytest.raises(ValueError, match="update_rule"):
        tiny_config(state_size=8, update_rule=["delta", "replace"])


def test_random_short_conv_init_draws_like_conv1d():
    """From scratch the conv starts random (uniform in +-1/sqrt(taps), as nn.Conv1d), not as the identity."""
    torch.manual_seed(0)
    conv = HallamonicForCausalLM(tiny_config(short_conv_size=4, short_conv_init="random")).model.layers[0].mixer.short_conv.weight
    assert conv.abs().max() <= 0.5 and conv.std() > 0.2  # bound 1/sqrt(4); the identity has std 0.43 but only 0s and 1s
    assert not torch.all((conv == 0) | (conv == 1))


def test_mamba_value_path_reads_maps_from_the_value_stream():
    """With maps_from_value the write/read maps take u (state width) and only v is filtered by the conv;
    the value skip makes the current token reach the output directly (and starts at D = 1)."""
    config = tiny_config(short_conv_size=4, state_size=8, **MAMBA_VALUE_PATH)
    block = HallamonicForCausalLM(config).model.layers[0].mixer
    assert block.state_write.in_features == block.state_read.in_features == config.state_width
    assert block.conv_widths == [config.num_key_value_heads * config.head_dim]
    assert torch.equal(block.value_skip.weight, torch.ones(config.state_width))
    x = torch.randn(1, 6, config.hidden_size)
    with torch.no_grad():
        with_skip, _ = block(x)
        block.value_skip.weight.zero_()
        without, _ = block(x)
    assert (with_skip - without).abs().max() > 1e-3


def test_mamba_value_path_refuses_attention_init_and_needs_the_expanded_state():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention

    config = tiny_config(short_conv_size=4, state_size=8, maps_from_value=True)
    attention = LlamaAttention(LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8), 0)
    with pytest.raises(ValueError, match="maps_from_value"):
        HarmonicBlock(config).init_from_attention(attention)
    with pytest.raises(ValueError, match="maps_from_value"):
        tiny_config(maps_from_value=True)  # state_size 1
    with pytest.raises(ValueError, match="value_activation"):
        tiny_config(value_activation="relu")
    with pytest.raises(ValueError, match="short_conv_init"):
        tiny_config(short_conv_init="zeros")


def test_a_taylor_model_reloads_with_the_same_logits(tmp_path):
    """from_pretrained builds modules on the meta device and fills only saved tensors: a Taylor map
    must not rely on anything else (its pair indices once lived in non-persistent buffers, garbage
    after a reload)."""
    model = stateful_model(state_size=8, feature_map=["taylor", "identity"], taylor_dims=4).eval()
    model.save_pretrained(tmp_path)
    again = HallamonicForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 97, (2, 33))
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits)
