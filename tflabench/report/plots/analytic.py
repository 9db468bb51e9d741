"""Figures of the analytic model: roofline (paper Figs. 19-20), intensity over chunk size (Fig. 18),
optimal chunk size over d_hv and over accelerator intensity (Figs. 21-22).

matplotlib is imported only inside these functions (via :mod:`tflabench.report.plots`). Each function
takes data computed by :mod:`tflabench.model`, writes the figure with :func:`save_figure` and
returns the path.
"""

from __future__ import annotations

import math
from pathlib import Path

from tflabench.analysis.analytic_inputs import ceilings_text
from tflabench.report.plots import fit_margins, new_figure, save_figure

from tflabench.report.plots.style import (PALETTE, ax_title, kernel_styles, label_points, legend_below, log_axis,
                                   log_log_axes, place_labels)

#: Dash patterns of the GPUs' lines (roofs, I_acc lines), one per GPU with its colour.
GPU_DASHES = ("-", (0, (6, 2)), (0, (2, 1.5)), (0, (6, 2, 1.5, 2)), (0, (1, 1)), (0, (9, 3)),
              (0, (3, 1, 1, 1, 1, 1)))
#: Palette offset of the GPUs' colours in figures whose curves take the first colours.
GPU_COLOUR_OFFSET = 4


def gpu_style(i: int, offset: int = 0) -> dict:
    """Colour and dash pattern of the ``i``-th GPU's line (matplotlib keywords)."""
    return {"color": PALETTE[(offset + i) % len(PALETTE)], "linestyle": GPU_DASHES[i % len(GPU_DASHES)]}


def _label_lines_right(ax, items, *, fontsize=7.5) -> list:
    """Label horizontal-ish lines at the right edge of ``ax``, outside the data: ``items``
    are ``(y, text, colour)``; labels are spread apart (:func:`place_labels`, again by
    :func:`_spread_right` once the axes has its final size) and joined to their line by a
    short leader where moved. Returns the annotations, in the order of ``items``."""
    labels = [ax.annotate(text, xy=(1.0, y), xycoords=("axes fraction", "data"), xytext=(1.035, y),
                          textcoords=("axes fraction", "data"), va="center", ha="left", fontsize=fontsize,
                          color=colour, annotation_clip=False,
                          arrowprops={"arrowstyle": "-", "color": colour, "lw": 0.6, "relpos": (0.0, 0.5),
                                      # from 3 pt off the text: 1 pt and the 2 pt by which matplotlib's
                                      # default clips a leader at a box around its text, without that
                                      # clip (a second bisection of the path per label and draw)
                                      "patchA": None, "shrinkA": 3, "shrinkB": 0})
              for y, text, colour in items]
    _spread_right(ax, labels, fontsize=fontsize)
    return labels


def _spread(ax, labels, *, axis: str, min_gap_pt: float) -> None:
    """Move annotations apart along ``axis`` ("y": their text's y, "x": its x) at the axes'
    current size (:func:`place_labels`, from where each one points); the other coordinate of
    each text stays."""
    j = 1 if axis == "y" else 0
    placed = place_labels(ax, [(a.xy[j], a.get_text()) for a in labels], axis=axis, min_gap_pt=min_gap_pt)
    for a, (_, at, _) in zip(labels, placed):
        a.xyann = (a.xyann[0], at) if axis == "y" else (at, a.xyann[1])


def _spread_right(ax, labels, *, fontsize=7.5) -> None:
    """Move the labels of :func:`_label_lines_right` apart at the axes' current size."""
    _spread(ax, labels, axis="y", min_gap_pt=fontsize + 2.5)


def _measured_kw(point: dict, styles: dict) -> dict:
    """Marker keywords of a measured point: its kernel's style; forward+backward points
    smaller than forward ones."""
    return styles[str(point.get("kernel") or point["label"])].point(7.0 if point.get("mode") != "fwdbw" else 4.5)


