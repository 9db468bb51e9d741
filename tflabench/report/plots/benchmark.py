"""Benchmark figures drawn from a result set (matplotlib, imported lazily).

- :func:`plot_runtime`: median runtime over the swept axis, one panel per mode: sequence
  length (the paper's Figure 4: forward left, forward+backward right; fixed tokens, so batch
  falls as S grows), else head dimension (Figure 14), chunk size or batch, whichever the
  result set sweeps (:func:`runtime_axis`). Only ``ok`` rows are drawn: a missing point is a
  case that did not measure (the results table gives its status and reason).
- :func:`plot_memory_runtime`: peak memory against runtime over chunk size, one panel per
  mode (the paper's Figure 5), for every kernel measured at more than one chunk size at
  the same shape; points are labelled with L where a label finds room. Past
  :data:`MAX_SWEEP_SERIES` (kernel, shape) series per panel, each series is drawn relative
  to its own fastest and smallest point, one colour per chunk size (a set sweeping many
  shapes, such as the chunk-rule suites).

:func:`write_plots` draws whichever apply into ``<result dir>/plots/`` (used by ``run``
and ``report``).
"""

from __future__ import annotations

import json
from pathlib import Path

from tflabench.report.plots import SAVE_DPI, save_figure
from tflabench.store.schema import chunk_size_ran, row_params

GIB = 2**30
MODE_TITLES = {"fwd": "forward", "fwdbw": "forward + backward"}


def _figure(ncols: int):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0 * ncols, 4.6), dpi=SAVE_DPI, layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


#: x-axis candidates of :func:`plot_runtime`, in order of preference: (result column, the
#: kernel-params key that sweeps it or None, axis label)
RUNTIME_AXES = (
    ("seq_len", None, "sequence length S (tokens)"),
    ("d_hv", "d_hv", "head dimension d_hv"),
    ("chunk_size", "chunk_size", "chunk size L (tokens)"),
    ("batch", "batch", "batch size B"),
)


def _chunk_that_ran(frame):
    """A copy of ``frame`` whose ``chunk_size`` is the size each row ran
    (:func:`tflabench.store.results.chunk_size_ran`: ``chunk_size: auto`` resolved), the L the
    figures draw."""
    frame = frame.copy()
    frame["chunk_size"] = [chunk_size_ran(r) for r in frame.to_dict("records")]
    return frame


def runtime_axis(frame) -> tuple[str, str | None, str]:
    """(column, params key, label) of the runtime plot's x-axis: the first of
    :data:`RUNTIME_AXES` that takes more than one value in ``frame``; sequence length when
    none does."""
    for col, key, label in RUNTIME_AXES:
        if col in frame and frame[col].nunique(dropna=True) > 1:
            return col, key, label
    return RUNTIME_AXES[0]


def _series_labels(frame, exclude: tuple[str, ...] = ()) -> list[str]:
    """Label per row: the kernel, plus the parameters that vary within that kernel label
    (e.g. ``chunk_size=64``) except those in ``exclude`` (the plot's x-axis), plus ``B=``
    when one (kernel, S) has several batch sizes."""
    labels = []
    varying: dict[str, list[str]] = {}
    for kernel, group in frame.groupby("kernel", sort=False):
        dicts = [row_params(r) for r in group.to_dict("records")]
        keys = sorted({k for d in dicts for k in d} - set(exclude))
        varying[kernel] = [k for k in keys if len({json.dumps(d.get(k), sort_keys=True) for d in dicts}) > 1]
    multi_batch = frame.groupby(["kernel", "params", "mode", "seq_len"])["batch"].transform("nunique") > 1
    if "batch" in exclude:
        multi_batch = multi_batch & False
    for (_, row), mb in zip(frame.iterrows(), multi_batch):
        params = row_params(row)
        extra = [f"{k}={params.get(k)}" for k in varying.get(row["kernel"], [])]
        if mb:
            extra.append(f"B={int(row['batch'])}")
        labels.append(row["kernel"] + (f" ({', '.join(extra)})" if extra else ""))
    return labels


def _series_styles(frame) -> dict:
    """One :class:`tflabench.report.plots.style.KernelStyle` per series, the same in every panel:
    a colour and marker per kernel family; ours solid and filled, the authors' and other
    peers dashed and hollow (:mod:`tflabench.report.plots.style`)."""
    from tflabench.report.plots.style import kernel_styles

    return kernel_styles((r["series"], r.get("backend"), r.get("params")) for r in frame.to_dict("records"))


