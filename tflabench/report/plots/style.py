"""One look for every figure: colour-blind-safe colours, a colour and marker per kernel,
ours told from the authors' at a glance, readable log ticks, labels that do not collide.

- Colours: the Okabe-Ito palette (Okabe and Ito, "Color Universal Design", 2008) without
  its yellow (too pale on white), then Paul Tol's muted scheme; both stay distinct under
  the common colour-vision deficiencies. Each kernel *family* gets one colour and one
  marker: our kernel and the authors' (``mlstm_kernels``) kernel of the same algorithm
  (variant and algorithm) share them, ours drawn with a solid line and filled markers, the
  authors' (and every other peer) dashed with hollow markers.
- Log axes: plain tick labels (``0.5``, ``2``, ``300``, ``64k``), 1-2-5 steps over narrow
  ranges so a panel never reads ``1.7×10⁰``, no labelled minor ticks.
- Labels: :func:`place_labels` spreads text labels apart along one axis and reports those it
  had to leave out.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from tflabench.store.schema import row_params

#: Okabe-Ito (blue, vermillion, bluish green, reddish purple, orange, sky blue, black),
#: then Paul Tol's muted (indigo, olive, wine, teal, sand, rose, purple).
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
           "#332288", "#999933", "#882255", "#44AA99", "#DDCC77", "#CC6677", "#AA4499")
#: One marker per family, in the palette's order (cycled with an offset beyond it).
MARKERS = ("o", "s", "D", "^", "v", "P", "X", "<", ">", "h", "p", "*", "d", "8")
#: Backends whose kernels are ours (drawn solid, filled).
OURS_BACKENDS = frozenset({"tfla"})
#: Backends of the TFLA authors' kernels (drawn dashed, hollow, in the colour of ours).
AUTHORS_BACKENDS = frozenset({"mlstm_kernels"})
#: Colours of other things in a figure (GPU roofs, model curves) than kernels.
NEUTRALS = ("#000000", "#555555", "#888888")


@dataclass(frozen=True)
class KernelStyle:
    """How one kernel is drawn: ``color``, ``marker``, and whether it is ``ours``."""

    color: str
    marker: str
    ours: bool

    def line(self) -> dict:
        """matplotlib keyword arguments of a line with markers."""
        return {"color": self.color, "marker": self.marker, "linestyle": "-" if self.ours else "--",
                "linewidth": 2.2 if self.ours else 1.4, "markersize": 6 if self.ours else 5.5,
                "markerfacecolor": self.color if self.ours else "white", "markeredgecolor": self.color,
                "markeredgewidth": 1.3}

    def point(self, size: float = 6.5) -> dict:
        """matplotlib keyword arguments of markers without a line."""
        return {"color": self.color, "marker": self.marker, "linestyle": "none", "markersize": size,
                "markerfacecolor": self.color if self.ours else "white", "markeredgecolor": self.color,
                "markeredgewidth": 1.3}


def family_key(label: str, backend: str | None = None, params=None) -> str:
    """The family a kernel belongs to: for ours and the authors' mLSTM kernels their
    ``variant`` and ``algorithm`` (so the two implementations of one algorithm share a
    colour), a ``chunk_size`` of ``"auto"`` its own family (the rule may pick another
    algorithm, the forward walk, so it is not drawn as the fixed-chunk kernel); for any
    other kernel its label without a trailing ``(...)`` implementation note only when that
    note names ours or the authors' backend, else the whole label."""
    p = row_params({"params": params})
    if backend in OURS_BACKENDS | AUTHORS_BACKENDS and p.get("variant"):
        key = f"mlstm {p.get('variant')} {p.get('algorithm') or 'xl_chunk'}"
        return key + " auto" if p.get("chunk_size") == "auto" else key
    match = re.match(r"^(.*?)\s*\((ours|mlstm_kernels)\)(.*)$", label)
    if match:
        return (match.group(1) + match.group(3)).strip()
    return label


def is_ours(label: str, backend: str | None = None) -> bool:
    """Whether a kernel is ours: its backend, else a label ending in ``(ours)``."""
    if backend is not None:
        return backend in OURS_BACKENDS
    return "(ours)" in label


def is_authors(label: str, backend: str | None = None) -> bool:
    """Whether a kernel is the TFLA authors' (:data:`AUTHORS_BACKENDS`): its backend, else a
    label ending in ``(mlstm_kernels)``."""
    if backend is not None:
        return backend in AUTHORS_BACKENDS
    return "(mlstm_kernels)" in label


