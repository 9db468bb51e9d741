"""The one rich Console every command prints through (tables, lines, progress).

On a terminal a Console takes the terminal's width. Elsewhere (output redirected to a
file, a pipe, a CI log) rich assumes 80 columns (or ``COLUMNS``), and a table wider than
that loses columns; so there the Console is at least :data:`WIDE` columns wide, enough for
every table tflabench prints (a wider ``COLUMNS`` is kept).
Markdown and JSON are written as plain text and never pass through here.
"""

from __future__ import annotations

import os
import sys

#: Width (characters) of a Console that does not write to a terminal and has no COLUMNS.
WIDE = 250


def output_width(stderr: bool = False, least: int = WIDE) -> int | None:
    """The width a Console should use: None on a terminal (rich takes the terminal's);
    elsewhere the larger of ``least`` and ``COLUMNS``."""
    stream = sys.stderr if stderr else sys.stdout
    try:
        interactive = stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        interactive = False
    if interactive:
        return None
    columns = os.environ.get("COLUMNS", "")
    return max(least, int(columns)) if columns.isdigit() else least


def make_console(stderr: bool = False):
    """A rich Console on stdout (or stderr) that keeps every table column where there is
    no terminal (:func:`output_width`); no automatic highlighting of numbers."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, width=output_width(stderr))


def literal(value) -> "Text":
    """``value`` (any text a user or a kernel wrote: a label, a reason, an error message, a
    path) as a rich ``Text`` that prints exactly as written. A plain string passed to rich
    is read as markup: ``[/]`` raises an error, ``[batch, seq]`` vanishes, ``:smile:``
    becomes an emoji. None prints as an empty text."""
    from rich.text import Text

    return Text("" if value is None else str(value))
