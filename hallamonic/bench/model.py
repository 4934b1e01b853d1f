"""Benchmark of the whole model: Hallamonic against a Llama of the same widths, by context length.

The claim under test is the point of the conversion: a HarmonicBlock keeps a constant-size state,
so per-token decode cost and memory should not depend on how long the prompt was, while a Llama's
KV cache (and with it decode cost and memory) grows with the context and its prefill is quadratic.

For each model and context length L, in a fresh subprocess (so that peak memory is that point's):

* build the model with random weights (widths of SmolLM2-135M by default, fp32; Llama with SDPA);
* prefill L random tokens -- Hallamonic in chunks (``chunk_size``, ``logits_to_keep=1``) carrying
  its recurrent state, Llama in one pass filling a DynamicCache -- and time it;
* decode: one warm-up step, then the median over ``decode_steps`` timed single-token steps;
* report the cache's size (every tensor it holds) and memory: on CPU the process's peak RSS from
  the moment the model was built and warmed up (Linux VmHWM, reset then; weights, runtime and
  all), that peak minus the RSS at that moment (the part the context adds), and the RSS right after
  decoding minus the same baseline; on CUDA the same three from ``max_memory_allocated`` /
  ``memory_allocated``.

Points that would exceed a wall-clock cap are not run: a length is skipped once the measured
prefill times, extrapolated with the growth exponent seen so far (at least linear), predict it
would exceed the cap; a point that runs over the cap anyway is killed. A Llama whose prefill was
skipped can still be *decoded* at that length from a synthetic KV cache of the right size (random
keys and values: decode cost depends on the cache's size, not its content) -- marked as such.

Library: :func:`benchmark_model` (rows as dicts), :func:`run`; the tables and the verdicts on the
targets are :mod:`hallamonic.bench.model_report`'s. CLI: ``python -m hallamonic.bench.model --help``
(typer-ready: :func:`model_command`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from hallamonic.bench.model_report import format_report, format_row, machine_description

SMOLLM2_135M_WIDTHS = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
)  # fmt: skip
DEFAULT_LENGTHS = (1024, 4096, 16384, 65536)
MODELS = ("hallamonic", "llama")
RESULT_TAG = "BENCH_MODEL_POINT "  # prefix of the worker's one result line on stdout


@dataclass
class PointSpec:
    """One measurement: a model kind at one context length (JSON-serialisable, sent to a worker)."""

    model: str
    context: int
    widths: dict = field(default_factory=lambda: dict(SMOLLM2_135M_WIDTHS))
    device: str = "cpu"
    decode_steps: int = 16
    chunk_size: int = 2048
    threads: int | None = None
    prefill: bool = True  # False: decode from a synthetic cache of `context` tokens
    seed: int = 0


# --------------------------------------------------------------------------------------------
# Models and caches
# --------------------------------------------------------------------------------------------
def build_model(kind: str, widths: dict, device: str) -> torch.nn.Module:
    """A randomly initialised fp32 model in eval mode: timing does not depend on trained weights."""
    if kind == "hallamonic":
        from hallamonic.modeling.modeling_hallamonic import HallamonicConfig, HallamonicForCausalLM

        model = HallamonicForCausalLM(HallamonicConfig(**widths))
    elif kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(**widths, attn_implementation="sdpa"))
    else:
        raise ValueError(f"bench model: unknown model {kind!r}; choose one of {', '.join(MODELS)}")
    return model.to(device=device, dtype=torch.float32).eval()


def cache_bytes(cache) -> int:
    """Bytes of every distinct tensor a cache holds (KV tensors, recurrent states), whatever its layout.

    0-d tensors are left out: they are bookkeeping (transformers >= 5.25 keeps a token counter per
    linear-attention layer as a scalar tensor), not memory that grows with heads, levels or context.
    """
    seen, total = set(), 0

    def visit(obj) -> None:
        nonlocal total
        if isinstance(obj, torch.Tensor):
            key = (obj.untyped_storage().data_ptr(), obj.device)
            if obj.dim() and obj.numel() and key not in seen:
                seen.add(key)
                total += obj.untyped_storage().nbytes()
        elif isinstance(obj, (list, tuple)):
            for item in obj:
                visit(item)
        elif isinstance(obj, dict):
            for item in obj.values():
                visit(item)

    for layer in getattr(cache, "layers", []):
        visit(vars(layer))
    return total


def synthetic_llama_cache(model: torch.nn.Module, context: int, seed: int):
    """A DynamicCache holding ``context`` random keys and values per layer, as a prefill would leave."""
    from transformers import DynamicCache

    cfg = model.config
    cache = DynamicCache(config=cfg)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    shape = (1, cfg.num_key_value_heads, context, head_dim)
    gen = torch.Generator(device=model.device).manual_seed(seed)
    for layer in range(cfg.num_hidden_layers):
        keys = torch.randn(shape, generator=gen, device=model.device)
        values = torch.randn(shape, generator=gen, device=model.device)
        cache.update(keys, values, layer)
    return cache


def run_forward(model: torch.nn.Module, kind: str, ids: torch.Tensor, cache, chunk_size: int):
    """One forward keeping the last logits only: Hallamonic chunked, Llama in one pass."""
    kwargs = dict(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    if kind == "hallamonic":
        kwargs["chunk_size"] = chunk_size
    out = model(**kwargs)
    return out.logits[:, -1:].argmax(-1), out.cache


# --------------------------------------------------------------------------------------------
# Measuring one point (inside a worker process)
# --------------------------------------------------------------------------------------------
class MemoryProbe:
    """Memory above a baseline: peak and current, from the OS on CPU and the allocator on CUDA.

    CPU: the peak is Linux's VmHWM (peak RSS), reset at the baseline by writing 5 to
    /proc/self/clear_refs, so the transient peak of building the model does not hide the run's;
    where that is impossible, ``getrusage`` maxrss (the lifetime peak: one process per point keeps it
    meaningful). tracemalloc would miss torch's own allocator.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.base_peak = self.base_now = 0

    @staticmethod
    def _proc_status_bytes(field_name: str) -> int | None:
        try:
            with open("/proc/self/status") as f:
                line = next(line for line in f if line.startswith(field_name + ":"))
            return int(line.split()[1]) * 1024  # kB
        except (OSError, StopIteration):
            return None

    def _peak(self) -> int:
        if self.cuda:
            return torch.cuda.max_memory_allocated(self.device)
        hwm = self._proc_status_bytes("VmHWM")
        return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def _now(self) -> int:
        if self.cuda:
            return torch.cuda.memory_allocated(self.device)
        rss = self._proc_status_bytes("VmRSS")
        return rss if rss is not None else 0

    @staticmethod
    def _reset_cpu_peak() -> None:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS
        except OSError:
            pass  # the lifetime peak remains: still one fresh process per point

    def set_baseline(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._reset_cpu_peak()
        self.base_peak, self.base_now = self._peak(), self._now()

    def peak_mb(self) -> float:
        return (self._peak() - self.base_peak) / 2**20

    def peak_total_mb(self) -> float:
        """The peak itself, weights included (what the process, or the GPU allocator, really needed)."""
        return self._peak() / 2**20

    def now_mb(self) -> float:
        return (self._now() - self.base_now) / 2**20


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device):
    """fn()'s result, its wall time and this process's CPU time (all threads), in seconds.

    On a shared machine wall time includes waiting for a core. CPU time does not, but it counts
    threads spin-waiting for a descheduled sibling, so with several threads contention inflates it
    too: it is kept in the JSON rows only (``prefill_cpu_s``, ``decode_cpu_ms``).
    """
    _sync(device)
    start, cpu_start = time.perf_counter(), time.process_time()
    result = fn()
    _sync(device)
    return result, time.perf_counter() - start, time.process_time() - cpu_start


