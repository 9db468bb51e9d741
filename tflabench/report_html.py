"""A self-contained HTML report of a result set: tables and figures in one file.

Nothing is loaded from the network and nothing needs a server: the figures are PNG files
embedded as ``data:image/png;base64`` URIs, the style sheet is inline, there is no script.
The file opens in any browser, offline, and can be attached to an issue or mailed.
Markdown stays the format for pull-request comments (``tflabench compare --format markdown``).

:func:`html_report` builds the text from a :class:`~tflabench.results.ResultSet`, the model
comparisons of :mod:`tflabench.model_vs_measured` and a list of figure files;
:func:`write_html_report` writes it.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Iterable

from tflabench.errors import UserError

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1400px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.8em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.82em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.ok td.status { color: #17702b; } tr.bad td.status { color: #b00020; } tr.na td.status { color: #777; }
td.reason { max-width: 38em; overflow-wrap: anywhere; color: #555; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; } p.note { font-size: 0.85em; color: #555; }
"""

_BAD = {"wrong", "crash", "timeout", "oom", "error"}


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _num(x, spec: str) -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return ""
    return "" if not math.isfinite(v) else format(v, spec)


def table_html(columns: list[str], rows: Iterable[list], *, numeric: Iterable[int] = (), row_class=None,
               cell_class: dict[int, str] | None = None) -> str:
    """An HTML table (every cell escaped). ``numeric``: indices of right-aligned columns;
    ``row_class``: a function of the row index giving a CSS class (or None);
    ``cell_class``: column index -> CSS class of that column's cells."""
    numeric = set(numeric)
    cell_class = {**{j: "num" for j in numeric}, **(cell_class or {})}
    out = ["<table><thead><tr>", *(f"<th>{_e(c)}</th>" for c in columns), "</tr></thead><tbody>"]
    for n, row in enumerate(rows):
        cls = row_class(n) if row_class else None
        out.append(f'<tr class="{_e(cls)}">' if cls else "<tr>")
        for j, cell in enumerate(row):
            klass = f' class="{cell_class[j]}"' if j in cell_class else ""
            out.append(f"<td{klass}>{_e(cell)}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _results_table(records: list[dict]) -> str:
    cols = ["kernel", "mode", "B", "S", "NH x d_qk/d_hv", "L", "status", "ms median", "peak GiB",
            "1st call s", "TFLOP/s", "of bound", "reason"]
    rows, classes = [], []
    for r in records:
        status = str(r.get("status") or "")
        peak = r.get("peak_mem_bytes")
        try:
            peak_gib = float(peak) / 2**30
        except (TypeError, ValueError):
            peak_gib = None
        rows.append([r.get("kernel"), r.get("mode"), _num(r.get("batch"), ".0f"), _num(r.get("seq_len"), ".0f"),
                     f"{_num(r.get('heads'), '.0f')} x {_num(r.get('d_qk'), '.0f')}/{_num(r.get('d_hv'), '.0f')}",
                     _num(r.get("chunk_size"), ".0f"), status, _num(r.get("ms_median"), ".3f"),
                     _num(peak_gib, ".2f"), _num(r.get("first_call_s"), ".2f"), _num(r.get("tflops_per_s"), ".3g"),
                     _num(r.get("roofline_fraction"), ".2f"), str(r.get("reason") or "")])
        classes.append("ok" if status == "ok" else "bad" if status in _BAD else "na")
    return table_html(cols, rows, numeric=(2, 3, 5, 7, 8, 9, 10, 11), row_class=lambda n: classes[n],
                      cell_class={6: "status", 12: "reason"})


def distance_table_html(distance: list[dict]) -> str:
    """The "distance to the bound" table (:func:`tflabench.model_vs_measured.distance_to_bound`)."""
    rows = [[d["kernel"], d["mode"], d["n"], _num(d["median_fraction"], ".2f"), _num(d["worst_fraction"], ".2f"),
             d["worst_case"], _num(d["best_fraction"], ".2f"), d["best_case"], d["bound"]] for d in distance]
    return table_html(["kernel", "mode", "cases", "median of bound", "worst", "worst case", "best", "best case",
                       "bound"], rows, numeric=(2, 3, 4, 6))


def sweep_table_html(sweeps) -> str:
    """Predicted vs measured optimal chunk size per sweep (:class:`ChunkSweep` list)."""
    rows = []
    for s in sweeps:
        ratios = ", ".join(f"{p['L']}: {p['ratio_sum']:.2f}" for p in s.points)
        rows.append([s.kernel, s.mode, f"B={s.shape['batch']} S={s.shape['seq_len']} NH={s.shape['heads']} "
                     f"{s.shape['d_qk']}/{s.shape['d_hv']}", s.measured_L_opt, _num(s.measured_ms_opt, ".3f"),
                     _num(s.optima["L_opt_runtime"], ".0f"), s.model_L_pow2, _num(s.optima["L_opt_flop"], ".1f"),
                     ratios])
    return table_html(["kernel", "mode", "shape", "measured L_opt", "ms there", "model L_opt (eq. 121)",
                       "model best swept L", "FLOP-optimal (eq. 111)", "measured / model at each L"],
                      rows, numeric=(3, 4, 5, 6, 7))


def embed_png(path: str | Path) -> str:
    """A ``data:image/png;base64,...`` URI of a PNG file. Raises UserError when unreadable
    or not a PNG."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read figure {str(p)!r}: {exc.strerror or exc}") from None
    if not data.startswith(b"\x89PNG"):
        raise UserError(f"figure {str(p)!r} is not a PNG; the HTML report embeds PNG files only")
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def html_report(rs, *, figures: Iterable[str | Path] = (), distance: list[dict] | None = None,
                sweeps=None, ceilings_text: str | None = None) -> str:
    """The report's HTML text (a whole document).

    Args:
        rs: :class:`tflabench.results.ResultSet`.
        figures: PNG files to embed, in order (captioned with their file name).
        distance: rows of the "distance to the bound" table, or None to leave it out.
        sweeps: chunk-size sweeps (:class:`tflabench.model_vs_measured.ChunkSweep`) or None.
        ceilings_text: which ceilings the model used (shown above the model tables).
    """
    meta = rs.metadata or {}
    records = rs.rows.to_dict("records") if hasattr(rs.rows, "to_dict") else list(rs.rows)
    from collections import Counter

    counts = Counter(str(r.get("status")) for r in records)
    title = f"tflabench: {meta.get('suite') or 'result set'} on {meta.get('gpu_name') or 'CPU'}"
    env = [("suite", f"{meta.get('suite')} ({meta.get('suite_path')})"), ("date", meta.get("date")),
           ("GPU", f"{meta.get('gpu_name') or 'none'} x {meta.get('gpu_count')} (driver {meta.get('driver')})"),
           ("software", f"torch {meta.get('torch')}, CUDA {meta.get('cuda')}, triton {meta.get('triton')}, "
                        f"python {meta.get('python')}"),
           ("peers", ", ".join(f"{k} {v}" for k, v in sorted((meta.get("peers") or {}).items())) or "none"),
           ("git", meta.get("git_revision")), ("result set", str(rs.path)),
           ("rows", ", ".join(f"{n} {s}" for s, n in counts.most_common()))]
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>",
             f"<h1>{_e(title)}</h1>", table_html(["", ""], [[k, v] for k, v in env])]
    if ceilings_text:
        parts.append(f'<p class="note">Model: {_e(ceilings_text)}</p>')
    if distance:
        parts.append("<h2>Distance to the bound</h2>")
        parts.append('<p class="note">Achieved FLOP/s (model FLOPs at the case\'s own shape / measured median '
                     "time) over the roofline bound min(beta·I, alpha) at the case's own intensity (paper eq. 119): "
                     "1 would be the bound. Median, worst and best case per kernel and mode.</p>")
        parts.append(distance_table_html(distance))
    if sweeps:
        parts.append("<h2>Optimal chunk size: predicted and measured</h2>")
        parts.append('<p class="note">Measured: the chunk size with the lowest median time among those swept. '
                     "Model: eq. 121 (runtime-optimal, sum form; forward+backward: numeric argmin of the derived "
                     "model) and eq. 111 (FLOP-optimal); measured / model is the measured time over eq. 116's.</p>")
        parts.append(sweep_table_html(sweeps))
    figs = list(figures)
    if figs:
        parts.append("<h2>Figures</h2>")
        for f in figs:
            parts.append(f'<figure><img alt="{_e(Path(f).name)}" src="{embed_png(f)}">'
                         f"<figcaption>{_e(Path(f).name)}</figcaption></figure>")
    parts.append("<h2>All rows</h2>")
    parts.append(_results_table(records))
    parts.append('<p class="note">Written by tflabench report --html; self-contained (figures embedded, no '
                 "scripts, nothing loaded from the network).</p></body></html>")
    return "\n".join(parts)


def write_html_report(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` (parents created). Raises UserError when not writable or
    when ``path`` does not end in ``.html`` / ``.htm``."""
    p = Path(path)
    if p.suffix.lower() not in (".html", ".htm"):
        raise UserError(f"--html={str(p)!r}: give a file name ending in .html")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {str(p)!r}: {exc.strerror or exc}") from None
    return p


__all__ = ["distance_table_html", "embed_png", "html_report", "sweep_table_html", "table_html",
           "write_html_report"]
