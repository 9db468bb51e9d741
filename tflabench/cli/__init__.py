"""The ``tflabench`` command line (Typer). Thin: parse, call the library, render.

Commands live in one module per area, each registering on :data:`app`:

- ``analytic_cmds``: flops, roofline, intensity, optimal-chunk, gpus (no torch import)
- ``run_cmds``: run, report, backends, doctor, calibrate
- ``compare_cmds``: compare, merge
- ``verify_cmds``: verify (the numerics grid)
- ``history_cmds``: history (steps over a series of result sets, one per commit)
"""

from __future__ import annotations

import contextlib
import inspect
import math
import re
import signal
import sys
import threading
from pathlib import Path
from typing import get_args, get_origin

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

from tflabench import __version__
from tflabench.console import output_width
from tflabench.errors import UserError
from tflabench.text_safety import terminal_text

#: Width of ``--help`` where there is no terminal and no COLUMNS (a file, a CI log).
HELP_WIDTH = 120


class _PlainArgument(TyperArgument):
    """An argument shown as click shows one: ``SUITE`` in the usage line, ``[SUITE]`` when
    optional, no Python type beside it."""

    def display_type_rich(self, ctx):
        return None

    def _usage_display_name(self) -> str:
        name = self.metavar or self.name.upper()
        name = name if self.required else f"[{name}]"
        return name + ("..." if self.nargs != 1 else "")


def _plain_metavar(param) -> str:
    """The metavar a user reads: nothing for a switch, the choices, PATH, N, NUMBER, TEXT
    (from the annotation typer recorded for the option)."""
    from typing import get_args

    if getattr(param, "is_flag", False):
        return ""
    desc = getattr(param, "type_descriptor", None)
    if desc is None:
        return "TEXT"
    if desc.is_choice and getattr(desc, "choices", None):
        return "|".join(map(str, desc.choices))
    if desc.is_path:
        return "PATH"
    if desc.is_list:  # a comma list (declared repeatable only to refuse the repeated spelling)
        return "LIST"
    annotation = desc.annotation
    if annotation is bool:
        return ""
    return {int: "N", float: "NUMBER"}.get(annotation, "TEXT")


def _unwrap(text: str | None) -> str | None:
    """Help text with each paragraph on one line (the renderer wraps it to the width)."""
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


def _plain_params(params) -> None:
    """Give each parameter its plain metavar (:func:`_plain_metavar`); arguments become
    :class:`_PlainArgument` named in capitals."""
    for param in params:
        if isinstance(param, TyperArgument):
            param.__class__ = _PlainArgument
            param.metavar = param.metavar or param.name.upper()
        elif param.metavar is None:
            param.metavar = _plain_metavar(param)