def _logspace(lo, hi, n=200):
    a, b = math.log10(lo), math.log10(hi)
    return [10 ** (a + (b - a) * i / (n - 1)) for i in range(n)]


def roofline_figure(gpus, points, *, path, peer_points=(), measured_points=(), title=None) -> Path:
    """Log-log roofline P(I) = min(beta·I, alpha) (eq. 119) per GPU with the model's points.

    Args:
        gpus: :class:`tflabench.hardware.GPU` list (their selected ceilings are drawn), each
            roof in its own colour and dash pattern, named at its right end.
        points: dicts with ``label`` and ``intensity_flop_per_byte`` (model points, e.g. per chunk
            size), drawn on each GPU's roof: open circles memory-bound, filled squares compute-bound.
        peer_points: same, for the peers (open diamonds).
        measured_points: dicts with ``label``, ``intensity_flop_per_byte``, ``flops_per_s``
            (measured FLOP/s = model FLOPs / measured time at the row's own shape), and
            optionally ``kernel`` and ``mode``: a colour and marker per kernel
            (:mod:`tflabench.report.plots.style`), forward+backward smaller than forward.
        path: output file. title: figure title.
    """
    fig, ax = new_figure((9.0, 5.8), layout=None)
    xs = [p["intensity_flop_per_byte"] for p in list(points) + list(peer_points) + list(measured_points)]
    xs += [g.intensity_flop_per_byte for g in gpus]
    lo = max(min(xs) / 3, 0.1)
    hi = max(xs) * 3
    grid = _logspace(lo, hi)
    roof_labels, to_label, markers = [], [], []
    for i, g in enumerate(gpus):
        st = gpu_style(i)
        ax.plot(grid, [min(g.bytes_per_s * x, g.flops_per_s) / 1e12 for x in grid], lw=1.8, **st)
        ax.axvline(g.intensity_flop_per_byte, color=st["color"], ls=":", lw=0.8)
        roof_labels.append((g.flops_per_s / 1e12, f"{g.name}: {g.flops_per_s / 1e12:.0f} TFLOP/s, "
                            f"{g.bytes_per_s / 1e12:.3g} TB/s, I_acc {g.intensity_flop_per_byte:.0f}",
                            st["color"]))
        for p in points:
            x = p["intensity_flop_per_byte"]
            y = min(g.bytes_per_s * x, g.flops_per_s) / 1e12
            compute = x >= g.intensity_flop_per_byte
            ax.plot([x], [y], marker="s" if compute else "o", color=st["color"], ms=5.5,
                    mfc=st["color"] if compute else "white", ls="none", zorder=3)
            (to_label if i == 0 else markers).append((x, y, p["label"], "k"))
        for p in peer_points:
            x = p["intensity_flop_per_byte"]
            y = min(g.bytes_per_s * x, g.flops_per_s) / 1e12
            ax.plot([x], [y], marker="D", color=st["color"], ms=5.5, ls="none", mfc="white", zorder=3)
            (to_label if i == 0 else markers).append((x, y, p["label"], "k"))
    handles = [ax.plot([], [], "o", mfc="white", color="k", ls="none")[0],
               ax.plot([], [], "s", color="k", ls="none")[0]]
    labels = ["model point, memory-bound", "model point, compute-bound"]
    if peer_points:
        handles.append(ax.plot([], [], "D", mfc="white", color="k", ls="none")[0])
        labels.append("peer (model)")
    styles = kernel_styles((str(m.get("kernel") or m["label"]), None, None) for m in measured_points)
    for kernel, st in styles.items():
        mp = [m for m in measured_points if str(m.get("kernel") or m["label"]) == kernel]
        for m in mp:
            ax.plot([m["intensity_flop_per_byte"]], [m["flops_per_s"] / 1e12], **_measured_kw(m, styles))
        handles.append(ax.plot([], [], **st.point(7.0))[0])
        labels.append(f"measured: {kernel}")
    if any(m.get("mode") == "fwdbw" for m in measured_points):
        labels[-len(styles)] += " (small: forward + backward)"
    log_log_axes(ax, xlabel="arithmetic intensity I (FLOP/byte)", ylabel="attainable performance (TFLOP/s)")
    ax_title(ax, title or "Roofline", fontsize=9)
    right = _label_lines_right(ax, roof_labels)
    legend_below(fig, handles, labels, ncol=3, fontsize=7.5, title=f"roofs: {ceilings_text(gpus)}")
    fit_margins(fig)
    _spread_right(ax, right)
    dropped = label_points(ax, to_label, obstacles=[(m[0], m[1]) for m in markers]
                           + [(m["intensity_flop_per_byte"], m["flops_per_s"] / 1e12) for m in measured_points])
    if dropped:
        ax.text(0.99, 0.01, f"{dropped} point label{'s' if dropped > 1 else ''} left out where "
                f"{'they' if dropped > 1 else 'it'} would overlap (the table names every point)",
                transform=ax.transAxes, va="bottom", ha="right", fontsize=6.5, color="0.35")  # below the roof
    return save_figure(fig, path)


