"""Reporting of the model benchmark (:mod:`hallamonic.bench.model`): progress lines, the
per-point table, Llama / Hallamonic ratios, and the claims checked against the measured rows.

Pure functions of the rows (dicts) -- nothing here measures anything -- plus a one-line
description of the machine for the results file.
"""

from __future__ import annotations

import math
import os

import torch


def _fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def format_row(row: dict) -> str:
    """One progress line."""
    return (
        f"{row['model']:>10} L={row['context']:>6}  prefill {_fmt(row.get('prefill_s'), '.1f')} s  "
        f"decode {_fmt(row.get('decode_ms'), '.1f')} ms  cache {_fmt(row.get('cache_mb'), '.1f')} MB  "
        f"peak +{_fmt(row.get('peak_mb'), '.0f')} MB  {row.get('note', '')}"
    )


def _table(head: list[str], body: list[list[str]]) -> str:
    """A GitHub-markdown table (readable as plain text too)."""
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    lines = ["| " + " | ".join(str(x).ljust(w) for x, w in zip(line, widths)) + " |" for line in [head, *body]]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def format_measurements(rows: list[dict]) -> str:
    """The per-point table."""
    head = ["model", "context", "prefill s", "prefill tok/s", "decode ms/tok (median)", "decode min-max",
            "cache MB", "peak mem MB", "peak +MB", "after decode +MB", "load", "note"]  # fmt: skip
    body = [
        [r["model"], str(r["context"]), _fmt(r.get("prefill_s"), ".1f"), _fmt(r.get("prefill_tok_s"), ".0f"),
         _fmt(r.get("decode_ms"), ".1f"),
         f"{r['decode_ms_min']:.1f}-{r['decode_ms_max']:.1f}" if r.get("decode_ms") else "-",
         _fmt(r.get("cache_mb"), ".2f"), _fmt(r.get("peak_total_mb"), ".0f"), _fmt(r.get("peak_mb"), ".0f"), _fmt(r.get("decode_mem_mb"), ".0f"), _fmt(r.get("load_1min"), ".1f"),
         r.get("note") or ""]
        for r in rows
    ]  # fmt: skip
    return _table(head, body)


def _by_context(rows: list[dict], kind: str) -> dict[int, dict]:
    return {r["context"]: r for r in rows if r["model"] == kind}


def _ratio(num, den) -> str:
    return f"{num / den:.2f}x" if num is not None and den else "-"


def format_ratios(rows: list[dict]) -> str:
    """Llama / Hallamonic decode latency per context, and each model's cost relative to its shortest context."""
    hall, llama = _by_context(rows, "hallamonic"), _by_context(rows, "llama")
    contexts = sorted(set(hall) | set(llama))
    if not contexts:
        return "(no results)"
    first = contexts[0]
    head = ["context", "Llama/Hallamonic decode", f"Hallamonic decode vs {first}", f"Hallamonic peak mem vs {first}",
            f"Llama decode vs {first}", "Hallamonic prefill s per 1K tok", "Llama prefill s per 1K tok"]  # fmt: skip
    body = []
    for c in contexts:
        h, l = hall.get(c, {}), llama.get(c, {})
        h0, l0 = hall.get(first, {}), llama.get(first, {})
        body.append([
            str(c), _ratio(l.get("decode_ms"), h.get("decode_ms")), _ratio(h.get("decode_ms"), h0.get("decode_ms")),
            _ratio(h.get("peak_total_mb"), h0.get("peak_total_mb")), _ratio(l.get("decode_ms"), l0.get("decode_ms")),
            _fmt(h["prefill_s"] * 1024 / c if h.get("prefill_s") else None, ".2f"),
            _fmt(l["prefill_s"] * 1024 / c if l.get("prefill_s") else None, ".2f"),
        ])  # fmt: skip
    return _table(head, body)


def check_targets(rows: list[dict]) -> list[str]:
    """The claims, each stated with the numbers that support or refute it (nothing is asserted)."""
    hall, llama = _by_context(rows, "hallamonic"), _by_context(rows, "llama")
    lines = []
    measured = sorted(c for c, r in hall.items() if r.get("decode_ms"))
    if len(measured) >= 2:
        lo, hi = hall[measured[0]], hall[measured[-1]]
        for key, name in (("decode_ms", "decode latency (ms)"), ("peak_total_mb", "peak memory, weights included (MB)")):
            if lo.get(key) and hi.get(key) is not None:
                change = hi[key] / lo[key] - 1
                verdict = "met" if abs(change) <= 0.10 else "NOT met"
                lines.append(f"Hallamonic {name} flat within 10% from {lo['context']} to {hi['context']}: "
                             f"{lo[key]:.1f} -> {hi[key]:.1f} ({change:+.0%}) -- {verdict}")  # fmt: skip
        if lo.get("peak_mb") is not None and hi.get("peak_mb") is not None:
            lines.append(f"Hallamonic context-dependent peak memory (above the built model): "
                         f"{lo['peak_mb']:.0f} MB at {lo['context']} -> {hi['peak_mb']:.0f} MB at {hi['context']}")  # fmt: skip
    if 16384 in hall and 16384 in llama and hall[16384].get("decode_ms") and llama[16384].get("decode_ms"):
        speedup = llama[16384]["decode_ms"] / hall[16384]["decode_ms"]
        lines.append(f"Hallamonic decode >= 3x faster than Llama at 16K: {speedup:.2f}x -- {'met' if speedup >= 3 else 'NOT met'}")
    prefills = sorted((c, r["prefill_s"]) for c, r in hall.items() if r.get("prefill_s"))
    if len(prefills) >= 2:
        (c0, t0), (c1, t1) = prefills[0], prefills[-1]
        exponent = math.log(t1 / t0) / math.log(c1 / c0)
        lines.append(f"Hallamonic prefill linear: time ~ L^{exponent:.2f} from {c0} to {c1} tokens -- "
                     f"{'met' if exponent <= 1.1 else 'NOT met'} (1.00 = linear)")  # fmt: skip
    return lines


def format_report(rows: list[dict]) -> str:
    """Measurements, ratios and the targets, as markdown."""
    parts = [format_measurements(rows), "", format_ratios(rows), ""]
    parts += [f"- {line}" for line in check_targets(rows)]
    return "\n".join(parts)


def machine_description(device: str, threads: int | None) -> str:
    """What ran the benchmark, for the results file."""
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    parts = [f"CPU {cpu}, {os.cpu_count()} cores visible, torch threads {threads or torch.get_num_threads()}"]
    if device.startswith("cuda") and torch.cuda.is_available():
        parts.append(f"GPU {torch.cuda.get_device_name(0)}")
    parts.append(f"torch {torch.__version__}, python {platform.python_version()}")
    return "; ".join(parts)
