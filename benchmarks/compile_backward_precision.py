"""What eager's backward precision costs compiled blocks: time and gradient error, side by side.

Under `train.mixed_precision: bf16` a block's scans and decay gates run in fp32 (autocast off
inside them), and eager autograd runs their backward in fp32 too. torch.compile's default traces
the backward under the forward's autocast instead (`backward_pass_autocast = "same_as_forward"`),
so those backward matmuls ran in bf16; the conversion now compiles with "off"
(`hallamonic.convert.phases.eager_backward_precision`). This script compiles one SmolLM2-shaped
block (random weights, a transfer-like input) both ways, times forward+backward alternately in one
process (so the CPU's drift hits both alike), and prints each setting's gradient error against the
eager block's float32 gradients. With ``--update-rule delta`` (the recipe's recall blocks) it also
compares ways of solving the delta rule's chunk systems under compile: the scan's blocked inverse
(ordinary ops, in the graph), torch.linalg.solve_triangular inside the graph (Inductor gave
non-finite gradients that way on SmolLM2's real inputs), and that solve as a graph break (the fix
before the blocked inverse).

Usage: python benchmarks/compile_backward_precision.py [--batch 4] [--seq-len 512] [--rounds 3] [--steps 3] [--levels 2]
       [--update-rule sum|delta]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

from hallamonic.convert.phases import eager_backward_precision
from hallamonic.convert.recipe import HarmonicSection
from hallamonic.convert.surgery import build_student
from hallamonic.convert.throughput import random_teacher
from hallamonic.modeling import hallamonic_delta_scan


def block_and_input(levels: int, batch: int, seq_len: int, update_rule: str = "sum"):
    torch.manual_seed(0)
    teacher = random_teacher("smollm2-135m", torch.float32, torch.device("cpu"))
    bands = [[1, 64], [64, 4096]] if levels == 2 else [[1, 16], [16, 256], [256, 4096]]
    student = build_student(teacher, HarmonicSection(state_size=None, timescale_bands=bands, update_rule=update_rule))
    block = student.model.layers[1].mixer
    x = torch.randn(batch, seq_len, teacher.config.hidden_size)  # (B, L, hidden), unit RMS like a normed stream
    upstream = torch.randn(batch, seq_len, teacher.config.hidden_size) * 1e-3  # (B, L, hidden)
    return block, x, upstream


def triangular_solve(system: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    return torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)


def solve_with(solve):
    """eager_backward_precision with the delta rule's chunk systems solved by `solve`."""

    @contextlib.contextmanager
    def context():
        kept = hallamonic_delta_scan._solve_unit_lower
        hallamonic_delta_scan._solve_unit_lower = solve
        try:
            with eager_backward_precision():
                yield
        finally:
            hallamonic_delta_scan._solve_unit_lower = kept

    return context


def step(call, block, x, upstream, autocast: bool) -> list[torch.Tensor]:
    """One forward+backward; the parameters' gradients."""
    block.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out, _ = call(x)
    out.backward(upstream.to(out.dtype))
    return [p.grad.clone() for p in block.parameters() if p.grad is not None]


def relative_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """Error of the whole gradient vector, relative to its norm."""
    num = sum((g.float() - w.float()).pow(2).sum() for g, w in zip(got, want))
    den = sum(w.float().pow(2).sum() for w in want)
    return (num / den).sqrt().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3, help="compiles of each setting, alternated")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after each compile")
    parser.add_argument("--levels", type=int, default=2, choices=(2, 3))
    parser.add_argument("--update-rule", default="sum", choices=("sum", "delta"))
    args = parser.parse_args()
    block, x, upstream = block_and_input(args.levels, args.batch, args.seq_len, args.update_rule)
    reference = step(block, block, x, upstream, autocast=False)  # eager float32
    eager_bf16 = step(block, block, x, upstream, autocast=True)  # eager under autocast: fp32 scans both ways
    settings = {
        "compiled, backward under forward autocast (torch default)": contextlib.nullcontext,
        "compiled, backward without autocast (eager_backward_precision)": eager_backward_precision,
    }
    eager_settings = {"eager under autocast": contextlib.nullcontext}  # the speed reference
    if args.update_rule == "delta":
        eager_settings["eager under autocast, torch.linalg.solve_triangular"] = solve_with(triangular_solve)
        settings["compiled, backward without autocast, torch.linalg.solve_triangular in the graph"] = solve_with(triangular_solve)
        settings["compiled, backward without autocast, torch.linalg.solve_triangular as a graph break"] = solve_with(
            torch.compiler.disable(triangular_solve)
        )
    # The setting applies when a graph is traced, and dynamo would reuse one setting's graph for the
    # other (it guards on shapes, not on this config): each round recompiles each setting after a
    # reset (from Inductor's disk cache after the first), warms it up untimed, then times it.
    errors, times = {}, {name: [] for name in settings}
    eager_times = {name: [] for name in eager_settings}
    for _ in range(args.rounds):
        for name, context in eager_settings.items():
            with context():
                for _ in range(args.steps):
                    began = time.perf_counter()
                    step(block, block, x, upstream, autocast=True)
                    eager_times[name].append(time.perf_counter() - began)
        for name, context in settings.items():
            torch._dynamo.reset()
            call = torch.compile(block, dynamic=False)
            with context():
                errors[name] = relative_error(step(call, block, x, upstream, autocast=True), reference)
                for _ in range(args.steps):
                    began = time.perf_counter()
                    step(call, block, x, upstream, autocast=True)
                    times[name].append(time.perf_counter() - began)
    print(f"one SmolLM2-shaped block ({args.levels} levels, N = 64, {args.update_rule} rule), {args.batch} x {args.seq_len} tokens, bf16 autocast, "
          f"{torch.get_num_threads()} threads, median of {args.rounds} x {args.steps} steps (and the fastest), settings alternated")
    reference_times = eager_times["eager under autocast"]
    base, fastest = statistics.median(reference_times), min(reference_times)
    print(f"eager gradient error (autocast) vs eager fp32: {relative_error(eager_bf16, reference):.2e}")
    for name, measured in eager_times.items():
        median = statistics.median(measured)
        print(f"{name}: fwd+bwd {median * 1e3:.0f} ms ({median / base:.2f}x; fastest {min(measured) / fastest:.2f}x)")
    for name in settings:
        median = statistics.median(times[name])
        print(
            f"{name}: fwd+bwd {median * 1e3:.0f} ms ({median / base:.2f}x; fastest {min(times[name]) / fastest:.2f}x), "
            f"gradient error vs eager fp32 {errors[name]:.2e}"
        )
    print("every step, ms:", {name: [round(t * 1e3) for t in measured] for name, measured in {**eager_times, **times}.items()})


if __name__ == "__main__":
    main()
