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


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
