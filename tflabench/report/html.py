"""A self-contained HTML report of a result set: tables and figures in one file.

Nothing is loaded from the network and nothing needs a server: the figures are PNG files
embedded as ``data:image/png;base64`` URIs, the style sheet is inline, there is no script.
The file opens in any browser, offline, and can be attached to an issue or mailed.
Markdown stays the format for pull-request comments (``tflabench compare --format markdown``).

:func:`html_report` builds the text from a :class:`~tflabench.store.results.ResultSet`, the model
comparisons of :mod:`tflabench.analysis.model_vs_measured` and a list of figure files;
:func:`write_html_report` writes it.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Iterable

from tflabench.errors import UserError
from tflabench.outputs import check_writable, write_text
from tflabench.report.tables import timing_text
from tflabench.store.schema import chunk_size_ran
from tflabench.text_safety import TEXT_WIDTH, terminal_text

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
p.warning { font-size: 0.9em; color: #8a4b00; background: #fff4e0; padding: 0.3em 0.6em; }
"""

_BAD = {"wrong", "crash", "timeout", "oom", "error"}


#: Most characters of a kernel label in the page (the rest cut, an ellipsis added).
HTML_LABEL_WIDTH = 120

#: Rows of the "All rows" table, at most (the rest counted; ``report --all`` lifts it).
HTML_ROWS = 2000

#: What each figure shows, by file name (the caption under it).
CAPTIONS = {
    "runtime.png": "Runtime: median time per call against sequence length, one line per kernel and mode "
                   "(the paper's Figure 4); bars: interquartile range of the timed calls.",
    "memory_vs_runtime.png": "Peak memory against runtime across chunk sizes, one point per chunk size "
                             "(the paper's Figure 5); a set of many shapes draws each kernel and shape "
                             "relative to its own fastest and smallest point, one colour per chunk size.",
    "roofline_measured.png": "Each measured case on the roofline of the GPU at its own shape: achieved FLOP/s "
                             "against arithmetic intensity, under the compute and memory ceilings.",
    "optimal_chunk.png": "Chunk-size sweeps: measured time per chunk size beside the model's (eq. 116), and "
                         "the predicted optimal chunk size (eq. 121).",
    "verify_heatmap.png": "Numerics verification: each kernel's largest error over its budget, per regime "
                          "and dtype (1 is the budget).",
}


def _e(x, width: int | None = None) -> str:
    """``x`` as HTML text: made safe for a terminal first (control characters and escape
    sequences dropped, at most ``width`` characters), then HTML-escaped."""
    return html.escape(terminal_text(x, width), quote=True)


