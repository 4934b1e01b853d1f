"""The names `hallamonic`'s docstring promises as its public API are exactly what it exports."""

from __future__ import annotations

import subprocess
import sys

import hallamonic


def documented_names() -> list[str]:
    """Names on the lines of the docstring's `Public API:` block (left of each `--`)."""
    block = hallamonic.__doc__.split("Public API:", 1)[1]
    lines = [line.split("--")[0] for line in block.splitlines() if "--" in line]
    return [name.strip() for line in lines for name in line.split(",") if name.strip()]


def test_every_documented_name_imports():
    names = documented_names()
    assert names == ["scan", "scan_step", "HallamonicConfig", "HallamonicForCausalLM"]
    namespace: dict = {}
    exec(f"from hallamonic import {', '.join(names)}", namespace)
    from hallamonic.modeling import HallamonicConfig, HallamonicForCausalLM, scan, scan_step

    assert [namespace[n] for n in names] == [scan, scan_step, HallamonicConfig, HallamonicForCausalLM]
    assert sorted(hallamonic.__all__) == sorted(names) and set(names) <= set(dir(hallamonic))


def test_unknown_names_raise_attribute_error():
    try:
        hallamonic.NotAThing  # noqa: B018
    except AttributeError as err:
        assert "NotAThing" in str(err)
    else:  # pragma: no cover
        raise AssertionError("hallamonic.NotAThing did not raise")


def test_importing_the_package_does_not_load_the_model_code():
    code = "import sys, hallamonic, hallamonic.data; print('transformers' in sys.modules, 'torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.split() == ["False", "False"]