def measure_point(spec: PointSpec) -> dict:
    """Prefill (or a synthetic cache), then decode; see the module docstring for what is measured."""
    if spec.threads:
        torch.set_num_threads(spec.threads)
    device = torch.device(spec.device)
    torch.manual_seed(spec.seed)
    model = build_model(spec.model, spec.widths, spec.device)
    vocab = spec.widths["vocab_size"]
    ids = torch.randint(0, vocab, (1, spec.context), device=device)
    memory = MemoryProbe(device)
    row = dict(asdict(spec), layers=spec.widths["num_hidden_layers"], status="ok", note="", load_1min=os.getloadavg()[0])
    with torch.inference_mode():
        run_forward(model, spec.model, ids[:, :16], None, spec.chunk_size)  # warm-up: kernels, thread pool
        memory.set_baseline()
        if spec.prefill:
            (token, cache), seconds, cpu = _timed(lambda: run_forward(model, spec.model, ids, None, spec.chunk_size), device)
            row.update(prefill_s=seconds, prefill_cpu_s=cpu, prefill_tok_s=spec.context / seconds, prefill_peak_mb=memory.peak_mb())
        else:
            cache = synthetic_llama_cache(model, spec.context, spec.seed)
            token = ids[:, -1:]
            row["note"] = "decode from a synthetic KV cache"
        steps, cpu_steps = [], []
        for step in range(spec.decode_steps + 1):  # step 0 is the warm-up
            (token, cache), seconds, cpu = _timed(lambda: run_forward(model, spec.model, token, cache, spec.chunk_size), device)
            if step:
                steps.append(seconds)
                cpu_steps.append(cpu)
    row.update(
        decode_ms=1e3 * statistics.median(steps),
        decode_ms_min=1e3 * min(steps),
        decode_ms_max=1e3 * max(steps),
        decode_cpu_ms=1e3 * statistics.median(cpu_steps),
        cache_mb=cache_bytes(cache) / 2**20,
        peak_mb=memory.peak_mb(),
        peak_total_mb=memory.peak_total_mb(),
        decode_mem_mb=memory.now_mb(),
    )
    return row