def plot_runtime(frame, path: str | Path, title: str | None = None) -> Path | None:
    """Median runtime (ms, log scale) over the swept axis (log2 scale; :func:`runtime_axis`:
    sequence length as in the paper's Fig. 4, else head dimension as in Fig. 14, chunk size
    or batch), one panel per mode, one line per kernel series, one legend below the panels.
    Returns the path, or None when no row is ``ok``.

    Args:
        frame: result rows (:attr:`tflabench.store.results.ResultSet.rows`).
    """
    from tflabench.report.plots.style import fig_title, legend_below, log_axis, order_kernels, ours_key

    ok = _chunk_that_ran(frame[(frame["status"] == "ok") & frame["ms_median"].notna()])
    if ok.empty:
        return None
    x_col, x_key, x_label = runtime_axis(ok)
    ok["series"] = _series_labels(ok, exclude=(x_key,) if x_key else ())
    styles = _series_styles(ok)
    modes = [m for m in ("fwd", "fwdbw") if (ok["mode"] == m).any()]
    fig, axes = _figure(len(modes))
    handles: dict = {}
    for ax, mode in zip(axes, modes):
        part = ok[ok["mode"] == mode]
        for series, group in part.groupby("series", sort=False):
            group = group.sort_values(x_col)
            (line,) = ax.plot(group[x_col], group["ms_median"], label=series, **styles[series].line())
            handles.setdefault(series, line)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        log_axis(ax, "x", base=2, values=part[x_col].unique())
        log_axis(ax, "y")
        ax.set_xlabel(x_label)
        ax.set_ylabel("runtime, median (ms)")
        ax.set_title(MODE_TITLES.get(mode, mode))
        ax.grid(True, which="both", alpha=0.3)
    order = order_kernels([s for s in styles if s in handles], styles)
    legend_below(fig, [handles[s] for s in order], order, ncol=3 if len(order) > 4 else len(order),
                 title=ours_key(zip(ok["series"], ok["backend"] if "backend" in ok else [None] * len(ok))))
    if title:
        fig_title(fig, title)
    return save_figure(fig, path)


def chunk_sweeps(frame):
    """Rows of kernels measured at more than one chunk size at the same shape, mode and
    dtype (with runtime and peak memory): the Figure-5 subset, ``chunk_size`` the size that
    ran; empty when none."""
    frame = _chunk_that_ran(frame)
    ok = frame[(frame["status"] == "ok") & frame["ms_median"].notna()
               & frame["peak_mem_bytes"].notna() & frame["chunk_size"].notna()]
    if ok.empty:
        return ok
    keys = ["kernel", "mode", "dtype", "batch", "seq_len", "heads", "d_qk", "d_hv"]
    n_chunks = ok.groupby(keys)["chunk_size"].transform("nunique")
    return ok[n_chunks > 1]


#: (kernel, shape) series per panel up to which :func:`plot_memory_runtime` draws one line
#: per series with its own legend entry (the paper's Figure 5 has five); past it, the
#: relative form (:func:`_plot_memory_runtime_relative`)
MAX_SWEEP_SERIES = 8


def plot_memory_runtime(frame, path: str | Path, title: str | None = None) -> Path | None:
    """Peak memory above the inputs (GiB) against median runtime (ms) over chunk size, one
    panel per mode, one line per kernel and shape, points labelled with L where the labels
    do not collide (paper Fig. 5), one legend below the panels. Past
    :data:`MAX_SWEEP_SERIES` series in a panel, the relative form instead
    (:func:`_plot_memory_runtime_relative`). Returns the path, or None when no kernel sweeps
    chunk sizes (or no memory was measured, as on the CPU)."""
    from tflabench.report.plots.style import fig_title, kernel_styles, label_points, legend_below

    sweep = chunk_sweeps(frame)
    if sweep.empty:
        return None
    sweep = sweep.copy()
    sweep["series"] = [f"{r['kernel']} (B={int(r['batch'])}, S={int(r['seq_len'])})"
                       for r in sweep.to_dict("records")]
    if sweep.groupby("mode")["series"].nunique().max() > MAX_SWEEP_SERIES:
        return _plot_memory_runtime_relative(sweep, path, title)
    styles = kernel_styles((r["series"], r.get("backend"), r.get("params")) for r in sweep.to_dict("records"))
    modes = [m for m in ("fwd", "fwdbw") if (sweep["mode"] == m).any()]
    fig, axes = _figure(len(modes))
    handles: dict = {}
    labels: dict = {}
    for ax, mode in zip(axes, modes):
        part = sweep[sweep["mode"] == mode]
        for series, group in part.groupby("series", sort=False):
            group = group.sort_values("chunk_size")
            (line,) = ax.plot(group["ms_median"], group["peak_mem_bytes"] / GIB, **styles[series].line())
            handles.setdefault(series, line)
            labels.setdefault(ax, []).extend(
                (float(r["ms_median"]), float(r["peak_mem_bytes"] / GIB), f"L={int(r['chunk_size'])}",
                 styles[series].color) for _, r in group.iterrows())
        ax.margins(x=0.08, y=0.1)  # room for the L labels of the outermost points
        ax.set_xlabel("runtime, median (ms)")
        ax.set_ylabel("peak memory above inputs (GiB)")
        ax.set_title(MODE_TITLES.get(mode, mode))
        ax.grid(True, alpha=0.3)
    legend_below(fig, list(handles.values()), list(handles), ncol=2)
    if title:
        fig_title(fig, title)
    for ax, items in labels.items():  # after the layout is whole: labels clear of each other and the markers
        label_points(ax, items, fontsize=7.5)
    return save_figure(fig, path)


