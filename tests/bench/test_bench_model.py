"""Smoke tests of the model benchmark (hallamonic.bench.model, reported by bench.model_report) on tiny widths and lengths.

They check that rows are well formed and the bookkeeping (cache sizes, skipping, reporting) is
right; they assert nothing about speed: timings on a shared CI machine mean nothing.
"""

from __future__ import annotations

import json

import pytest

from hallamonic.bench import model as bench
from hallamonic.bench import model_report as report

TINY = dict(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
)  # fmt: skip
NUMERIC = ("prefill_s", "prefill_tok_s", "decode_ms", "decode_ms_min", "decode_ms_max", "decode_cpu_ms", "prefill_cpu_s", "cache_mb",
           "peak_mb", "peak_total_mb", "decode_mem_mb")  # fmt: skip


def run_tiny(**kwargs):
    args = dict(lengths=(16, 48), widths=TINY, decode_steps=2, chunk_size=8, threads=1, isolate=False, log=lambda _: None)
    args.update(kwargs)
    return bench.benchmark_model(**args)


def test_rows_are_well_formed():
    rows = run_tiny()
    assert [(r["model"], r["context"]) for r in rows] == [
        ("hallamonic", 16), ("hallamonic", 48), ("llama", 16), ("llama", 48)
    ]  # fmt: skip
    for row in rows:
        assert row["status"] == "ok" and row["layers"] == 2
        for key in NUMERIC:
            assert isinstance(row[key], float), key
        assert row["decode_ms_min"] <= row["decode_ms"] <= row["decode_ms_max"]
        assert row["prefill_s"] > 0 and row["cache_mb"] > 0
    json.dumps(rows)  # rows are saved as JSON


def test_cache_sizes_constant_for_hallamonic_growing_for_llama():
    rows = run_tiny()
    hall = [r["cache_mb"] for r in rows if r["model"] == "hallamonic"]
    llama = [r["cache_mb"] for r in rows if r["model"] == "llama"]
    assert hall[0] == hall[1]
    # 2 layers x 3 levels x (4 heads x 8 dims) fp32 states
    assert hall[0] * 2**20 == pytest.approx(2 * 3 * 32 * 4)
    # keys + values: 2 layers x 2 kv heads x (context + 1 warm-up + 2 steps) x 8 dims, fp32
    assert llama[1] * 2**20 == pytest.approx(2 * 2 * 2 * (48 + 3) * 8 * 4)


def test_skipped_llama_prefill_still_decodes_from_a_synthetic_cache(monkeypatch):
    monkeypatch.setattr(bench, "predicted_prefill_s", lambda done, context: 1e9 if done else None)
    rows = run_tiny(models=("llama",))
    first, second = rows
    assert first["status"] == "ok" and "prefill_s" in first
    assert second["status"] == "ok" and "prefill_s" not in second and second["decode_ms"] > 0
    assert "prefill not run (prefill predicted" in second["note"] and "synthetic" in second["note"]
    assert second["cache_mb"] * 2**20 == pytest.approx(2 * 2 * 2 * (48 + 3) * 8 * 4)


def test_skipped_hallamonic_point_is_marked_not_run(monkeypatch):
    monkeypatch.setattr(bench, "predicted_prefill_s", lambda done, context: 1e9 if done else None)
    rows = run_tiny(models=("hallamonic",))
    assert rows[1]["status"] == "not run" and rows[1]["note"].startswith("prefill predicted")
    text = report.format_report(rows)  # a missing point does not break the report
    assert "prefill predicted" in text


def test_predicted_prefill_extrapolates_at_least_linearly_at_most_quadratically():
    assert bench.predicted_prefill_s([], 4096) is None
    assert bench.predicted_prefill_s([dict(context=1024, prefill_s=2.0)], 4096) == pytest.approx(8.0)
    sub_linear = [dict(context=1024, prefill_s=2.0), dict(context=2048, prefill_s=3.0)]
    assert bench.predicted_prefill_s(sub_linear, 4096) == pytest.approx(6.0)
    cubic = [dict(context=1024, prefill_s=1.0), dict(context=2048, prefill_s=8.0)]
    assert bench.predicted_prefill_s(cubic, 4096) == pytest.approx(32.0)


def test_report_has_ratios_and_targets():
    text = report.format_report(run_tiny())
    assert "Llama/Hallamonic decode" in text
    assert "Hallamonic decode latency (ms) flat within 10% from 16 to 48" in text
    assert "Hallamonic prefill linear" in text


def test_worker_subprocess_returns_a_row():
    spec = bench.PointSpec("hallamonic", 16, dict(TINY), decode_steps=1, chunk_size=8, threads=1)
    row = bench.run_point(spec, timeout_s=120)
    assert row["status"] == "ok", row["note"]
    assert row["peak_total_mb"] > 0 and row["context"] == 16
