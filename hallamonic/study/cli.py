"""`hallamonic study`: a thin wrapper over :func:`run_study` and :func:`memory_wall`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from hallamonic.console import fail


def study_command(
    recipe: Annotated[str, typer.Argument(help="A bundled study recipe (study-enwik8-cpu, study-enwik8-28m, study-ci) or a YAML file.")],
    output_dir: Annotated[Optional[Path], typer.Option("--output-dir", "-o", help="Where runs and results go (default: outputs/RECIPE).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a recipe key, e.g. --set train.tokens=100000 (repeatable).")] = None,
    memory: Annotated[bool, typer.Option("--memory", help="Measure the memory wall (one training step vs sequence length) instead of training.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an interrupted study: finished runs are kept, a run in progress restarts from its checkpoint.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Delete an existing output folder first.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks.")] = False,
) -> None:
    """Train Harmonic, a Transformer (Llama) and Mamba from scratch at equal budget and compare them.

    Every model in the recipe is trained at every context length on the same tokens, in the same
    order, with the same optimizer, schedule, clipping and seed; baselines are sized to the
    Harmonic parameter count (within 5%). Writes results.md / results.json (test bits per
    context, gaps in %), bits_vs_context.png and training_curves.png. With --memory it writes
    memory.md / memory.json / memory.png instead.
    """
    from hallamonic.data import DataError
    from hallamonic.study.models import ParameterMismatch
    from hallamonic.study.recipe import load_study_recipe
    from hallamonic.study.runner import StudyOutputError, run_study
    from hallamonic.training.recipe import RecipeError
    from hallamonic.training.trainer import TrainingDiverged

    try:
        loaded = load_study_recipe(recipe, set_ or [])
        target = output_dir or Path("outputs") / loaded.name
        if memory:
            from hallamonic.study.memory import memory_wall
            from hallamonic.study.data import load_study_corpus

            vocab = 256 if loaded.data.tokenizer == "bytes" else load_study_corpus(loaded.data).vocab_size
            memory_wall(loaded, target / "memory", vocab_size=vocab, echo=typer.echo)
            typer.echo(f"wrote {target / 'memory'}/memory.md, memory.json, memory.png")
            return
        run_study(loaded, target, resume=resume, overwrite=overwrite, echo=typer.echo)
    except (RecipeError, DataError, StudyOutputError, ParameterMismatch, TrainingDiverged, ValueError) as err:
        fail(str(err), debug=debug)  # ValueError: a model config the recipe's shape makes invalid
    except OSError as err:
        hint = "rerun" if memory else "finished runs are kept, fix the cause and rerun with --resume"
        fail(f"{err}; {hint}", debug=debug)
    except KeyboardInterrupt:
        fail("interrupted; rerun with --resume to continue (finished runs are kept)", code=130)
    else:
        typer.echo((target / "results.md").read_text())
        typer.echo(f"wrote {target}/results.md, results.json, bits_vs_context.png, training_curves.png")