def ours_key(kernels) -> str | None:
    """The legend's note on how ours and the peers are drawn, naming only what the figure
    shows: ``solid, filled: ours``, then ``dashed, hollow:`` the authors' kernels
    (``mlstm_kernels``) where one is drawn and other peers where one is drawn. None where
    no kernel of ours is drawn (every kernel then looks alike: no note).

    Args:
        kernels: iterable of ``(label, backend)`` of the kernels drawn (backend may be None).
    """
    items = list(dict.fromkeys((str(label), backend) for label, backend in kernels))
    if not any(is_ours(label, backend) for label, backend in items):
        return None
    peers = [(label, backend) for label, backend in items if not is_ours(label, backend)]
    authors = any(is_authors(label, backend) for label, backend in peers)
    others = any(not is_authors(label, backend) for label, backend in peers)
    named = (["the authors' kernels (mlstm_kernels)"] if authors else []) + (
        ["other peers" if authors else "peers"] if others else [])
    return "solid, filled: ours" + ("; dashed, hollow: " + " and ".join(named) if named else "")


def kernel_styles(kernels) -> dict[str, KernelStyle]:
    """A :class:`KernelStyle` per kernel label.

    Args:
        kernels: iterable of ``(label, backend, params)`` (backend and params may be None;
            params a dict or its JSON), in the order they should take colours; families of
            ours come first.

    Returns:
        {label: KernelStyle}; one colour and marker per family (:func:`family_key`).
    """
    items = list(dict.fromkeys((str(k[0]), k[1], json.dumps(row_params({"params": k[2]}), sort_keys=True)) for k in kernels))
    families: list[str] = []
    ours_first = sorted(items, key=lambda it: not is_ours(it[0], it[1]))
    for label, backend, params in ours_first:
        key = family_key(label, backend, params)
        if key not in families:
            families.append(key)
    out = {}
    for label, backend, params in items:
        i = families.index(family_key(label, backend, params))
        marker = MARKERS[(i + i // len(PALETTE)) % len(MARKERS)]
        out.setdefault(label, KernelStyle(PALETTE[i % len(PALETTE)], marker, is_ours(label, backend)))
    return out


def order_kernels(labels, styles: dict[str, KernelStyle]) -> list[str]:
    """``labels`` grouped by family in the palette's order (ours first within a family), so
    that our kernel and the authors' of one algorithm sit side by side."""
    return sorted(labels, key=lambda k: (PALETTE.index(styles[k].color) if styles[k].color in PALETTE else 99,
                                         MARKERS.index(styles[k].marker), not styles[k].ours, k))


def styles_for_rows(frame, label_column: str = "kernel") -> dict[str, KernelStyle]:
    """:func:`kernel_styles` of a result-set DataFrame's rows (``label_column``, ``backend``,
    ``params`` where present)."""
    records = frame.to_dict("records")
    return kernel_styles((r[label_column], r.get("backend"), r.get("params")) for r in records)


# ------------------------------------------------------------------ axes


def tick_text(value: float) -> str:
    """A tick label a reader takes in at once: ``0.05``, ``3``, ``250``, ``8192``, ``64k``
    (k = 1024 for powers of two), ``1e+06`` beyond."""
    if value <= 0 or not math.isfinite(value):
        return ""
    if value >= 16384 and math.log2(value).is_integer():
        return f"{int(value) // 1024}k"
    if 1e-3 <= value < 1e5:
        return str(int(value)) if value >= 1 and float(value).is_integer() else f"{value:.3g}"
    return f"{value:.0e}"


def log_axis(ax, which: str = "y", base: float = 10, values=None) -> None:
    """Readable ticks on a log axis of ``ax`` (call after the data are drawn).

    Base 2 (sizes, lengths): a tick at each power of two in range, or at ``values`` (the
    swept values), labelled plainly. Base 10: ticks at 1-2-5 steps when the axis spans
    less than three decades, at 1-3 steps below 4.5, else at powers of ten; labels plain
    numbers. Minor ticks (unlabelled) only where the major ones are sparse: at 2 and 5
    between 1-3 steps, at 2 to 9 between powers of ten (every tick costs drawing time; a
    1-2-5 axis reads as log without them).
    """
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator

    axis = ax.yaxis if which == "y" else ax.xaxis
    lo, hi = sorted(ax.get_ylim() if which == "y" else ax.get_xlim())
    lo = max(lo, 1e-300)
    if base == 2:
        if values is not None:
            ticks = sorted({float(v) for v in values if lo <= v <= hi})
        else:
            ticks = [2.0 ** k for k in range(math.ceil(math.log2(lo)), math.floor(math.log2(hi)) + 1)]
        axis.set_major_locator(FixedLocator(ticks))
    else:
        decades = math.log10(hi / lo)
        subs = (1.0, 2.0, 5.0) if decades < 3 else (1.0, 3.0) if decades < 4.5 else (1.0,)
        if decades < 0.5:  # under a factor of about 3: finer steps
            subs = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)
        axis.set_major_locator(LogLocator(base=10, subs=subs))
        minor = {(1.0, 3.0): (2.0, 5.0), (1.0,): (2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0)}.get(subs)
        axis.set_minor_locator(LogLocator(base=10, subs=minor) if minor else NullLocator())
    axis.set_major_formatter(FuncFormatter(lambda v, _: tick_text(v)))
    axis.set_minor_formatter(NullFormatter())


# ------------------------------------------------------------------ labels


def place_labels(ax, labels, *, axis: str = "y", min_gap_pt: float = 9.0, limits=None) -> list:
    """Positions for text labels along one axis so that none overlap.

    Args:
        ax: the axes (its current limits and size in points are used).
        labels: list of ``(value, text)``: the data coordinate each label belongs to on
            ``axis``.
        axis: ``"y"`` (labels stacked vertically, e.g. at a line's right end) or ``"x"``.
        min_gap_pt: the smallest distance between two labels, in points.
        limits: ``(lo, hi)`` data range the labels must stay in (default the axis limits).

    Returns:
        list of ``(value, position, text)`` in the input's order: ``position`` is where to
        draw the label (data coordinates, log axes respected), moved from ``value`` as
        little as the gap requires.
    """
    if not labels:
        return []
    scale = ax.get_yscale() if axis == "y" else ax.get_xscale()
    lo, hi = limits or sorted(ax.get_ylim() if axis == "y" else ax.get_xlim())
    fig = ax.get_figure()
    bbox = ax.get_window_extent(fig.canvas.get_renderer()) if hasattr(fig.canvas, "get_renderer") else None
    length_pt = (bbox.height if axis == "y" else bbox.width) * 72.0 / fig.dpi if bbox is not None else 300.0
    fwd = (lambda v: math.log10(v)) if scale == "log" else (lambda v: v)
    inv = (lambda u: 10 ** u) if scale == "log" else (lambda u: u)
    u_lo, u_hi = fwd(lo), fwd(hi)
    gap = (u_hi - u_lo) * min_gap_pt / max(length_pt, 1.0)
    order = sorted(range(len(labels)), key=lambda i: labels[i][0])
    pos = [fwd(labels[i][0]) for i in order]
    for k in range(1, len(pos)):  # push up
        pos[k] = max(pos[k], pos[k - 1] + gap)
    if pos and pos[-1] > u_hi:  # then pull down from the top
        pos[-1] = u_hi
        for k in range(len(pos) - 2, -1, -1):
            pos[k] = min(pos[k], pos[k + 1] - gap)
    out = [None] * len(labels)
    for k, i in enumerate(order):
        out[i] = (labels[i][0], inv(pos[k]), labels[i][1])
    return out


#: Where :func:`label_points` tries a point's label, in points from the point, in order.
LABEL_OFFSETS = ((5, -11), (5, 4), (-5, 4), (-5, -11), (7, -4), (-7, -4), (0, 7), (0, -14))


def label_points(ax, items, *, obstacles=(), fontsize: float = 7.0, marker_pt: float = 6.0) -> int:
    """Label points of ``ax`` with text that neither overlaps another label nor sits on a
    marker, nor leaves the axes: each label takes the first of :data:`LABEL_OFFSETS` where
    it fits, else it is left out (the command's table gives every value).

    Args:
        items: ``(x, y, text, colour)`` in data coordinates, in order of importance.
        obstacles: further ``(x, y)`` markers to keep clear of (the labelled points are).
        fontsize: points. marker_pt: a marker's size in points (its box is kept clear).

    Returns:
        how many labels were left out.
    """
    fig = ax.get_figure()
    if not hasattr(fig.canvas, "get_renderer"):  # a bare Figure: the Agg canvas it is saved with
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    renderer = fig.canvas.get_renderer()
    engine = fig.get_layout_engine()
    if engine is not None:  # the layout's first pass sets the data-to-pixel transform (no draw needed)
        engine.execute(fig)
    frame = ax.get_window_extent(renderer)
    half = marker_pt * fig.dpi / 72.0 / 2
    taken = []
    for x, y in [(i[0], i[1]) for i in items] + list(obstacles):
        px, py = ax.transData.transform((x, y))
        taken.append((px - half, py - half, px + half, py + half))
    dropped = 0
    for x, y, text, colour in items:
        for dx, dy in LABEL_OFFSETS:
            a = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=fontsize,
                            ha="left" if dx > 0 else "right" if dx < 0 else "center", color=colour)
            b = a.get_window_extent(renderer)
            inside = frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1
            if inside and not any(b.x0 < t[2] and t[0] < b.x1 and b.y0 < t[3] and t[1] < b.y1 for t in taken):
                taken.append((b.x0, b.y0, b.x1, b.y1))
                break
            a.remove()
        else:
            dropped += 1
    if engine is not None:  # labels inside the axes never move the layout: the save keeps it
        fig.set_layout_engine("none")
    return dropped


