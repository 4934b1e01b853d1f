"""Shared test helpers."""

from __future__ import annotations

import textwrap

import pytest

# Prepended to scripts that run in a fresh interpreter: any import of the `hallamonic` package
# fails there, so a checkpoint can only work through the files copied into it.
NO_HALLAMONIC = textwrap.dedent(
    """
    import importlib.abc, sys
    class NoHallamonic(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "hallamonic" or name.startswith("hallamonic."):
                raise ImportError("hallamonic is deliberately unavailable in this process")
    sys.meta_path.insert(0, NoHallamonic())
    """
)


@pytest.fixture(scope="session")
def without_hallamonic():
    """A function that turns a script body into one that runs with `hallamonic` unimportable."""
    return lambda body: NO_HALLAMONIC + textwrap.dedent(body)
