"""The package's import graph only points down the layers, so no piece grows a hidden dependency.

Layers, top to bottom (a module may import its own unit and any unit of a lower layer; nothing
sideways, nothing up):

    6  hallamonic.__main__                              `python -m hallamonic`
    5  hallamonic.cli                                   the command line
    4  hallamonic.recipes                               conversion and study recipes as peers
    3  hallamonic.convert, hallamonic.study, hallamonic.bench
    2  hallamonic.training, hallamonic.evaluation
    1  hallamonic (the package root), hallamonic.data, hallamonic.loading, hallamonic.tiny,
       hallamonic.console, hallamonic.allocator
    0  hallamonic.modeling                              self-contained remote code (relative imports only)

Every import counts, also the ones inside functions. A new module must be given a layer here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hallamonic"
LAYERS = (
    ("hallamonic.modeling",),
    ("hallamonic", "hallamonic.data", "hallamonic.loading", "hallamonic.tiny", "hallamonic.console", "hallamonic.allocator"),
    ("hallamonic.training", "hallamonic.evaluation"),
    ("hallamonic.convert", "hallamonic.study", "hallamonic.bench"),
    ("hallamonic.recipes",),
    ("hallamonic.cli",),
    ("hallamonic.__main__",),
)
LAYER = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def unit_of(module: str) -> str | None:
    """The layered unit a module belongs to: the longest unit that is it or a package above it."""
    units = [u for u in LAYER if module == u or (u != "hallamonic" and module.startswith(u + "."))]
    return max(units, key=len, default=None)


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, hallamonic module) for every import of the package in ``source``."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against this module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{target}.{alias.name}"
                found.append((node.lineno, sub if sub in MODULES else target))
    return [(line, name) for line, name in found if name == "hallamonic" or name.startswith("hallamonic.")]


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    own = unit_of(module)
    problems = []
    for line, target in imported_modules(source, module, is_package):
        theirs = unit_of(target)
        if theirs == own:
            continue
        if theirs is None or LAYER[theirs] >= LAYER[own]:
            where = "up" if theirs is not None and LAYER[theirs] > LAYER[own] else "sideways"
            problems.append(f"{module}:{line} imports {target} ({where}: layer {LAYER[own]} -> {LAYER.get(theirs)})")
    return problems


def test_every_module_has_a_layer():
    assert not [m for m in MODULES if unit_of(m) is None], "give new modules a layer in LAYERS"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_point_down(module):
    path = MODULES[module]
    assert violations(module, path.read_text(), path.name == "__init__.py") == []


def test_modeling_is_self_contained():
    """The modeling folder is copied into every checkpoint: siblings only, by relative import."""
    for module, path in MODULES.items():
        if unit_of(module) != "hallamonic.modeling":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level:
                assert not (node.module or "").startswith("hallamonic"), f"{module}:{node.lineno}"
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("hallamonic") for a in node.names), f"{module}:{node.lineno}"


@pytest.mark.parametrize(
    "module, source, expected",
    [
        ("hallamonic.training.trainer", "from hallamonic.convert.recipe import Recipe", "up"),
        ("hallamonic.training.trainer", "def f():\n    from hallamonic.evaluation import scoring", "sideways"),
        ("hallamonic.study.runner", "import hallamonic.convert.data", "sideways"),
        ("hallamonic.modeling.modeling_hallamonic", "from hallamonic.data import DataError", "up"),
        ("hallamonic.data", "from .training.packing import PackedBatches", "up"),
        ("hallamonic.convert.pipeline", "from hallamonic import cli", "up"),
    ],
)
def test_forbidden_imports_are_caught(module, source, expected):
    (problem,) = violations(module, source)
    assert f"({expected}:" in problem


def test_allowed_imports_pass():
    source = "from hallamonic.training.trainer import run_phase\nfrom hallamonic.evaluation import scoring\nfrom . import data"
    assert violations("hallamonic.study.runner", source) == []
