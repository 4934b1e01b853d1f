"""`python -m hallamonic.bench.selective`: the kernel-vs-chunked rows, run through the interpreter."""

from __future__ import annotations

import importlib.util

import pytest

from hallamonic.bench.selective import check, main

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed"),
]


def test_every_value_block_is_checked_and_timed(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    (row,) = check("cpu", {"odd": (1, 33, 1, 20, 16)}, value_blocks=(16, 32))
    assert row["ok"] and row["max_rel_error"] < 1e-4  # both blocks agree with the chunked path
    assert set(row["triton_ms"]) == {16, 32} and row["best_value_block"] in (16, 32)
    assert row["speedup"] == pytest.approx(row["chunked_ms"] / min(row["triton_ms"].values()))


def test_cli_writes_the_rows_and_exits_zero_when_all_agree(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr("hallamonic.bench.selective.CPU_SHAPES", {"tiny": (1, 17, 1, 16, 16)})
    with pytest.raises(SystemExit) as exit_info:
        main(["--device", "cpu", "--json", str(tmp_path / "rows.json")])
    assert exit_info.value.code == 0
    assert '"best_value_block"' in (tmp_path / "rows.json").read_text()
