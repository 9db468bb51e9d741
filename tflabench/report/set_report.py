"""What ``tflabench report`` shows of one result set, worked out here and printed by the command:
the heading, the model comparison (the ceilings, each row's distance to its roofline bound,
the chunk-size sweeps), the rows whose time is split by model part, the figures and the
HTML page."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tflabench.errors import UserError
from tflabench.text_safety import terminal_text


def set_heading(meta: dict) -> str:
    """The line a report opens with: suite, GPU (or CPU), torch and triton versions, date and
    git revision, made safe for the terminal."""
    return terminal_text(
        f"suite {meta.get('suite')} on {meta.get('gpu_name') or 'CPU'} ("
        + ", ".join(f"{k} {meta[k]}" for k in ("torch", "triton") if meta.get(k))
        + f"; {meta.get('date') or 'date not recorded'}, git {meta.get('git_revision') or 'not recorded'})")


def is_verify_set(rows) -> bool:
    """Whether the rows are a ``tflabench verify`` result set (they name a numerics case)."""
    return bool(rows["numerics_case"].notna().any())


@dataclass
class ModelComparison:
    """A set against the model: ``gpu`` the ceilings it uses (None where there are none),
    ``distance`` each kernel and mode's distance to its roofline bound, ``sweeps`` the
    chunk-size sweeps, ``note`` why there is no comparison (None where there is one)."""

    gpu: Any = None
    distance: list = field(default_factory=list)
    sweeps: list = field(default_factory=list)
    note: str | None = None

    @property
    def notes(self) -> list[str]:
        """The note as the report's list of notes."""
        return [self.note] if self.note else []

    def ceilings_text(self) -> str | None:
        """The line naming the ceilings used, or None without them."""
        from tflabench.analysis.model_vs_measured import model_ceilings_text

        return model_ceilings_text(self.gpu) if self.gpu else None


def model_comparison(rows, meta: dict, *, ceilings: str, gpu: str | None, F_causal: float) -> ModelComparison:
    """The rows against the model at the ceilings ``ceilings`` of ``gpu`` (or the set's GPU).
    Where the set's GPU has no ceilings of that kind the comparison is left out with a note;
    with ``gpu`` given or ``ceilings`` ``measured`` that is the UserError."""
    from tflabench.analysis import model_vs_measured as mm

    try:
        model_gpu = mm.ceilings_for(meta, ceilings, gpu)
    except UserError as exc:
        if gpu is not None or ceilings == "measured":
            raise
        return ModelComparison(note=terminal_text(f"no model comparison: {exc}", 2000))
    placement = mm.roofline_placement(rows, peak_flops_per_s=model_gpu.flops_per_s, beta=model_gpu.bytes_per_s)
    sweeps = mm.chunk_sweeps(rows, peak_flops_per_s=model_gpu.flops_per_s, beta=model_gpu.bytes_per_s,
                             ceilings=model_gpu.ceilings, F_causal=F_causal)
    return ModelComparison(gpu=model_gpu, distance=mm.distance_to_bound(placement), sweeps=sweeps)


def profile_rows(rows, model_gpu, all_rows: bool):
    """The rows whose time a report splits by model part: the first
    :data:`~tflabench.report.tables.SHOWN_ROWS` (every row with ``all_rows``); None where no
    row was profiled and there is no model to split by."""
    from tflabench.report.tables import SHOWN_ROWS

    profiled = "kernel_profile" in rows.columns and bool(rows["kernel_profile"].notna().any())
    if not profiled and model_gpu is None:
        return None
    return rows if all_rows or len(rows) <= SHOWN_ROWS else rows.iloc[:SHOWN_ROWS]


def draw_figures(rs, directory: Path, *, verify_set: bool, model_gpu=None, F_causal: float = 0.66) -> list[Path]:
    """Draw the set's figures into ``directory``: a verify set's heat map, else the
    benchmark figures (:func:`tflabench.report.plots.benchmark.write_plots`)."""
    if verify_set:
        from tflabench.report.plots.numerics import heatmap_title, write_heatmap
        from tflabench.text_safety import LABEL_WIDTH

        shown = rs.rows.assign(kernel=rs.rows["kernel"].map(lambda k: terminal_text(k, LABEL_WIDTH)))
        return [write_heatmap(shown, directory / "verify_heatmap.png", title=heatmap_title(rs.metadata))]
    from tflabench.report.plots.benchmark import write_plots

    return write_plots(rs.path, directory, model_gpu=model_gpu, F_causal=F_causal)


def install_drawn(draw: Callable[[Path], list], target: Path) -> list[Path]:
    """Call ``draw`` on a temporary directory, then rename each file it wrote into the same
    place under ``target``: a figure is never written through a link."""
    from tflabench.store.files import install_file

    with tempfile.TemporaryDirectory(prefix="tflabench-plots-") as scratch:
        return [install_file(p, target / Path(p).relative_to(scratch)) for p in draw(Path(scratch))]


def html_page(rs, *, figures: list[Path] | None, comparison: ModelComparison, warnings: list[str],
              all_rows: bool, verify_set: bool, F_causal: float) -> str:
    """The set's self-contained HTML report. ``figures``: those written already; None: drawn
    in a temporary directory that does not stay."""
    from tflabench.report.html import HTML_ROWS, html_report

    with tempfile.TemporaryDirectory(prefix="tflabench-report-") as scratch:
        if figures is None:
            figures = draw_figures(rs, Path(scratch), verify_set=verify_set, model_gpu=comparison.gpu,
                                   F_causal=F_causal)
        return html_report(rs, figures=figures, distance=comparison.distance, sweeps=comparison.sweeps,
                           notes=comparison.notes, warnings=warnings, max_rows=None if all_rows else HTML_ROWS,
                           ceilings_text=comparison.ceilings_text())
