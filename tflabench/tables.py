"""The rich tables of result sets: a run's rows, a verify set's verdicts, the distance to
the roofline bound and the chunk-size sweeps. They read rows (pandas DataFrames) and
analysis results only; the CLI prints them.
"""

from __future__ import annotations

import math

from rich.table import Table

from tflabench.console import literal as L
from tflabench.verify_summary import cell_summary


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


def summary_table(frame, title: str | None = None):
    """A rich Table of result rows (kernel, mode, shape, status, ms_median, peak GiB,
    first-call s, numerics error and its tensor, TFLOP/s (``no model`` where the model has no
    count of the kernel), reason), in row order; with a
    ``GPU`` column (index, and the model where they differ) when the rows ran on several GPUs,
    and a ``GPU clock`` column (the lowest busy SM clock in MHz and the slowdown reasons) when
    they were measured with ``run --gpu-trace``."""
    records = frame.to_dict("records")
    gpus = {(r.get("gpu_index"), r.get("gpu_name")) for r in records if r.get("gpu_index")}
    show_gpu = len(gpus) > 1
    mixed = len({name for _, name in gpus}) > 1
    show_trace = any(isinstance(r.get("gpu_slowdowns"), str) for r in records)
    table = Table(title=title, show_lines=False)
    for col, kw in (("kernel", {}), ("mode", {}), ("B", {"justify": "right"}), ("S", {"justify": "right"}),
                    ("NH x d_qk/d_hv", {}), ("L", {"justify": "right"}), ("status", {}),
                    ("ms median", {"justify": "right"}), ("peak GiB", {"justify": "right"}),
                    ("1st call s", {"justify": "right"}), ("err", {"justify": "right"}),
                    ("TFLOP/s", {"justify": "right"}), ("reason", {"overflow": "fold", "max_width": 60})):
        table.add_column(col, **kw)
    if show_gpu:
        table.add_column("GPU")
    if show_trace:
        table.add_column("GPU clock", overflow="fold", max_width=40)
    colour = {"ok": "green", "wrong": "red", "crash": "red", "timeout": "yellow", "oom": "yellow",
              "error": "red", "unavailable": "dim", "not_run": "yellow"}

    fmt = _number
    for r in records:
        status = r.get("status") or ""
        peak = r.get("peak_mem_bytes")
        table.add_row(
            L(r.get("kernel")), L(r.get("mode")), fmt(r.get("batch"), ".0f"), fmt(r.get("seq_len"), ".0f"),
            f"{fmt(r.get('heads'), '.0f')} x {fmt(r.get('d_qk'), '.0f')}/{fmt(r.get('d_hv'), '.0f')}",
            fmt(r.get("chunk_size"), ".0f"), _styled(status, colour),
            fmt(r.get("ms_median"), ".3f"), fmt(peak / 2**30 if peak is not None and peak == peak else None, ".2f"),
            fmt(r.get("first_call_s"), ".2f"),
            L(" ".join(x for x in (fmt(r.get("numerics_err"), ".1e"), str(r.get("numerics_worst") or "")) if x)),
            _tflops_cell(r), L(str(r.get("reason") or "")[:160]),
            *([L(" ".join(str(x) for x in (r.get("gpu_index"), r.get("gpu_name") if mixed else None) if x))]
              if show_gpu else []),
            *([L(_trace_cell(r))] if show_trace else []),
        )
    return table


def verify_table(frame, title: str | None = None):
    """A rich Table of :func:`cell_summary`: kernel, dtype, regime, status, failed / cases,
    the deciding tensor, its error and budget, where, reason."""
    summary = cell_summary(frame)
    table = Table(title=title)
    for col, kw in (("kernel", {}), ("dtype", {}), ("regime", {}), ("status", {}),
                    ("failed", {"justify": "right"}), ("tensor", {}), ("err", {"justify": "right"}),
                    ("budget", {"justify": "right"}), ("where", {}),
                    ("reason", {"overflow": "fold", "max_width": 70})):
        table.add_column(col, **kw)
    colour = {"ok": "green", "wrong": "red", "crash": "red", "error": "red", "timeout": "yellow",
              "oom": "yellow", "unavailable": "dim"}

    def fmt(x):
        return _number(x, ".1e")

    for r in summary.to_dict("records"):
        nonfinite = r.get("numerics_nonfinite")
        err = "NaN/inf" if nonfinite and not (isinstance(nonfinite, float) and math.isnan(nonfinite)) else fmt(r["numerics_err"])
        table.add_row(L(r["kernel"]), L(r["dtype"]), L(r["regime"]), _styled(r["status"], colour),
                      f"{r['failed']}/{r['cases']}", L(r["numerics_worst"] if isinstance(r.get("numerics_worst"), str) else ""),
                      err, fmt(r["numerics_budget"]), L(r["where"]),
                      L("" if r["status"] == "ok" else str(r.get("reason") or "")[:200]))
    return table


