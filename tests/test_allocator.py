"""`HALLAMONIC_MALLOC=keep` runs the `hallamonic` command with glibc malloc keeping freed memory (allocator.py)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from hallamonic.allocator import MALLOC_SETTINGS, missing_malloc_settings


def test_asking_for_it_on_glibc_gets_every_setting():
    assert missing_malloc_settings({"HALLAMONIC_MALLOC": "keep"}, libc="glibc") == MALLOC_SETTINGS


@pytest.mark.parametrize(
    "environ, libc",
    [
        ({}, "glibc"),  # the default: glibc's own settings
        ({"HALLAMONIC_MALLOC": "system"}, "glibc"),
        ({"HALLAMONIC_MALLOC": "keep", "MALLOC_TOP_PAD_": "0"}, "glibc"),  # the user tuned malloc: theirs win
        ({"HALLAMONIC_MALLOC": "keep"}, ""),  # not glibc (musl, macOS): the names mean nothing there
        ({"HALLAMONIC_MALLOC": "keep", **MALLOC_SETTINGS}, "glibc"),  # already there: the re-executed command does not loop
    ],
)
def test_no_settings_unless_asked_for_and_missing_on_glibc(environ, libc):
    assert missing_malloc_settings(environ, libc=libc) == {}


def run_child(body: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in MALLOC_SETTINGS and k != "HALLAMONIC_MALLOC"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(body)], env={**environ, **env},
                          capture_output=True, text=True, timeout=120)


REEXEC = """
    import os, sys
    from hallamonic.allocator import exec_with_malloc_settings
    print("before", os.environ.get("MALLOC_MMAP_THRESHOLD_"), flush=True)
    exec_with_malloc_settings([sys.executable, "-c", "import os; print('after', os.environ.get('MALLOC_MMAP_THRESHOLD_'))"])
    print("not replaced")
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the tunables are glibc's: elsewhere the command never re-executes")
def test_exec_replaces_the_process_with_one_that_has_the_settings():
    result = run_child(REEXEC, HALLAMONIC_MALLOC="keep")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["before None", f"after {MALLOC_SETTINGS['MALLOC_MMAP_THRESHOLD_']}"]


def test_by_default_the_process_stays():
    result = run_child(REEXEC)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["before None", "not replaced"]


def test_the_command_line_runs_through_the_re_execution():
    result = run_child(HALLAMONIC_MALLOC="keep", body="""
        import sys
        sys.argv = ["hallamonic", "recipes", "list"]
        from hallamonic.cli import main
        main()
    """)
    assert result.returncode == 0, result.stderr
    assert "smollm2-135m" in result.stdout
