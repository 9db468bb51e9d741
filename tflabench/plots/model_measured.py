"""Figures where the model meets the measurement (matplotlib, imported lazily).

- :func:`roofline_measured_figure`: every measured case against the roofline at its own
  shape (left: the GPU's roof, each point joined to its own bound at its own intensity;
  right: the achieved fraction of that bound, one row per kernel). Readable with dozens of
  points: one colour per kernel, one marker per mode, only outliers labelled.
- :func:`chunk_sweep_figure`: measured runtime over chunk size beside the model's runtime
  curve and optima (eqs. 111, 116, 121), the measured/model ratio and the peak memory.

Data come from :mod:`tflabench.model_vs_measured`; each function writes with
:func:`tflabench.plots.save_figure` and returns the path.
"""

from __future__ import annotations

import math
from pathlib import Path

from tflabench.plots import save_figure
from tflabench.plots.analytic import MODE_MARKERS, measured_styles

GIB = 2**30


def _plain_log_ticks(axis) -> None:
    """Tick labels as plain numbers (30, 100, 300) instead of 3x10^1 on a log axis."""
    from matplotlib.ticker import FuncFormatter

    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    axis.set_major_formatter(fmt)
    axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "235" else ""))


def _figure(nrows, ncols, size, **kw):
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def roofline_measured_figure(placement: list[dict], gpu, *, path, title: str | None = None) -> Path:
    """Per-shape roofline of measured cases (paper eq. 119, each case at its own intensity).

    Args:
        placement: :func:`tflabench.model_vs_measured.roofline_placement` (dicts with
            ``kernel``, ``mode``, ``case``, ``intensity_flop_per_byte``,
            ``achieved_flops_per_s``, ``bound_flops_per_s``, ``fraction``, ``outlier``).
        gpu: :class:`tflabench.hardware.GPU` whose ceilings ``placement`` used.
        path: output file. title: figure title.

    Left panel: the roof ``min(beta·I, alpha)``; a hollow marker at each case's own bound,
    a thin line down to the filled marker of what it achieved (the vertical distance is the
    time left on the table; kernels by colour, named in the right panel). Right panel:
    achieved / bound per case, one row per kernel, the kernel's median as a bar; outliers (:data:`tflabench.model_vs_measured.OUTLIER_FACTOR`
    from the median) labelled with their case.
    """
    from tflabench.errors import UserError

    if not placement:
        raise UserError("no measured case with model FLOPs/bytes and a time to place on the roofline")
    fig, axes = _figure(1, 2, (13.0, max(5.0, 0.32 * len({p["kernel"] for p in placement}) + 3.0)),
                        gridspec_kw={"width_ratios": [1.1, 1.0]})
    ax, ax2 = axes[0]
    colours, markers = measured_styles(placement, n_reserved=1)
    xs = [p["intensity_flop_per_byte"] for p in placement] + [gpu.intensity_flop_per_byte]
    lo, hi = max(min(xs) / 3, 0.1), max(xs) * 3
    grid = [10 ** (math.log10(lo) + (math.log10(hi) - math.log10(lo)) * i / 199) for i in range(200)]
    ax.plot(grid, [min(gpu.bytes_per_s * x, gpu.flops_per_s) / 1e12 for x in grid], color="k", lw=1.8,
            label=f"{gpu.name}: {gpu.flops_per_s / 1e12:.0f} TFLOP/s, {gpu.bytes_per_s / 1e12:.3g} TB/s ({gpu.ceilings})")
    ax.axvline(gpu.intensity_flop_per_byte, color="k", ls=":", lw=0.8)
    for p in placement:
        col = colours[p["kernel"]]
        x = p["intensity_flop_per_byte"]
        y_bound, y = p["bound_flops_per_s"] / 1e12, p["achieved_flops_per_s"] / 1e12
        ax.plot([x, x], [y, y_bound], color=col, lw=0.7, alpha=0.6)
        ax.plot([x], [y_bound], marker="o", mfc="white", mec=col, ms=4, ls="none")
        ax.plot([x], [y], marker=markers[p["mode"]], color=col, ms=7, mew=1.5, ls="none")
    ax.plot([], [], "o", mfc="white", mec="k", ls="none", label="model bound at the case's own shape")
    for mode, marker in markers.items():
        ax.plot([], [], marker, color="k", ls="none", ms=7, label=f"measured, {mode or 'any mode'}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_ticks(ax.yaxis)
    ax.set_xlabel("arithmetic intensity of the case, I (FLOP/byte; model counts at its shape)")
    ax.set_ylabel("performance (TFLOP/s; model FLOPs / measured time)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("each case against its own bound", fontsize=9)

    kernels = list(dict.fromkeys(p["kernel"] for p in placement))
    modes = list(markers)
    for k, kernel in enumerate(kernels):
        for j, mode in enumerate(modes):
            pts = [p for p in placement if p["kernel"] == kernel and p["mode"] == mode]
            if not pts:
                continue
            yk = k + (j - (len(modes) - 1) / 2) * 0.25
            fr = [p["fraction"] for p in pts]
            ax2.plot(fr, [yk] * len(fr), marker=markers[mode], ls="none", color=colours[kernel], ms=6, mew=1.3)
            med = sorted(fr)[len(fr) // 2]
            ax2.plot([med, med], [yk - 0.11, yk + 0.11], color=colours[kernel], lw=2.2)
            for p in pts:
                if p.get("outlier"):
                    ax2.annotate(p["case"], (p["fraction"], yk), textcoords="offset points", xytext=(3, 3),
                                 fontsize=6, color=colours[kernel])
    ax2.set_yticks(range(len(kernels)), kernels, fontsize=7)
    for tick, kernel in zip(ax2.get_yticklabels(), kernels):
        tick.set_color(colours[kernel])
    ax2.invert_yaxis()
    ax2.axvline(1.0, color="k", lw=1.0)
    ax2.set_xlim(0, max(1.05, max(p["fraction"] for p in placement) * 1.08))
    ax2.set_xlabel("achieved / bound at the case's own intensity")
    ax2.grid(True, axis="x", alpha=0.3)
    ax2.set_title("distance to the bound (bar: median; labelled: outliers)", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def _logspace(lo, hi, n=120):
    a, b = math.log2(lo), math.log2(hi)
    return [2 ** (a + (b - a) * i / (n - 1)) for i in range(n)]


def chunk_sweep_figure(sweeps, *, path, title: str | None = None) -> Path:
    """Measured runtime over chunk size L beside the model (the optimal-chunk figure).

    One column per (shape, mode); top row: measured median ms per kernel (solid, markers),
    the model's runtime curve (eq. 116 sum form, dashed; the max form = roofline bound,
    dotted), vertical lines at the model's optima (eq. 111 FLOP-optimal, eq. 121
    runtime-optimal) and a star at each kernel's measured optimum; bottom row: measured /
    model (sum form) per L, and the peak memory (GiB, right axis) where measured.

    Args:
        sweeps: :class:`tflabench.model_vs_measured.ChunkSweep` list (one per kernel,
            shape and mode).
        path: output file. title: figure title.

    Raises:
        UserError: no sweep given.
    """
    from tflabench.errors import UserError

    if not sweeps:
        raise UserError("no chunk-size sweep of an mLSTM kernel (two or more chunk sizes at one shape) to draw")
    panels: dict[tuple, list] = {}
    for s in sweeps:
        panels.setdefault((tuple(sorted(s.shape.items())), s.mode), []).append(s)
    keys = list(panels)
    fig, axes = _figure(2, len(keys), (6.2 * len(keys), 7.6), sharex="col",
                        gridspec_kw={"height_ratios": [2.2, 1.0]})
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
    for col, key in enumerate(keys):
        ax, axr = axes[0][col], axes[1][col]
        group = panels[key]
        first = group[0]
        Ls = sorted({p["L"] for s in group for p in s.points})
        grid = _logspace(max(1.0, Ls[0] / 2), min(float(first.shape["seq_len"]), Ls[-1] * 2))
        ax.plot(grid, first.model_curve(grid, "sum"), color="k", ls="--", lw=1.4,
                label=f"model, sum form (eq. 116; F_causal={first.F_causal:g})")
        ax.plot(grid, first.model_curve(grid, "max"), color="0.5", ls=":", lw=1.4,
                label="model, max form = roofline bound (eq. 114)")
        o = first.optima
        for name, ls, lab in (("L_opt_flop", "-.", "FLOP-optimal (eq. 111)"),
                              ("L_opt_runtime", "--", "runtime-optimal (eq. 121)")):
            if grid[0] <= o[name] <= grid[-1]:
                ax.axvline(o[name], color="0.3", ls=ls, lw=0.9, label=f"model {lab}: L={o[name]:.0f}")
            else:
                ax.plot([], [], " ", label=f"model {lab}: L={o[name]:.0f} (off the axis)")
        mem_ax = None
        for j, s in enumerate(group):
            c = palette[j % len(palette)]
            x = [p["L"] for p in s.points]
            ax.plot(x, [p["ms_median"] for p in s.points], marker="o", color=c, lw=1.8, label=f"{s.kernel}")
            ax.plot([s.measured_L_opt], [s.measured_ms_opt], marker="*", color=c, ms=15, mec="k", ls="none",
                    label=f"measured optimum L={s.measured_L_opt}")
            axr.plot(x, [p["ratio_sum"] for p in s.points], marker="o", color=c, lw=1.4)
            mem = [(p["L"], p["peak_mem_bytes"] / GIB) for p in s.points if p.get("peak_mem_bytes")]
            if mem:
                mem_ax = mem_ax or axr.twinx()
                mem_ax.plot([m[0] for m in mem], [m[1] for m in mem], marker="s", ms=3, color=c, ls=":", lw=1.0)
        if mem_ax is not None:
            mem_ax.set_ylabel("peak memory, dotted (GiB)", fontsize=8)
            mem_ax.set_ylim(bottom=0)
        s0 = first.shape
        ax.set_title(f"{first.mode}: B={s0['batch']} S={s0['seq_len']} NH={s0['heads']} d_qk={s0['d_qk']} "
                     f"d_hv={s0['d_hv']} ({first.ceilings} ceilings: {first.alpha / 1e12:.0f} TFLOP/s, "
                     f"{first.beta / 1e12:.3g} TB/s)", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        _plain_log_ticks(ax.yaxis)
        ax.set_ylabel("runtime (ms): measured median, model")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6.5, loc="upper center")
        axr.set_xscale("log", base=2)
        axr.axhline(1.0, color="k", lw=0.8)
        axr.set_ylim(bottom=0)
        axr.set_xlabel("chunk size L (tokens)")
        axr.set_ylabel("measured / model (sum form)", fontsize=8)
        axr.grid(True, which="both", alpha=0.3)
        axr.set_xticks(Ls, [str(L) for L in Ls])
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def model_figures(rs, out_dir: str | Path, *, gpu=None, F_causal: float = 0.66, counts: str = "rows") -> list[Path]:
    """The model-vs-measurement figures of a result set that apply, into ``out_dir``:
    ``roofline_measured.png`` (every ``ok`` row with model counts) and ``optimal_chunk.png``
    (when an mLSTM kernel sweeps chunk sizes). ``gpu``: the ceilings
    (:func:`tflabench.model_vs_measured.ceilings_for`); default: the set's GPU with measured
    ceilings where recorded. Returns [] when the set was measured on no catalogued GPU."""
    from tflabench import model_vs_measured as mm
    from tflabench.errors import UserError

    if gpu is None:
        try:
            gpu = mm.ceilings_for(rs.metadata)
        except UserError:
            return []
    out = Path(out_dir)
    suite = rs.metadata.get("suite") or ""
    where = f"{suite} on {rs.metadata.get('gpu_name') or gpu.name}"
    written = []
    placement = mm.roofline_placement(rs.rows, alpha=gpu.flops_per_s, beta=gpu.bytes_per_s)
    if placement:
        written.append(roofline_measured_figure(
            placement, gpu, path=out / "roofline_measured.png",
            title=f"{where}: every case against the roofline at its own shape ({gpu.ceilings} ceilings)"))
    sweeps = mm.chunk_sweeps(rs.rows, alpha=gpu.flops_per_s, beta=gpu.bytes_per_s, ceilings=gpu.ceilings,
                             F_causal=F_causal, counts=counts)
    if sweeps:
        written.append(chunk_sweep_figure(
            sweeps, path=out / "optimal_chunk.png",
            title=f"{where}: runtime over chunk size, measured and modelled (counts={counts})"))
    return written


__all__ = ["chunk_sweep_figure", "model_figures", "roofline_measured_figure", "MODE_MARKERS"]
