"""The `hallamonic` command line: thin wrappers over library functions.

Each command group lives beside the code it drives and is registered here; `recipes` lives here
because conversion and study recipes are peers (:mod:`hallamonic.recipes`).
"""

from __future__ import annotations

from typing import Annotated

import typer

from hallamonic.console import fail

app = typer.Typer(
    name="hallamonic",
    help="Convert a pretrained Llama-family LLM into an attention-free hierarchical state-space "
    "model (HarmonicBlock), evaluate it against its teacher, and benchmark the pieces.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Command groups (one line each; keep this list short and flat).
from hallamonic.bench.scan import app as bench_app  # noqa: E402

app.add_typer(bench_app, name="bench", help="Benchmarks of the pieces (scan kernels vs memory-bound floors) and of a conversion.")
from hallamonic.convert.cli import convert_command, throughput_command  # noqa: E402

app.command("convert")(convert_command)
bench_app.command("convert", help="Tokens/s of each phase a conversion recipe trains (phase 1, focus, phase 2, refit) here, and its full phases' wall time.")(throughput_command)
from hallamonic.evaluation.cli import eval_command  # noqa: E402

app.command("eval", help="Evaluate a model and its fair baselines: LAMBADA, loss by context length, passkey.")(eval_command)
from hallamonic.study.cli import study_command  # noqa: E402

app.command("study")(study_command)  # its docstring is the help: protocol, outputs, --memory
recipes_app = typer.Typer(help="List and show the bundled recipes (conversion and study).", no_args_is_help=True)
app.add_typer(recipes_app, name="recipes")


@recipes_app.command("list")
def recipes_list() -> None:
    """Bundled recipes with their one-line description: `hallamonic convert` and `hallamonic study` ones."""
    from hallamonic.recipes import KINDS, list_recipes

    for kind, recipes in list_recipes().items():
        typer.echo(f"{kind} recipes ({KINDS[kind][0]}):")
        for name, description in recipes.items():
            typer.echo(f"  {name:18s} {description}")


@recipes_app.command("show")
def recipes_show(name: Annotated[str, typer.Argument(help="Recipe name or file.")]) -> None:
    """Print a recipe's YAML (with its comments); conversion recipes first, then study recipes."""
    from hallamonic.recipes import recipe_path
    from hallamonic.training.recipe import RecipeError

    try:
        typer.echo(recipe_path(name).read_text())
    except RecipeError as err:
        fail(str(err))


def main() -> None:  # pragma: no cover - console entry point
    import sys

    from hallamonic.allocator import exec_with_malloc_settings

    # glibc's malloc tunables are read at start-up: run again with them set (allocator.py)
    exec_with_malloc_settings([sys.executable, "-m", "hallamonic", *sys.argv[1:]])
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
