"""The ``tflabench`` command line (Typer). Thin: parse, call the library, render.

Commands live in one module per area, each registering on :data:`app`:

- ``analytic_cmds``: flops, roofline, intensity, optimal-chunk, gpus (no torch import)
- ``run_cmds``: run, report, backends, doctor, calibrate
- ``compare_cmds``: compare, merge
- ``verify_cmds``: verify (the numerics grid)
"""

from __future__ import annotations

import contextlib
import sys

import typer

from tflabench import __version__
from tflabench.errors import UserError

app = typer.Typer(
    name="tflabench",
    help="Benchmark and roofline-analyse TFLA mLSTM kernels and their peers "
    "(FlashAttention, SDPA, Mamba 2, FLA, mlstm_kernels).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tflabench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Benchmark and roofline-analyse TFLA mLSTM kernels and their peers."""


@contextlib.contextmanager
def user_errors():
    """Turn a :class:`UserError` into one line on stderr and exit status 2 (no traceback)."""
    try:
        yield
    except UserError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def echo_warnings(*result_sets) -> None:
    """Print what loading each result set skipped (a torn last line of a killed run), one
    ``warning:`` line each on stderr."""
    for rs in result_sets:
        for line in getattr(rs, "warnings", ()):
            typer.echo(f"warning: {line}", err=True)


def _register() -> None:
    # Each command module registers its commands on `app` when imported.
    for name in ("analytic_cmds", "run_cmds", "compare_cmds", "verify_cmds"):
        __import__(f"tflabench.cli.{name}")


_register()


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
