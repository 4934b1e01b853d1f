"""The chunked selective scan of this tree against the same function at an earlier git revision,
forward + backward, timed side by side in one run (and checked to agree).

    python benchmarks/selective_vs_revision.py REV [--shapes 4x512,1x1024,1x4096] [--repeats 8] [--blocks 10]

Shapes are batch x length at SmolLM2's mixer (9 heads, 64 channels, N = 64): 4 x 512 is a phase-1
micro-batch, 1 x 1,024 a phase-2 one. Prints ms per call and the ratio old / new. With --blocks K it
then times what a phase-1 step does with the mixers: K SmolLM2-shaped HarmonicBlocks (3 levels,
output gate), each on its own 4 x 512 input, one backward through the sum of their losses, with the
model's selective_scan patched to either revision; and the activation memory they keep for
backward (counted exactly, as `hallamonic bench block` does).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from hallamonic.bench.scan import _time_ms
from hallamonic.modeling import hallamonic_selective_scan as current

MODULE = "hallamonic/modeling/hallamonic_selective_scan.py"


def load_revision(rev: str):
    """The module as it was at REV, imported under another name (its sibling imports made absolute)."""
    source = subprocess.run(["git", "show", f"{rev}:{MODULE}"], capture_output=True, text=True, check=True).stdout
    source = source.replace("from .hallamonic_", "from hallamonic.modeling.hallamonic_")
    path = Path(tempfile.mkdtemp()) / "selective_at_revision.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("selective_at_revision", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inputs(batch: int, length: int, heads=9, channels=64, state=64):
    g = torch.Generator().manual_seed(0)
    b = torch.randn(batch, length, heads, channels, generator=g)
    log_a = -torch.rand(batch, length, heads, channels, generator=g) * 0.5
    write, read = (torch.randn(batch, length, heads, state, generator=g) for _ in range(2))
    return [t.requires_grad_() for t in (b, log_a, write, read)]


def fwd_bwd(fn, tensors) -> None:
    y, final = fn(*tensors)
    (y.square().mean() + final.square().mean()).backward()


def blocks_step_ms(count: int, repeats: int, scan) -> tuple[float, float]:
    """(ms per step, saved GB) of COUNT SmolLM2-shaped blocks trained together, using SCAN."""
    import types

    from hallamonic.bench.block import saved_bytes
    from hallamonic.modeling import modeling_hallamonic as modeling

    modeling.selective_scan = scan
    config = modeling.HallamonicConfig(
        hidden_size=576, num_attention_heads=9, num_key_value_heads=3, head_dim=64, state_size=64,
        intermediate_size=1536, num_hidden_layers=1, vocab_size=8, output_gate=True,
    )
    torch.manual_seed(0)
    blocks = [modeling.HarmonicBlock(config, i) for i in range(count)]
    for block in blocks:
        for module in block.modules():
            modeling.HallamonicPreTrainedModel._init_weights(types.SimpleNamespace(config=config), module)
    inputs_ = [torch.randn(4, 512, 576) for _ in blocks]  # (4, 512, hidden) each
    forward = lambda: sum(b(x)[0].float().pow(2).mean() for b, x in zip(blocks, inputs_))  # noqa: E731
    step = lambda: forward().backward()  # noqa: E731
    _, saved = saved_bytes(step)  # the activations one step keeps for its backward
    return _time_ms(step, torch.device("cpu"), repeats), saved / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev")
    parser.add_argument("--shapes", default="4x512,1x1024,1x4096")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(2)
    old = load_revision(args.rev)
    print(f"chunked selective scan, fwd+bwd, 9 heads x 64 channels x N=64, {torch.get_num_threads()} threads")
    print(f"{'batch x length':>15} {args.rev[:10]:>12} {'this tree':>12} {'old/new':>8} {'max |dy|':>10}")
    for shape in args.shapes.split(","):
        batch, length = (int(s) for s in shape.split("x"))
        tensors = inputs(batch, length)
        y_old, _ = old.chunked_selective_scan(*tensors)
        y_new, _ = current.chunked_selective_scan(*tensors)
        diff = (y_old - y_new).abs().max().item()
        ms_old = _time_ms(lambda: fwd_bwd(old.chunked_selective_scan, tensors), torch.device("cpu"), args.repeats)
        ms_new = _time_ms(lambda: fwd_bwd(current.chunked_selective_scan, tensors), torch.device("cpu"), args.repeats)
        print(f"{shape:>15} {ms_old:12.1f} {ms_new:12.1f} {ms_old / ms_new:8.2f} {diff:10.1e}", flush=True)
    if args.blocks:
        print(f"\n{args.blocks} HarmonicBlocks (SmolLM2 shape, N = 64), each on 4 x 512, one backward: ms per step / saved GB")
        for round_ in range(2):  # alternate, twice: this CPU's speed drifts
            ms_old, gb_old = blocks_step_ms(args.blocks, 3, old.selective_scan)
            ms_new, gb_new = blocks_step_ms(args.blocks, 3, current.selective_scan)
            print(f"round {round_ + 1}: {args.rev[:10]} {ms_old:.0f} ms / {gb_old:.2f} GB, this tree {ms_new:.0f} ms / "
                  f"{gb_new:.2f} GB, old/new time {ms_old / ms_new:.2f}, memory {gb_old / gb_new:.2f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
