"""The memory wall: peak memory of one training step against sequence length, per architecture.

One step = forward, backward and an AdamW update on ``batch_size`` sequences of random tokens;
"step memory" is the peak during the first step above what the built model held before it
(activations, gradients and optimizer state; not the weights). The time is that of a second step.
On CUDA the peak is ``torch.cuda.max_memory_allocated``, measured in-process; an out-of-memory
error marks the length (and every longer one) "OOM". On CPU every measurement runs in a fresh
process whose peak resident set size (``ru_maxrss``) is read after the step, minus the resident
size before it; a length predicted to need more than ``memory.limit_gb`` (extrapolated from the
previous two lengths) is not run, and the process's address space is capped as a safety.

Why the CPU measurement sets glibc's mmap threshold: by default glibc raises that threshold after the
first ~1 MB block is freed, so every later temporary of that size comes from the main heap, and
tensors still alive pin the heap's freed pages. Peak RSS then grows with everything the step *ever*
allocated, not with what it needs at once: the harmonic step's 2,048-token recompute segments free
~1.2 MB temporaries by the hundred, and its peak RSS read 645 MB at 4K tokens against 211 MB with the
threshold fixed at 128 KB (the transformer's: 286 vs 207 MB). The memory child fixes the threshold
so every model's peak is what it holds, not what the allocator kept; the step is then timed in a
second child with the default allocator, since small mmaps are slower. Both children start without
the malloc settings `HALLAMONIC_MALLOC=keep` gives the `hallamonic` command (``hallamonic/allocator.py``): those keep
every freed block, and a 1 GiB heap pad serves later blocks before any threshold is consulted.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import math
import multiprocessing
import os
import resource
import time
from pathlib import Path

import torch

from hallamonic.allocator import MALLOC_SETTINGS
from hallamonic.study.models import Architecture, build_architectures
from hallamonic.study.recipe import StudyRecipe
from hallamonic.study.runner import implementation

WALL_MODELS = ("harmonic", "transformer", "mamba")  # the ablations have the harmonic model's memory


def _step(model, optimizer, length: int, batch_size: int, device: str) -> None:
    from hallamonic.study.runner import next_token_loss

    batch = torch.randint(0, model.config.vocab_size, (batch_size, length), device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        loss = next_token_loss(model, batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()


def _built(arch: Architecture, device: str):
    model = arch.build(0).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def _timed_step(model, optimizer, length: int, batch_size: int, device: str) -> float:
    began = time.perf_counter()
    _step(model, optimizer, length, batch_size, device)
    return time.perf_counter() - began


def _rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize() / 2**20


M_MMAP_THRESHOLD = -3  # mallopt parameter number (malloc.h)
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's initial default, kept fixed instead of adapting upward


def return_freed_memory() -> bool:
    """Pin glibc's mmap threshold at 128 KB so freed large temporaries go back to the OS (see the
    module docstring). False where the C library is not glibc (nothing changed)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return bool(libc and libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False


def _cpu_child(arch: Architecture, length: int, batch_size: int, cap_bytes: int, threads: int, measure: str, queue) -> None:
    """One measurement in a fresh process: ``measure`` "memory" (peak RSS of a first step, allocator
    returning freed memory) or "time" (a second, warm step with the default allocator)."""
    from hallamonic.evaluation.scoring import is_out_of_memory

    torch.set_num_threads(threads)
    resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))
    try:
        if measure == "memory":
            return_freed_memory()
        model, optimizer = _built(arch, "cpu")
        before = _rss_mb()
        _step(model, optimizer, length, batch_size, "cpu")
        if measure == "memory":
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            queue.put({"status": "ok", "step_mb": peak - before})
        else:
            queue.put({"status": "ok", "seconds": _timed_step(model, optimizer, length, batch_size, "cpu")})
    except (MemoryError, RuntimeError) as err:
        if isinstance(err, MemoryError) or is_out_of_memory(err):
            queue.put({"status": "out of memory", "error": str(err)[:200]})
        else:
            queue.put({"status": f"error: {type(err).__name__}", "error": str(err)[:300]})