def caption(path: str | Path) -> str:
    """The caption of a figure file in words (:data:`CAPTIONS`; the file name where unknown)."""
    name = Path(path).name
    return CAPTIONS.get(name, name)


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
            out.append(f"<td{klass}>{_e(cell, TEXT_WIDTH)}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


#: Optional columns of the rows table: (header, row key, why it can be empty). A column
#: empty in every row is left out and its reason listed under the table.
_OPTIONAL = (
    ("peak GiB", "peak_mem_bytes", "peak memory is measured on CUDA devices only (torch's allocator statistics)"),
    ("1st call s", "first_call_s", "no row recorded a first call"),
    ("numerics err", "numerics_err", "the numerics gate was off (suite numerics.check: false) or no row reached it"),
    ("TFLOP/s", "tflops_per_s", "no row has model FLOPs (kernels outside the analytic model, e.g. custom)"),
    ("of bound", "roofline_fraction", "no roofline comparison: the set was measured on no catalogued GPU "
                                     "(a CPU run); `tflabench report --gpu KEY` places the rows on a GPU's roofline"),
)


def _present(value) -> bool:
    if value is None:
        return False
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return bool(str(value).strip())


def _results_table(records: list[dict]) -> tuple[str, list[str]]:
    """The rows table (every column the terminal's ``report`` shows, plus the roofline
    fraction) and the notes on the optional columns left out because every row is empty."""
    if any(_present(r.get("numerics_case")) for r in records):  # a verify set: no timings, its regime
        shown, notes = [("regime", "numerics_case"), ("numerics err", "numerics_err")], []
    else:
        shown = [(h, key) for h, key, _ in _OPTIONAL if any(_present(r.get(key)) for r in records)]
        notes = [f"No \"{h}\" column: {why}." for h, key, why in _OPTIONAL if (h, key) not in shown]
    cols = ["kernel", "mode", "B", "S", "NH x d_qk/d_hv", "L", "status", "ms median", "ms q25-q75",
            *(h for h, _ in shown), "reason"]
    if shown and shown[0][0] == "regime":
        cols.remove("ms median")
        cols.remove("ms q25-q75")
    rows, classes = [], []
    for r in records:
        status = str(r.get("status") or "")
        q25, q75 = _num(r.get("ms_q25"), ".3f"), _num(r.get("ms_q75"), ".3f")
        cells = [terminal_text(r.get("kernel"), HTML_LABEL_WIDTH), r.get("mode"), _num(r.get("batch"), ".0f"),
                 _num(r.get("seq_len"), ".0f"),
                 f"{_num(r.get('heads'), '.0f')} x {_num(r.get('d_qk'), '.0f')}/{_num(r.get('d_hv'), '.0f')}",
                 _num(chunk_size_ran(r), ".0f"), status, _num(r.get("ms_median"), ".3f"),
                 f"{q25}-{q75}" if q25 and q75 else ""]
        if "ms median" not in cols:
            del cells[-2:]
        for _, key in shown:
            value = r.get(key)
            if key == "peak_mem_bytes":
                cells.append(_num(float(value) / 2**30 if _present(value) else None, ".2f"))
            elif key == "numerics_err":
                worst = r.get("numerics_worst")
                cells.append(" ".join(x for x in (_num(value, ".1e"), str(worst) if _present(worst) else "") if x))
            elif key == "first_call_s":
                cells.append(_num(value, ".2f"))
            elif key in ("tflops_per_s", "roofline_fraction") and status == "ok" and not _present(r.get("flops")):
                cells.append("no model")  # a kernel the analytic model does not count: no figure made up
            elif key == "tflops_per_s":
                cells.append(_num(value, ".3g"))
            elif key == "numerics_case":
                cells.append(str(value) if _present(value) else "")
            else:
                cells.append(_num(value, ".2f"))
        cells.append(str(r.get("reason") or ""))
        rows.append(cells)
        classes.append("ok" if status == "ok" else "bad" if status in _BAD else "na")
    first = cols.index("status") + 1 + 2 * ("ms median" in cols)
    numeric = [2, 3, 5] + ([7, 8] if "ms median" in cols else []) + [
        first + j for j, (h, _) in enumerate(shown) if h not in ("numerics err", "regime")]
    return table_html(cols, rows, numeric=numeric, row_class=lambda n: classes[n],
                      cell_class={6: "status", len(cols) - 1: "reason"}), notes


def verify_table_html(frame) -> str:
    """The verify verdict per kernel, dtype and regime (the deciding case:
    :func:`tflabench.analysis.verify_summary.cell_summary`), as the terminal's ``report`` prints it."""
    from tflabench.analysis.verify_summary import cell_summary

    rows, classes = [], []
    for r in cell_summary(frame).to_dict("records"):
        nonfinite = r.get("numerics_nonfinite")
        err = "NaN/inf" if _present(nonfinite) and float(nonfinite) > 0 else _num(r.get("numerics_err"), ".1e")
        status = str(r["status"])
        rows.append([terminal_text(r["kernel"], HTML_LABEL_WIDTH), r["dtype"], r["regime"], status, f"{r['failed']}/{r['cases']}",
                     r["numerics_worst"] if isinstance(r.get("numerics_worst"), str) else "", err,
                     _num(r.get("numerics_budget"), ".1e"), r["where"],
                     "" if status == "ok" else str(r.get("reason") or "")])
        classes.append("ok" if status == "ok" else "bad" if status in _BAD else "na")
    return table_html(["kernel", "dtype", "regime", "status", "failed / cases", "tensor", "err", "budget", "where",
                       "reason"], rows, numeric=(4, 6, 7), row_class=lambda n: classes[n],
                      cell_class={3: "status", 9: "reason"})


def distance_table_html(distance: list[dict]) -> str:
    """The "distance to the bound" table (:func:`tflabench.analysis.model_vs_measured.distance_to_bound`)."""
    rows = [[terminal_text(d["kernel"], HTML_LABEL_WIDTH), d["mode"], d["n"], _num(d["median_fraction"], ".2f"), _num(d["worst_fraction"], ".2f"),
             d["worst_case"], _num(d["best_fraction"], ".2f"), d["best_case"], d["bound"]] for d in distance]
    return table_html(["kernel", "mode", "cases", "median of bound", "worst", "worst case", "best", "best case",
                       "bound"], rows, numeric=(2, 3, 4, 6))


def sweep_table_html(sweeps) -> str:
    """Predicted vs measured optimal chunk size per sweep (:class:`ChunkSweep` list)."""
    rows = []
    for s in sweeps:
        ratios = ", ".join(f"{p['L']}: {p['ratio_sum']:.2f}" for p in s.points)
        rows.append([terminal_text(s.kernel, HTML_LABEL_WIDTH), s.mode, f"B={s.shape['batch']} S={s.shape['seq_len']} NH={s.shape['heads']} "
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


def _environment(rs, counts) -> list[tuple[str, str]]:
    """The lines of the report's head: what ran where; a value not recorded is said so,
    never printed as None."""
    meta = rs.metadata or {}

    def known(key):
        value = meta.get(key)
        return None if value in (None, "", "None") else value

    gpu = known("gpu_name")
    if gpu:
        gpu_line = f"{gpu} x {known('gpu_count') or 1}"
        gpu_line += f" (driver {known('driver')})" if known("driver") else " (driver not recorded)"
    else:
        gpu_line = "none (CPU)"
    software = ", ".join(f"{name} {known(key)}" for name, key in (("torch", "torch"), ("CUDA", "cuda"),
                                                                  ("triton", "triton"), ("python", "python"))
                         if known(key))
    lines = [("suite", f"{known('suite') or 'not recorded'}"
                       + (f" ({known('suite_path')})" if known("suite_path") else "")),
             ("date", known("date") or "not recorded"), ("host", known("hostname") or "not recorded"),
             ("CPU", _cpu_line(meta)), ("GPU", gpu_line), ("software", software or "not recorded"),
             ("peers", ", ".join(f"{k} {v}" for k, v in sorted((meta.get("peers") or {}).items())) or "none"),
             ("git", (known("git_revision") or "not recorded")
              + (f" (sources sha256 {known('sources_sha256')[:12]})" if known("sources_sha256") else ""))]
    if meta.get("merged_from"):
        missing = meta.get("shards_missing") or []
        lines.append(("merged", f"{len(meta['merged_from'])} shard(s)"
                                + (f"; missing {', '.join(map(str, missing))}" if missing else "")))
    elif known("shard"):
        lines.append(("shard", f"{known('shard')} only (merge the shards for the whole run)"))
    if not rs.rows["numerics_case"].notna().any():   # a verify set has no timings
        lines.append(("timed", timing_text(meta)))
    lines += [("result set", str(rs.path)), ("rows", ", ".join(f"{n} {s}" for s, n in counts.most_common()))]
    return lines


def _cpu_line(meta) -> str:
    """The CPU model and the workers' thread pools (``cpu_threads``), e.g. ``AMD EPYC 7R13
    (1 thread per worker of 16 cores, 2 workers; set by tflabench)``."""
    cpu = meta.get("cpu") if meta.get("cpu") not in (None, "", "None") else "model not recorded"
    threads = meta.get("cpu_threads") if isinstance(meta.get("cpu_threads"), dict) else {}
    if not threads:
        return f"{cpu} (threads not recorded)"
    parts = [f"{threads.get('per_worker', '?')} thread(s) per worker of {threads.get('cores', '?')} cores"]
    if threads.get("workers"):
        parts.append(f"{threads['workers']} worker(s)")
    if threads.get("set_by"):
        parts.append(f"set by {threads['set_by']}")
    return f"{cpu} ({'; '.join(parts)})"


def html_report(rs, *, figures: Iterable[str | Path] = (), distance: list[dict] | None = None,
                sweeps=None, ceilings_text: str | None = None, notes: Iterable[str] = (),
                warnings: Iterable[str] = (), max_rows: int | None = HTML_ROWS) -> str:
    """The report's HTML text (a whole document): everything ``tflabench report`` prints on
    the terminal, and the figures.

    Args:
        rs: :class:`tflabench.store.results.ResultSet` of a run, a verify run or merged shards.
        figures: PNG files to embed, in order (captioned in words: :func:`caption`).
        distance: rows of the "distance to the bound" table, or None to leave it out.
        sweeps: chunk-size sweeps (:class:`tflabench.analysis.model_vs_measured.ChunkSweep`) or None.
        ceilings_text: which ceilings the model used (shown above the model tables).
        notes: lines the terminal report printed beside its tables (e.g. why there is no
            model comparison), shown under the head.
        warnings: what the terminal warned (e.g. cases whose timings spread), shown as
            warnings under the head.
        max_rows: most rows in the "All rows" table (None: all); the rest are counted.

    Raises:
        UserError: a figure is missing or not a PNG.
    """
    from collections import Counter

    meta = rs.metadata or {}
    records = rs.rows.to_dict("records") if hasattr(rs.rows, "to_dict") else list(rs.rows)
    verify = any(_present(r.get("numerics_case")) for r in records)
    counts = Counter(str(r.get("status")) for r in records)
    what = "numerics verification" if verify else "benchmark"
    suite = str(meta.get("suite") or "result set").removesuffix("-verify")
    title = f"tflabench {what}: {suite} on {meta.get('gpu_name') or 'CPU'}"
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>",
             f"<h1>{_e(title)}</h1>", table_html(["", ""], [[k, v] for k, v in _environment(rs, counts)])]
    for warning in warnings:
        parts.append(f'<p class="warning">Warning: {_e(warning, 4 * TEXT_WIDTH)}</p>')
    for note in notes:
        parts.append(f'<p class="note">{_e(note, 4 * TEXT_WIDTH)}</p>')
    if ceilings_text:
        parts.append(f'<p class="note">Model: {_e(ceilings_text)}</p>')
    sections = (
        (verify, "Verdict per kernel and regime",
         "The deciding case of each cell (failing first, then the largest error / "
         "budget) over lengths, initial state and modes; err is the max-normalised error of its worst "
         "tensor against the float64 reference, budget that tensor's budget.",
         lambda: verify_table_html(rs.rows)),
        (distance, "Distance to the bound",
         "Achieved FLOP/s (model FLOPs at the case's own shape / measured median "
         "time) over the roofline bound min(beta·I, alpha) at the case's own intensity (paper eq. 119): "
         "1 would be the bound. Median, worst and best case per kernel and mode.",
         lambda: distance_table_html(distance)),
        (sweeps, "Optimal chunk size: predicted and measured",
         "Measured: the chunk size with the lowest median time among those swept. "
         "Model: eq. 121 (runtime-optimal, sum form; forward+backward: numeric argmin of the derived "
         "model) and eq. 111 (FLOP-optimal); measured / model is the measured time over eq. 116's.",
         lambda: sweep_table_html(sweeps)),
    )
    for present, heading, note, table in sections:
        if present:
            parts += [f"<h2>{heading}</h2>", f'<p class="note">{note}</p>', table()]
    figs = list(figures)
    if figs:
        parts.append("<h2>Figures</h2>")
        for f in figs:
            parts.append(f'<figure><img alt="{_e(caption(f))}" src="{embed_png(f)}">'
                         f"<figcaption>{_e(caption(f))}</figcaption></figure>")
    parts.append("<h2>All rows</h2>")
    shown = records if max_rows is None else records[:max_rows]
    table, column_notes = _results_table(shown)
    parts.append(table)
    if len(shown) < len(records):
        column_notes.insert(0, f"{len(records) - len(shown)} of {len(records)} rows left out (the first "
                               f"{len(shown)} shown); `tflabench report RESULTS --all --html FILE` writes every row.")
    for note in column_notes:
        parts.append(f'<p class="note">{_e(note)}</p>')
    parts.append('<p class="note">Written by tflabench report --html; self-contained (figures embedded, no '
                 "scripts, nothing loaded from the network).</p></body></html>")
    return "\n".join(parts)


def check_html_path(path: str | Path) -> Path:
    """``path`` as the HTML report's file; UserError unless it ends in ``.html`` / ``.htm``
    and can be written (:func:`tflabench.outputs.check_writable`: not a directory, a
    writable place); checked before anything is drawn, changing nothing on disk."""
    p = Path(path)
    if p.suffix.lower() not in (".html", ".htm"):
        raise UserError(f"--html={str(p)!r}: give a file name ending in .html")
    if p.is_dir():
        raise UserError(f"--html={str(p)!r} is a directory; give a file name ending in .html")
    return check_writable(p, "--html")


def write_html_report(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` (parents created) whole, through a temporary file and a
    rename. Raises UserError when not writable or when ``path`` does not end in ``.html`` /
    ``.htm``."""
    return write_text(check_html_path(path), text, "--html")


__all__ = ["CAPTIONS", "caption", "check_html_path", "distance_table_html", "embed_png", "html_report", "sweep_table_html", "table_html",
           "verify_table_html", "write_html_report"]
