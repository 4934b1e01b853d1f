"""Benchmark of the scan op: how close each backend gets to the memory-bound floor.

The scan h_t = a_t * h_{t-1} + b_t does a few flops per element, so its speed limit is memory
traffic. On CPU the floor is an elementwise ``a * b`` (forward and backward) on the same tensors;
on CUDA it is a device-to-device copy, and the Triton kernel is reported as effective bandwidth:
bytes it must move (forward: read a, b, write h = 3 tensors; backward: read a, dh, h, write da, db
= 5 tensors) over its time, against the copy's bytes read + written over its time.

Library: :func:`benchmark_scan` (results as dicts), :func:`check_correctness` (GPU: the compiled
Triton kernel against the reference loop and the torch backend). CLI: ``hallamonic bench scan``,
or ``python -m hallamonic.bench.scan`` where typer is not installed (the GPU check script).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from hallamonic.modeling.hallamonic_scan import scan, triton_available

CPU_SHAPES = [(1, 4096, 576), (4, 1024, 576)]
GPU_SHAPES = [(8, 4096, 2048), (1, 65536, 2048)]


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------
def _time_ms(fn, device: torch.device, repeats: int = 10, warmup: bool = True) -> float:
    """Median wall time of fn() in milliseconds (CUDA: triton's do_bench, L2 flushed)."""
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median"))
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _inputs(shape, dtype, device, with_h0=False, requires_grad=False, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    a = (0.9 + 0.1 * torch.rand(shape, generator=gen, device=device)).to(dtype)
    b = torch.randn(shape, generator=gen, device=device).to(dtype)
    h0 = torch.randn(shape[0], shape[2], generator=gen, device=device).to(dtype) if with_h0 else None
    if requires_grad:
        for t in (a, b, h0):
            if t is not None:
                t.requires_grad_()
    return a, b, h0


def _fwd_bwd(fn, leaves, dh):
    return lambda: torch.autograd.grad(fn(), leaves, dh)


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    return ((x - ref).abs().max() / ref.abs().max().clamp(min=1e-12)).item()


# --------------------------------------------------------------------------------------------
# CPU: torch backend and reference vs an elementwise floor
# --------------------------------------------------------------------------------------------
def _bench_cpu(shapes, repeats: int) -> list[dict]:
    device = torch.device("cpu")
    rows = []
    for shape in shapes:
        a, b, _ = _inputs(shape, torch.float32, device, requires_grad=True)
        dh = torch.randn(shape)
        floor_f = _time_ms(lambda: a * b, device, repeats)
        floor_fb = _time_ms(_fwd_bwd(lambda: a * b, (a, b), dh), device, repeats)
        for backend in ("torch", "reference"):
            # the reference's autograd graph has L nodes per step: time its backward once, cold
            slow = backend == "reference"
            with torch.no_grad():
                fwd = _time_ms(lambda: scan(a, b, backend=backend), device, min(3, repeats) if slow else repeats)
            fb_fn = _fwd_bwd(lambda: scan(a, b, backend=backend), (a, b), dh)
            fb = _time_ms(fb_fn, device, 1 if slow else repeats, warmup=not slow)
            rows.append(
                dict(
                    device="cpu", backend=backend, shape=list(shape), dtype="float32",
                    fwd_ms=fwd, fwd_bwd_ms=fb, floor_fwd_ms=floor_f, floor_fwd_bwd_ms=floor_fb,
                    fwd_x_floor=fwd / floor_f, fwd_bwd_x_floor=fb / floor_fb,
                )
            )  # fmt: skip
    return rows


# --------------------------------------------------------------------------------------------
# CUDA: Triton effective bandwidth vs a device-to-device copy, and correctness vs torch
# --------------------------------------------------------------------------------------------
def _bench_cuda(shapes, dtypes, device) -> list[dict]:
    rows = []
    for shape in shapes:
        for dtype in dtypes:
            a, b, h0 = _inputs(shape, dtype, device, with_h0=True, requires_grad=True)
            dh = torch.randn(shape, device=device).to(dtype)
            nbytes = a.numel() * a.element_size()  # one (B, L, D) tensor
            src, dst = torch.empty_like(b), torch.empty_like(b)
            src.copy_(b.detach())
            copy_ms = _time_ms(lambda: dst.copy_(src), device)
            copy_gbs = 2 * nbytes / copy_ms / 1e6
            with torch.no_grad():
                fwd_ms = _time_ms(lambda: scan(a, b, h0, backend="triton"), device)
            fb_ms = _time_ms(_fwd_bwd(lambda: scan(a, b, h0, backend="triton"), (a, b, h0), dh), device)
            fwd_gbs = 3 * nbytes / fwd_ms / 1e6
            fb_gbs = 8 * nbytes / fb_ms / 1e6

            # correctness vs the torch backend (fp32 accumulation in both)
            h = scan(a, b, h0, backend="triton")
            grads = torch.autograd.grad(h, (a, b, h0), dh)
            h_ref = scan(a, b, h0, backend="torch")
            grads_ref = torch.autograd.grad(h_ref, (a, b, h0), dh)
            errs = [_rel_err(h, h_ref)] + [_rel_err(g, r) for g, r in zip(grads, grads_ref)]
            del h, grads, h_ref, grads_ref
            rows.append(
                dict(
                    device=torch.cuda.get_device_name(device) if device.type == "cuda" else "interpreter", backend="triton", shape=list(shape),
                    dtype=str(dtype).replace("torch.", ""), fwd_ms=fwd_ms, fwd_bwd_ms=fb_ms,
                    copy_ms=copy_ms, copy_gbs=copy_gbs, fwd_gbs=fwd_gbs, fwd_bwd_gbs=fb_gbs,
                    fwd_pct_copy=100 * fwd_gbs / copy_gbs, fwd_bwd_pct_copy=100 * fb_gbs / copy_gbs,
                    err_h=errs[0], err_da=errs[1], err_db=errs[2], err_dh0=errs[3],
                )
            )  # fmt: skip
            del a, b, h0, dh, src, dst
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def check_correctness(device="cuda", n_cases: int | None = None) -> list[dict]:
    """The compiled Triton kernel vs the reference loop (short) and the torch backend (long),
    forward and all gradients, fp32 and bf16, on lengths and widths that are no multiple of any
    tile, decays near 0 and near 1. Returns one dict per case with relative errors and ``ok``."""
    device = torch.device(device)
    cases = [  # (shape, decay_kind, against)
        ((1, 1, 1), "uniform", "reference"),
        ((2, 17, 5), "uniform", "reference"),
        ((3, 37, 7), "near1", "reference"),
        ((2, 300, 33), "near0", "reference"),
        ((2, 1000, 130), "uniform", "reference"),
        ((1, 4099, 257), "near1", "torch"),
        ((2, 65539, 96), "uniform", "torch"),  # ~1000 chunks: long look-back chains
        ((3, 5000, 2050), "near1", "torch"),
    ]
    out = []
    for shape, kind, against in cases[:n_cases]:
        for dtype in (torch.float32, torch.bfloat16):
            for with_h0 in (False, True):
                gen = torch.Generator(device=device).manual_seed(1)
                if kind == "near0":
                    a = 1e-4 * (1 + 0.1 * torch.rand(shape, generator=gen, device=device))
                elif kind == "near1":
                    a = (0.9999 + 1e-4 * torch.rand(shape, generator=gen, device=device)).clamp(max=1)
                else:
                    a = 0.5 + 0.5 * torch.rand(shape, generator=gen, device=device)
                b = torch.randn(shape, generator=gen, device=device)
                leaves = [a.to(dtype).requires_grad_(), b.to(dtype).requires_grad_()]
                if with_h0:
                    leaves.append(torch.randn(shape[0], shape[2], generator=gen, device=device).to(dtype).requires_grad_())
                h0 = leaves[2] if with_h0 else None
                dh = torch.randn(shape, generator=gen, device=device).to(dtype)
                h = scan(leaves[0], leaves[1], h0, backend="triton")
                g = torch.autograd.grad(h, leaves, dh)
                h_ref = scan(leaves[0], leaves[1], h0, backend=against)
                g_ref = torch.autograd.grad(h_ref, leaves, dh)
                errs = [_rel_err(h, h_ref)] + [_rel_err(x, y) for x, y in zip(g, g_ref)]
                tol = 1e-4 if dtype == torch.float32 else 3e-2
                out.append(
                    dict(shape=list(shape), decay=kind, dtype=str(dtype).replace("torch.", ""), h0=with_h0,
                         against=against, max_rel_err=max(errs), errs=errs, ok=max(errs) < tol)
                )  # fmt: skip
    return out


def sweep_triton_configs(configs, shapes=None, dtypes=None, device="cuda") -> list[dict]:
    """Time the Triton kernel forward and forward+backward under each (CHUNK, BLOCK_D, num_warps)
    in ``configs`` (overriding the shape heuristic); for choosing that heuristic on new hardware."""
    from hallamonic.modeling import hallamonic_scan_triton as kmod

    device = torch.device(device)
    rows = []
    for shape in shapes or GPU_SHAPES:
        for dtype in dtypes or (torch.float32, torch.bfloat16):
            a, b, h0 = _inputs(shape, dtype, device, with_h0=True, requires_grad=True)
            dh = torch.randn(shape, device=device).to(dtype)
            nbytes = a.numel() * a.element_size()
            for chunk, block_d, warps in configs:
                kmod._OVERRIDE.update(CHUNK=chunk, BLOCK_D=block_d, num_warps=warps)
                try:
                    with torch.no_grad():
                        fwd = _time_ms(lambda: scan(a, b, h0, backend="triton"), device)
                    fb = _time_ms(_fwd_bwd(lambda: scan(a, b, h0, backend="triton"), (a, b, h0), dh), device)
                    row = dict(shape=list(shape), dtype=str(dtype).replace("torch.", ""), config=[chunk, block_d, warps],
                               fwd_ms=fwd, fwd_bwd_ms=fb, fwd_gbs=3 * nbytes / fwd / 1e6, fwd_bwd_gbs=8 * nbytes / fb / 1e6)  # fmt: skip
                except Exception as e:  # a config may not compile (registers, shared memory)
                    row = dict(shape=list(shape), dtype=str(dtype), config=[chunk, block_d, warps], error=repr(e)[:200])
                finally:
                    kmod._OVERRIDE.clear()
                print("sweep", json.dumps(row), flush=True)
                rows.append(row)
            del a, b, h0, dh
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def benchmark_scan(device: str | torch.device = "auto", shapes=None, repeats: int = 10, dtypes=None) -> list[dict]:
    """Time the scan backends on ``device`` ("auto": CUDA if present, else CPU); see module doc."""
    if str(device) == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda":
        if not triton_available():
            raise RuntimeError("bench scan on CUDA needs triton")
        return _bench_cuda(shapes or GPU_SHAPES, dtypes or (torch.float32, torch.bfloat16), device)
    return _bench_cpu(shapes or CPU_SHAPES, repeats)


# --------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------
def format_table(rows: list[dict]) -> str:
    """A plain-text table of benchmark rows (CPU or CUDA columns)."""
    if not rows:
        return "(no results)"
    if rows[0]["device"] == "cpu":
        head = ["backend", "shape", "fwd ms", "x floor", "fwd+bwd ms", "x floor", "floor fwd ms", "floor f+b ms"]
        body = [
            [r["backend"], "x".join(map(str, r["shape"])), f"{r['fwd_ms']:.2f}", f"{r['fwd_x_floor']:.1f}",
             f"{r['fwd_bwd_ms']:.2f}", f"{r['fwd_bwd_x_floor']:.1f}", f"{r['floor_fwd_ms']:.2f}",
             f"{r['floor_fwd_bwd_ms']:.2f}"]
            for r in rows
        ]  # fmt: skip
    else:
        head = ["shape", "dtype", "fwd ms", "fwd GB/s", "% copy", "f+b ms", "f+b GB/s", "% copy",
                "copy GB/s", "err h", "err da", "err db", "err dh0"]  # fmt: skip
        body = [
            ["x".join(map(str, r["shape"])), r["dtype"], f"{r['fwd_ms']:.3f}", f"{r['fwd_gbs']:.0f}",
             f"{r['fwd_pct_copy']:.0f}%", f"{r['fwd_bwd_ms']:.3f}", f"{r['fwd_bwd_gbs']:.0f}",
             f"{r['fwd_bwd_pct_copy']:.0f}%", f"{r['copy_gbs']:.0f}", f"{r['err_h']:.1e}",
             f"{r['err_da']:.1e}", f"{r['err_db']:.1e}", f"{r['err_dh0']:.1e}"]
            for r in rows
        ]  # fmt: skip
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(str(x).rjust(w) for x, w in zip(line, widths)) for line in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run(device: str = "auto", json_path: str | None = None, check: bool = False, repeats: int = 10) -> list[dict]:
    """Benchmark (and optionally check correctness), print a table, save JSON if asked."""
    rows = benchmark_scan(device, repeats=repeats)
    note = (
        "CPU: median ms; floor = elementwise a*b (forward, forward+backward) on the same tensors"
        if rows and rows[0]["device"] == "cpu"
        else "CUDA: effective GB/s = bytes the op must move (fwd 3 tensors, fwd+bwd 8) / time; "
        "copy = dst.copy_(src), read+write; errors: max |triton - torch| / max |torch|"
    )
    print(note)
    print(format_table(rows))
    result = {"bench": rows}
    if check:
        checks = check_correctness(device if str(device) != "auto" else "cuda")
        for c in checks:
            print(f"check {'ok ' if c['ok'] else 'BAD'} {c}")
        result["checks"] = checks
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=1))
    return rows


