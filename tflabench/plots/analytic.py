"""Figures of the analytic model: roofline (paper Figs. 19-20), intensity over chunk size (Fig. 18),
optimal chunk size over d_hv and over accelerator intensity (Figs. 21-22).

matplotlib is imported only inside these functions (via :mod:`tflabench.plots`). Each function
takes data computed by :mod:`tflabench.model`, writes the figure with :func:`save_figure` and
returns the path.
"""

from __future__ import annotations

import math
from pathlib import Path

from tflabench.plots import new_figure, save_figure

_COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
           "tab:gray", "tab:olive", "tab:cyan"]


#: marker of measured points per harness mode (tflabench.backends.base MODES)
MODE_MARKERS = {"fwd": "x", "fwdbw": "+"}
_OTHER_MARKERS = ["1", "2", "3", "4"]


def _kernel_mode(point: dict) -> tuple[str, str]:
    """(kernel, mode) of a measured point: ``kernel`` (else ``label``) and ``mode`` (else "")."""
    return str(point.get("kernel") or point["label"]), str(point.get("mode") or "")


def measured_styles(measured_points, n_reserved: int = 0) -> tuple[dict, dict]:
    """Colours per kernel and markers per mode for measured roofline points.

    One colour per kernel (``kernel``, else ``label``), none of them among the first
    ``n_reserved`` colours (those draw the GPUs' roofs): tab10 while it suffices, else the 20
    colours of tab20 without the roofs' dark/light pairs (repeating only beyond 20 kernels).
    One marker per mode: "x" forward, "+" forward+backward, others after.
    Returns ({kernel: colour}, {mode: marker}).
    """
    kernels = sorted({_kernel_mode(m)[0] for m in measured_points})
    modes = sorted({_kernel_mode(m)[1] for m in measured_points})
    if n_reserved + len(kernels) <= len(_COLORS):
        palette = _COLORS
    else:  # tab20 holds each tab10 colour as a dark/light pair: skip the roofs' pairs
        from matplotlib import colormaps

        palette = [colormaps["tab20"](i) for i in range(20)]
        n_reserved = min(2 * n_reserved, 20 - min(len(kernels), 20))
    colours = {k: palette[(n_reserved + j) % len(palette)] for j, k in enumerate(kernels)}
    others = iter(_OTHER_MARKERS * (1 + len(modes)))
    markers = {m: MODE_MARKERS.get(m) or next(others) for m in modes}
    return colours, markers


def _logspace(lo, hi, n=200):
    a, b = math.log10(lo), math.log10(hi)
    return [10 ** (a + (b - a) * i / (n - 1)) for i in range(n)]