def distance_table(distance: list[dict]):
    """A rich Table of :func:`tflabench.model_vs_measured.distance_to_bound` rows."""
    t = Table(title="distance to the bound: achieved / roofline bound at each case's own shape (eq. 119)")
    for col in ("kernel", "mode", "cases", "median", "worst", "worst case", "best", "best case", "bound"):
        t.add_column(col, justify="right" if col in ("cases", "median", "worst", "best") else "left")
    for d in distance:
        t.add_row(L(d["kernel"]), L(d["mode"]), str(d["n"]), f"{d['median_fraction']:.2f}", f"{d['worst_fraction']:.2f}",
                  L(d["worst_case"]), f"{d['best_fraction']:.2f}", L(d["best_case"]), L(d["bound"]))
    return t


def sweep_table(sweeps):
    """A rich Table: predicted vs measured optimal chunk size per chunk-size sweep
    (:func:`tflabench.model_vs_measured.chunk_sweeps`)."""
    t = Table(title="optimal chunk size: measured (lowest median) vs model (eq. 121 runtime, eq. 111 FLOPs)")
    for col in ("kernel", "mode", "shape", "measured L", "ms", "model L (eq. 121)", "model best swept L",
                "FLOP-opt L (eq. 111)", "measured / model (eq. 116) per L"):
        t.add_column(col, justify="left" if col in ("kernel", "mode", "shape") or col.startswith("measured /")
                     else "right", overflow="fold")
    for s in sweeps:
        sh = s.shape
        t.add_row(L(s.kernel), L(s.mode), f"B={sh['batch']} S={sh['seq_len']} NH={sh['heads']} {sh['d_qk']}/{sh['d_hv']}",
                  str(s.measured_L_opt), f"{s.measured_ms_opt:.3f}", f"{s.optima['L_opt_runtime']:.0f}",
                  str(s.model_L_pow2), f"{s.optima['L_opt_flop']:.1f}",
                  ", ".join(f"{p['L']}: {p['ratio_sum']:.2f}" for p in s.points))
    return t


def _ms_and_fraction(ms, bound) -> str:
    """``0.412 (0.61)``: a time in ms and, in brackets, ``bound / ms``."""
    if ms is None:
        return ""
    if bound is None or not ms:
        return f"{ms:.3f}"
    return f"{ms:.3f} ({bound / ms:.2f})"


def profile_table(cases, title: str | None = None):
    """A rich Table of :class:`tflabench.kernel_profile.CaseBreakdown` objects, one row per
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
    t = Table(title=title or default,
              caption=("parts: the model's (docs/model.md); a part's bound: its model FLOPs and bytes at the "
                       "ceilings; " if profiled else "")
              + "floor: the fewest bytes and FLOPs any implementation needs (docs/model.md)")
    for col in ("kernel", "mode", "S", "L", "ms median", *(["kernels ms"] if profiled else []), *labels,
                "model bound", "floor"):
        t.add_column(col, justify="left" if col in ("kernel", "mode") else "right")
    for case in cases:
        r = case.row
        chunk = r.get("chunk_size")
        cells = [L(str(r.get("kernel"))), str(r.get("mode")), f"{int(r['seq_len'])}",
                 "" if chunk is None or chunk != chunk else f"{int(chunk)}",
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
        t.add_row(*cells)
    return t


def kernels_table(case, top: int = 12):
    """A rich Table of one profiled case's kernels (the ``top`` largest of each part): part,
    kernel name, ms and launches per call, share of the kernel time."""
    r = case.row
    t = Table(title=L(f"{r.get('kernel')} {r.get('mode')} S={int(r['seq_len'])}: {case.source} per call"))
    for col in ("part", "kernel", "ms", "launches", "share"):
        t.add_column(col, justify="left" if col in ("part", "kernel") else "right",
                     overflow="fold" if col == "kernel" else "ellipsis")
    for part in case.parts:
        for name, ms, calls in part.kernels[:top]:
            share = f"{100 * ms / case.kernel_ms:.1f} %" if case.kernel_ms else ""
            t.add_row(part.label, L(name), f"{ms:.4f}", f"{calls:g}", share)
        if len(part.kernels) > top:
            rest = part.kernels[top:]
            t.add_row(part.label, f"({len(rest)} more)", f"{sum(k[1] for k in rest):.4f}",
                      f"{sum(k[2] for k in rest):g}", "")
    return t


__all__ = ["summary_table", "verify_table", "distance_table", "sweep_table", "profile_table", "kernels_table"]
