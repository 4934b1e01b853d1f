"""GPU check of the fused Triton selective scan: the compiled kernel against the chunked PyTorch
twin (outputs, final state, every gradient) and both timed, forward + backward, in one run, the
kernel at every value-channel block size (programs split the value channels, see
``hallamonic_selective_scan_triton.py``).

Runs on a bare CUDA machine with torch + triton (no typer, no transformers needed):
``python -m hallamonic.bench.selective --json OUT.json``. Its first H200 run (2026-12-04,
evals/results/study-enwik8-28m-h200, before the value channels were split) set where the model's
"auto" backend uses the kernel: ``AUTO_TRITON_MAX_STATE`` in hallamonic_selective_scan.py. The
shapes include the conversion's (SmolLM2 at the GPU batches of ``benchmarks/convert_gpu.sh``,
TinyLlama's 32 heads), where "auto" runs the chunked path today. On CPU (``--device cpu``, with
``TRITON_INTERPRET=1``) it checks the script itself on tiny shapes.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import torch

from hallamonic.bench.scan import _time_ms
from hallamonic.modeling.hallamonic_selective_scan import MAX_DECAY_RATE, selective_scan

SHAPES = {  # (B, L, H, P, N)
    "tiny": (1, 100, 2, 36, 16),
    "long-context, N = 64": (2, 4096, 9, 64, 64),
    "28M study at 64K": (1, 65536, 8, 64, 16),
    "SmolLM2 phase 1 (16 x 512)": (16, 512, 9, 64, 64),
    "SmolLM2 phase 2 (8 x 1,024)": (8, 1024, 9, 64, 64),
    "TinyLlama heads (8 x 2,048)": (8, 2048, 32, 64, 64),
}
CPU_SHAPES = {"interpreted": (1, 40, 2, 40, 16)}
VALUE_BLOCKS = (16, 32, 64)


def _inputs(shape, device, seed=0):
    batch, length, heads, channels, state = shape
    g = torch.Generator(device=device).manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g, device=device)  # noqa: E731
    log_a = -torch.rand(batch, length, heads, channels, generator=g, device=device) * MAX_DECAY_RATE
    tensors = [rand(batch, length, heads, channels), log_a, rand(batch, length, heads, state), rand(batch, length, heads, state)]
    return [t.requires_grad_() for t in tensors], rand(batch, heads, channels, state).requires_grad_()


def _run(scan, tensors, h0):
    y, final = scan(*tensors, h0)
    loss = y.square().mean() + final.square().mean()
    grads = torch.autograd.grad(loss, [*tensors, h0])
    return [y, final, *grads]


def check(device: str = "cuda", shapes: dict | None = None, value_blocks=VALUE_BLOCKS) -> list[dict]:
    """One row per shape: the chunked path's time, the kernel's error and time at every value block,
    the best block and its speedup over the chunked path."""
    from hallamonic.modeling.hallamonic_selective_scan_triton import triton_selective_scan

    dev = torch.device(device)
    repeats = 10 if dev.type == "cuda" else 1  # on CPU the interpreter checks the script, not speed
    rows = []
    for name, shape in (shapes or SHAPES).items():
        tensors, h0 = _inputs(shape, device)
        chunked = partial(_run, partial(selective_scan, backend="chunked"), tensors, h0)
        want = chunked()
        row = {"name": name, "shape": shape, "chunked_ms": _time_ms(chunked, dev, repeats=repeats), "triton_ms": {}, "max_rel_error": 0.0}
        for block in value_blocks:
            fused = partial(_run, partial(triton_selective_scan, value_block=block), tensors, h0)
            got = fused()
            error = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item() for a, b in zip(got, want))
            row["max_rel_error"] = max(row["max_rel_error"], error)
            row["triton_ms"][block] = _time_ms(fused, dev, repeats=repeats)
        row["best_value_block"] = min(row["triton_ms"], key=row["triton_ms"].get)
        row["speedup"] = row["chunked_ms"] / row["triton_ms"][row["best_value_block"]]
        row["ok"] = row["max_rel_error"] < 1e-3
        print(row, flush=True)
        rows.append(row)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hallamonic.bench.selective", description=__doc__.splitlines()[0])
    parser.add_argument("--json", dest="json_path", default=None)
    parser.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (TRITON_INTERPRET=1: tiny shapes, checks the script)")
    args = parser.parse_args(argv)
    rows = check(args.device, None if args.device == "cuda" else CPU_SHAPES, VALUE_BLOCKS if args.device == "cuda" else (16, 64))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=1))
    raise SystemExit(0 if all(r["ok"] for r in rows) else 1)


if __name__ == "__main__":
    main()