def roofline_figure(gpus, points, *, path, peer_points=(), measured_points=(), title=None) -> Path:
    """Log-log roofline P(I) = min(beta·I, alpha) (eq. 119) per GPU with the model's points.

    Args:
        gpus: :class:`tflabench.hardware.GPU` list (their selected ceilings are drawn).
        points: dicts with ``label`` and ``intensity_flop_per_byte`` (model points, e.g. per chunk
            size), drawn on each GPU's roof: filled circles memory-bound, squares compute-bound.
        peer_points: same, for the peers (diamonds).
        measured_points: dicts with ``label``, ``intensity_flop_per_byte``, ``flops_per_s``
            (measured FLOP/s = model FLOPs / measured time at the row's own shape), and
            optionally ``kernel`` and ``mode``: one colour per kernel, one marker per mode
            (:func:`measured_styles`).
        path: output file. title: figure title.
    """
    fig, ax = new_figure((8.0, 5.4))
    xs = [p["intensity_flop_per_byte"] for p in list(points) + list(peer_points) + list(measured_points)]
    xs += [g.intensity_flop_per_byte for g in gpus]
    lo = max(min(xs) / 3, 0.1)
    hi = max(xs) * 3
    grid = _logspace(lo, hi)
    for i, g in enumerate(gpus):
        col = _COLORS[i % len(_COLORS)]
        ax.plot(grid, [min(g.bytes_per_s * x, g.flops_per_s) / 1e12 for x in grid], color=col, lw=2,
                label=f"{g.name}: {g.flops_per_s / 1e12:.0f} TFLOP/s, {g.bytes_per_s / 1e12:.3g} TB/s ({g.ceilings})")
        ax.axvline(g.intensity_flop_per_byte, color=col, ls=":", lw=0.8)
        for p in points:
            x = p["intensity_flop_per_byte"]
            y = min(g.bytes_per_s * x, g.flops_per_s) / 1e12
            compute = x >= g.intensity_flop_per_byte
            ax.plot([x], [y], marker="s" if compute else "o", color=col, ms=6,
                    mfc=col if compute else "white", ls="none")
            if i == 0:
                ax.annotate(p["label"], (x, y), textcoords="offset points", xytext=(4, -12), fontsize=7)
        for p in peer_points:
            x = p["intensity_flop_per_byte"]
            y = min(g.bytes_per_s * x, g.flops_per_s) / 1e12
            ax.plot([x], [y], marker="D", color=col, ms=6, ls="none", mfc="none")
            if i == 0:
                ax.annotate(p["label"], (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    # legend entries for the marker meanings
    ax.plot([], [], "o", mfc="white", color="k", label="model point, memory-bound")
    ax.plot([], [], "s", color="k", label="model point, compute-bound")
    if peer_points:
        ax.plot([], [], "D", mfc="none", color="k", label="peer (model)")
    colours, markers = measured_styles(measured_points, n_reserved=len(gpus))
    for kernel, col in colours.items():
        for mode, marker in markers.items():
            mp = [m for m in measured_points if _kernel_mode(m) == (kernel, mode)]
            ax.plot([m["intensity_flop_per_byte"] for m in mp], [m["flops_per_s"] / 1e12 for m in mp],
                    marker=marker, ls="none", ms=8, mew=1.5, color=col)
        ax.plot([], [], "s", color=col, ls="none", label=f"measured: {kernel}")
    if any(markers):  # a legend entry per mode unless the points name none
        for mode, marker in markers.items():
            ax.plot([], [], marker, color="k", ls="none", ms=8, label=f"measured, {mode or 'any mode'}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity I (FLOP/byte)")
    ax.set_ylabel("attainable performance (TFLOP/s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title or "Roofline", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    return save_figure(fig, path)


def intensity_figure(curves, gpus, *, T, path, title=None) -> Path:
    """Arithmetic intensity over chunk size (eq. 118), one curve per (state bytes, F_causal),
    accelerators' I_acc = alpha/beta as horizontal lines; log-log (paper Fig. 18).

    Args:
        curves: dicts with ``label``, ``coefficients`` (a, b, c, m, n of analysis.chunkwise_coefficients)
            and ``intensity`` ({L: I} points to mark).
        gpus: GPUs whose I_acc lines are drawn. T: largest chunk size on the x axis.
    """
    fig, ax = new_figure((7.5, 5.0))
    Lg = _logspace(1, T)
    fcs = sorted({c.get("F_causal") for c in curves}, key=lambda v: (v is None, v))
    sbs = sorted({c.get("bytes_Cmn") for c in curves}, key=lambda v: (v is None, -(v or 0)))
    styles = ["-", "--", ":", "-."]
    for i, c in enumerate(curves):
        co = c["coefficients"]
        col = _COLORS[fcs.index(c.get("F_causal")) % len(_COLORS)]
        ls = styles[sbs.index(c.get("bytes_Cmn")) % len(styles)]
        ax.plot(Lg, [(co["a"] * L * L + co["b"] * L + co["c"]) / (co["m"] * L + co["n"]) for L in Lg],
                color=col, ls=ls, label=c["label"])
        pts = sorted(c["intensity"].items())
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", color=col, ms=3)
    curve_legend = ax.legend(fontsize=7, loc="upper left", title="states, F_causal", title_fontsize=7)
    gpu_styles = [(0, (1, 1.5)), (0, (6, 2)), (0, (4, 1.5, 1, 1.5)), (0, (2, 3)), (0, (8, 2, 1, 2))]
    handles = []
    for j, g in enumerate(gpus):
        handles.append(ax.axhline(g.intensity_flop_per_byte, color=["k", "0.4"][j // 5 % 2],
                                  ls=gpu_styles[j % 5], lw=1.1,
                                  label=f"{g.name}: I_acc {g.intensity_flop_per_byte:.1f} ({g.ceilings})"))
    ax.add_artist(curve_legend)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("chunk size L (tokens)")
    ax.set_ylabel("arithmetic intensity (FLOP/byte)")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title or "Arithmetic intensity", fontsize=9)
    if handles:
        ax.legend(handles=handles, fontsize=7, loc="lower right", title="accelerator intensity",
                  title_fontsize=7)
    return save_figure(fig, path)


def optimal_chunk_figure(gpus, *, variant="sig", p_qk=0.5, F_causal=0.66, bytes_Cmn=4, counts="rows",
                         path, d_hvs=(32, 64, 128, 256, 512, 1024, 2048)) -> Path:
    """Two panels: optimal chunk size over d_hv (runtime-optimal eq. 121 per GPU, FLOP-optimal
    eq. 111) and runtime-optimal chunk size over accelerator intensity I_acc for several d_hv,
    with the GPUs marked (paper Figs. 21-22). Log axes."""
    from tflabench.model.analysis import chunkwise_coefficients, l_opt_flop, l_opt_runtime

    plt_fig, ax0 = new_figure((11.0, 4.6))
    ax0.remove()
    ax1 = plt_fig.add_subplot(1, 2, 1)
    ax2 = plt_fig.add_subplot(1, 2, 2)
    dg = _logspace(min(d_hvs), max(d_hvs), 80)

    def coeffs(d):
        return chunkwise_coefficients(variant, d_hv=d, p_qk=p_qk, F_causal=F_causal, bytes_Cmn=bytes_Cmn,
                                      counts=counts)

    for i, g in enumerate(gpus):
        col = _COLORS[i % len(_COLORS)]
        ax1.plot(dg, [l_opt_runtime(coeffs(d), g.intensity_flop_per_byte) for d in dg], color=col,
                 label=f"runtime-optimal, {g.name} (I_acc {g.intensity_flop_per_byte:.0f})")
    ax1.plot(dg, [l_opt_flop(coeffs(d)) for d in dg], color="k", ls="--", label="FLOP-optimal (eq. 111)")
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log", base=2)
    ax1.set_xlabel("head dimension d_hv")
    ax1.set_ylabel("optimal chunk size L (tokens)")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=7)
    ax1.set_title(f"over d_hv (p_qk={p_qk:g}, F_causal={F_causal:g}, bytes_Cmn={bytes_Cmn:g})", fontsize=9)

    Ig = _logspace(10, 2000, 120)
    for j, d in enumerate((128, 256, 512, 1024)):
        co = coeffs(d)
        ax2.plot(Ig, [l_opt_runtime(co, I) for I in Ig], color=_COLORS[j], label=f"d_hv = {d}")
        for g in gpus:
            I = g.intensity_flop_per_byte
            ax2.plot([I], [l_opt_runtime(co, I)], "o", color=_COLORS[j], ms=4)
    for k, g in enumerate(gpus):
        ax2.axvline(g.intensity_flop_per_byte, color="gray", ls=":", lw=0.8)
        ax2.annotate(g.key, (g.intensity_flop_per_byte, 1.0), xycoords=("data", "axes fraction"),
                     xytext=(2 if k % 2 == 0 else -9, -10), textcoords="offset points", fontsize=7,
                     rotation=90, va="top")
    ax2.set_xscale("log")
    ax2.set_yscale("log", base=2)
    ax2.set_xlabel("accelerator intensity I_acc = alpha / beta (FLOP/byte)")
    ax2.set_ylabel("runtime-optimal chunk size L (tokens)")
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=7)
    ax2.set_title(f"over accelerator intensity (eq. 121, mLSTM{variant})", fontsize=9)
    return save_figure(plt_fig, path)
