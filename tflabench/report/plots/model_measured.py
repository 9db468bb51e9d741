"""Figures where the model meets the measurement (matplotlib, imported lazily).

- :func:`roofline_measured_figure`: every measured case against the roofline at its own
  shape (left: the GPU's roof, each point joined to its own bound at its own intensity;
  right: the achieved fraction of that bound, one row per kernel). Readable with dozens of
  points: one colour per kernel, one marker per mode, only outliers labelled.
- :func:`chunk_sweep_figure`: measured runtime over chunk size beside the model's runtime
  curve and optima (eqs. 111, 116, 121), the measured/model ratio and the peak memory.

Data come from :mod:`tflabench.analysis.model_vs_measured`; each function writes with
:func:`tflabench.report.plots.save_figure` and returns the path.
"""

from __future__ import annotations

import math
from pathlib import Path

from tflabench.analysis.model_vs_measured import OUTLIER_FACTOR
from tflabench.report.plots import SAVE_DPI, save_figure

GIB = 2**30


def _figure(nrows, ncols, size, **kw):
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=SAVE_DPI, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


#: How an outlier is ringed in the distance panel (its case is named by the distance table).
OUTLIER_RING = {"marker": "o", "markersize": 12, "markerfacecolor": "none", "markeredgecolor": "k",
                "markeredgewidth": 0.9, "linestyle": "none"}


