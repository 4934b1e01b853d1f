"""The model benchmark's report: tables and verdicts are pure functions of the rows."""

from __future__ import annotations

from hallamonic.bench.model_report import check_targets, format_ratios, format_row


def row(model, context, decode_ms, prefill_s, peak_total_mb=1000.0, **extra):
    return dict(model=model, context=context, decode_ms=decode_ms, decode_ms_min=decode_ms, decode_ms_max=decode_ms,
                prefill_s=prefill_s, peak_total_mb=peak_total_mb, peak_mb=10.0, cache_mb=1.0, note="", **extra)  # fmt: skip


ROWS = [
    row("hallamonic", 1024, 10.0, 1.0), row("hallamonic", 16384, 10.5, 16.5, peak_total_mb=1050.0),
    row("llama", 1024, 12.0, 0.5), row("llama", 16384, 40.0, 40.0),
]  # fmt: skip


def test_targets_state_their_numbers_and_verdicts():
    lines = check_targets(ROWS)
    assert "Hallamonic decode latency (ms) flat within 10% from 1024 to 16384: 10.0 -> 10.5 (+5%) -- met" in lines
    assert "Hallamonic decode >= 3x faster than Llama at 16K: 3.81x -- met" in lines
    assert any(line.startswith("Hallamonic prefill linear: time ~ L^1.01") and "-- met" in line for line in lines)


def test_ratios_and_progress_lines():
    table = format_ratios(ROWS)
    assert "| 16384   | 3.81x" in table and "(no results)" == format_ratios([])
    assert format_row(dict(model="llama", context=64, note="x")).split() == "llama L= 64 prefill - s decode - ms cache - MB peak +- MB x".split()