# --------------------------------------------------------------------------------------------
# Orchestration: one subprocess per point, a wall-clock cap, skipping what cannot fit
# --------------------------------------------------------------------------------------------
def run_point(spec: PointSpec, timeout_s: float, isolate: bool = True) -> dict:
    """Measure a point in a fresh process (isolate=True, needed for a per-point peak RSS) or here."""
    if not isolate:
        return measure_point(spec)
    cmd = [sys.executable, "-m", "hallamonic.bench.model", "--worker", json.dumps(asdict(spec))]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return not_run(spec, f"killed after {timeout_s:.0f} s")
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG) :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
    return not_run(spec, f"failed: {tail[0][:160]}")


def not_run(spec: PointSpec, reason: str) -> dict:
    return dict(asdict(spec), layers=spec.widths["num_hidden_layers"], status="not run", note=reason)


def predicted_prefill_s(done: list[dict], context: int) -> float | None:
    """Prefill time at ``context`` extrapolated from the measured points: t ~ L^p, p from the last
    two points, clamped to [1, 2] (from one point: linear, a lower bound for attention)."""
    measured = [r for r in done if r.get("prefill_s")]
    if not measured:
        return None
    last = measured[-1]
    exponent = 1.0
    if len(measured) >= 2:
        prev = measured[-2]
        exponent = math.log(last["prefill_s"] / prev["prefill_s"]) / math.log(last["context"] / prev["context"])
        exponent = min(max(exponent, 1.0), 2.0)
    return last["prefill_s"] * (context / last["context"]) ** exponent


