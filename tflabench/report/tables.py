"""The rich tables of result sets: a run's rows, a verify set's verdicts, the distance to
the roofline bound and the chunk-size sweeps. They read rows (pandas DataFrames) and
analysis results only; the CLI prints them.

Every table fits the width it is given (docs/harness.md, "What reaches the terminal"):
:func:`fit_tables` keeps each number whole and moves the columns that do not fit into a
second table, its rows numbered like the first's; kernel labels longer than their share of
the width are shortened in the middle, with a legend of the full labels
(:func:`short_labels`). Every string from a set passes :func:`tflabench.console.literal`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from tflabench.console import literal as L
from tflabench.store.schema import chunk_size_ran
from tflabench.text_safety import ELLIPSIS, LABEL_WIDTH, shorten, terminal_text
from tflabench.analysis.chunk_rule import GAP_LIMIT
from tflabench.analysis.verify_summary import cell_summary
from tflabench.store.schema import recorded_timing

#: Rows of a run's table printed by default (the rest are counted; ``report --all`` prints them).
SHOWN_ROWS = 100

#: Least width (characters) of a column of free text (reasons) before it moves to another part.
FOLD_MIN = 16

#: Least width of a kernel label's column at a narrow width.
LABEL_MIN = 14


@dataclass
class Column:
    """One column of a :func:`fit_tables` table: ``header``; ``numeric`` (right-aligned,
    never cut or wrapped); ``fold`` (free text folded onto more lines, at most ``max_width``
    characters wide); ``optional`` (left out where every cell is empty)."""

    header: str
    numeric: bool = False
    fold: bool = False
    max_width: int = 60
    optional: bool = False


def _width(cell) -> int:
    if isinstance(cell, Text):
        return cell.cell_len
    return cell_len(str(cell))


def fit_tables(title: str | None, columns: list[Column], rows: list[list], width: int | None,
               caption: str | None = None) -> list[Table]:
    """``rows`` (lists of str or rich Text, one per column) as rich Tables no wider than
    ``width`` characters (None: one table, any width). Numbers keep their whole width;
    free-text columns fold; a column that does not fit beside the ones before it starts a
    further table, and every table then begins with a ``#`` column numbering the rows
    (so a row is read across the tables); an ``optional`` column empty in every row is left
    out. Headers wrap at spaces. Raises ValueError when a column's cells and the ``#``
    column cannot fit in ``width`` at all (less than about 20 characters)."""
    keep = [j for j, col in enumerate(columns) if not col.optional or any(_width(r[j]) for r in rows)]
    if len(keep) < len(columns):
        columns = [columns[j] for j in keep]
        rows = [[r[j] for j in keep] for r in rows]
    natural = []
    for j, col in enumerate(columns):
        words = max((cell_len(w) for w in col.header.split()), default=1)
        cells = max((_width(r[j]) for r in rows), default=0)
        need = max(words, cells, 1)
        natural.append(min(need, col.max_width) if col.fold else need)
    least = [min(n, FOLD_MIN) if c.fold else n for n, c in zip(natural, columns)]

    def total(idx, number_width=0):
        return sum(least[j] for j in idx) + 3 * len(idx) + 1 + (number_width + 3 if number_width else 0)

    groups: list[list[int]] = [list(range(len(columns)))]
    number_width = len(str(len(rows))) if rows else 1
    if width is not None and total(groups[0]) > width:
        groups = [[]]
        for j in range(len(columns)):
            if groups[-1] and total(groups[-1] + [j], number_width) > width:
                groups.append([])
            groups[-1].append(j)
        if any(total(g, number_width) > width for g in groups):
            raise ValueError(f"a table of these columns cannot be drawn {width} characters wide")
    tables = []
    split = len(groups) > 1
    for n, idx in enumerate(groups):
        spare = None if width is None else width - total(idx, number_width if split else 0)
        part_title = title if n == 0 else f"(continued, part {n + 1} of {len(groups)})"
        if split and n == 0 and title:
            part_title = f"{title} (part 1 of {len(groups)}; a row continues under its # below)"
        table = Table(title=part_title, caption=caption if n == len(groups) - 1 else None)
        if split:
            table.add_column("#", justify="right", no_wrap=True, width=number_width)
        for j in idx:  # fixed widths: rich then neither shrinks a number nor drops a column
            col = columns[j]
            header = Text(col.header, no_wrap=False, overflow="fold")
            if col.numeric:
                table.add_column(header, justify="right", no_wrap=True, width=natural[j])
            elif col.fold:
                w = natural[j] if spare is None else least[j] + max(0, min(spare, natural[j] - least[j]))
                if spare is not None:
                    spare -= w - least[j]
                table.add_column(header, overflow="fold", width=w)
            else:
                table.add_column(header, no_wrap=True, width=natural[j])
        for k, row in enumerate(rows, 1):
            table.add_row(*([str(k)] if split else []), *(row[j] for j in idx))
        tables.append(table)
    return tables


def _middle(label: str, width: int) -> str:
    """``label`` cut in the middle to ``width`` characters (its start and its end kept)."""
    if len(label) <= width:
        return label
    head = (width - 1 + 1) // 2
    tail = width - 1 - head
    return label[:head] + ELLIPSIS + (label[-tail:] if tail else "")


def short_labels(labels, width: int) -> dict[str, str]:
    """Each label (as :func:`tflabench.text_safety.terminal_text` prints it) -> its name in
    a table ``width`` characters wide: whole where it fits, else its start and end around
    an ellipsis, made distinct with ``~2``, ``~3`` where two would read alike."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for label in dict.fromkeys(terminal_text(x) for x in labels):
        short = _middle(label, width)
        n = 1
        while short in taken:
            n += 1
            short = _middle(label, width - len(f"~{n}")) + f"~{n}"
        taken.add(short)
        out[label] = short
    return out


