"""The `hallamonic` command line: thin wrappers over library functions.

Each command group lives beside the code it drives and is registered here.
"""

from __future__ import annotations

import typer

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

app.add_typer(bench_app, name="bench", help="Benchmarks of the pieces (scan kernels vs memory-bound floors).")
from hallamonic.convert.cli import convert_command, recipes_app  # noqa: E402

app.command("convert")(convert_command)
app.add_typer(recipes_app, name="recipes")
from hallamonic.evaluation.cli import eval_command  # noqa: E402

app.command("eval", help="Evaluate a model and its fair baselines: LAMBADA, loss by context length, passkey.")(eval_command)
from hallamonic.study.cli import study_command  # noqa: E402

app.command("study")(study_command)  # its docstring is the help: protocol, outputs, --memory


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
