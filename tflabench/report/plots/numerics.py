"""The verify heat map: kernels x regimes, each cell's colour its worst error as a share of
its numerics budget.

One cell per (kernel, dtype) row and regime column (:func:`tflabench.analysis.verify_summary.cell_summary`:
the deciding case over lengths, initial state and modes). The colour is the deciding
case's error / budget (the max-normalised error of its worst tensor over that tensor's
budget, docs/numerics.md) in steps a key below the map names: blues within the budget
(lighter: further inside), vermillion past it (also marked ``x`` with the tensor). A
cell's text gives the error and its share of the budget. Non-finite outputs (NaN/inf
where the reference is finite) are black ``NaN``; cells where no case ran (the regime
does not apply to that kernel, e.g. gate regimes for attention, or the kernel is
unavailable) are hatched grey ``n/a``; crashes and errors are marked by their status.
"""

from __future__ import annotations

import math
from pathlib import Path

from tflabench.report.plots import SAVE_DPI, save_figure

#: Steps of error / budget and their colours: within the budget blues (colour-blind safe,
#: light = far inside), past it vermillion.
BUDGET_STEPS = (0.0, 1e-3, 1e-2, 0.1, 0.5, 1.0, math.inf)
BUDGET_COLOURS = ("#eff3ff", "#bdd7e7", "#6baed6", "#3182bd", "#08519c", "#D55E00")
BUDGET_LABELS = ("< 0.1 %", "0.1-1 %", "1-10 %", "10-50 %", "50-100 %", "> 100 %: fails")
NA_COLOUR = "#d9d9d9"


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _share(share: float) -> str:
    """``20% of budget``, ``0.3% of budget``; past ten budgets ``27x budget``, ``5e+05x budget``."""
    if share >= 10:
        return f"{share:.0f}x budget" if share < 1e4 else f"{share:.0e}x budget"
    if share >= 0.1:
        return f"{share:.0%} of budget"
    return f"{share * 100:.2g}% of budget"


def heatmap_title(metadata) -> str:
    """The heat map's title from a verify set's metadata: which suite, on which device, and
    what the colours mean."""
    suite = str(metadata.get("suite") or "?").removesuffix("-verify")
    where = metadata.get("gpu_name") or ("the CPU" if metadata.get("device") in (None, "cpu") else metadata.get("device"))
    return f"Numerics of suite {suite} · measured on {where}: worst error per kernel and regime, as a share of its budget"


def write_heatmap(frame, path: str | Path, title: str | None = None) -> Path:
    """Draw the heat map of verify rows ``frame`` (a result-set DataFrame) to ``path``
    (``.png``, ``.svg`` or ``.pdf``); returns the path.

    Args:
        frame: verify rows (``numerics_case`` set), with ``numerics_err`` and
            ``numerics_budget``.
        path: output file.
        title: figure title (default: what the map shows).

    Raises:
        ValueError: the frame holds no verify rows (``numerics_case`` all empty).
    """
    import numpy as np
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle

    from tflabench.analysis.verify_summary import FAILING, cell_summary

    summary = cell_summary(frame)
    if summary.empty:
        raise ValueError("no verify rows (numerics_case empty) to draw")
    summary["row"] = summary["kernel"] + " [" + summary["dtype"] + "]"
    rows = list(dict.fromkeys(summary["row"]))
    cols = list(dict.fromkeys(summary["regime"]))
    share = np.full((len(rows), len(cols)), np.nan)
    fig = Figure(figsize=(1.25 * len(cols) + 5.0, 0.55 * len(rows) + 2.6), dpi=SAVE_DPI, layout="constrained")
    ax = fig.subplots()
    texts, specials = [], []
    for r in summary.to_dict("records"):
        y, x = rows.index(r["row"]), cols.index(r["regime"])
        err, budget = r.get("numerics_err"), r.get("numerics_budget")
        nonfinite = r.get("numerics_nonfinite") or 0
        nonfinite = 0 if _missing(nonfinite) else nonfinite
        if r["cases"] == 0:
            specials.append((x, y, "na"))
            texts.append((x, y, "n/a", "black"))
        elif nonfinite:
            specials.append((x, y, "nan"))
            texts.append((x, y, f"NaN\n{r.get('numerics_worst') or ''}", "white"))
        elif _missing(err):
            specials.append((x, y, "na"))
            texts.append((x, y, str(r["status"]), "black"))
        else:
            fails = r["status"] in FAILING
            if not _missing(budget) and budget > 0:
                share[y, x] = err / budget
                detail = f"{err:.0e}\n{_share(err / budget)}"
            else:
                detail = f"{err:.0e}\n(no budget)"
            mark = f"x {r.get('numerics_worst')}\n" if fails else ""
            dark = not _missing(share[y, x]) and share[y, x] > 0.1
            texts.append((x, y, mark + detail, "white" if dark else "black"))
    seen = {(rows.index(r), cols.index(c)) for r, c in zip(summary["row"], summary["regime"])}
    for y in range(len(rows)):
        for x in range(len(cols)):
            if (y, x) not in seen:  # no row at all: the regime does not apply to this kernel
                specials.append((x, y, "na"))
                texts.append((x, y, "n/a", "black"))
    cmap = ListedColormap(BUDGET_COLOURS).with_extremes(bad=NA_COLOUR)
    finite_steps = list(BUDGET_STEPS[:-1]) + [1e6]
    norm = BoundaryNorm(finite_steps, cmap.N)
    ax.imshow(np.ma.masked_invalid(np.clip(share, 0, 1e5)), cmap=cmap, norm=norm, aspect="auto")
    for x, y, kind in specials:
        if kind == "nan":
            ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, color="black"))
        else:
            ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=NA_COLOUR, edgecolor="white", hatch="//",
                                   linewidth=0))
    for r in summary.to_dict("records"):
        if r["status"] in FAILING:
            y, x = rows.index(r["row"]), cols.index(r["regime"])
            ax.add_patch(Rectangle((x - 0.47, y - 0.47), 0.94, 0.94, fill=False, edgecolor="black", linewidth=2.0))
    for x, y, text, color in texts:
        ax.text(x, y, text, ha="center", va="center", fontsize=6.5, color=color)
    ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right")
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel("regime (gate pre-activations and inputs; docs/numerics.md)")
    handles = [Patch(facecolor=c, edgecolor="0.6", label=f"{lab} of budget" if i < len(BUDGET_LABELS) - 1 else lab)
               for i, (c, lab) in enumerate(zip(BUDGET_COLOURS, BUDGET_LABELS))]
    handles.append(Patch(facecolor="black", label="NaN / inf where the reference is finite"))
    handles.append(Patch(facecolor=NA_COLOUR, hatch="//", edgecolor="white",
                         label="n/a: no case ran (the regime does not apply to the kernel, or it is unavailable)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=7, frameon=False,
               title="worst error / its budget (the case that decides the cell: the worst over lengths, "
                     "initial state and modes; framed: fails)", title_fontsize=7.5)
    from tflabench.report.plots.style import fig_title

    fig_title(fig, title or "Numerics: worst error per kernel and regime, as a share of its budget", fontsize=10)
    return save_figure(fig, path)


__all__ = ["BUDGET_STEPS", "heatmap_title", "write_heatmap"]