def legend_table(names: dict[str, str]):
    """A rich Table of the shortened labels (:func:`short_labels`) and the full ones, or
    None where no label was shortened."""
    cut = [(s, full) for full, s in names.items() if s != full]
    if not cut:
        return None
    table = Table(title="kernel labels shortened above")
    table.add_column("short", no_wrap=True)
    table.add_column("label", overflow="fold")
    for short, full in cut:
        table.add_row(L(short), L(full))
    return table


def label_width(width: int | None) -> int:
    """The width a kernel label may take in a table ``width`` characters wide."""
    return LABEL_WIDTH if width is None else max(LABEL_MIN, min(LABEL_WIDTH, width // 4))


def _styled(status, colour: dict):
    """A status as Text in its colour (a status read from a damaged set prints as written)."""
    text = L(status)
    text.stylize(colour.get(status, "white"))
    return text


def _number(x, spec: str) -> str:
    """``format(x, spec)``, or ``""`` for None and NaN (a cell where nothing was measured)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return format(x, spec)


def _trace_cell(row: dict) -> str:
    """``"1755 MHz sw_power_cap"``: a row's lowest busy SM clock and slowdown reasons
    (``run --gpu-trace``; empty where not traced)."""
    mhz = _number(row.get("gpu_sm_mhz_min"), ".0f")
    return " ".join(x for x in (mhz and f"{mhz} MHz", row.get("gpu_slowdowns") or "") if x)


def _tflops_cell(row: dict) -> str:
    """The achieved TFLOP/s of a row; ``no model`` for a measured row whose kernel the
    analytic model does not count (no FLOPs: docs/offline-peers.md, section 5), never a made-up figure."""
    if row.get("status") == "ok" and _number(row.get("flops"), ".3g") == "":
        return "no model"
    return _number(row.get("tflops_per_s"), ".3g")


class Fitted:
    """A renderable that builds its tables at the width it is printed at: ``build(width)``
    gives the renderables (:func:`fit_tables`) for a console ``width`` characters wide."""

    def __init__(self, build):
        self.build = build

    def __rich_console__(self, console, options):
        yield from self.build(options.max_width)


def _fitted(title, columns: list[Column], rows: list[list], *, label_cols=(), caption=None, after=()):
    """:class:`Fitted` tables of ``rows``; the cells of ``label_cols`` (column indices, kernel
    labels as plain strings) shortened to the width's share (:func:`short_labels`) with a
    legend; ``after``: lines printed below."""

    def build(width):
        out_rows = rows
        names = {}
        if label_cols:
            names = short_labels([r[j] for r in rows for j in label_cols], label_width(width))
            out_rows = [[L(names[terminal_text(c)]) if j in label_cols else c for j, c in enumerate(r)]
                        for r in rows]
        out = list(fit_tables(title, columns, out_rows, width, caption=caption))
        legend = legend_table(names)
        if legend is not None:
            out.append(legend)
        out.extend(L(line) for line in after)
        return out

    return Fitted(build)


def summary_table(frame, title: str | None = None, limit: int | None = SHOWN_ROWS):
    """A table of result rows (kernel, mode, shape, status, ms_median, quartiles, peak GiB,
    first-call s, numerics error and its tensor, TFLOP/s, reason), in row order, fitted to the
    width it is printed at (:func:`fit_tables`); a ``host ms`` column where rows recorded the
    host's time per call (GPU rows, docs/harness.md "Host time"); with a ``GPU`` column (index, and the model
    where they differ) when the rows ran on several GPUs, and a ``GPU clock`` column (the
    lowest busy SM clock in MHz and the slowdown reasons) when they were measured with
    ``run --gpu-trace``. At most ``limit`` rows (None: all) are shown; a line below says how
    many were left out and how to see them (``report --all``). Times in ms, memory in GiB."""
    shown = frame if limit is None or len(frame) <= limit else frame.iloc[:limit]
    records = shown.to_dict("records")
    gpus = {(r.get("gpu_index"), r.get("gpu_name")) for r in records if r.get("gpu_index")}
    show_gpu = len(gpus) > 1
    mixed = len({name for _, name in gpus}) > 1
    show_trace = any(isinstance(r.get("gpu_slowdowns"), str) for r in records)
    show_q = any(_number(r.get("ms_q25"), ".3f") for r in records)
    show_host = any(_number(r.get("host_ms"), ".3f") for r in records)
    columns = [Column("kernel"), Column("mode"), Column("B", True), Column("S", True), Column("NH x d_qk/d_hv"),
               Column("L", True), Column("status"), Column("ms median", True),
               *([Column("ms q25-q75", True)] if show_q else []),
               *([Column("host ms", True, optional=True)] if show_host else []), Column("peak GiB", True, optional=True),
               Column("1st call s", True, optional=True), Column("err", True, optional=True),
               Column("TFLOP/s", True, optional=True), Column("reason", fold=True, max_width=60, optional=True)]
    if show_gpu:
        columns.append(Column("GPU"))
    if show_trace:
        columns.append(Column("GPU clock", fold=True, max_width=40))
    colour = {"ok": "green", "wrong": "red", "crash": "red", "timeout": "yellow", "oom": "yellow",
              "error": "red", "unavailable": "dim", "not_run": "yellow"}

    fmt = _number
    rows = []
    for r in records:
        status = r.get("status") or ""
        peak = r.get("peak_mem_bytes")
        q25, q75 = fmt(r.get("ms_q25"), ".3f"), fmt(r.get("ms_q75"), ".3f")
        rows.append([
            r.get("kernel"), L(r.get("mode")), fmt(r.get("batch"), ".0f"), fmt(r.get("seq_len"), ".0f"),
            f"{fmt(r.get('heads'), '.0f')} x {fmt(r.get('d_qk'), '.0f')}/{fmt(r.get('d_hv'), '.0f')}",
            fmt(chunk_size_ran(r), ".0f"), _styled(status, colour), fmt(r.get("ms_median"), ".3f"),
            *([f"{q25}-{q75}" if q25 and q75 else ""] if show_q else []),
            *([fmt(r.get("host_ms"), ".3f")] if show_host else []),
            fmt(peak / 2**30 if peak is not None and peak == peak else None, ".2f"),
            fmt(r.get("first_call_s"), ".2f"),
            L(" ".join(x for x in (fmt(r.get("numerics_err"), ".1e"), str(r.get("numerics_worst") or "")) if x)),
            _tflops_cell(r), L(terminal_text(r.get("reason"), 160)),
            *([L(" ".join(str(x) for x in (r.get("gpu_index"), r.get("gpu_name") if mixed else None) if x))]
              if show_gpu else []),
            *([L(_trace_cell(r))] if show_trace else []),
        ])
    after = []
    if len(shown) < len(frame):
        after.append(f"{len(frame) - len(shown)} of {len(frame)} rows left out of the table above (the first "
                     f"{len(shown)} shown); `tflabench report RESULTS --all` prints every row")
    return _fitted(title, columns, rows, label_cols=(0,), after=after)


def verify_table(frame, title: str | None = None):
    """A table of :func:`cell_summary`: kernel, dtype, regime, status, failed / cases,
    the deciding tensor, its error and budget, where, reason; fitted to the width it is
    printed at (:func:`fit_tables`)."""
    summary = cell_summary(frame)
    columns = [Column("kernel"), Column("dtype"), Column("regime"), Column("status"), Column("failed", True),
               Column("tensor"), Column("err", True), Column("budget", True), Column("where", fold=True, max_width=40),
               Column("reason", fold=True, max_width=70)]
    colour = {"ok": "green", "wrong": "red", "crash": "red", "error": "red", "timeout": "yellow",
              "oom": "yellow", "unavailable": "dim"}

    def fmt(x):
        return _number(x, ".1e")

    rows = []
    for r in summary.to_dict("records"):
        nonfinite = r.get("numerics_nonfinite")
        err = "NaN/inf" if nonfinite and not (isinstance(nonfinite, float) and math.isnan(nonfinite)) else fmt(r["numerics_err"])
        rows.append([r["kernel"], L(r["dtype"]), L(r["regime"]), _styled(r["status"], colour),
                     f"{r['failed']}/{r['cases']}", L(r["numerics_worst"] if isinstance(r.get("numerics_worst"), str) else ""),
                     err, fmt(r["numerics_budget"]), L(r["where"]),
                     L("" if r["status"] == "ok" else terminal_text(r.get("reason"), 200))])
    return _fitted(title, columns, rows, label_cols=(0,))


def distance_table(distance: list[dict]):
    """A table of :func:`tflabench.analysis.model_vs_measured.distance_to_bound` rows (fractions of
    the bound, eq. 119), fitted to the width it is printed at."""
    columns = [Column("kernel"), Column("mode"), Column("cases", True), Column("median", True), Column("worst", True),
               Column("worst case", fold=True, max_width=40), Column("best", True),
               Column("best case", fold=True, max_width=40), Column("bound", fold=True, max_width=30)]
    rows = [[d["kernel"], L(d["mode"]), str(d["n"]), f"{d['median_fraction']:.2f}", f"{d['worst_fraction']:.2f}",
             L(d["worst_case"]), f"{d['best_fraction']:.2f}", L(d["best_case"]), L(d["bound"])] for d in distance]
    return _fitted("distance to the bound: achieved / roofline bound at each case's own shape (eq. 119)",
                   columns, rows, label_cols=(0,))


def sweep_table(sweeps):
    """A table: predicted vs measured optimal chunk size per chunk-size sweep
    (:func:`tflabench.analysis.model_vs_measured.chunk_sweeps`), fitted to the width it is printed at."""
    columns = [Column("kernel"), Column("mode"), Column("shape", fold=True, max_width=30), Column("measured L", True),
               Column("ms", True), Column("model L (eq. 121)", True), Column("model best swept L", True),
               Column("FLOP-opt L (eq. 111)", True), Column("measured / model (eq. 116) per L", fold=True)]
    rows = []
    for s in sweeps:
        sh = s.shape
        rows.append([s.kernel, L(s.mode), f"B={sh['batch']} S={sh['seq_len']} NH={sh['heads']} {sh['d_qk']}/{sh['d_hv']}",
                     str(s.measured_L_opt), f"{s.measured_ms_opt:.3f}", f"{s.optima['L_opt_runtime']:.0f}",
                     str(s.model_L_pow2), f"{s.optima['L_opt_flop']:.1f}",
                     ", ".join(f"{p['L']}: {p['ratio_sum']:.2f}" for p in s.points)])
    return _fitted("optimal chunk size: measured (lowest median) vs model (eq. 121 runtime, eq. 111 FLOPs)",
                   columns, rows, label_cols=(0,))


def auto_gap_table(gaps):
    """A table: ``chunk_size="auto"`` against the best fixed chunk size per shape and mode
    (:func:`tflabench.analysis.chunk_rule.auto_gaps`), and how many shapes are within the limit."""
    columns = [Column("kernel"), Column("mode"), Column("shape", fold=True, max_width=30),
               Column("best fixed L", True), Column("ms", True), Column("auto L", True),
               Column("auto ms", True), Column("gap", True)]
    rows = [[g.shape["kernel"], L(g.shape["mode"]),
             f"B={g.shape['batch']} S={g.shape['seq_len']} NH={g.shape['heads']} {g.shape['d_qk']}/{g.shape['d_hv']}",
             str(g.best_L), f"{g.best_ms:.3f}", "-" if g.auto_L is None else str(g.auto_L), f"{g.auto_ms:.3f}",
             Text(f"{100 * g.gap:+.1f} %", style="" if g.within else "bold red")] for g in gaps]
    inside = sum(g.within for g in gaps)
    same = sum(g.same_plan and not g.within for g in gaps)
    spread = (f"; {same} of the {len(gaps) - inside} beyond ran the best fixed L's own plan (chunk size and "
              "algorithm), a spread between two measurements of one configuration rather than the rule's "
              "choice") if same else ""
    return _fitted(f'chunk_size "auto" against the best fixed chunk size: {inside} of {len(gaps)} shapes '
                   f"within {100 * GAP_LIMIT:.0f} %{spread}", columns, rows, label_cols=(0,))


def _ms_and_fraction(ms, bound) -> str:
    """``0.412 (0.61)``: a time in ms and, in brackets, ``bound / ms``."""
    if ms is None:
        return ""
    if bound is None or not ms:
        return f"{ms:.3f}"
    return f"{ms:.3f} ({bound / ms:.2f})"


def profile_table(cases, title: str | None = None):
    """A rich Table of :class:`tflabench.run.kernel_profile.CaseBreakdown` objects, one row per
    case: the measured median, the profiled kernels' time, each model part's time with
    ``(bound / time)`` against the part's own roofline bound, the model's bound of the whole
    call and the physical floor, each with ``(bound / measured median)``; ``no model`` where
    the model has no count of the case's kernel."""
    labels: list[str] = []
    for case in cases:
        labels.extend(p.label for p in case.parts if p.label not in labels)
    order = [f"{pa} {pt}" for pa in ("fwd", "bwd") for pt in ("recurrent", "parallel", "whole", "other")]
    labels = [lb for lb in order if lb in labels]
    profiled = any(case.kernel_ms is not None for case in cases)
    default = ("where the time goes: ms per call, (bound / time) against each part's own bound" if profiled
               else "each case against the model's bound and the physical floor: ms, (bound / measured)")
    caption = (("parts: the model's (docs/model.md); a part's bound: its model FLOPs and bytes at the "
                "ceilings; " if profiled else "")
               + "floor: the fewest bytes and FLOPs any implementation needs (docs/model.md)")
    columns = [Column("kernel"), Column("mode"), *(Column(c, True) for c in (
        "S", "L", "ms median", *(["kernels ms"] if profiled else []), *labels, "model bound", "floor"))]
    rows = []
    for case in cases:
        r = case.row
        chunk = chunk_size_ran(r)
        cells = [r.get("kernel"), L(r.get("mode")), f"{int(r['seq_len'])}",
                 "" if chunk is None else f"{int(chunk)}",
                 "" if case.measured_ms is None else f"{case.measured_ms:.3f}"]
        if profiled:
            cells.append("" if case.kernel_ms is None else f"{case.kernel_ms:.3f}")
        for label in labels:
            part = case.part(label)
            cells.append("" if part is None else _ms_and_fraction(part.ms, part.bound_ms))
        for bound in (case.bound_ms, case.floor_ms):
            empty = "no model" if case.bound_ms is None else ""   # a counted kind may lack a floor
            cells.append(empty if bound is None else (
                f"{bound:.3f}" if not case.measured_ms else f"{bound:.3f} ({bound / case.measured_ms:.2f})"))
        rows.append(cells)
    return _fitted(title or default, columns, rows, label_cols=(0,), caption=caption)


def kernels_table(case, top: int = 12):
    """A rich Table of one profiled case's kernels (the ``top`` largest of each part): part,
    kernel name, ms and launches per call, share of the kernel time."""
    r = case.row
    columns = [Column("part"), Column("kernel", fold=True, max_width=80), Column("ms", True),
               Column("launches", True), Column("share", True)]
    rows = []
    for part in case.parts:
        for name, ms, calls in part.kernels[:top]:
            share = f"{100 * ms / case.kernel_ms:.1f} %" if case.kernel_ms else ""
            rows.append([part.label, L(name), f"{ms:.4f}", f"{calls:g}", share])
        if len(part.kernels) > top:
            rest = part.kernels[top:]
            rows.append([part.label, f"({len(rest)} more)", f"{sum(k[1] for k in rest):.4f}",
                         f"{sum(k[2] for k in rest):g}", ""])
    title = terminal_text(f"{shorten(terminal_text(r.get('kernel')), LABEL_WIDTH)} {r.get('mode')} "
                          f"S={int(r['seq_len'])}: {case.source} per call")
    return _fitted(title, columns, rows)


def timing_text(metadata: Mapping[str, Any]) -> str:
    """How a result set's cases were timed, in words
    (:func:`tflabench.store.schema.recorded_timing`), e.g. "median of 30 replays of one
    captured CUDA graph, after 10 warm-up calls"; "not recorded" where the set has no
    timing record: the line under the CLI's table of a set and in the HTML report."""
    t = recorded_timing(metadata)
    if not t:
        return "not recorded"
    how = ("replays of one captured CUDA graph" if t.get("cuda_graph")
           else "calls, each after a synchronise" if t.get("sync_each") else "calls queued back to back")
    text = f"median of {t.get('iterations', '?')} {how}, after {t.get('warmup', '?')} warm-up calls"
    if t.get("warmup_s"):
        text += f" and {t['warmup_s']:g} s of them"
    if t.get("flush_l2"):
        text += ", L2 flushed before each"
    return text


__all__ = ["Column", "Fitted", "fit_tables", "legend_table", "short_labels", "summary_table", "verify_table", "distance_table", "sweep_table", "auto_gap_table", "profile_table", "kernels_table",
           "timing_text"]

