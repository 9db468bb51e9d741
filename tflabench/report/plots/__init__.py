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


def new_figure(figsize=(7.0, 4.8)):
    """A new (figure, axes) pair with constrained layout on the Agg canvas (no display
    needed; pyplot is not imported, so a figure costs no GUI backend and no global state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def save_figure(fig, path: str | Path, *, dpi: int = 150) -> Path:
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