class _PlainHelp:
    """Mixin of :class:`_Command` and :class:`_Group`: help that reads as a user's (plain
    metavars, no ``<bool>``, ``<list[Path]>``, ``{results_dir}``; paragraphs without hard
    line breaks) and keeps every column where there is no terminal."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _quick_coercion(self.params)

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        _quick_coercion([option] if option is not None else [])  # it is made on the first parse
        return option

    def format_help(self, ctx, formatter):
        from typer import rich_utils

        self.help = _unwrap(self.help)
        _plain_params(self.get_params(ctx))  # --help itself is added here
        previous = rich_utils.MAX_WIDTH
        if previous is None:  # no terminal: wide enough that nothing is cut
            rich_utils.MAX_WIDTH = output_width(least=HELP_WIDTH)
        try:
            return super().format_help(ctx, formatter)
        finally:
            rich_utils.MAX_WIDTH = previous


#: What :func:`_plain_value` answers where it cannot be sure of typer's answer.
_UNSURE = object()
#: Option values read as typer's pydantic adapters read them, here without pydantic:
#: digits (int), decimals with an optional exponent (float). Anything else goes to typer.
_INT_TEXT = re.compile(r"[-+]?[0-9]{1,18}")
_FLOAT_TEXT = re.compile(r"[-+]?(?:[0-9]{1,18}(?:\.[0-9]{0,18})?|\.[0-9]{1,18})(?:[eE][-+]?[0-9]{1,2})?")


def _plain_value(annotation, info, value, param, ctx):
    """``value`` converted to ``annotation`` exactly as typer's pydantic adapter converts
    it, for the plain cases every tflabench option is (str, int, float, Path, a string that
    is plainly a number); :data:`_UNSURE` for anything else. Raises what typer raises for
    a path (its own check, :func:`typer._param_types.coerce_cli_path`)."""
    if annotation is str:
        return value if isinstance(value, str) else _UNSURE
    if annotation in (int, float) and info.parser is None and info.min is None and info.max is None:
        if isinstance(value, int) and not isinstance(value, bool):
            return annotation(value)
        if annotation is float and isinstance(value, float) and math.isfinite(value):
            return value
        if isinstance(value, str) and (_INT_TEXT if annotation is int else _FLOAT_TEXT).fullmatch(value):
            return annotation(value)
        return _UNSURE
    if annotation is Path and info.parser is None and info.path_type is None and isinstance(value, (str, Path)):
        try:
            from typer._param_types import coerce_cli_path
        except ImportError:  # another typer: its own adapter
            return _UNSURE
        return coerce_cli_path(Path(value), info, path_type=Path, param=param, ctx=ctx)
    return _UNSURE


class _QuickCoercion:
    """The runtime conversion of a command's option values: the plain ones by
    :func:`_plain_value`, everything else (and every error message) by typer's own pydantic
    adapter, built on first need. Typer builds one adapter per option, importing pydantic
    (a tenth of a second; issue 44: the analytic commands answer in about a second), and
    the values come out the same (tests/test_cli_analytic.py compares them)."""

    def __init__(self):
        self._typer = None

    def coerce(self, value, param, ctx):
        multi = param.multiple or param.nargs == -1
        if value is None:
            return () if multi else None
        annotation, info = param.type_descriptor.annotation, param.type_descriptor.parameter_info
        if param.type_descriptor.file_annotation is None:
            if not multi:
                plain = _plain_value(annotation, info, value, param, ctx)
            elif isinstance(value, (list, tuple)) and get_origin(annotation) is list:
                (item_type,) = get_args(annotation)
                items = [_plain_value(item_type, info, item, param, ctx) for item in value]
                plain = _UNSURE if any(item is _UNSURE for item in items) else items
            else:
                plain = _UNSURE
            if plain is not _UNSURE:
                return plain
        if self._typer is None:
            from typer._coercion import build_runtime_param

            self._typer = build_runtime_param(param.type_descriptor)
        return self._typer.coerce(value, param=param, ctx=ctx)


def _quick_coercion(params) -> None:
    """Give typer's parameters :class:`_QuickCoercion` (where typer has the hook)."""
    for param in params:
        if hasattr(param, "type_descriptor") and getattr(param, "_runtime_param", _UNSURE) is None:
            param._runtime_param = _QuickCoercion()


class _Command(_PlainHelp, TyperCommand):
    """Every tflabench command (usage lines and errors name arguments plainly too)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _plain_params(self.params)

    def invoke(self, ctx):
        """Run the command; Ctrl-C or SIGTERM that no block of it handles
        (:func:`interruptible`) is one ``interrupted`` line and exit status 130."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            typer.echo("interrupted (Ctrl-C or SIGTERM); every file it wrote is whole or absent", err=True)
            raise typer.Exit(130) from None


