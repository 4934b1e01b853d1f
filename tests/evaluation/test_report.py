"""results.json layout, tables and plots."""

from __future__ import annotations

import json

from hallamonic.evaluation.report import markdown_table, plot_results, write_results

CONTEXT = {
    "task": "context", "bits_per_token": {"1024": 3.5, "4096": 3.2}, "tokens": {"1024": 1023, "4096": 4095},
    "by_position": {"1024": {"0-1024": 3.5}, "4096": {"0-1024": 3.6, "1024-2048": 3.1, "2048-4096": 3.0}},
    "not_run": {},
}  # fmt: skip


def test_single_model_writes_the_bare_object(tmp_path):
    path = write_results({"teacher": CONTEXT}, tmp_path)
    assert json.loads(path.read_text())["bits_per_token"]["4096"] == 3.2


def test_baselines_are_keyed_by_name_and_not_run_is_shown(tmp_path):
    ntk = {**CONTEXT, "bits_per_token": {"1024": 3.5}, "not_run": {"4096": "out of memory"}}
    results = {"teacher": CONTEXT, "teacher+ntk": ntk}
    assert set(json.loads(write_results(results, tmp_path).read_text())) == {"teacher", "teacher+ntk"}
    table = markdown_table(results)
    assert "| teacher+ntk | 3.500 | not run |" in table and "out of memory" in table
    assert [p.name for p in plot_results(results, tmp_path)] == ["context.png"]
    assert (tmp_path / "context.png").stat().st_size > 1000


def test_lambada_and_passkey_tables(tmp_path):
    lam = markdown_table({"m": {"task": "lambada", "accuracy": 0.5, "perplexity": 12.345, "n": 4}})
    assert "| m | 0.5000 | 12.35 | 4 |" in lam
    pk = {"m": {"task": "passkey", "accuracy": {"1024": 1.0, "2048": 0.5}, "trials": 2, "not_run": {}}}
    assert "| m | 1.00 | 0.50 |" in markdown_table(pk)  # results from before key_tokens existed still print
    assert plot_results(pk, tmp_path)[0].name == "passkey.png"
    pk["m"]["key_tokens"] = {"1024": 1.0, "2048": 0.8}
    assert "- m, key tokens right (teacher-forced): 1024: 1.00, 2048: 0.80" in markdown_table(pk)


def test_no_plot_when_every_length_was_skipped(tmp_path):
    """A passkey run whose lengths are all shorter than the prompt has nothing to draw (it used
    to crash matplotlib's log axis)."""
    pk = {"m": {"task": "passkey", "accuracy": {}, "trials": 2, "not_run": {"128": "shorter than the prompt"}}}
    assert plot_results(pk, tmp_path) == []
    assert "not run" in markdown_table(pk)
