"""Trend figures of ``tflabench history`` (matplotlib, imported lazily): one figure per
kernel family (:func:`tflabench.report.plots.style.family_key`), each case's median time per
commit, the levels of its segments and a mark at each step (docs/ci.md, "History")."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tflabench.report.plots import new_figure, save_figure


def _file_name(family: str) -> str:
    return "history-" + (re.sub(r"[^A-Za-z0-9_.-]+", "_", family).strip("_") or "cases") + ".png"


def families(history: Any) -> dict[str, list]:
    """The cases of a :class:`tflabench.compare.history.History` grouped by family, in first-seen order."""
    from tflabench.report.plots.style import family_key

    out: dict[str, list] = {}
    for case in history.cases:
        out.setdefault(family_key(case.kernel, case.backend, case.params), []).append(case)
    return out


def plot_trends(history: Any, out_dir: str | Path, max_cases: int = 12) -> list[Path]:
    """Write ``history-<family>.png`` into ``out_dir`` per family: x the commits in order
    (index and short revision), y the median time (ms, log scale); per case its medians
    (markers), the level of each segment between steps (a line) and a dashed mark before the
    first commit after each step, labelled with the step's size. At most ``max_cases`` cases
    per figure: those with steps first (``history.cases`` order), the rest counted in the title.

    Returns the paths written. Raises UserError where a file cannot be written."""
    import numpy as np

    from tflabench.report.plots.style import MARKERS, PALETTE, legend_below, log_axis

    labels = [f"#{i + 1}\n{c.short}" for i, c in enumerate(history.commits)]
    written = []
    for family, cases in families(history).items():
        fig, ax = new_figure(figsize=(max(6.0, 0.55 * len(labels) + 2.5), 4.8))
        shown = cases[:max_cases]
        handles, names = [], []
        for n, case in enumerate(shown):
            colour, marker = PALETTE[n % len(PALETTE)], MARKERS[n % len(MARKERS)]
            xs = [i for i, m in enumerate(case.medians_ms) if m is not None]
            ys = [case.medians_ms[i] for i in xs]
            (handle,) = ax.plot(xs, ys, linestyle="none", marker=marker, color=colour, markersize=5)
            handles.append(handle)
            names.append(case.label + (" (regression)" if case.regression else ""))
            bounds = [xs[0]] + [s.index for s in case.steps] + [xs[-1] + 1]
            for a, b in zip(bounds[:-1], bounds[1:]):
                seg = [m for i, m in zip(xs, ys) if a <= i < b]
                if seg:
                    ax.hlines(float(np.median(seg)), a - 0.3, b - 0.7, color=colour, linewidth=1.6)
            for step in case.steps:
                ax.axvline(step.index - 0.5, color=colour, linestyle="--", linewidth=0.9, alpha=0.7)
                ax.annotate(f"{step.size * 100:+.0f} %", (step.index - 0.5, step.after_ms), color=colour,
                            fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xticks(range(len(labels)), labels, fontsize=7)
        ax.set_xlim(-0.6, len(labels) - 0.4)
        ax.set_yscale("log")
        log_axis(ax, "y")
        ax.grid(True, which="major", axis="y", alpha=0.3)
        ax.set_ylabel("median time per call (ms)")
        ax.set_xlabel("commit (oldest first)")
        more = f", {len(cases) - len(shown)} more case(s) not drawn" if len(cases) > len(shown) else ""
        ax.set_title(f"{history.suite}: {family} over {len(labels)} commits{more}", fontsize=9)
        legend_below(fig, handles, names, ncol=1, fontsize=7)
        written.append(save_figure(fig, Path(out_dir) / _file_name(family)))
    return written
