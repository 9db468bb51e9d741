"""The verify heat map: kernels x regimes, colour = log10 of the worst max-normalised error.

One cell per (kernel, dtype) row and regime column (:func:`tflabench.verify_summary.cell_summary`:
the deciding case over lengths, initial state and modes). Colour: log10 of that case's
max-normalised error (the tensor with the largest error / budget); the cell's text gives
the error and, for a failing cell, ``x`` and the tensor; non-finite values (NaN/inf where
the reference is finite) are drawn black with ``NaN``; cells with no case that ran (all
unavailable) are grey ``n/a``; crashes and errors are marked by their status.
"""

from __future__ import annotations

import math
from pathlib import Path

from tflabench.plots import save_figure
from tflabench.verify_summary import FAILING, cell_summary


def write_heatmap(frame, path: str | Path, title: str | None = None) -> Path:
    """Draw the heat map of verify rows ``frame`` (a result-set DataFrame) to ``path``
    (``.png``, ``.svg`` or ``.pdf``); returns the path. Raises ValueError when the frame
    holds no verify rows (``numerics_case`` all empty)."""
    import matplotlib
    import numpy as np
    from matplotlib.figure import Figure

    summary = cell_summary(frame)
    if summary.empty:
        raise ValueError("no verify rows (numerics_case empty) to draw")
    summary["row"] = summary["kernel"] + " [" + summary["dtype"] + "]"
    rows = list(dict.fromkeys(summary["row"]))
    cols = list(dict.fromkeys(summary["regime"]))
    values = np.full((len(rows), len(cols)), np.nan)
    fig = Figure(figsize=(1.3 * len(cols) + 4.5, 0.5 * len(rows) + 2.0), layout="constrained")
    ax = fig.subplots()
    texts = []
    for r in summary.to_dict("records"):
        y, x = rows.index(r["row"]), cols.index(r["regime"])
        err, nonfinite = r.get("numerics_err"), r.get("numerics_nonfinite") or 0
        if isinstance(nonfinite, float) and math.isnan(nonfinite):
            nonfinite = 0
        if r["cases"] == 0:
            texts.append((x, y, "n/a", "dimgray"))
        elif nonfinite:
            texts.append((x, y, f"NaN\n{r.get('numerics_worst') or ''}", "white"))
        elif r["status"] in FAILING and (err is None or (isinstance(err, float) and math.isnan(err))):
            texts.append((x, y, r["status"], "black"))
        elif err is not None and not (isinstance(err, float) and math.isnan(err)):
            values[y, x] = math.log10(max(err, 1e-16))
            mark = f"x {r.get('numerics_worst')}\n" if r["status"] in FAILING else ""
            texts.append((x, y, f"{mark}{err:.0e}", "white" if values[y, x] > -2.5 else "black"))
    cmap = matplotlib.colormaps["viridis_r"].with_extremes(bad="lightgray")
    finite = values[np.isfinite(values)]
    vmin = float(min(finite.min(), -7)) if finite.size else -7.0
    vmax = float(max(finite.max(), 0)) if finite.size else 0.0
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    for r in summary.to_dict("records"):  # non-finite cells: black
        nonfinite = r.get("numerics_nonfinite") or 0
        if nonfinite and not (isinstance(nonfinite, float) and math.isnan(nonfinite)):
            y, x = rows.index(r["row"]), cols.index(r["regime"])
            ax.add_patch(matplotlib.patches.Rectangle((x - 0.5, y - 0.5), 1, 1, color="black"))
        if r["status"] in FAILING:
            y, x = rows.index(r["row"]), cols.index(r["regime"])
            ax.add_patch(matplotlib.patches.Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False,
                                                      edgecolor="red", linewidth=2.5))
    for x, y, text, color in texts:
        ax.text(x, y, text, ha="center", va="center", fontsize=7, color=color)
    ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right")
    ax.set_yticks(range(len(rows)), rows)
    fig.colorbar(image, ax=ax, label="log10 max-normalised error (deciding tensor)")
    ax.set_title(title or "verify: worst error per kernel and regime (red frame: fails its budget)",
                 fontsize=10)
    return save_figure(fig, path)


__all__ = ["write_heatmap"]