def benchmark_model(
    models=MODELS,
    lengths=DEFAULT_LENGTHS,
    layers: int | None = None,
    device: str = "cpu",
    cap_s: float = 120.0,
    decode_steps: int = 16,
    chunk_size: int = 2048,
    threads: int | None = None,
    widths: dict | None = None,
    synthetic_decode: bool = True,
    isolate: bool = True,
    log=print,
) -> list[dict]:
    """Rows of measurements, one per (model, context); see the module docstring.

    ``layers`` overrides the depth of both models equally (to fit a CPU budget); ``cap_s`` is the
    wall-clock cap on one prefill. ``synthetic_decode``: where a Llama prefill is skipped, still
    time its decode from a synthetic KV cache of that length.
    """
    widths = dict(widths or SMOLLM2_135M_WIDTHS)
    if layers:
        widths["num_hidden_layers"] = layers
    rows = []
    for kind in models:
        done, skip_reason = [], None
        for context in sorted(lengths):
            spec = PointSpec(kind, context, widths, device, decode_steps, chunk_size, threads)
            predicted = predicted_prefill_s(done, context)
            if skip_reason is None and predicted is not None and predicted > cap_s:
                skip_reason = f"prefill predicted {predicted:.0f} s > cap {cap_s:.0f} s"
            if skip_reason is None:
                row = run_point(spec, timeout_s=cap_s + 60 + 5 * decode_steps, isolate=isolate)
                if row["status"] != "ok":
                    skip_reason = f"prefill at {context} tokens: {row['note']}"
            if skip_reason is not None:
                row = not_run(spec, skip_reason)
                if kind == "llama" and synthetic_decode:
                    spec.prefill = False
                    row = run_point(spec, timeout_s=60 + 5 * decode_steps * max(1, context // 4096), isolate=isolate)
                    row["note"] = f"prefill not run ({skip_reason}); decode from a synthetic KV cache"
            done.append(row)
            log(format_row(row))
        rows.extend(done)
    return rows


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
def run(
    models: str = ",".join(MODELS),
    lengths: str = ",".join(map(str, DEFAULT_LENGTHS)),
    layers: int | None = None,
    device: str = "cpu",
    cap: float = 120.0,
    decode_steps: int = 16,
    chunk_size: int = 2048,
    threads: int | None = None,
    synthetic_decode: bool = True,
    json_path: str | None = None,
    markdown: str | None = None,
    command: str | None = None,
) -> list[dict]:
    """Benchmark, print progress and the report, and save them if asked (see the module docstring)."""
    model_list = [m.strip() for m in models.split(",") if m.strip()]
    length_list = [int(x) for x in lengths.split(",")]
    layers = layers or SMOLLM2_135M_WIDTHS["num_hidden_layers"]
    header = (
        f"Hallamonic vs Llama, SmolLM2-135M widths, {layers} layers "
        f"{'(full depth)' if layers == 30 else '(REDUCED from 30, both models equally)'}, fp32, "
        f"random weights, device {device}; {machine_description(device, threads)}"
    )
    print(header, flush=True)
    start = time.perf_counter()
    rows = benchmark_model(
        model_list, length_list, layers, device, cap, decode_steps, chunk_size, threads,
        synthetic_decode=synthetic_decode, log=lambda line: print(line, flush=True),
    )  # fmt: skip
    report = format_report(rows)
    footer = f"total wall time {time.perf_counter() - start:.0f} s"
    print("\n" + report + "\n\n" + footer)
    if json_path:
        Path(json_path).write_text(json.dumps(dict(header=header, rows=rows), indent=1))
    if markdown:
        command = command or "python -m hallamonic.bench.model " + " ".join(sys.argv[1:])
        Path(markdown).write_text(f"{header}\n\nCommand: `{command}`\n\n{report}\n\n{footer}\n")
    return rows


def model_command(
    models: str = ",".join(MODELS),
    lengths: str = ",".join(map(str, DEFAULT_LENGTHS)),
    layers: int = 0,
    device: str = "cpu",
    cap: float = 120.0,
    decode_steps: int = 16,
    chunk_size: int = 2048,
    threads: int = 0,
    synthetic_decode: bool = True,
    json_path: str = "",
    markdown: str = "",
) -> None:
    """Decode latency, memory, cache size and prefill time of Hallamonic vs a same-width Llama by context.

    --layers 0 = full depth (30); --threads 0 = torch's default.
    """
    # Plain defaults only, so typer registers this without the module importing typer:
    # ``app.command("model")(model_command)``.
    run(models, lengths, layers or None, device, cap, decode_steps, chunk_size, threads or None,
        synthetic_decode, json_path or None, markdown or None)  # fmt: skip


def _parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m hallamonic.bench.model", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: hallamonic,llama")
    parser.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)), help="context lengths, comma-separated")
    parser.add_argument("--layers", type=int, default=None, help="depth of BOTH models (default: 30, SmolLM2-135M)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--cap", type=float, default=120.0, help="wall-clock cap on one prefill, seconds")
    parser.add_argument("--decode-steps", type=int, default=16)
    parser.add_argument("--chunk-size", type=int, default=2048, help="Hallamonic prefill chunk")
    parser.add_argument("--threads", type=int, default=None, help="torch threads in every worker")
    parser.add_argument("--no-synthetic-decode", action="store_true", help="no Llama decode where its prefill is skipped")
    parser.add_argument("--json", dest="json_path", default=None, help="save the rows as JSON here")
    parser.add_argument("--markdown", default=None, help="save the report as markdown here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: one point, JSON spec
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = _parse_args(argv)
    if args.worker:
        print(RESULT_TAG + json.dumps(measure_point(PointSpec(**json.loads(args.worker)))), flush=True)
        return
    command = "python -m hallamonic.bench.model " + " ".join(sys.argv[1:] if argv is None else argv)
    run(args.models, args.lengths, args.layers, args.device, args.cap, args.decode_steps, args.chunk_size,
        args.threads, not args.no_synthetic_decode, args.json_path, args.markdown, command)  # fmt: skip


if __name__ == "__main__":
    main()
