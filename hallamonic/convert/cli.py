"""`hallamonic convert` and `hallamonic recipes`: thin wrappers over the conversion library."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

recipes_app = typer.Typer(help="List and show the bundled recipes (conversion and study).", no_args_is_help=True)


def fail(message: str, *, debug: bool = False, code: int = 2) -> None:
    """One clear line on stderr and a non-zero exit; the traceback only with --debug."""
    if debug:
        raise
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def convert_command(
    recipe: Annotated[str, typer.Argument(help="A bundled recipe name (see `hallamonic recipes list`) or a YAML file.")],
    output_dir: Annotated[Optional[Path], typer.Option("--output-dir", "-o", help="Where the checkpoint is written (default: outputs/RECIPE).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a recipe key, e.g. --set phase1.steps=100 --set data.path=corpus.jsonl (repeatable).")] = None,
    phases: Annotated[Optional[str], typer.Option(help="Comma-separated subset of surgery,phase1,phase2 (default: all).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an interrupted conversion from its last checkpoints.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Delete an existing output folder first.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks.")] = False,
) -> None:
    """Convert a pretrained Llama-family model into an attention-free Hallamonic model.

    Runs surgery (copy the teacher, put a HarmonicBlock where each attention was), phase 1
    (per-layer attention transfer), phase 2 (end-to-end fine-tune) and exports a checkpoint that
    loads with AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True).
    Offline: --set base.model=path/to/model.gguf --set data.path=corpus.jsonl
    """
    from hallamonic.convert.data import DataError
    from hallamonic.convert.pipeline import OutputDirError, convert, parse_phases
    from hallamonic.convert.recipe import RecipeError, load_recipe
    from hallamonic.convert.surgery import UnsupportedModelError
    from hallamonic.convert.trainer import TrainingDiverged

    try:
        loaded = load_recipe(recipe, set_ or [])
        selected = parse_phases(phases)
        target = output_dir or Path("outputs") / loaded.name
        report = convert(loaded, target, phases=selected, resume=resume, overwrite=overwrite)
    except (RecipeError, DataError, OutputDirError, UnsupportedModelError, FileNotFoundError, ValueError, TrainingDiverged) as err:
        fail(str(err), debug=debug)
    except OSError as err:  # disk full, permissions, ...: the checkpoints written so far are intact
        fail(f"{err}; checkpoints already written are intact, fix the cause and rerun with --resume", debug=debug)
    except KeyboardInterrupt:
        fail("interrupted; rerun with --resume to continue from the last checkpoint", code=130)
    else:
        if os.environ.get("RANK", "0") != "0":  # one summary per run under torchrun
            return
        typer.echo(f"wrote {target} in {report['wall_seconds'] / 60:.1f} min")
        for name, result in (report.get("heldout") or {}).items():
            bits = ", ".join(f"{k}: {v:.3f}" for k, v in result["bits_per_token"].items())
            typer.echo(f"  held-out bits/token, {name}: {bits}")


@recipes_app.command("list")
def recipes_list() -> None:
    """Bundled recipes with their one-line description: `hallamonic convert` and `hallamonic study` ones."""
    from hallamonic.convert.recipe import bundled_recipes, load_recipe
    from hallamonic.study.recipe import bundled_study_recipes, load_study_recipe

    typer.echo("conversion recipes (hallamonic convert NAME):")
    for name in bundled_recipes():
        typer.echo(f"  {name:18s} {load_recipe(name).description}")
    typer.echo("study recipes (hallamonic study NAME):")
    for name in bundled_study_recipes():
        typer.echo(f"  {name:18s} {load_study_recipe(name).description}")


@recipes_app.command("show")
def recipes_show(name: Annotated[str, typer.Argument(help="Recipe name or file.")]) -> None:
    """Print a recipe's YAML (with its comments); conversion recipes first, then study recipes."""
    from hallamonic.convert.recipe import RecipeError, bundled_recipes, resolve_recipe_path
    from hallamonic.study.recipe import STUDY_RECIPES_DIR, bundled_study_recipes

    try:
        folder = STUDY_RECIPES_DIR if name in bundled_study_recipes() and name not in bundled_recipes() else None
        typer.echo((resolve_recipe_path(name, folder) if folder else resolve_recipe_path(name)).read_text())
    except RecipeError as err:
        fail(str(err))
