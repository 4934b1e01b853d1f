"""GPU check of the fused Triton selective scan: the compiled kernel against the chunked PyTorch
twin (outputs, final state, every gradient) and both timed, forward + backward, in one run.

Runs on a bare CUDA machine with torch + triton (no typer, no transformers needed):
``python -m hallamonic.bench.selective --json OUT.json``. Its first H200 run (2026-12-04,
evals/results/study-enwik8-28m-h200) set where the model's "auto" backend uses the kernel:
``AUTO_TRITON_MAX_STATE`` in hallamonic_selective_scan.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hallamonic.bench.scan import _time_ms
from hallamonic.modeling.hallamonic_selective_scan import MAX_DECAY_RATE, selective_scan

SHAPES = [(1, 100, 2, 36, 16), (2, 4096, 9, 64, 64), (1, 65536, 8, 64, 16)]  # (B, L, H, P, N)


def _inputs(shape, device, seed=0):
    batch, length, heads, channels, state = shape
    g = torch.Generator(device=device).manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g, device=device)  # noqa: E731
    log_a = -torch.rand(batch, length, heads, channels, generator=g, device=device) * MAX_DECAY_RATE
    tensors = [rand(batch, length, heads, channels), log_a, rand(batch, length, heads, state), rand(batch, length, heads, state)]
    return [t.requires_grad_() for t in tensors], rand(batch, heads, channels, state).requires_grad_()


def _run(backend, tensors, h0):
    y, final = selective_scan(*tensors, h0, backend=backend)
    loss = y.square().mean() + final.square().mean()
    grads = torch.autograd.grad(loss, [*tensors, h0])
    return [y, final, *grads]


def check(device="cuda") -> list[dict]:
    rows = []
    for shape in SHAPES:
        tensors, h0 = _inputs(shape, device)
        fused, chunked = _run("triton", tensors, h0), _run("chunked", tensors, h0)
        errors = [((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item() for a, b in zip(fused, chunked)]
        row = {"shape": shape, "max_rel_error": max(errors), "ok": max(errors) < 1e-3}
        row["triton_ms"] = _time_ms(lambda: _run("triton", tensors, h0), torch.device(device))
        row["chunked_ms"] = _time_ms(lambda: _run("chunked", tensors, h0), torch.device(device))
        row["speedup"] = row["chunked_ms"] / row["triton_ms"]
        print(row, flush=True)
        rows.append(row)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hallamonic.bench.selective", description=__doc__.splitlines()[0])
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    rows = check()
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=1))
    raise SystemExit(0 if all(r["ok"] for r in rows) else 1)


if __name__ == "__main__":
    main()
