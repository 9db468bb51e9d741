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


def new_figure(figsize=(7.0, 4.8)):
    """A new (figure, axes) pair with constrained layout on the Agg canvas (no display
    needed; pyplot is not imported, so a figure costs no GUI backend and no global state);
    matplotlib imported by :func:`lean_matplotlib`."""
    lean_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=SAVE_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


#: The resolution figures are laid out and written at (dots per inch). Text extents do not
#: scale exactly with the resolution (glyph hinting), so a layout worked out at another
#: resolution than the file's can leave a label cut at the edge.
SAVE_DPI = 150


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
            fig.savefig(path, dpi=dpi, format=path.suffix.lower().lstrip("."))
    except OSError as exc:
        raise UserError(f"cannot write plot {str(path)!r}: {exc.strerror or exc}") from None
    return path  # no pyplot registry holds the figure: it is freed with its last reference