def _plot_memory_runtime_relative(sweep, path: str | Path, title: str | None) -> Path:
    """:func:`plot_memory_runtime` for many (kernel, shape) series (``sweep``: its rows with a
    ``series`` column): each point is one chunk size of one series, its runtime divided by
    the series' fastest and its peak memory by the series' smallest, so that every shape
    shares one scale; one colour per chunk size L, ours filled and peers hollow, no line and
    no legend entry per series (the command's table gives every value)."""
    from matplotlib import colormaps

    from tflabench.report.plots.style import fig_title, is_ours, legend_below

    chunks = sorted({int(c) for c in sweep["chunk_size"]})
    cmap = colormaps["viridis"]
    colours = {L: cmap(j / max(1, len(chunks) - 1) * 0.9) for j, L in enumerate(chunks)}
    by_series = sweep.groupby(["mode", "series"])
    sweep = sweep.assign(rt_rel=sweep["ms_median"] / by_series["ms_median"].transform("min"),
                         mem_rel=sweep["peak_mem_bytes"] / by_series["peak_mem_bytes"].transform("min"))
    ours = sweep.apply(lambda r: is_ours(r["kernel"], r.get("backend")), axis=1)
    modes = [m for m in ("fwd", "fwdbw") if (sweep["mode"] == m).any()]
    fig, axes = _figure(len(modes))
    handles: dict = {}
    for ax, mode in zip(axes, modes):
        part = sweep[sweep["mode"] == mode]
        for L in chunks:
            for filled in (True, False):
                pts = part[(part["chunk_size"] == L) & (ours[part.index] == filled)]
                if pts.empty:
                    continue
                dots = ax.scatter(pts["rt_rel"], pts["mem_rel"], s=22, alpha=0.8, linewidths=1.0,
                                  facecolors=colours[L] if filled else "none", edgecolors=colours[L])
                handles.setdefault(f"L={L}", dots)
        ax.set_xlabel("runtime / the series' fastest (1 = best chunk size)")
        ax.set_ylabel("peak memory / the series' smallest")
        n = part["series"].nunique()
        ax.set_title(f"{MODE_TITLES.get(mode, mode)}: {n} kernel and shape series")
        ax.grid(True, alpha=0.3)
    legend_below(fig, list(handles.values()), list(handles), ncol=min(6, len(handles)),
                 title="one point per chunk size and series; filled: ours, hollow: peers")
    if title:
        fig_title(fig, title)
    return save_figure(fig, path)


def write_plots(directory: str | Path, out_dir: str | Path | None = None, *, model_gpu=None,
                F_causal: float = 0.66) -> list[Path]:
    """Draw every benchmark figure that applies to the result set at ``directory`` into
    ``out_dir`` (default ``<directory>/plots/``): ``runtime.png`` (Fig. 4) and, when a
    kernel sweeps chunk sizes, ``memory_vs_runtime.png`` (Fig. 5); on a catalogued GPU also
    ``roofline_measured.png`` and ``optimal_chunk.png``
    (:func:`tflabench.report.plots.model_measured.model_figures`; ``model_gpu``: its ceilings, default the
    set's GPU, measured where recorded; ``F_causal``: its chunk-sweep model). Returns the paths written.
    Raises UserError when ``directory`` is not a result set."""
    from tflabench.store.results import load_results

    from tflabench.text_safety import LABEL_WIDTH, terminal_text

    rs = load_results(directory)
    out = Path(out_dir) if out_dir is not None else rs.path / "plots"
    rs.rows["kernel"] = rs.rows["kernel"].map(lambda k: terminal_text(k, LABEL_WIDTH))  # a figure's labels: short, plain
    frame = rs.rows
    from tflabench.report.plots.style import set_label

    title = set_label(rs.metadata)
    written = []
    for fn, name in ((plot_runtime, "runtime.png"), (plot_memory_runtime, "memory_vs_runtime.png")):
        path = fn(frame, out / name, title=title)
        if path is not None:
            written.append(path)
    from tflabench.report.plots.model_measured import model_figures

    written += model_figures(rs, out, gpu=model_gpu, F_causal=F_causal)
    return written