@contextlib.contextmanager
def _glibc_default_malloc():
    """Within the block, child processes start with glibc's own malloc settings."""
    saved = {name: os.environ.pop(name) for name in MALLOC_SETTINGS if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _measure_cpu(arch: Architecture, length: int, batch_size: int, limit_gb: float) -> dict:
    context = multiprocessing.get_context("spawn")
    cap = int((2 * limit_gb + 4) * 2**30)  # room for the interpreter, torch and its virtual reservations
    row: dict = {}
    for measure in ("memory", "time"):
        queue = context.Queue()
        child = context.Process(target=_cpu_child, args=(arch, length, batch_size, cap, torch.get_num_threads(), measure, queue))
        with _glibc_default_malloc():
            child.start()
        child.join()
        result = queue.get() if not queue.empty() else {"status": f"failed (exit code {child.exitcode})"}
        if result["status"] != "ok":
            return result
        row.update(result)
    return row


def _measure_cuda(arch: Architecture, length: int, batch_size: int) -> dict:
    model, optimizer = _built(arch, "cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    try:
        _step(model, optimizer, length, batch_size, "cuda")
        peak = torch.cuda.max_memory_allocated()
        seconds = _timed_step(model, optimizer, length, batch_size, "cuda")  # warm: the second step
    except torch.OutOfMemoryError:
        return {"status": "OOM"}
    finally:
        del model, optimizer
        torch.cuda.empty_cache()
    return {"status": "ok", "step_mb": (peak - before) / 2**20, "seconds": seconds}


def _predicted(points: list[tuple[int, float]], length: int) -> float | None:
    """A cost (MB or seconds) at ``length`` extrapolated from the last two measured lengths with
    their own growth exponent (at least linear)."""
    if not points:
        return None
    (l1, m1), (l2, m2) = (points[-2] if len(points) > 1 else (points[-1][0] / 2, points[-1][1] / 2)), points[-1]
    exponent = max(1.0, math.log(max(m2, 1e-6) / max(m1, 1e-6)) / math.log(l2 / l1)) if l2 != l1 else 1.0
    return m2 * (length / l2) ** exponent


def memory_wall(recipe: StudyRecipe, out: Path, *, vocab_size: int = 256, echo=print) -> dict:
    """Measure every wall model at every ``memory.lengths``; write memory.json / memory.md / memory.png."""
    names = [m for m in WALL_MODELS if m in recipe.models]
    lengths = sorted(recipe.memory.lengths)
    archs = build_architectures(recipe.model, vocab_size, names, max(lengths))
    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if cuda else f"cpu ({torch.get_num_threads()} threads)"
    results: dict = {"device": device, "batch_size": recipe.memory.batch_size, "models": {}}
    for name in names:
        arch, points, times, rows, stopped = archs[name], [], [], {}, None
        for length in lengths:
            if stopped:
                rows[str(length)] = {"status": stopped}
                continue
            predicted = None if cuda else _predicted(points, length)
            seconds = _predicted(times, length)
            if predicted is not None and predicted > recipe.memory.limit_gb * 1024:
                stopped = f"not run: predicted {predicted / 1024:.1f} GB > limit {recipe.memory.limit_gb} GB"
            elif seconds is not None and seconds > recipe.memory.max_step_seconds:
                stopped = f"not run: predicted {seconds:.0f} s per step > limit {recipe.memory.max_step_seconds:.0f} s"
            if stopped:
                rows[str(length)] = {"status": stopped}
                echo(f"{name:12s} {length:>8,} tokens: {stopped}")
                continue
            row = _measure_cuda(arch, length, recipe.memory.batch_size) if cuda else _measure_cpu(
                arch, length, recipe.memory.batch_size, recipe.memory.limit_gb
            )
            rows[str(length)] = row
            if row["status"] == "ok":
                points.append((length, row["step_mb"]))
                times.append((length, row["seconds"]))
                tokens_s = length * recipe.memory.batch_size / row["seconds"]
                row["tokens_per_s"] = tokens_s
                echo(f"{name:12s} {length:>8,} tokens: {row['step_mb']:>9,.0f} MB, {row['seconds']:.2f} s ({tokens_s:,.0f} tokens/s)")
            else:
                stopped = row["status"]
                echo(f"{name:12s} {length:>8,} tokens: {row['status']}")
        results["models"][name] = {"params": arch.params, "implementation": implementation(arch), "lengths": rows}
    out.mkdir(parents=True, exist_ok=True)
    (out / "memory.json").write_text(json.dumps(results, indent=1))
    (out / "memory.md").write_text(_markdown(results, lengths))
    _plot(results, lengths, out / "memory.png")
    return results


def _markdown(results: dict, lengths: list[int]) -> str:
    lines = [
        f"Peak memory of one training step (MB: activations, gradients, optimizer state; not the weights), "
        f"batch {results['batch_size']}, {results['device']}.",
        "", "| model | params | " + " | ".join(f"{n:,}" for n in lengths) + " |", "|---|---:|" + "---:|" * len(lengths),
    ]
    for name, entry in results["models"].items():
        cells = []
        for n in lengths:
            row = entry["lengths"][str(n)]
            cells.append(f"{row['step_mb']:,.0f}" if row["status"] == "ok" else row["status"].split(":")[0])
        lines.append(f"| {name} | {entry['params']:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _plot(results: dict, lengths: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, entry in results["models"].items():
        points = [(int(n), r["step_mb"]) for n, r in entry["lengths"].items() if r["status"] == "ok"]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("peak step memory (MB)")
    ax.set_title(f"memory wall, {results['device']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