def roofline_measured_figure(placement: list[dict], gpu, *, path, title: str | None = None) -> Path:
    """Per-shape roofline of measured cases (paper eq. 119, each case at its own intensity).

    Args:
        placement: :func:`tflabench.analysis.model_vs_measured.roofline_placement` (dicts with
            ``kernel``, ``mode``, ``case``, ``intensity_flop_per_byte``,
            ``achieved_flops_per_s``, ``bound_flops_per_s``, ``fraction``, ``outlier``;
            ``backend`` and ``params`` pick the kernel styles).
        gpu: :class:`tflabench.hardware.GPU` whose ceilings ``placement`` used.
        path: output file. title: figure title.

    One row of panels per mode. Left: the roof ``min(beta·I, alpha)``; a small open circle
    at each case's own bound, a thin line down to the marker of what it achieved (the
    vertical distance is the time left on the table). Right: achieved / bound per case,
    one row per kernel, the kernel's median as a bar; outliers
    (:data:`tflabench.analysis.model_vs_measured.OUTLIER_FACTOR` from the median) ringed (the
    distance table names their case: no text on the markers). Kernels keep one colour and marker
    throughout (:mod:`tflabench.report.plots.style`: ours filled, peers hollow), named in one
    legend below the panels.
    """
    from tflabench.errors import UserError
    from tflabench.report.plots.style import ax_title, fig_title, kernel_styles, legend_below, log_axis, order_kernels, ours_key

    if not placement:
        raise UserError("no measured case with model FLOPs/bytes and a time to place on the roofline")
    styles = kernel_styles((p["kernel"], p.get("backend"), p.get("params")) for p in placement)
    kernels = order_kernels(list(dict.fromkeys(p["kernel"] for p in placement)), styles)
    modes = [m for m in ("fwd", "fwdbw") if any(p["mode"] == m for p in placement)]
    modes += sorted({p["mode"] for p in placement} - set(modes))
    row_height = max(3.9, 0.3 * len(kernels) + 1.6)
    fig, axes = _figure(len(modes), 2, (13.0, row_height * len(modes) + 0.35 * math.ceil(len(kernels) / 3) + 0.6),
                        gridspec_kw={"width_ratios": [1.0, 1.0]})
    xs = [p["intensity_flop_per_byte"] for p in placement] + [gpu.intensity_flop_per_byte]
    lo, hi = max(min(xs) / 2, 0.1), max(xs) * 2
    grid = [10 ** (math.log10(lo) + (math.log10(hi) - math.log10(lo)) * i / 199) for i in range(200)]
    x_max = max(1.05, max(p["fraction"] for p in placement) * 1.08)
    handles = {}
    mode_names = {"fwd": "forward", "fwdbw": "forward + backward"}
    for row, mode in enumerate(modes):
        ax, ax2 = axes[row]
        pts_mode = [p for p in placement if p["mode"] == mode]
        roof = ax.plot(grid, [min(gpu.bytes_per_s * x, gpu.flops_per_s) / 1e12 for x in grid], color="k", lw=1.6)[0]
        ax.axvline(gpu.intensity_flop_per_byte, color="k", ls=":", lw=0.8)
        for p in pts_mode:
            st = styles[p["kernel"]]
            x = p["intensity_flop_per_byte"]
            y_bound, y = p["bound_flops_per_s"] / 1e12, p["achieved_flops_per_s"] / 1e12
            ax.plot([x, x], [y, y_bound], color=st.color, lw=0.7, alpha=0.5)
            ax.plot([x], [y_bound], marker="o", mfc="white", mec="0.4", ms=3, ls="none")
            handles.setdefault(p["kernel"], ax.plot([x], [y], **st.point(6.5))[0])
        ax.set_xscale("log")
        ax.set_yscale("log")
        log_axis(ax, "x")
        log_axis(ax, "y")
        ax.set_xlabel("intensity I of the case (FLOP/byte)", fontsize=9)
        ax.set_ylabel("achieved TFLOP/s", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax_title(ax, f"{mode_names.get(mode, mode)}: each case against its own bound", fontsize=9)
        if row == 0:
            bound_handle = ax.plot([], [], "o", mfc="white", mec="0.4", ms=3, ls="none")[0]
            roof_handle = roof

        ax2.set_xlim(0, x_max)
        present = [k for k in kernels if any(p["kernel"] == k for p in pts_mode)]
        for k, kernel in enumerate(kernels):
            pts = [p for p in pts_mode if p["kernel"] == kernel]
            if not pts:
                continue
            st = styles[kernel]
            fr = [p["fraction"] for p in pts]
            ax2.plot(fr, [k] * len(fr), **st.point(6.0))
            out = [p["fraction"] for p in pts if p.get("outlier")]
            if out:
                ring = ax2.plot(out, [k] * len(out), **OUTLIER_RING)[0]
                handles.setdefault("__outlier__", ring)
            med = sorted(fr)[len(fr) // 2]
            ax2.plot([med, med], [k - 0.32, k + 0.32], color=st.color, lw=2.4)
        ax2.set_yticks(range(len(kernels)), kernels, fontsize=7)
        ax2.set_ylim(len(kernels) - 0.5, -0.5)
        for tick, kernel in zip(ax2.get_yticklabels(), kernels):
            tick.set_alpha(1.0 if kernel in present else 0.35)
        ax2.axvline(1.0, color="k", lw=1.0)
        ax2.set_xlabel("achieved / bound at the case's own intensity", fontsize=9)
        ax2.grid(True, axis="x", alpha=0.3)
        ax_title(ax2, f"{mode_names.get(mode, mode)}: distance to the bound (bar: each kernel's median)", fontsize=9)
    labels = list(kernels) + [f"{gpu.name} roof: {gpu.flops_per_s / 1e12:.0f} TFLOP/s, "
                              f"{gpu.bytes_per_s / 1e12:.3g} TB/s ({gpu.ceilings} ceilings)",
                              "model bound at the case's own shape"]
    extra = [roof_handle, bound_handle]
    if "__outlier__" in handles:
        labels.append(f"ringed: outlier, over {OUTLIER_FACTOR:g}x from its kernel's median")
        extra.append(handles["__outlier__"])
    legend_below(fig, [handles[k] for k in kernels] + extra, labels, ncol=3, fontsize=7.5,
                 title=ours_key((p["kernel"], p.get("backend")) for p in placement))
    if title:
        fig_title(fig, title, fontsize=10)
    return save_figure(fig, path)


def _logspace(lo, hi, n=120):
    a, b = math.log2(lo), math.log2(hi)
    return [2 ** (a + (b - a) * i / (n - 1)) for i in range(n)]


#: The most (shape, mode) columns the optimal-chunk figure draws (6.4 inches each).
MAX_SWEEP_PANELS = 6


def chunk_sweep_figure(sweeps, *, path, title: str | None = None) -> Path:
    """Measured runtime over chunk size L beside the model (the optimal-chunk figure).

    One column per (shape, mode), the first :data:`MAX_SWEEP_PANELS` of them (the title says
    when more were measured); top row: measured median ms per kernel (ours solid and
    filled, the authors' dashed and hollow: :mod:`tflabench.report.plots.style`), the model's
    runtime curve (eq. 116 sum form, dashed black; the max form = roofline bound, dotted
    grey), vertical lines at the model's optima (eq. 111 FLOP-optimal, eq. 121
    runtime-optimal) and a star at each kernel's measured optimum; middle row: measured /
    model (sum form) per L; bottom row (where measured): the peak memory above the inputs
    (GiB). Each column's key sits below it, outside the data.

    Args:
        sweeps: :class:`tflabench.analysis.model_vs_measured.ChunkSweep` list (one per kernel,
            shape and mode).
        path: output file. title: figure title.

    Raises:
        UserError: no sweep given.
    """
    from tflabench.errors import UserError
    from tflabench.report.plots.style import ax_title, fig_title, kernel_styles, log_axis

    if not sweeps:
        raise UserError("no chunk-size sweep of an mLSTM kernel (two or more chunk sizes at one shape) to draw")
    panels: dict[tuple, list] = {}
    for s in sweeps:
        panels.setdefault((tuple(sorted(s.shape.items())), s.mode), []).append(s)
    keys = list(panels)
    if len(keys) > MAX_SWEEP_PANELS:  # a readable figure: the first shapes; `report`'s table has every one
        title = (f"{title}; " if title else "") + (f"the first {MAX_SWEEP_PANELS} of {len(keys)} shapes and modes "
                                                   "(the optimal-chunk table of `report` gives every one)")
        keys = keys[:MAX_SWEEP_PANELS]
        sweeps = [s for key in keys for s in panels[key]]
    styles = kernel_styles((s.kernel, None, None) for s in sweeps)
    has_mem = any(p.get("peak_mem_bytes") for s in sweeps for p in s.points)
    ratios = [2.2, 1.0] + ([1.0] if has_mem else [])
    fig, axes = _figure(len(ratios), len(keys), (max(6.4 * len(keys), 7.5), 9.0 + (2.2 if has_mem else 0)),
                        sharex="col", gridspec_kw={"height_ratios": ratios})
    mode_names = {"fwd": "forward", "fwdbw": "forward + backward"}
    for col, key in enumerate(keys):
        ax, axr = axes[0][col], axes[1][col]
        group = sorted(panels[key], key=lambda s: not styles[s.kernel].ours)
        first = group[0]
        Ls = sorted({p["L"] for s in group for p in s.points})
        grid = _logspace(max(1.0, Ls[0] / 2), min(float(first.shape["seq_len"]), Ls[-1] * 2))
        handles, labels = [], []
        for s in group:
            st = styles[s.kernel]
            x = [p["L"] for p in s.points]
            handles.append(ax.plot(x, [p["ms_median"] for p in s.points], **st.line())[0])
            labels.append(f"{s.kernel}: measured (star: its optimum, L={s.measured_L_opt})")
            ax.plot([s.measured_L_opt], [s.measured_ms_opt], marker="*", color=st.color, ms=16, mec="k",
                    mew=0.8, ls="none", zorder=5)
            axr.plot(x, [p["ratio_sum"] for p in s.points], **st.line())
        handles.append(ax.plot(grid, first.model_curve(grid, "sum"), color="k", ls="--", lw=1.4)[0])
        labels.append(f"model, sum form (eq. 116; F_causal={first.F_causal:g})")
        handles.append(ax.plot(grid, first.model_curve(grid, "max"), color="0.5", ls=":", lw=1.4)[0])
        labels.append("model, max form = roofline bound (eq. 114)")
        o = first.optima
        for name, ls, lab in (("L_opt_flop", "-.", "FLOP-optimal (eq. 111)"),
                              ("L_opt_runtime", (0, (5, 2)), "runtime-optimal (eq. 121)")):
            if grid[0] <= o[name] <= grid[-1]:
                handles.append(ax.axvline(o[name], color="0.3", ls=ls, lw=0.9))
                labels.append(f"model {lab}: L={o[name]:.0f}")
            else:
                handles.append(ax.plot([], [], " ")[0])
                labels.append(f"model {lab}: L={o[name]:.0f} (off the axis)")
        bottom = axr
        if has_mem:
            bottom = axm = axes[2][col]
            for s in group:
                mem = [(p["L"], p["peak_mem_bytes"] / GIB) for p in s.points if p.get("peak_mem_bytes")]
                if mem:
                    axm.plot([m[0] for m in mem], [m[1] for m in mem], **styles[s.kernel].line())
            axm.set_ylabel("peak memory (GiB)", fontsize=8)
            axm.set_ylim(bottom=0)
            axm.set_xscale("log", base=2)
            axm.grid(True, which="both", alpha=0.3)
        s0 = first.shape
        ax_title(ax, f"{mode_names.get(first.mode, first.mode)}: B={s0['batch']} S={s0['seq_len']} "
                 f"NH={s0['heads']} d_qk={s0['d_qk']} d_hv={s0['d_hv']} ({first.ceilings} ceilings: "
                 f"{first.peak_flops_per_s / 1e12:.0f} TFLOP/s, {first.beta / 1e12:.3g} TB/s)", fontsize=8.5)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        log_axis(ax, "y")
        ax.set_ylabel("runtime (ms): measured median, model")
        ax.grid(True, which="both", alpha=0.3)
        axr.set_xscale("log", base=2)
        axr.axhline(1.0, color="k", lw=0.8)
        axr.set_ylim(bottom=0)
        axr.set_ylabel("measured / model (sum form)", fontsize=8)
        axr.grid(True, which="both", alpha=0.3)
        bottom.set_xlabel("chunk size L (tokens)")
        bottom.set_xticks(Ls, [str(L) for L in Ls])
        bottom.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.32), fontsize=7, ncol=1,
                      frameon=False)
    if title:
        fig_title(fig, title, fontsize=10)
    return save_figure(fig, path)