class _Group(_PlainHelp, TyperGroup):
    """The ``tflabench`` group: its help like its commands'. A usage error (an unknown
    option, a value of the wrong type, a missing argument) is one ``error:`` line and exit
    status 2, like every other refusal (:func:`user_errors`); Ctrl-C and SIGTERM are exit
    status 130 in every command (:func:`stop_on_sigterm`): never 1, which ``compare``,
    ``verify`` and ``history`` keep for what they find."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            with stop_on_sigterm():
                code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except Exception as exc:  # click's exceptions (typer may bring its own click)
            if type(exc).__name__ == "NoArgsIsHelpError":  # `tflabench` alone: the help
                exc.show()
                sys.exit(exc.exit_code)
            if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
                ctx = getattr(exc, "ctx", None)
                hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
                typer.echo(f"error: {exc.format_message()}{hint}", err=True)
                sys.exit(exc.exit_code)
            if type(exc).__name__ == "Abort":
                typer.echo("interrupted", err=True)
                sys.exit(130)
            raise
        sys.exit(code if isinstance(code, int) else 0)


class _App(typer.Typer):
    """typer.Typer whose commands are :class:`_Command` unless told otherwise."""

    def command(self, *args, cls=None, **kwargs):
        return super().command(*args, cls=cls or _Command, **kwargs)


app = _App(
    name="tflabench",
    cls=_Group,
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
    """Turn a :class:`UserError` into one line on stderr and exit status 2 (no traceback);
    what it quotes from a file passes :func:`tflabench.text_safety.terminal_text`."""
    try:
        yield
    except UserError as exc:
        typer.echo(f"error: {terminal_text(exc, 4000)}", err=True)
        raise typer.Exit(2) from None



def _sigterm_as_interrupt(signum, frame):
    """The SIGTERM handler of every command: SIGTERM (a batch job's time limit, ``kill``)
    stops the command as Ctrl-C does."""
    raise KeyboardInterrupt


@contextlib.contextmanager
def stop_on_sigterm():
    """While the block runs, SIGTERM raises KeyboardInterrupt, as Ctrl-C does (the one
    SIGTERM handler; docs/harness.md, "Exit status": both exit 130). The previous handler is
    restored after the block; outside the main thread nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def interruptible(interrupted_line):
    """Stop the block on Ctrl-C or SIGTERM (a batch job's time limit sends it) alike: print
    ``interrupted_line(the KeyboardInterrupt)`` (what was kept and how to go on) on stderr and
    exit with status 130."""
    try:
        with stop_on_sigterm():
            yield
    except KeyboardInterrupt as stop:
        typer.echo(interrupted_line(stop), err=True)
        raise typer.Exit(130) from None

# ------------------------------------------------------------------ one convention per concept
#
# Every command spells a concept the same way: a figure switch is --plots/--no-plots (on);
# a list is one comma-separated value (--gpu h100,h200); --out is the directory a command
# writes into; --ceilings is auto|datasheet|measured (auto); --mode is fwd, fwdbw or both.

CEILINGS_HELP = ("Roofline ceilings: auto (measured where recorded, by `tflabench calibrate` or a hardware "
                 "file, else datasheet), datasheet or measured.")


def plots_option(help: str = "Draw the figures.") -> bool:
    """The figure switch of every command that draws: ``--plots/--no-plots``, on."""
    return typer.Option(True, "--plots/--no-plots", help=help)


def ceilings_option() -> str:
    """``--ceilings auto|datasheet|measured``, default auto, the same in every command."""
    return typer.Option("auto", "--ceilings", help=CEILINGS_HELP, metavar="auto|datasheet|measured")


def comma_list(name: str, text, allowed=None) -> list[str] | None:
    """A comma list option's items (stripped, empty ones dropped), or None when not given.

    ``text`` is the option's value, or the list of its values where the option is declared
    repeatable only to catch the old repeated spelling (``--gpu a --gpu b``): that is refused.

    Raises:
        UserError: the option given more than once, an empty list, or an item outside
            ``allowed`` (when given).
    """
    if isinstance(text, (list, tuple)):
        if len(text) > 1:
            raise UserError(f"{name} given {len(text)} times; give one comma-separated list, "
                            f"e.g. {name} {','.join(text)}")
        text = text[0] if text else None
    if text is None:
        return None
    items = [item.strip() for item in str(text).split(",") if item.strip()]
    if not items:
        raise UserError(f"{name}={text!r} is empty; give one value or several separated by commas")
    if allowed is not None:
        for item in items:
            if item not in allowed:
                raise UserError(f"{name}={text!r}: {item!r} is not one of {', '.join(allowed)}")
    return items


def echo_warnings(*result_sets) -> None:
    """Print what loading each result set skipped (a torn last line of a killed run), one
    ``warning:`` line each on stderr."""
    for rs in result_sets:
        for line in getattr(rs, "warnings", ()):
            typer.echo(f"warning: {terminal_text(line, 4000)}", err=True)


def _register() -> None:
    # Each command module registers its commands on `app` when imported.
    for name in ("analytic_cmds", "run_cmds", "compare_cmds", "verify_cmds", "history_cmds"):
        __import__(f"tflabench.cli.{name}")


_register()


#: Exit status of an internal error (a bug in tflabench, never a finding about the kernels):
#: distinct from 1, which ``compare``, ``verify`` and ``history`` use for what they find.
EXIT_INTERNAL_ERROR = 3


#: :func:`gc.set_threshold` of the ``tflabench`` process: young objects collected every
#: 20,000 allocations (Python's default: 700), the middle generation every 20 of those.
GC_THRESHOLDS = (20_000, 20, 10)


def missing_dependency(exc: BaseException) -> str | None:
    """The distribution name of one of tflabench's own dependencies (``pyproject.toml``,
    ``[project] dependencies``) whose import failed with ``exc``, or None: ``exc`` is no
    ``ModuleNotFoundError``, or the module is not a dependency's (e.g. an optional peer)."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    import importlib.metadata

    try:
        reqs = [r for r in importlib.metadata.requires("tflabench") or () if "extra ==" not in r]
    except importlib.metadata.PackageNotFoundError:    # run from a checkout, not installed
        import tomllib

        path = Path(__file__).resolve().parents[2] / "pyproject.toml"
        try:
            reqs = tomllib.loads(path.read_text())["project"]["dependencies"]
        except (OSError, KeyError, ValueError):
            return None
    names = {re.split(r"[\s;<>=!~\[]", r, maxsplit=1)[0].lower() for r in reqs}
    top = exc.name.split(".")[0]
    name = {"yaml": "pyyaml"}.get(top, top)
    return name if name.lower() in names else None


def main() -> None:
    """Console-script entry point. Exit statuses (docs/harness.md, "Exit status"): 0 done,
    1 only where a command says so (``compare --fail-on``, ``verify``, ``history``), 2 unusable input or
    output (one ``error:`` line; also a dependency of tflabench that this Python lacks,
    :func:`missing_dependency`), 130 interrupted, :data:`EXIT_INTERNAL_ERROR` for a bug
    (the traceback follows a one-line summary).

    Garbage collection for a process that is one command (issue 44: the analytic commands
    answer in about a second): young objects are collected every 20,000 allocations
    (:data:`GC_THRESHOLDS`), not every 700 (importing matplotlib makes ~100k objects that live
    as long as the process, which the default scans in ~170 passes, ~60 ms of a command that
    draws a figure); and the process ends with what it holds frozen (``gc.freeze``), so that
    Python's exit skips the collection of every object left (~0.1 s after a figure). Files are
    closed and the streams flushed as on any exit."""
    import gc
    import traceback

    gc.set_threshold(*GC_THRESHOLDS)
    try:
        app()
    except Exception as exc:  # noqa: BLE001 - a bug: say so, and never exit 1
        dependency = missing_dependency(exc)
        if dependency is not None:           # the environment, not a bug: one line, status 2
            typer.echo(f"error: tflabench needs the package {dependency!r}, which this Python "
                       f"({sys.executable}) lacks; install tflabench with its dependencies "
                       "(pip install -e . in its checkout) or that package", err=True)
            sys.exit(2)
        traceback.print_exc()
        typer.echo(f"internal error: {type(exc).__name__}: {exc}; this is a bug in tflabench: please report it "
                   "with the command and the traceback above", err=True)
        sys.exit(EXIT_INTERNAL_ERROR)
    finally:
        gc.freeze()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
