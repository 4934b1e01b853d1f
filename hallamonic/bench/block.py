"""Benchmark of one mixer layer in training: time of forward + backward and the activation memory
it keeps for backward, HarmonicBlock at several state sizes beside a Llama attention (SDPA) of the
same width, all in one run so the ratios are fair.

Memory is counted exactly, not sampled: every tensor autograd saves for backward passes through a
``saved_tensors_hooks`` pack hook and is counted once per storage. That is the activation memory a
training step holds per layer (weights and gradients excluded); it does not depend on the machine.

Library: :func:`benchmark_blocks`. CLI: ``hallamonic bench block``.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch


def saved_bytes(fn) -> tuple[object, int]:
    """Run ``fn()`` and count the bytes of the distinct storages autograd saves for backward."""
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor):
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn()
    return result, sum(seen.values())


# Mamba's value path, the from-scratch study's block (short conv random, silu, maps from u, D skip).
VALUE_PATH = {"short_conv_init": "random", "value_activation": "silu", "maps_from_value": True, "value_skip": True}


def _harmonic_layer(hidden: int, heads: int, **block):
    """One HarmonicBlock and how to run it; ``block``: config keys (state_size, recompute_mixer, ...)."""
    from hallamonic.modeling import HallamonicConfig
    from hallamonic.modeling.modeling_hallamonic import HallamonicDecoderLayer

    config = HallamonicConfig(
        hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=1, num_attention_heads=heads,
        num_key_value_heads=heads, vocab_size=8, **block,
    )
    layer = HallamonicDecoderLayer(config, 0)
    run = layer._recomputed_mixer if config.recompute_mixer else layer.mixer  # the model's own recompute path
    return layer.mixer, lambda x: run(x, None, None)[0]


def _attention_layer(hidden: int, heads: int, length: int):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=length,
        attn_implementation="sdpa",
    )
    attention = LlamaAttention(config, 0)
    rotary = LlamaRotaryEmbedding(config)

    def run(x):
        positions = torch.arange(x.shape[1]).unsqueeze(0)
        cos, sin = rotary(x, positions)
        return attention(x, position_embeddings=(cos, sin), attention_mask=None)[0]

    return attention, run


def _time_forward_backward(module, run, x, repeats: int) -> tuple[float, int]:
    times = []
    memory = 0
    for i in range(repeats + 1):
        module.zero_grad(set_to_none=True)
        began = time.perf_counter()
        out, memory = saved_bytes(lambda: run(x))
        out.float().pow(2).mean().backward()
        if i:  # the first run warms up allocators and kernels
            times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000, memory


def benchmark_blocks(
    batch: int = 1, length: int = 4096, hidden: int = 576, heads: int = 9, state_sizes=(1, 16, 64), repeats: int = 3
) -> list[dict]:
    """Rows of forward+backward ms and saved activation MB per mixer, with ratios to the N = 1 block."""
    torch.manual_seed(0)
    x = torch.randn(batch, length, hidden, requires_grad=True)
    rows = []
    expanded = [n for n in state_sizes if n > 1]
    cases = [(f"harmonic N={n}", {"state_size": n}) for n in state_sizes]
    cases += [(f"harmonic N={n} recompute", {"state_size": n, "recompute_mixer": True}) for n in expanded]
    cases += [(f"harmonic N={n} hedgehog", {"state_size": n, "feature_map": "hedgehog"}) for n in expanded]
    cases += [(f"harmonic N={n} taylor M={min(n, 16)}", {"state_size": n, "feature_map": "taylor", "taylor_dims": min(n, 16)}) for n in expanded]
    cases += [(f"harmonic N={n} delta", {"state_size": n, "update_rule": "delta"}) for n in expanded]
    cases += [(f"harmonic N={n} conv", {"state_size": n, "short_conv_size": 4}) for n in expanded]
    cases += [(f"harmonic N={n} value path", {"state_size": n, "short_conv_size": 4, **VALUE_PATH}) for n in expanded]
    for name, block in cases:
        module, run = _harmonic_layer(hidden, heads, **block)
        ms, memory = _time_forward_backward(module, run, x, repeats)
        rows.append({"mixer": name, "ms": ms, "saved_mb": memory / 2**20})
    module, run = _attention_layer(hidden, heads, length)
    ms, memory = _time_forward_backward(module, run, x, repeats)
    rows.append({"mixer": "llama attention (sdpa)", "ms": ms, "saved_mb": memory / 2**20})
    base = rows[0]
    for row in rows:
        row.update(batch=batch, length=length, hidden=hidden, heads=heads)
        row["time_vs_n1"] = row["ms"] / base["ms"]
        row["memory_vs_attention"] = row["saved_mb"] / rows[-1]["saved_mb"]
    return rows


def format_table(rows: list[dict]) -> str:
    head = ["mixer", "fwd+bwd ms", "x N=1", "saved MB", "x attention"]
    body = [
        [r["mixer"], f"{r['ms']:.1f}", f"{r['time_vs_n1']:.2f}", f"{r['saved_mb']:.1f}", f"{r['memory_vs_attention']:.2f}"]
        for r in rows
    ]
    widths = [max(len(str(line[i])) for line in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(str(c).rjust(w) for c, w in zip(line, widths)) for line in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def block_command(
    length: int = 4096, hidden: int = 576, heads: int = 9, batch: int = 1, state_sizes: str = "1,16,64",
    repeats: int = 3, json_path: Path | None = None,
) -> None:
    """Forward+backward time and saved activation memory of one mixer: HarmonicBlock (N = 1, the
    expanded state with and without recompute, with Hedgehog features and a normalised read-out, and
    with the gated delta rule, with the short conv, and on Mamba's value path) vs a Llama SDPA attention of the same width."""
    sizes = tuple(int(s) for s in state_sizes.split(","))
    rows = benchmark_blocks(batch, length, hidden, heads, sizes, repeats)
    print(f"one mixer, input ({batch}, {length}, {hidden}), {heads} heads, {torch.get_num_threads()} threads; "
          "saved MB = activations kept for backward (exact)")
    print(format_table(rows))
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))
