"""`hallamonic convert`: a thin wrapper over the conversion library."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from hallamonic.console import fail


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
    from hallamonic.convert.pipeline import OutputDirError, convert, parse_phases
    from hallamonic.convert.recipe import load_recipe
    from hallamonic.convert.surgery import UnsupportedModelError
    from hallamonic.data import DataError
    from hallamonic.training.recipe import RecipeError
    from hallamonic.training.trainer import TrainingDiverged

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



def throughput_command(
    recipe: Annotated[str, typer.Argument(help="A bundled recipe name or a YAML file.")],
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a recipe key (repeatable), e.g. --set base.model=FILE.gguf.")] = None,
    teacher_shape: Annotated[Optional[str], typer.Option(help="Use a random teacher with a known model's shapes (tinyllama-1.1b, smollm2-135m) instead of loading base.model.")] = None,
    steps: Annotated[int, typer.Option(help="Timed optimizer steps per phase.")] = 4,
    warmup: Annotated[int, typer.Option(help="Untimed steps first (allocation, compilation).")] = 1,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Also save the result as JSON here.")] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks.")] = False,
) -> None:
    """Tokens/s of each phase a conversion recipe trains (phase 1, its focus, phase 2, the refit)
    on this machine, and the wall time of its full phases at those rates (the pipeline's own code,
    on random token ids)."""
    import json

    from hallamonic.convert.recipe import load_recipe
    from hallamonic.convert.throughput import format_throughput, measure_throughput
    from hallamonic.training.recipe import RecipeError

    try:
        result = measure_throughput(load_recipe(recipe, set_ or []), teacher_shape=teacher_shape, steps=steps, warmup=warmup)
    except (RecipeError, ValueError, FileNotFoundError, RuntimeError) as err:
        fail(str(err), debug=debug)
    typer.echo(format_throughput(result))
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=1))
