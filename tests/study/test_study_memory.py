"""The memory wall: extrapolation, the CPU measurement in a fresh process, the limit, the files."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from hallamonic.study.memory import _predicted, memory_wall
from hallamonic.study.recipe import load_study_recipe


def test_prediction_follows_the_measured_growth():
    assert _predicted([(1024, 10.0), (2048, 40.0)], 4096) == pytest.approx(160.0)  # quadratic
    assert _predicted([(1024, 10.0), (2048, 20.0)], 8192) == pytest.approx(80.0)  # linear
    assert _predicted([(1024, 10.0), (2048, 15.0)], 4096) == pytest.approx(30.0)  # at least linear
    assert _predicted([], 4096) is None


def test_cpu_wall_measures_and_stops_at_the_limit(tmp_path):
    recipe = load_study_recipe("study-ci", ["models=[harmonic, transformer]", "memory.lengths=[256, 2048]", "memory.limit_gb=0.02"])
    results = memory_wall(recipe, tmp_path, echo=lambda *_: None)
    for name in ("harmonic", "transformer"):
        first = results["models"][name]["lengths"]["256"]
        assert first["status"] == "ok" and first["step_mb"] > 0 and first["tokens_per_s"] > 0
        assert results["models"][name]["lengths"]["2048"]["status"].startswith("not run: predicted")
    assert json.loads((tmp_path / "memory.json").read_text()) == results
    assert "| harmonic |" in (tmp_path / "memory.md").read_text()
    assert (tmp_path / "memory.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the mmap threshold is a glibc setting")
def test_memory_child_can_fix_the_mmap_threshold():
    # In a fresh interpreter: the setting would slow every later test in this one.
    code = "from hallamonic.study.memory import return_freed_memory as r; raise SystemExit(0 if r() else 1)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the malloc settings are glibc's")
def test_memory_children_start_without_the_commands_malloc_settings(monkeypatch):
    # The `hallamonic` command runs with malloc keeping freed memory; a measured step must not.
    from hallamonic.allocator import MALLOC_SETTINGS
    from hallamonic.study.memory import _glibc_default_malloc

    for name, value in MALLOC_SETTINGS.items():
        monkeypatch.setenv(name, value)
    with _glibc_default_malloc():
        seen = subprocess.run([sys.executable, "-c", "import os; print(sorted(k for k in os.environ if k.startswith('MALLOC_')))"],
                              capture_output=True, text=True).stdout.strip()
    assert seen == "[]"
    assert all(os.environ[name] == value for name, value in MALLOC_SETTINGS.items())  # restored after