# --------------------------------------------------------------------------------------------
# CLI: typer when installed (``hallamonic bench scan``), argparse otherwise (``python -m``)
# --------------------------------------------------------------------------------------------
try:
    import typer
except ImportError:  # e.g. the bare GPU machine: use ``python -m hallamonic.bench.scan``
    typer = None

if typer is not None:
    app = typer.Typer(help="Benchmarks of the model's pieces.", no_args_is_help=True)
    from hallamonic.bench.model import model_command  # noqa: E402

    app.command("model", help="Decode latency, memory and prefill time vs context: Hallamonic vs Llama.")(model_command)
    from hallamonic.bench.block import block_command  # noqa: E402

    app.command("block", help="One mixer's forward+backward time and saved memory: HarmonicBlock by state size vs attention.")(block_command)

    @app.command("scan")
    def scan_command(
        device: str = typer.Option("auto", help="auto, cpu or cuda"),
        json_path: Path | None = typer.Option(None, "--json", help="save the results as JSON here"),
        check: bool = typer.Option(False, help="also check the Triton kernel's correctness (CUDA)"),
        repeats: int = typer.Option(10, help="timed repeats per measurement (CPU)"),
    ) -> None:
        """Time the scan backends against the memory-bound floor (CPU) or a copy (CUDA)."""
        run(device, str(json_path) if json_path else None, check, repeats)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hallamonic.bench.scan", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--json", dest="json_path", default=None)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--check-only", action="store_true", help="only the correctness checks (CUDA)")
    parser.add_argument("--cases", type=int, default=None, help="with --check-only: the first N cases only")
    parser.add_argument("--sweep", default=None, help="CHUNK,BLOCK_D,WARPS;... Triton configs to time")
    args = parser.parse_args(argv)
    if args.sweep:
        configs = [tuple(int(x) for x in c.split(",")) for c in args.sweep.split(";")]
        rows = sweep_triton_configs(configs, device=args.device if args.device != "auto" else "cuda")
        if args.json_path:
            Path(args.json_path).write_text(json.dumps(rows, indent=1))
    elif args.check_only:
        checks = check_correctness(args.device if args.device != "auto" else "cuda", args.cases)
        for c in checks:
            print(f"check {'ok ' if c['ok'] else 'BAD'} {c}", flush=True)
        if args.json_path:
            Path(args.json_path).write_text(json.dumps(checks, indent=1))
        raise SystemExit(0 if all(c["ok"] for c in checks) else 1)
    else:
        run(args.device, args.json_path, args.check, args.repeats)


if __name__ == "__main__":
    main()
