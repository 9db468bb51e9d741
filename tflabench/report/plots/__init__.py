"""Plots (matplotlib, imported lazily): analytic figures (analytic.py) and benchmark figures.

Shared helpers: :func:`save_figure` (directories, format by extension, returns the path) and
:func:`new_figure` (a figure on the Agg canvas, without pyplot).
"""

from __future__ import annotations

from pathlib import Path

#: Where the analytic commands write their figures unless ``--out`` names another directory
#: (relative to the working directory; the commands print each file's absolute path).
DEFAULT_PLOT_DIR = Path("results") / "plots"

_FORMATS = {".png", ".svg", ".pdf"}


def lean_matplotlib() -> None:
    """Import matplotlib (first call only) without two costs no figure here needs, which are
    a quarter of its import time (issue 44: the analytic commands answer in about a second):

    - the ``set()`` docstrings every Artist subclass builds from its setters' docstrings
      when it is defined (``matplotlib.artist.kwdoc``, ~8,000 ``inspect.cleandoc`` calls):
      replaced by a one-line pointer to the setters before any subclass is defined;
    - the 3D toolkit ``matplotlib.projections`` registers (``mpl_toolkits.mplot3d``,
      dozens of Artist classes): not imported, its warning silenced; no figure is 3D.

    Drawing is untouched: the figures are the same bytes. A process that imported
    matplotlib before keeps it as it is."""
    import sys

    if "matplotlib" in sys.modules:
        return
    import warnings

    sys.modules.setdefault("mpl_toolkits.mplot3d", None)  # None in sys.modules: ImportError, caught by matplotlib
    import matplotlib.artist

    matplotlib.artist.kwdoc = lambda artist: "Properties: see the set_* methods."
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Unable to import Axes3D")
        import matplotlib.projections  # noqa: F401  (registers the 2D projections, now)
    if sys.modules.get("mpl_toolkits.mplot3d", 0) is None:
        del sys.modules["mpl_toolkits.mplot3d"]  # a later explicit import of it still works


def new_figure(figsize=(7.0, 4.8), *, layout: str | None = "constrained", ncols: int = 1):
    """A new (figure, axes) pair on the Agg canvas (no display needed; pyplot is not imported,
    so a figure costs no GUI backend and no global state); matplotlib imported by
    :func:`lean_matplotlib`. Where ``ncols`` > 1, a tuple of that many axes in a row.

    Args:
        figsize: (width, height) in inches. ncols: axes side by side.
        layout: ``"constrained"`` (matplotlib's constrained layout, worked out on every
            draw) or None: no layout engine; the figure then lays itself out once with
            :func:`fit_margins` before it is saved, and the save draws it once.
    """
    lean_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=SAVE_DPI, layout=layout)
    FigureCanvasAgg(fig)
    return fig, (fig.subplots() if ncols == 1 else tuple(fig.subplots(1, ncols)))


def fit_margins(fig, *, pad_in: float = 0.1, gap_in: float = 0.12) -> None:
    """Lay out a figure without a layout engine whose axes form one row of subplots, once,
    from the extents of what it holds (no draw): each axes' overhang (tick labels, axis
    labels, title, annotations and legends outside it: :func:`_text_hull`) sets
    the margins and the space between the axes, and figure legends at the bottom
    (:func:`~tflabench.report.plots.style.legend_below`) are kept below the axes.

    Call it when every text is in place; labels spread along an axis's length
    (:func:`~tflabench.report.plots.style.place_labels`) are worth placing again after it
    (the axes' size changes).

    Args:
        fig: a figure made by :func:`new_figure` with ``layout=None``.
        pad_in: inches kept free at the canvas's edges. gap_in: inches between the axes'
            texts and a figure legend below them.
    """
    import matplotlib
    from matplotlib.text import Text

    for text in fig.findobj(Text):  # measured as save_figure draws them: never mathtext
        text.set_parse_math(False)
    with matplotlib.rc_context({"text.parse_math": False}):  # and the tick labels made while measuring
        _fit_margins(fig, pad_in, gap_in)


