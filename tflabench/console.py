"""The one rich Console every command prints through (tables, lines, progress).

On a terminal a Console takes the terminal's width. Elsewhere (output redirected to a
file, a pipe, a CI log) it is ``COLUMNS`` wide where that is set, else :data:`WIDE`
columns, enough for every table tflabench prints on one line each. Tables fit any width
of at least :data:`NARROWEST` (columns that do not fit move to a second table,
:func:`tflabench.report.tables.fit_tables`); ``report --wide`` prints them on one line each.
Text read from a set or a suite passes :func:`literal` (escape sequences and control
characters removed: :mod:`tflabench.text_safety`). Markdown and JSON are written as plain
text and never pass through here.
"""

from __future__ import annotations

import os
import sys

from tflabench.text_safety import TEXT_WIDTH, terminal_text

#: Width (characters) of a Console that does not write to a terminal and has no COLUMNS.
WIDE = 250

#: Narrowest width (characters) a Console is given, whatever ``COLUMNS`` says.
NARROWEST = 40


def output_width(stderr: bool = False, least: int = WIDE) -> int | None:
    """The width a Console should use: None on a terminal (rich takes the terminal's);
    elsewhere ``COLUMNS`` where set (at least :data:`NARROWEST`), else ``least``."""
    stream = sys.stderr if stderr else sys.stdout
    try:
        interactive = stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        interactive = False
    if interactive:
        return None
    columns = os.environ.get("COLUMNS", "")
    return max(NARROWEST, int(columns)) if columns.isdigit() else least


def make_console(stderr: bool = False, wide: bool = False):
    """A rich Console on stdout (or stderr) as wide as :func:`output_width` says (``wide``:
    :data:`WIDE` at least, for ``--wide`` views); no automatic highlighting of numbers."""
    from rich.console import Console

    width = output_width(stderr)
    if wide:
        width = max(width or 0, WIDE)
    return Console(stderr=stderr, highlight=False, width=width)


def literal(value, width: int | None = TEXT_WIDTH) -> "Text":
    """``value`` (any text a user or a kernel wrote: a label, a reason, an error message, a
    path) as a rich ``Text`` that prints exactly as written, once made safe for a terminal
    (:func:`tflabench.text_safety.terminal_text`: no escape sequence or control character,
    at most ``width`` characters). A plain string passed to rich is read as markup: ``[/]``
    raises an error, ``[batch, seq]`` vanishes, ``:smile:`` becomes an emoji. None prints
    as an empty text."""
    from rich.text import Text

    return Text(terminal_text(value, width))