def model_figures(rs, out_dir: str | Path, *, gpu=None, F_causal: float = 0.66, counts: str = "rows") -> list[Path]:
    """The model-vs-measurement figures of a result set that apply, into ``out_dir``:
    ``roofline_measured.png`` (every ``ok`` row with model counts) and ``optimal_chunk.png``
    (when an mLSTM kernel sweeps chunk sizes). ``gpu``: the ceilings
    (:func:`tflabench.analysis.model_vs_measured.ceilings_for`); default: the set's GPU with measured
    ceilings where recorded. Returns [] when the set was measured on no catalogued GPU."""
    from tflabench.analysis import model_vs_measured as mm
    from tflabench.errors import UserError

    if gpu is None:
        try:
            gpu = mm.ceilings_for(rs.metadata)
        except UserError:
            return []
    out = Path(out_dir)
    from tflabench.report.plots.style import set_label

    where = set_label(rs.metadata)
    written = []
    placement = mm.roofline_placement(rs.rows, peak_flops_per_s=gpu.flops_per_s, beta=gpu.bytes_per_s)
    if placement:
        written.append(roofline_measured_figure(
            placement, gpu, path=out / "roofline_measured.png",
            title=f"Every measured case against the roofline at its own shape ({gpu.ceilings} ceilings), {where}"))
    sweeps = mm.chunk_sweeps(rs.rows, peak_flops_per_s=gpu.flops_per_s, beta=gpu.bytes_per_s, ceilings=gpu.ceilings,
                             F_causal=F_causal, counts=counts)
    if sweeps:
        written.append(chunk_sweep_figure(
            sweeps, path=out / "optimal_chunk.png",
            title=f"Runtime over chunk size L, measured and modelled (counts={counts}), {where}"))
    return written


__all__ = ["chunk_sweep_figure", "model_figures", "roofline_measured_figure"]
