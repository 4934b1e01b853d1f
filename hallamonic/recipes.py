"""Every bundled recipe, conversion and study side by side (`hallamonic recipes list|show`).

Both kinds share one schema machinery (:mod:`hallamonic.training.recipe`) and one folder,
``recipes/`` (conversion) and ``recipes/study/`` (study); this module is where they are peers, so
neither `convert` nor `study` needs to know about the other.
"""

from __future__ import annotations

from pathlib import Path

from hallamonic.convert.recipe import bundled_conversion_recipes, load_recipe
from hallamonic.study.recipe import STUDY_RECIPES_DIR, bundled_study_recipes, load_study_recipe
from hallamonic.training.recipe import RECIPES_DIR, resolve_recipe_path

# kind -> (how its recipes are run, its bundled recipes, its loader)
KINDS = {
    "conversion": ("hallamonic convert NAME", bundled_conversion_recipes, load_recipe),
    "study": ("hallamonic study NAME", bundled_study_recipes, load_study_recipe),
}


def list_recipes() -> dict[str, dict[str, str]]:
    """{kind: {name: one-line description}} for every bundled recipe."""
    return {kind: {name: load(name).description for name in bundled()} for kind, (_, bundled, load) in KINDS.items()}


def recipe_path(name_or_path: str) -> Path:
    """A recipe file by path, or a bundled recipe by name (conversion recipes first, then study
    recipes); an unknown name is a RecipeError suggesting the closest bundled one of either kind."""
    return resolve_recipe_path(name_or_path, RECIPES_DIR, STUDY_RECIPES_DIR)