def intensity_figure(curves, gpus, *, S, path, title=None) -> Path:
    """Arithmetic intensity over chunk size (eq. 118), one curve per (state bytes, F_causal),
    accelerators' I_acc = alpha/beta as horizontal lines; log-log (paper Fig. 18).

    Each GPU's line has its own colour and dash pattern and is named at its right end with
    its I_acc (labels spread apart where two GPUs nearly coincide, e.g. B200 292.2 and H100
    295.2); the curves' key sits below the axes.

    Args:
        curves: dicts with ``label``, ``coefficients`` (a, b, c, m, n of analysis.chunkwise_coefficients)
            and ``intensity`` ({L: I} points to mark).
        gpus: GPUs whose I_acc lines are drawn. S: the sequence length, the largest chunk size on the x axis.
    """
    fig, ax = new_figure((8.5, 5.6), layout=None)
    Lg = _logspace(1, S)
    fcs = sorted({c.get("F_causal") for c in curves}, key=lambda v: (v is None, v))
    sbs = sorted({c.get("bytes_Cmn") for c in curves}, key=lambda v: (v is None, -(v or 0)))
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "D", "^"]
    handles, labels = [], []
    for c in curves:
        co = c["coefficients"]
        col = PALETTE[fcs.index(c.get("F_causal")) % GPU_COLOUR_OFFSET]
        ls = styles[sbs.index(c.get("bytes_Cmn")) % len(styles)]
        mk = markers[sbs.index(c.get("bytes_Cmn")) % len(markers)]
        (line,) = ax.plot(Lg, [(co["a"] * L * L + co["b"] * L + co["c"]) / (co["m"] * L + co["n"]) for L in Lg],
                          color=col, ls=ls, lw=1.8)
        pts = sorted(c["intensity"].items())
        ax.plot([p[0] for p in pts], [p[1] for p in pts], mk, color=col, ms=4)
        handles.append(ax.plot([], [], color=col, ls=ls, marker=mk, ms=4, lw=1.8)[0])
        labels.append(f"states {c['label']}")
    gpu_labels = []
    for j, g in enumerate(gpus):
        st = gpu_style(j, GPU_COLOUR_OFFSET)
        ax.axhline(g.intensity_flop_per_byte, lw=1.2, **st)
        gpu_labels.append((g.intensity_flop_per_byte, f"{g.name}: I_acc {g.intensity_flop_per_byte:.1f}",
                           st["color"]))
    log_log_axes(ax, xlabel="chunk size L (tokens)", ylabel="arithmetic intensity (FLOP/byte)", x_base=2)
    ax_title(ax, title or "Arithmetic intensity", fontsize=9)
    right = _label_lines_right(ax, gpu_labels)
    legend_below(fig, handles, labels, ncol=min(4, len(labels)),
                 title=f"curves: state bytes and F_causal; lines: each GPU's I_acc = alpha / beta "
                       f"({ceilings_text(gpus)}), compute-bound above")
    fit_margins(fig)
    _spread_right(ax, right)
    return save_figure(fig, path)