def wrap_text(text: str, width_in: float, fontsize: float = 10.0) -> str:
    """``text`` broken at spaces into lines that fit ``width_in`` inches at ``fontsize``
    points (an average glyph is taken as 0.6 em wide, a safe bound for DejaVu Sans), so
    that a title never runs past the canvas (constrained layout does not shrink text)."""
    import textwrap

    chars = max(20, int(width_in * 72.0 / (0.6 * fontsize)))
    return "\n".join(textwrap.wrap(text, chars, break_long_words=False, break_on_hyphens=False)) or text


def fig_title(fig, text: str, fontsize: float = 10.0):
    """The figure's title, wrapped to its width (:func:`wrap_text`)."""
    return fig.suptitle(wrap_text(text, fig.get_figwidth() * 0.96, fontsize), fontsize=fontsize)


def ax_title(ax, text: str, fontsize: float = 9.0, **kwargs):
    """An axes' title, wrapped to the axes' width (:func:`wrap_text`)."""
    fig = ax.get_figure()
    width = fig.get_figwidth() * ax.get_position().width
    return ax.set_title(wrap_text(text, width, fontsize), fontsize=fontsize, **kwargs)


def set_label(metadata: dict) -> str:
    """Which result set a figure shows, with the suite and the device apart: ``suite h100_7b
    · measured on NVIDIA H200`` (a suite's name is no claim about the GPU it ran on); ``the
    CPU`` for a run without a GPU."""
    suite = str((metadata or {}).get("suite") or "?")
    return f"suite {suite} · measured on {(metadata or {}).get('gpu_name') or 'the CPU'}"


