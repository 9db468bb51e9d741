"""Text from a result set or a suite, made safe for where it is shown.

A result set travels (a colleague's run, a CI artifact, a pull request's candidate), so
every string read from one (a kernel label, a backend name, a reason, an error message,
a metadata value) may hold what a terminal, a Markdown renderer or a browser acts upon.
This module is the one home of the rules (docs/harness.md, "What reaches the terminal"):

- :func:`terminal_text`: no escape sequence (ANSI CSI, OSC, ...) and no C0/C1 control
  character reaches the terminal; line breaks and tabs become spaces.
- :func:`markdown_text`: :func:`terminal_text`, then every character Markdown or the HTML
  inside it acts on is escaped (``<``, ``>``, ``&``, ``@``, ``|``, backticks, brackets,
  emphasis), so ``<!--``, ``</details>``, ``<img ...>`` and ``@user`` print as written.
- HTML: ``html.escape`` (:mod:`tflabench.report.html`), after :func:`terminal_text`.
- :func:`normalise_label`: NFC and no zero-width characters, applied where a suite or a
  set is read; :func:`distinct_labels` refuses labels that collide after it.
- :func:`shorten`: a long label cut to :data:`LABEL_WIDTH` characters with an ellipsis,
  for tables and figures.
- :func:`case_label`: the one short label of a case (kernel, mode, dtype, shape), from a
  result row or a case's identity, for tables, warnings and progress lines.
"""

from __future__ import annotations

import math
import numbers
import re
import unicodedata
from typing import Any, Iterable, Mapping

from tflabench.errors import UserError

#: Most characters of a label in a table cell or a figure (the rest cut, ``…`` added).
LABEL_WIDTH = 40

#: Most characters of any other one-line text from a set (a reason, a metadata value) shown.
TEXT_WIDTH = 400

ELLIPSIS = "…"

# ESC-introduced sequences: CSI (ESC [ ... final), OSC/DCS/SOS/PM/APC (ESC ] ... BEL or ST),
# and two-character escapes; the 8-bit C1 forms (CSI U+009B, OSC U+009D, ...) likewise.
_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"  # CSI
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC, DCS, SOS, PM, APC
    r"|\x1b[ -/]*[0-~]?"  # other escapes (ESC c, ESC ( B, a lone ESC)
)
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_BREAKS = re.compile(r"[\t\n\r\x0b\x0c\x85\u2028\u2029]+")
# Bidirectional overrides and isolates reorder what follows them on screen.
_BIDI = re.compile("[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")
_ZERO_WIDTH = re.compile("[\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e]")
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+!~])")
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "@": "&#64;", "|": "&#124;", '"': "&quot;"}


def terminal_text(value, width: int | None = TEXT_WIDTH) -> str:
    """``value`` as one line a terminal prints as written: escape sequences (CSI, OSC, DCS,
    8-bit C1 forms) removed, line breaks and tabs made spaces, other C0/C1 control
    characters and bidirectional overrides removed; None gives ``""``. Longer than
    ``width`` characters (None: no limit) it is cut with an ellipsis (:func:`shorten`).
    Source: ECMA-48 (control functions), docs/harness.md "What reaches the terminal"."""
    if value is None:
        return ""
    text = str(value)
    if width is not None and len(text) > 4 * width + 64:  # a 5 MB label is not scanned whole
        text = text[: 4 * width + 64]
    text = _ESCAPES.sub("", _BREAKS.sub(" ", text))
    text = _BIDI.sub("", _CONTROLS.sub("", text))
    return text if width is None else shorten(text, width)


def markdown_text(value, width: int | None = TEXT_WIDTH) -> str:
    """``value`` (:func:`terminal_text`) for a Markdown document or a table cell of one
    (GitHub-flavoured): ``& < > @ | "`` as HTML entities (no tag, comment or mention
    survives, no pipe splits a cell), Markdown's punctuation (``\\ ` * _ { } [ ] ( ) # + ! ~``)
    behind a backslash. Source: GFM spec, "Backslash escapes" and "Entity references"."""
    text = terminal_text(value, width)
    text = _MARKDOWN.sub(r"\\\1", text)
    return "".join(_ENTITIES.get(ch, ch) for ch in text)


def shorten(text: str, width: int = LABEL_WIDTH) -> str:
    """``text`` cut to at most ``width`` characters, the last one an ellipsis (``…``)
    where it was cut; unchanged where it fits. Raises ValueError for ``width`` < 1."""
    if width < 1:
        raise ValueError(f"width={width}; allowed: >= 1")
    return text if len(text) <= width else text[: width - 1].rstrip() + ELLIPSIS


def normalise_label(label: str) -> str:
    """A kernel label as compared and shown: Unicode NFC, zero-width characters (ZWSP, ZWNJ,
    ZWJ, word joiner, BOM, soft hyphen) removed, surrounding white space stripped. Two
    labels that print alike are then equal. Source: Unicode UAX #15 (normalisation forms)."""
    return _ZERO_WIDTH.sub("", unicodedata.normalize("NFC", str(label))).strip()


def distinct_labels(labels: Iterable[str], where: str) -> dict[str, str]:
    """Each distinct label -> its :func:`normalise_label` form.

    Raises:
        UserError: two different labels have the same normalised form (they would print
            as one kernel); the message starts with ``where`` and names both.
    """
    out: dict[str, str] = {}
    seen: dict[str, str] = {}
    for label in labels:
        if label in out or label is None:
            continue
        norm = normalise_label(label)
        other = seen.setdefault(norm, label)
        if other != label:
            raise UserError(f"{where}: the labels {terminal_text(repr(other), 120)} and "
                            f"{terminal_text(repr(label), 120)} differ only by Unicode normalisation or "
                            "invisible characters; give the kernels labels that differ in what they show")
        out[label] = norm
    return out


def case_label(record: Mapping[str, Any], *, shape_only: bool = False) -> str:
    """The one short label of a case, from a result row or a :class:`tflabench.store.suite.Case`'s
    identity: ``kernel mode dtype B8 S8192 NH8 d256/512 L128`` and, for a ``tflabench
    verify`` row, its case (``f_closed+init``). Parts whose columns are empty are left out
    (``d?/512`` where one head dimension is unknown). ``shape_only``: the shape part alone
    (``B8 S8192 NH8 d256/512 L128``), for tables whose other columns name kernel and mode.
    The column names are the result schema's (:mod:`tflabench.store.schema`)."""
    def text(column: str) -> str | None:
        value = record.get(column)
        return value if isinstance(value, str) and value else None

    def whole(column: str) -> str | None:  # a count of the shape; None where no finite number
        value = record.get(column)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            return None
        return str(int(value))

    parts = [] if shape_only else [text("kernel") or text("backend") or "?", text("mode"), text("dtype")]
    parts += [f"{prefix}{whole(column)}" if whole(column) else None
              for column, prefix in (("batch", "B"), ("seq_len", "S"), ("heads", "NH"))]
    if whole("d_qk") or whole("d_hv"):
        parts.append(f"d{whole('d_qk') or '?'}/{whole('d_hv') or '?'}")
    ran = whole("chunk_size_run") or whole("chunk_size")   # the size that ran (older sets: chunk_size)
    parts.append(f"L{ran}" if ran else None)
    if not shape_only:
        parts.append(text("numerics_case"))
    return " ".join(p for p in parts if p)


__all__ = ["ELLIPSIS", "LABEL_WIDTH", "TEXT_WIDTH", "case_label", "distinct_labels", "markdown_text", "normalise_label",
           "shorten", "terminal_text"]