def optimal_chunk_figure(gpus, *, variant="sig", p_qk=0.5, F_causal=0.66, bytes_Cmn=4, counts="rows",
                         path, d_hvs=(32, 64, 128, 256, 512, 1024, 2048)) -> Path:
    """Two panels: optimal chunk size over d_hv (runtime-optimal eq. 121 per GPU, FLOP-optimal
    eq. 111) and runtime-optimal chunk size over accelerator intensity I_acc for several d_hv,
    with the GPUs marked and named (labels spread apart where GPUs nearly coincide; paper
    Figs. 21-22). Log axes; each panel's key below it."""
    from tflabench.model.analysis import chunkwise_coefficients, l_opt_flop, l_opt_runtime

    plt_fig, (ax1, ax2) = new_figure((12.0, 5.6), layout=None, ncols=2)
    dg = _logspace(min(d_hvs), max(d_hvs), 80)

    def coeffs(d):
        return chunkwise_coefficients(variant, d_hv=d, p_qk=p_qk, F_causal=F_causal, bytes_Cmn=bytes_Cmn,
                                      counts=counts)

    for i, g in enumerate(gpus):
        ax1.plot(dg, [l_opt_runtime(coeffs(d), g.intensity_flop_per_byte) for d in dg], lw=1.8,
                 label=f"runtime-optimal (eq. 121), {g.name} (I_acc {g.intensity_flop_per_byte:.0f})",
                 **gpu_style(i, GPU_COLOUR_OFFSET))
    ax1.plot(dg, [l_opt_flop(coeffs(d)) for d in dg], color="k", ls="-.", lw=1.4, label="FLOP-optimal (eq. 111)")
    log_log_axes(ax1, xlabel="head dimension d_hv", ylabel="optimal chunk size L (tokens)", x_base=2, y_base=2)
    ax1.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
    ax_title(ax1, f"optimal L over d_hv (p_qk={p_qk:g}, F_causal={F_causal:g}, bytes_Cmn={bytes_Cmn:g}; "
             f"{ceilings_text(gpus)})", fontsize=9)

    Ig = _logspace(10, 2000, 120)
    for j, d in enumerate((128, 256, 512, 1024)):
        co = coeffs(d)
        ax2.plot(Ig, [l_opt_runtime(co, I) for I in Ig], color=PALETTE[j], lw=1.8, marker=None, label=f"d_hv = {d}")
        for g in gpus:
            I = g.intensity_flop_per_byte
            ax2.plot([I], [l_opt_runtime(co, I)], "o", color=PALETTE[j], ms=4)
    ax2.set_xscale("log")
    ax2.set_yscale("log", base=2)
    log_axis(ax2, "x")
    log_axis(ax2, "y", base=2)
    gpu_names = []
    for k, g in enumerate(gpus):
        st = gpu_style(k, GPU_COLOUR_OFFSET)
        ax2.axvline(g.intensity_flop_per_byte, color=st["color"], ls=":", lw=1.0)
        gpu_names.append((g.intensity_flop_per_byte, g.key, st["color"]))
    names = [ax2.annotate(name, xy=(x, 1.0), xycoords=("data", "axes fraction"), xytext=(x, 1.01),
                          textcoords=("data", "axes fraction"), rotation=90, va="bottom", ha="center", fontsize=7,
                          color=colour, annotation_clip=False) for x, name, colour in gpu_names]
    ax2.set_xlabel("accelerator intensity I_acc = alpha / beta (FLOP/byte)")
    ax2.set_ylabel("runtime-optimal chunk size L (tokens)")
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False, ncol=4)
    ax_title(ax2, f"runtime-optimal L over accelerator intensity (eq. 121, mLSTM{variant}; dots: the GPUs)",
             fontsize=9, pad=28)
    fit_margins(plt_fig)
    _spread(ax2, names, axis="x", min_gap_pt=9.0)  # apart at the axes' final width
    return save_figure(plt_fig, path)