def legend_below(fig, handles, labels, *, ncol: int | None = None, title: str | None = None, fontsize=8):
    """One legend for the whole figure, below the axes (outside the data)."""
    n = len(labels)
    ncol = ncol or max(1, min(4, n))
    return fig.legend(handles, labels, loc="outside lower center", ncol=ncol, fontsize=fontsize, frameon=False,
                      title=title, title_fontsize=fontsize)


def log_log_axes(ax, *, xlabel: str, ylabel: str, x_base: float = 10, y_base: float = 10) -> None:
    """Log scales on both axes of ``ax`` with :func:`log_axis` ticks (call after the data are
    drawn), the axis labels and the usual grid."""
    ax.set_xscale("log", base=x_base)
    ax.set_yscale("log", base=y_base)
    log_axis(ax, "x", base=x_base)
    log_axis(ax, "y", base=y_base)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)


__all__ = ["AUTHORS_BACKENDS", "KernelStyle", "MARKERS", "NEUTRALS", "OURS_BACKENDS", "PALETTE", "family_key",
           "is_authors", "is_ours", "kernel_styles", "ours_key", "order_kernels", "legend_below", "log_axis", "log_log_axes", "place_labels", "set_label", "styles_for_rows", "tick_text",
           "wrap_text", "fig_title", "ax_title", "label_points", "LABEL_OFFSETS"]