def _fit_margins(fig, pad_in: float, gap_in: float) -> None:
    renderer = fig.canvas.get_renderer()
    axes = sorted((ax for ax in fig.axes if ax.get_subplotspec() is not None), key=lambda a: a.get_position().x0)
    if not axes:
        return
    width, height = fig.canvas.get_width_height()
    pad, gap = pad_in * fig.dpi, gap_in * fig.dpi
    hangs = []  # (left, right, bottom, top) overhang of each axes' texts past its frame, pixels
    for ax in axes:
        frame, tight = ax.get_window_extent(renderer), _text_hull(ax, renderer)
        hangs.append((max(0.0, frame.x0 - tight.x0), max(0.0, tight.x1 - frame.x1),
                      max(0.0, frame.y0 - tight.y0), max(0.0, tight.y1 - frame.y1)))
    below = max((lg.get_window_extent(renderer).y1 for lg in fig.legends), default=0.0)
    left = (hangs[0][0] + pad) / width
    right = 1.0 - (hangs[-1][1] + pad) / width
    bottom = (max(h[2] for h in hangs) + (below + gap if below else pad)) / height
    top = 1.0 - (max(h[3] for h in hangs) + pad) / height
    space = max((a[1] + b[0] + gap for a, b in zip(hangs, hangs[1:])), default=0.0)
    each = ((right - left) * width - space * (len(axes) - 1)) / len(axes)  # one axes' width, pixels
    fig.subplots_adjust(left=left, right=right, bottom=bottom, top=top, wspace=space / max(each, 1.0))


def _text_hull(ax, renderer):
    """The box around ``ax`` and what it shows outside its frame: both axes' ticks, tick
    labels and labels, the titles, the texts and annotations (their text: a leader runs
    between the frame and its text) and the legend. What ``ax.get_tightbbox`` measures, at
    a fraction of its cost (it updates every axis's ticks again for each spine)."""
    from matplotlib.text import Annotation, Text
    from matplotlib.transforms import Bbox

    boxes = [ax.get_window_extent(renderer)]
    boxes += [axis.get_tightbbox(renderer) for axis in (ax.xaxis, ax.yaxis) if axis.get_visible()]
    texts = [ax.title, ax._left_title, ax._right_title, *ax.texts]
    for t in texts:
        if t.get_visible() and t.get_text():
            if isinstance(t, Annotation):
                t.update_positions(renderer)  # where its text goes (the arrow's path is left to the draw)
            boxes.append(Text.get_window_extent(t, renderer))
    if ax.get_legend() is not None:
        boxes.append(ax.get_legend().get_window_extent(renderer))
    return Bbox.union([b for b in boxes if b is not None and b.width > 0 and b.height > 0])


#: The resolution figures are laid out and written at (dots per inch). Text extents do not
#: scale exactly with the resolution (glyph hinting), so a layout worked out at another
#: resolution than the file's can leave a label cut at the edge.
SAVE_DPI = 150


#: zlib level of the PNG files: 3 writes in half the time of Pillow's default 6, for files
#: about a tenth larger (the same pixels).
PNG_COMPRESS_LEVEL = 3


def save_figure(fig, path: str | Path, *, dpi: int = SAVE_DPI) -> Path:
    """Write ``fig`` to ``path`` (parent directories created) and return the path.

    The format follows the extension: ``.png`` (default when there is none), ``.svg`` or ``.pdf``.
    Every text is drawn as written: matplotlib's mathtext is off, so a kernel label such as
    ``$a^$`` neither fails nor turns into a formula (no figure of tflabench uses mathtext).

    Raises:
        tflabench.errors.UserError: another extension, or the file cannot be written.
    """
    from tflabench.errors import UserError

    path = Path(path)
    if path.suffix == "":
        path = path.with_suffix(".png")
    if path.suffix.lower() not in _FORMATS:
        raise UserError(
            f"--out={str(path)!r} has an unsupported extension; allowed: {', '.join(sorted(_FORMATS))}"
        )
    import matplotlib
    from matplotlib.text import Text

    for text in fig.findobj(Text):  # labels, reasons, suite names are data: never mathtext
        text.set_parse_math(False)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with matplotlib.rc_context({"text.parse_math": False}):  # and texts made while drawing
            fmt = path.suffix.lower().lstrip(".")
            fig.savefig(path, dpi=dpi, format=fmt, **({"pil_kwargs": {"compress_level": PNG_COMPRESS_LEVEL}}
                                                      if fmt == "png" else {}))
    except OSError as exc:
        raise UserError(f"cannot write plot {str(path)!r}: {exc.strerror or exc}") from None
    return path  # no pyplot registry holds the figure: it is freed with its last reference
