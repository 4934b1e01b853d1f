"""What every command does with an error it expects: one clear line on stderr and a non-zero exit."""

from __future__ import annotations

import typer


def fail(message: str, *, debug: bool = False, code: int = 2) -> None:
    """One clear line on stderr and a non-zero exit; the traceback only with --debug."""
    if debug:
        raise
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)
