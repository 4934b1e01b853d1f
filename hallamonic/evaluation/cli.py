"""`hallamonic eval MODEL --task ...`: flags in, table + results.json + plots out.

All checking of user input happens here so that errors are one clear line and exit code 2,
never a traceback from deep inside a forward pass.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer

from hallamonic.console import fail
from hallamonic.evaluation.baselines import BASELINES
from hallamonic.evaluation.baselines import DEFAULT_NTK_FACTOR as NTK_FACTOR


class Task(str, enum.Enum):
    lambada = "lambada"
    context = "context"
    passkey = "passkey"


def parse_lengths(text: str | None) -> list[int]:
    """'1024,4k,8K' -> [1024, 4096, 8192]; anything else is a BadParameter."""
    if not text:
        return []
    lengths = []
    for part in text.split(","):
        item = part.strip().lower()
        scale = 1024 if item.endswith("k") else 1
        digits = item[:-1] if scale > 1 else item
        if not digits.isdigit() or int(digits) * scale < 2:
            message = f"{part.strip()!r} is not a positive integer length (>= 2)"
            raise typer.BadParameter(message, param_hint="--context-lengths")
        lengths.append(int(digits) * scale)
    return lengths


def resolve_device(device: str) -> str:
    """``auto`` is the GPU when there is one: scoring a GPU machine's checkpoint on its CPU by default
    would be ~100x slower for no reason. Anything else is passed on as given."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def eval_command(
    model: Annotated[str, typer.Argument(help="Hub id, local folder, or .gguf file.")],
    task: Annotated[Task, typer.Option(help="lambada | context | passkey.", case_sensitive=False)],
    data: Annotated[
        Path | None,
        typer.Option(help="Local data: JSONL with 'text', or txt. Default: the hub dataset."),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option(min=1, help="Cap passages (lambada), windows per length (context), trials per length (passkey)."),
    ] = None,
    context_lengths: Annotated[
        str | None,
        typer.Option(help="Comma list, e.g. 1024,4096,8192 (context) or 1K,...,16K (passkey)."),
    ] = None,
    baseline: Annotated[list[str] | None, typer.Option(help="teacher | ntk | yarn; repeat for several.")] = None,
    teacher: Annotated[
        str | None,
        typer.Option(help="Teacher spec (default: the base model recorded in the checkpoint's config)."),
    ] = None,
    output_dir: Annotated[
        Path | None,
        typer.Option(help="Where results.json and plots go (default outputs/eval/<task>)."),
    ] = None,
    trials: Annotated[int, typer.Option(min=1, help="Passkey trials per length.")] = 10,
    seed: Annotated[int, typer.Option(help="Passkey keys and depths.")] = 0,
    batch_size: Annotated[int, typer.Option(min=1, help="LAMBADA passages per forward.")] = 8,
    max_attention_length: Annotated[
        int | None,
        typer.Option(min=2, help="Skip (mark 'not run') attention-model windows longer than this."),
    ] = None,
    ntk_factor: Annotated[float, typer.Option(min=1.0, help="Dynamic-NTK factor (--baseline ntk).")] = NTK_FACTOR,
    name: Annotated[
        str | None,
        typer.Option(help="Row name of MODEL in tables (default: 'teacher' or the folder name)."),
    ] = None,
    device: Annotated[str, typer.Option(help="auto (cuda when available, else cpu), cpu, cuda, cuda:1, ...")] = "auto",
    dtype: Annotated[str, typer.Option(help="float32 | bfloat16 | float16.")] = "float32",
    threads: Annotated[int | None, typer.Option(min=1, help="torch CPU threads.")] = None,
    allow_pickle: Annotated[bool, typer.Option(help="Allow pickle (pytorch_model.bin) weights.")] = False,
    progress: Annotated[bool, typer.Option(help="Show progress bars.")] = True,
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks.")] = False,
) -> None:
    """Evaluate MODEL (and fair baselines) on LAMBADA, held-out loss by context length, or passkey."""
    import torch

    from hallamonic.data import DataError
    from hallamonic.evaluation.report import markdown_table, plot_results, write_results
    from hallamonic.evaluation.runner import EvalOptions, run_evaluation
    from hallamonic.loading import load_causal_lm

    lengths = parse_lengths(context_lengths)
    unknown = [b for b in baseline or [] if b not in BASELINES]
    if unknown:
        message = f"unknown baseline {unknown[0]!r}; choose from {', '.join(BASELINES)}"
        raise typer.BadParameter(message, param_hint="--baseline")
    if data is not None and not data.is_file():
        raise typer.BadParameter(f"data file not found: {data}", param_hint="--data")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise typer.BadParameter(f"{dtype!r}: choose float32, bfloat16 or float16", param_hint="--dtype")
    if threads:
        torch.set_num_threads(threads)
    options = EvalOptions(
        task=task.value, data=str(data) if data else None, limit=limit, lengths=lengths, trials=trials, seed=seed,
        batch_size=batch_size, max_attention_length=max_attention_length, ntk_factor=ntk_factor, progress=progress,
    )  # fmt: skip

    device = resolve_device(device)

    def load(spec: str):
        return load_causal_lm(spec, dtype=getattr(torch, dtype), device=device, allow_pickle=allow_pickle)

    try:
        results = run_evaluation(model, options, baselines=baseline or [], teacher=teacher, name=name, load=load)
    except (DataError, FileNotFoundError, ValueError, OSError) as err:
        fail(str(err).splitlines()[0] if str(err) else type(err).__name__, debug=debug)
    out = output_dir or Path("outputs") / "eval" / task.value
    typer.echo(markdown_table(results))
    written = [write_results(results, out), *plot_results(results, out)]
    typer.echo("wrote " + ", ".join(str(p) for p in written))
