"""Commands of the analytic model: flops, roofline, intensity, optimal-chunk, gpus.

Thin: parse, check the options (:mod:`tflabench.analysis.analytic_inputs`), compute the rows
(:mod:`tflabench.analysis.analytic_rows`), render (rich tables or ``--json``), plot
(:mod:`tflabench.report.plots.analytic`, imported only when a plot is drawn).
No torch, pandas or matplotlib import on the paths that print numbers only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import List, Optional

import typer

from tflabench.analysis import analytic_inputs as inputs
from tflabench.analysis.analytic_rows import (count_row_kernel, intensity_curves, measured_points, mlstm_points,
                                     optimal_chunk_rows, peer_points, roofline_rows)
from tflabench.cli import app, ceilings_option, comma_list, interruptible, plots_option, user_errors
from tflabench.console import literal as lit
from tflabench.errors import UserError
from tflabench.model import mlstm_counts, mlstm_fwdbw_counts

# ------------------------------------------------------------------ shared option vocabulary

_H_VARIANT = "mLSTM variant: sig (sigmoid input gate) or exp (exponential input gate)."
_H_FORM = "Formulation: chunkwise (TFLA), parallel or recurrent."
_H_T = "Sequence length S (tokens; the paper's T)."
_H_B = "Batch size B."
_H_NH = "Number of heads NH."
_H_DHV = "Value/hidden head dimension d_hv."
_H_DQK = "Query/key head dimension d_qk (give --dqk or --pqk, not both)."
_H_PQK = "p_qk = d_qk / d_hv (default 0.5, the paper's)."
_H_STATE = "Bytes per state element C, n, m (bytes_Cmn): 4 (fp32) or 2 (bf16)."
_H_QKV = "Bytes per q, k, v, h element (bytes_qkv)."
_H_IF = "Bytes per gate pre-activation element (bytes_if)."
_H_CAUSAL = "F_causal: fraction of each L x L matrix computed, in [0.5, 1] (0.66: the paper's figures)."
_H_COUNTS = "rows: totals are the sums of the table rows (default); paper: printed Table 17 / eqs. 111-121."
_H_GPU = "GPU keys or names, comma-separated (e.g. h100,h200); see `tflabench gpus`."
_H_JSON = "Print machine-readable JSON instead of tables."
_H_HW = "YAML file adding or overriding GPUs (else $TFLABENCH_HARDWARE or ~/.config/tflabench/gpus.yaml)."
_H_OUT = ("Directory the figures are written into (created; default results/plots under the current "
          "directory); the command prints each file's path.")
_H_FIGFORMAT = "File format of the figures: png, svg or pdf."
_H_MODE = ("fwd (forward, the paper's model), fwdbw (forward + derived backward, docs/model.md), or both "
           "comma-separated.")
_H_LIST = " One value or several, comma-separated."

#: The analytic commands' shared options, one home each: name -> (default, flags, help).
#: :func:`_opt` makes the typer option; a command may give its own default or add words.
_OPTIONS: dict[str, tuple] = {
    "variant": ("sig", ("--variant",), _H_VARIANT),
    "seq_len": (8192, ("--seq-len", "-T"), _H_T),
    "batch": (8, ("--batch",), _H_B),
    "heads": (8, ("--heads",), _H_NH),
    "dhv": ("512", ("--dhv",), _H_DHV + _H_LIST),
    "dqk": (None, ("--dqk",), _H_DQK),
    "pqk": (None, ("--pqk",), _H_PQK),
    "state_bytes": ("4", ("--state-bytes",), _H_STATE + _H_LIST),
    "qkv_bytes": (2, ("--qkv-bytes",), _H_QKV),
    "causal_factor": ("0.66", ("--causal-factor",), _H_CAUSAL + _H_LIST),
    "counts": ("rows", ("--counts",), _H_COUNTS),
    "out": (None, ("--out",), _H_OUT),
    "figure_format": ("png", ("--figure-format",), _H_FIGFORMAT),
    "hardware": (None, ("--hardware",), _H_HW),
    "as_json": (False, ("--json",), _H_JSON),
}
_SAME = object()


def _opt(name: str, default=_SAME, extra: str = ""):
    """The typer option ``name`` of :data:`_OPTIONS` (its default unless ``default`` is
    given; ``extra`` appended to its help). Raises KeyError for an unknown name."""
    value, flags, text = _OPTIONS[name]
    return typer.Option(value if default is _SAME else default, *flags, help=text + extra)

DEFAULT_ROOFLINE_L = "64,128,256,512,1024,2048,4096"
DEFAULT_INTENSITY_L = "16,32,64,128,256,512,1024,2048,4096"


def _modes(text: str) -> list[str]:
    return comma_list("--mode", text, allowed=("fwd", "fwdbw"))


def _grid(**lists) -> list[dict]:
    """Every combination of the list options' values (in the options' order)."""
    import itertools

    keys = list(lists)
    return [dict(zip(keys, values)) for values in itertools.product(*(lists[k] for k in keys))]


def _state_name(bytes_Cmn: float) -> str:
    return {4: "fp32", 2: "bf16"}.get(bytes_Cmn, f"{bytes_Cmn:g} B")


def _varying_label(cfg: dict, varying: set[str]) -> str:
    """The parts of a configuration that differ between the combinations shown."""
    names = {"d_hv": lambda v: f"d_hv={v}", "bytes_Cmn": lambda v: f"states {_state_name(v)}",
             "F_causal": lambda v: f"F_c={v:g}", "mode": str, "L": lambda v: f"L={v}"}
    return " ".join(names[k](cfg[k]) for k in names if k in varying and k in cfg)


def _plot_dir(out: Path | None, figure_format: str) -> tuple[Path, str]:
    """Where figures go (``--out``, default results/plots) and their suffix."""
    from tflabench.report.plots import DEFAULT_PLOT_DIR

    fmt = inputs.one_of("--figure-format", figure_format, ("png", "svg", "pdf"))
    directory = Path(out) if out is not None else DEFAULT_PLOT_DIR
    if directory.exists() and not directory.is_dir():
        raise UserError(f"--out={str(directory)!r} is a file; give the directory the figures go into")
    return directory, fmt


def _shown(path) -> str:
    """A written file's path as the user can open it (absolute)."""
    return str(Path(path).resolve())


def _echo_json(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, default=_json_default))


def _json_default(o):
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, float) and not math.isfinite(o):
        return None
    raise TypeError(type(o).__name__)


def _console():
    from tflabench.console import make_console

    return make_console()


def _table(title):
    from rich import box
    from rich.table import Table

    from tflabench.console import literal

    return Table(title=literal(title), box=box.SIMPLE_HEAD, pad_edge=False)  # GPU names are user text


def _e(x) -> str:
    if x is None:
        return "-"
    return f"{x:.4g}" if abs(x) < 1e5 else f"{x:.4e}"


def _variant_counts(variant: str, counts: str) -> tuple[str, str]:
    """``--variant`` (sig, exp) and ``--counts`` (rows, paper), checked in that order and lower-cased."""
    return (inputs.one_of("--variant", variant, ("sig", "exp")),
            inputs.one_of("--counts", counts, ("rows", "paper")))


def _positive(**values) -> None:
    """UserError unless each value is positive, checked in the order given and named by its
    option (``seq_len`` -> ``--seq-len``)."""
    for name, value in values.items():
        inputs.positive("--" + name.replace("_", "-"), value)


def _chunk_sizes(Ls: list, is_default: bool, seq_len: int, *, at_most_S: bool = False) -> list:
    """The chunk sizes to model: the default list cut to those up to S (else [S]), each checked
    positive (and, with ``at_most_S``, at most S) in turn."""
    if is_default:  # defaults longer than the sequence: drop, not an error
        Ls = [L for L in Ls if L <= seq_len] or [seq_len]
    for L in Ls:
        inputs.positive("--chunk-size", L)
        if at_most_S:
            inputs.chunk_at_most(L, seq_len)
    return Ls


def _shape_grid(dhv: str, state_bytes: str, causal_factor: str, mode: str | None = None) -> list[dict]:
    """Every combination (:func:`_grid`) of --dhv, --state-bytes, --causal-factor and, when given,
    --mode, parsed in that order (UserError for a malformed list)."""
    lists = dict(d_hv=inputs.parse_list("--dhv", dhv, int), bytes_Cmn=inputs.parse_list("--state-bytes", state_bytes),
                 F_causal=inputs.parse_list("--causal-factor", causal_factor))
    if mode is not None:
        lists["mode"] = _modes(mode)
    return _grid(**lists)


def _check_shape(cfg: dict) -> None:
    """UserError unless a combination's d_hv is positive, its state bytes 4 or 2 and its F_causal
    in [0.5, 1] (checked in that order)."""
    inputs.positive("--dhv", cfg["d_hv"])
    inputs.state_bytes(cfg["bytes_Cmn"])
    inputs.causal(cfg["F_causal"])


def _distinct(grid: list[dict], key: str) -> list:
    """The values of ``key`` over the combinations, each once, in the grid's order."""
    return list(dict.fromkeys(cfg[key] for cfg in grid))


def _joined(grid: list[dict], key: str, fmt=str) -> str:
    """The values of ``key`` over the combinations, formatted, each once, comma-joined (for titles)."""
    return ",".join(dict.fromkeys(fmt(cfg[key]) for cfg in grid))


def _print_plots(con, paths) -> None:
    """``plot: PATH`` (absolute) for each figure written; None (a figure not drawn) is skipped."""
    for path in paths:
        if path:
            con.print(f"plot: {_shown(path)}", markup=False)


# ------------------------------------------------------------------ flops


@app.command()
def flops(
    variant: str = _opt("variant"),
    formulation: str = typer.Option("chunkwise", "--formulation", help=_H_FORM),
    chunk_size: str = typer.Option("128", "--chunk-size", "-L", help="Chunk size L (chunkwise only)." + _H_LIST),
    seq_len: int = _opt("seq_len"), batch: int = _opt("batch"), heads: int = _opt("heads"),
    dhv: str = _opt("dhv"), dqk: Optional[int] = _opt("dqk"), pqk: Optional[float] = _opt("pqk"),
    state_bytes: str = _opt("state_bytes"), qkv_bytes: float = _opt("qkv_bytes"),
    gate_bytes: float = typer.Option(2, "--gate-bytes", help=_H_IF),
    causal_factor: str = _opt("causal_factor"), counts: str = _opt("counts"),
    mode: str = typer.Option("fwd", "--mode", help=_H_MODE),
    pad: bool = typer.Option(False, "--pad", help="Allow L not dividing S: count ceil(S/L) padded chunks."),
    as_json: bool = _opt("as_json"),
) -> None:
    """FLOP and byte counts of mLSTM configurations, by part, with intensity (paper App. F).

    -L, --dhv, --state-bytes, --causal-factor and --mode take comma lists: one table per combination (JSON: a list under "results" when there are several).

    Example: tflabench flops --variant exp -L 256 -T 8192 --dhv 512 --pqk 0.5
    """
    with user_errors():
        variant = inputs.one_of("--variant", variant, ("sig", "exp"))
        formulation = inputs.one_of("--formulation", formulation, ("chunkwise", "parallel", "recurrent"))
        counts = inputs.one_of("--counts", counts, ("rows", "paper"))
        grid = _grid(L=inputs.parse_list("--chunk-size", chunk_size, int), d_hv=inputs.parse_list("--dhv", dhv, int),
                     bytes_Cmn=inputs.parse_list("--state-bytes", state_bytes), F_causal=inputs.parse_list("--causal-factor",
                                                                                             causal_factor),
                     mode=_modes(mode))
        _positive(seq_len=seq_len, batch=batch, heads=heads, qkv_bytes=qkv_bytes, gate_bytes=gate_bytes)
        results = []
        for cfg in grid:
            L, d_hv, sb, fc, m = cfg["L"], cfg["d_hv"], cfg["bytes_Cmn"], cfg["F_causal"], cfg["mode"]
            _positive(dhv=d_hv, chunk_size=L)
            inputs.state_bytes(sb)
            d_qk, p_qk = inputs.dqk_pqk(d_hv, dqk, pqk)
            inputs.causal(fc)
            inputs.counted_shape(formulation, m, L, seq_len, pad)
            kw = dict(S=seq_len, d_hv=d_hv, d_qk=d_qk, B=batch, NH=heads, F_causal=fc,
                      bytes_qkv=qkv_bytes, bytes_if=gate_bytes, bytes_Cmn=sb, chunks="pad" if pad else "divide")
            chunk = L if formulation == "chunkwise" else None
            if m == "fwd":
                c = mlstm_counts(variant, formulation, L=chunk, counts=counts, **kw)
            else:
                c = mlstm_fwdbw_counts(variant, L=chunk, counts=counts, **kw)
            config = {"variant": variant, "formulation": formulation, "mode": m, "counts": counts,
                      "batch": batch, "heads": heads, "seq_len": seq_len, "L": chunk, "d_qk": d_qk, "d_hv": d_hv,
                      "p_qk": p_qk, "F_causal": fc, "bytes_qkv": qkv_bytes,
                      "bytes_if": gate_bytes, "bytes_Cmn": sb, "pad": pad}
            results.append((config, c))
        if as_json:
            docs = [{"config": config, **c.as_dict()} for config, c in results]
            _echo_json(docs[0] if len(docs) == 1 else {"results": docs})
            return
        for config, c in results:
            _render_counts(config, c)


def _render_counts(config: dict, c) -> None:
    con = _console()
    form = config["formulation"]
    title = (f"mLSTM{config['variant']} {form} {config['mode']}: B={config['batch']} NH={config['heads']} "
             f"S={config['seq_len']}" + (f" L={config['L']}" if config["L"] else "")
             + f" d_qk={_e(config['d_qk'])} d_hv={config['d_hv']} F_causal={config['F_causal']} "
             f"states {_state_name(config['bytes_Cmn'])} counts={config['counts']}")
    t = _table(title)
    t.add_column("part")
    t.add_column("kernel")
    t.add_column("FLOPs", justify="right")
    t.add_column("share", justify="right")
    for k, v in c.flop_rows.items():
        t.add_row(k, count_row_kernel(form, k), f"{v:.4e}", f"{100 * v / c.flops:.2f} %")
    t.add_row("[b]total[/b]", "", f"[b]{c.flops:.4e}[/b]", "100 %")
    if c.matmul_flops is not None:
        t.add_row("of which matmul (tensor core)", "", f"{c.matmul_flops:.4e}",
                  f"{100 * c.matmul_flops / c.flops:.2f} %")
    con.print(t)
    b = _table("HBM bytes (loads + stores)")
    b.add_column("kernel, direction")
    b.add_column("bytes", justify="right")
    b.add_column("share", justify="right")
    for k, v in c.byte_rows.items():
        b.add_row(k, f"{v:.4e}", f"{100 * v / c.bytes:.2f} %")
    b.add_row("[b]total[/b]", f"[b]{c.bytes:.4e}[/b]", "100 %")
    con.print(b)
    con.print(f"arithmetic intensity: [b]{c.intensity_flop_per_byte:.2f}[/b] FLOP/byte (eq. 117)")
    for n in c.notes:
        con.print(f"[dim]{n}[/dim]")


# ------------------------------------------------------------------ roofline


def _load_set(path):
    """``roofline --results``: the result set at ``path`` (None when not given); UserError when
    it is none or has no usable row."""
    if path is None:
        return None
    from tflabench.store.results import load_results

    result_set = load_results(path)
    if not measured_points(result_set.rows):
        raise UserError(f"--results={str(path)!r} has no rows with status ok and usable flops/bytes/tflops_per_s")
    return result_set


def _measured_gpu(result_set, gpu_name, ceilings, hardware):
    """``roofline --results``: the GPU whose roofline the set's rows are placed on: the first
    ``--gpu``, else the GPU the set was measured on (a CPU set needs ``--gpu``, as ``report``
    does: :func:`tflabench.analysis.model_vs_measured.ceilings_for`); None without ``--results``."""
    if result_set is None:
        return None
    from tflabench.analysis.model_vs_measured import ceilings_for

    return ceilings_for(result_set.metadata, ceilings, gpu_name, hardware_file=hardware)


def _roofline_points(variant, grid, Ls, *, dqk, pqk, counts, peers, seq_len, batch, heads, bytes_qkv):
    """``roofline``: the model points of each combination in ``grid`` (chunk sizes ``Ls``) and,
    with ``peers``, the peers' at the same shape, labelled with what varies between combinations.
    Each combination is checked just before its points are counted (UserError: a bad one, L > S)."""
    varying = {k for k in grid[0] if len({cfg[k] for cfg in grid}) > 1}
    pts, peer_pts = [], []
    for cfg in grid:
        _check_shape(cfg)
        d_qk, _ = inputs.dqk_pqk(cfg["d_hv"], dqk, pqk)
        tag = _varying_label(cfg, varying)
        shape = dict(seq_len=seq_len, batch=batch, heads=heads, dhv=cfg["d_hv"], d_qk=d_qk, F_causal=cfg["F_causal"],
                     bytes_qkv=bytes_qkv)
        model = mlstm_points(variant, cfg["mode"], Ls, bytes_if=bytes_qkv, bytes_Cmn=cfg["bytes_Cmn"], counts=counts,
                             **shape)
        for into, points in ((pts, model), (peer_pts, peer_points(cfg["mode"], **shape) if peers else [])):
            into.extend({**p, **cfg, "d_qk": d_qk, "label": f"{p['label']} {tag}".strip()} for p in points)
    return pts, peer_pts


def _roofline_table(gpus, points: list[dict]) -> list[dict]:
    """Each point on each GPU's roofline (:func:`roofline_rows`), with its mode, d_hv, state bytes
    and F_causal: the rows of the tables and of JSON ``points``."""
    return [{**row, "mode": p["mode"], "d_hv": p["d_hv"], "bytes_Cmn": p["bytes_Cmn"], "F_causal": p["F_causal"]}
            for row, p in zip(roofline_rows(gpus, points), points * len(gpus))]


def _measured_placement(result_set, measured_gpu) -> tuple[list, list, list]:
    """``roofline --results``: the set's measured points, each row placed on ``measured_gpu``'s
    roofline at its own shape, and their distance to the bound (three empty lists without a set)."""
    measured = measured_points(result_set.rows) if result_set is not None else []
    if not measured:
        return measured, [], []
    from tflabench.analysis.model_vs_measured import distance_to_bound, roofline_placement

    placement = roofline_placement(result_set.rows, peak_flops_per_s=measured_gpu.flops_per_s,
                                   beta=measured_gpu.bytes_per_s)
    return measured, placement, distance_to_bound(placement)


def _roofline_file(gpus, variant: str, modes: list[str], fmt: str) -> str:
    """The roofline figure's file name: GPUs, variant and modes shown, suffix ``fmt``."""
    return f"roofline_{'_'.join(g.key for g in gpus)}_{variant}_{'_'.join(modes)}.{fmt}"


def _roofline_title(gpus, grid: list[dict], modes: list[str], *, variant: str, dqk, pqk) -> str:
    """The roofline figure's title: variant, modes, the d_hv, p_qk, F_causal and state sizes
    shown, the GPUs' ceilings."""
    return (f"Roofline, mLSTM{variant} chunkwise {'+'.join(modes)} (d_hv={_joined(grid, 'd_hv')}, "
            f"p_qk={inputs.dqk_pqk(grid[0]['d_hv'], dqk, pqk)[1]:g}, F_causal={_joined(grid, 'F_causal', '{:g}'.format)}, "
            f"states {_joined(grid, 'bytes_Cmn', _state_name)}; {inputs.ceilings_text(gpus)})")


def _roofline_plots(gpus, pts, peer_pts, *, path: Path, title: str, placement, measured_gpu, result_set):
    """Draw the roofline figure at ``path`` and, when measured rows were placed, its
    ``*_measured`` companion; returns both paths (the second None when not drawn)."""
    from tflabench.report.plots.analytic import roofline_figure

    path = roofline_figure(gpus, pts, path=path, peer_points=peer_pts, title=title)
    if not placement:
        return path, None
    from tflabench.report.plots.model_measured import roofline_measured_figure
    from tflabench.report.plots.style import set_label

    return path, roofline_measured_figure(
        placement, measured_gpu, path=path.with_name(f"{path.stem}_measured{path.suffix}"),
        title=(f"Every measured case against the {measured_gpu.name} roofline at its own shape "
               f"({measured_gpu.ceilings} ceilings), {set_label(result_set.metadata)}"))


def _roofline_json(grid, modes, gpus, measured_gpu, *, variant, counts, seq_len, batch, heads, dqk, pqk, bytes_qkv,
                   ceilings, table, measured, placement, distance, paths) -> dict:
    """``roofline --json``: the configuration, the GPUs, the model points on each roofline, the
    measured points with their placement and distance to the bound, the figures' paths."""
    path, measured_path = paths
    return {
        "config": {"variant": variant, "modes": modes, "counts": counts, "seq_len": seq_len, "batch": batch,
                   "heads": heads, "d_hv": sorted({c["d_hv"] for c in grid}), "d_qk": dqk, "p_qk": pqk,
                   "F_causal": sorted({c["F_causal"] for c in grid}),
                   "bytes_Cmn": sorted({c["bytes_Cmn"] for c in grid}), "bytes_qkv": bytes_qkv,
                   "ceilings": ceilings},
        "gpus": [g.as_dict() for g in gpus],
        "measured_gpu": measured_gpu.as_dict() if measured_gpu else None,
        "points": table,
        "measured": measured,
        "placement": placement,
        "distance_to_bound": distance,
        "plot": _shown(path) if path else None,
        "measured_plot": _shown(measured_path) if measured_path else None,
    }


def _print_roofline_tables(con, gpus, table: list[dict]) -> None:
    """One table per GPU (its ceilings in the title): each point's FLOPs, bytes, intensity,
    attainable TFLOP/s, bound and times; then what the columns mean."""
    for g in gpus:
        t = _table(f"{g.name}: {g.flops_per_s / 1e12:.0f} TFLOP/s, {g.bytes_per_s / 1e12:.3g} TB/s, "
                        f"I_acc {g.intensity_flop_per_byte:.1f} FLOP/byte ({g.ceilings})")
        for col in ("point", "FLOPs", "bytes", "I", "TFLOP/s", "bound", "ms max", "ms sum"):
            t.add_column(col, justify="left" if col in ("point", "bound") else "right")
        for r in (r for r in table if r["gpu"] == g.key):
            t.add_row(lit(r["label"]), f"{r['flops']:.3e}", f"{r['bytes']:.3e}",
                      f"{r['intensity_flop_per_byte']:.1f}", f"{r['attainable_tflops_per_s']:.1f}",
                      r["bound"], f"{r['roofline_ms']:.3f}", f"{r['sum_form_ms']:.3f}")
        con.print(t)
    con.print("[dim]I: FLOP/byte (eq. 117); TFLOP/s: attainable, min(beta*I, alpha) (eq. 119); "
              "ms max: roofline bound FLOPs/attainable = max form (eq. 114); ms sum: eq. 113/116[/dim]")


def _print_measured_distance(con, measured: list, results, measured_gpu, distance: list) -> None:
    """``roofline --results``: how many measured points were placed on which roofline, and the
    distance-to-the-bound table."""
    con.print(f"{len(measured)} measured points from {results}, each placed at its own shape "
              f"on the {measured_gpu.name} roofline ({measured_gpu.ceilings} ceilings):", markup=False)
    from tflabench.report.tables import distance_table

    con.print(distance_table(distance))


@app.command()
def roofline(
    gpu: Optional[List[str]] = typer.Option(None, "--gpu", help=_H_GPU + " Default h100,h200; --results places "
                                             "its rows on the first --gpu, else on the set's GPU."),
    chunk_size: str = typer.Option(DEFAULT_ROOFLINE_L, "--chunk-size", "-L", show_default=False,
                                   help="Chunk sizes L." + _H_LIST + " Default " + DEFAULT_ROOFLINE_L.replace(",", ", ")
                                   + " (those up to S)."),
    variant: str = _opt("variant"),
    mode: str = typer.Option("fwd", "--mode", help=_H_MODE),
    seq_len: int = _opt("seq_len"), batch: int = _opt("batch"), heads: int = _opt("heads"),
    dhv: str = _opt("dhv"), dqk: Optional[int] = _opt("dqk"), pqk: Optional[float] = _opt("pqk"),
    state_bytes: str = _opt("state_bytes"), qkv_bytes: float = _opt("qkv_bytes"),
    causal_factor: str = _opt("causal_factor"), counts: str = _opt("counts"),
    ceilings: str = ceilings_option(),
    peers: bool = typer.Option(False, "--peers", help="Also place FlashAttention, simple GLA and Mamba 2 SSD (same B, S)."),
    results: Optional[Path] = typer.Option(
        None, "--results", help="Result set whose measured rows to place, each at its own shape, on the "
        "roofline of the GPU it was measured on, or of the first --gpu (a second figure, *_measured, and a "
        "distance-to-the-bound table); a CPU set needs --gpu."),
    plots: bool = plots_option(),
    out: Optional[Path] = _opt("out"), figure_format: str = _opt("figure_format"),
    hardware: Optional[Path] = _opt("hardware"), as_json: bool = _opt("as_json"),
) -> None:
    """Roofline (eq. 119) of TFLA's chunkwise kernel for chunk sizes, optionally with measured points.

    Defaults: the paper's roofline figure (mLSTMsig, d_hv 512, p_qk 0.5, B 8, NH 8, S 8192, F_causal 0.66). --dhv, --state-bytes, --causal-factor and --mode take comma lists: a set of points per combination.

    Example: tflabench roofline --gpu h100,h200 -L 64,128,256 --results results/reference/h100/h100_7b
    """
    with user_errors():
        variant, counts = _variant_counts(variant, counts)
        Ls = inputs.parse_list("--chunk-size", chunk_size, int)
        _positive(seq_len=seq_len, batch=batch, heads=heads, qkv_bytes=qkv_bytes)
        Ls = _chunk_sizes(Ls, chunk_size == DEFAULT_ROOFLINE_L, seq_len)
        grid = _shape_grid(dhv, state_bytes, causal_factor, mode)
        gpu_names = comma_list("--gpu", gpu)
        gpus = inputs.gpus(gpu_names or ["h100", "h200"], ceilings, hardware)
        result_set = _load_set(results)
        measured_gpu = _measured_gpu(result_set, gpu_names[0] if gpu_names else None, ceilings, hardware)
        plot_dir, fmt = _plot_dir(out, figure_format) if plots else (None, "png")
        pts, peer_pts = _roofline_points(variant, grid, Ls, dqk=dqk, pqk=pqk, counts=counts, peers=peers,
                                         seq_len=seq_len, batch=batch, heads=heads, bytes_qkv=qkv_bytes)
        table = _roofline_table(gpus, pts + peer_pts)
        measured, placement, distance = _measured_placement(result_set, measured_gpu)
        modes = _distinct(grid, "mode")
        paths = (None, None)
        if plots:
            paths = _roofline_plots(gpus, pts, peer_pts, path=plot_dir / _roofline_file(gpus, variant, modes, fmt),
                                    title=_roofline_title(gpus, grid, modes, variant=variant, dqk=dqk, pqk=pqk),
                                    placement=placement, measured_gpu=measured_gpu, result_set=result_set)
        if as_json:
            _echo_json(_roofline_json(grid, modes, gpus, measured_gpu, variant=variant, counts=counts, seq_len=seq_len,
                                      batch=batch, heads=heads, dqk=dqk, pqk=pqk, bytes_qkv=qkv_bytes,
                                      ceilings=ceilings, table=table, measured=measured, placement=placement,
                                      distance=distance, paths=paths))
            return
        con = _console()
        _print_roofline_tables(con, gpus, table)
        if measured:
            _print_measured_distance(con, measured, results, measured_gpu, distance)
        _print_plots(con, paths)


# ------------------------------------------------------------------ intensity


def _intensity_curves(variant: str, Ls: list, grid: list[dict], *, dqk, pqk, counts: str, gpus) -> list[dict]:
    """``intensity``: the curves (:func:`intensity_curves`) of every combination in ``grid``, d_hv
    by d_hv, each label naming its d_hv where several are shown."""
    d_hvs = _distinct(grid, "d_hv")
    curves = []
    for d_hv in d_hvs:
        d_qk, _ = inputs.dqk_pqk(d_hv, dqk, pqk)
        for c in intensity_curves(variant, Ls, state_bytes=_distinct(grid, "bytes_Cmn"),
                                  causal_factors=_distinct(grid, "F_causal"),
                                  d_hv=d_hv, d_qk=d_qk, counts=counts, gpus=gpus):
            label = c["label"] + (f", d_hv={d_hv}" if len(d_hvs) > 1 else "")
            curves.append({**c, "label": label, "d_hv": d_hv})
    return curves


def _intensity_plot(curves: list[dict], gpus, *, variant: str, seq_len: int, dhvs: str, p_qk: float,
                    plot_dir: Path, fmt: str) -> Path:
    """Draw the intensity curves against each GPU's I_acc; returns the figure's path."""
    from tflabench.report.plots.analytic import intensity_figure

    return intensity_figure(
        curves, gpus, S=seq_len, path=plot_dir / f"intensity_{variant}_dhv{dhvs.replace(',', '_')}.{fmt}",
        title=(f"Arithmetic intensity of mLSTM{variant} chunkwise over chunk size (d_hv={dhvs}, "
               f"p_qk={p_qk:g}), against each GPU's I_acc ({inputs.ceilings_text(gpus)})"),
    )


def _intensity_json(curves: list[dict], gpus, grid: list[dict], *, variant, counts, dqk, p_qk, seq_len, ceilings,
                    path) -> dict:
    """``intensity --json``: the configuration, the GPUs, the curves (chunk sizes as string keys),
    the figure's path."""
    return {
        "config": {"variant": variant, "counts": counts, "d_hv": sorted({c["d_hv"] for c in grid}),
                   "d_qk": dqk, "p_qk": p_qk, "seq_len": seq_len, "ceilings": ceilings},
        "gpus": [g.as_dict() for g in gpus],
        "curves": [{**c, "intensity": {str(k): v for k, v in c["intensity"].items()}} for c in curves],
        "plot": _shown(path) if path else None,
    }


def _print_intensity_tables(con, curves: list[dict], gpus, Ls: list, *, variant: str, dhvs: str,
                            p_qk: float) -> None:
    """The intensity of each curve at each chunk size, then the chunk size where each curve
    meets each GPU's I_acc."""
    con.print(_curve_table(
        f"I_algo (FLOP/byte) over chunk size L, mLSTM{variant} chunkwise, d_hv={dhvs}, p_qk={p_qk:g} (eq. 118)",
        curves, [(f"{L}", lambda c, L=L: c["intensity"][L]) for L in Ls]))
    con.print(_curve_table(
        "chunk size L where I_algo = I_acc (compute-bound above)", curves,
        [(f"{g.key} ({g.intensity_flop_per_byte:.1f})", lambda c, g=g: c["L_at_I_acc"][g.key]) for g in gpus]))


@app.command()
def intensity(
    gpu: Optional[List[str]] = typer.Option(None, "--gpu", help=_H_GPU + " Default v100,a100,h100,h200,b200."),
    chunk_size: str = typer.Option(DEFAULT_INTENSITY_L, "--chunk-size", "-L", show_default=False,
                                   help="Chunk sizes L for the table." + _H_LIST + " Default "
                                   + DEFAULT_INTENSITY_L.replace(",", ", ") + " (those up to S)."),
    variant: str = _opt("variant"), seq_len: int = _opt("seq_len"),
    dhv: str = _opt("dhv"), dqk: Optional[int] = _opt("dqk"), pqk: Optional[float] = _opt("pqk"),
    state_bytes: str = _opt("state_bytes", "4,2"),
    causal_factor: str = _opt("causal_factor"), counts: str = _opt("counts"),
    ceilings: str = ceilings_option(),
    plots: bool = plots_option(),
    out: Optional[Path] = _opt("out"), figure_format: str = _opt("figure_format"),
    hardware: Optional[Path] = _opt("hardware"), as_json: bool = _opt("as_json"),
) -> None:
    """Arithmetic intensity over chunk size (eq. 118) for float32 and bfloat16 states, with GPUs' I_acc.

    Also gives the chunk size where the kernel turns compute-bound on each GPU (I_algo = I_acc). Intensity does not depend on batch size or heads (both scale FLOPs and bytes alike), so it takes neither. One curve per combination of --dhv, --state-bytes and --causal-factor.

    Example: tflabench intensity --dhv 512 --state-bytes 4,2 --causal-factor 0.5,0.66,1
    """
    with user_errors():
        variant, counts = _variant_counts(variant, counts)
        Ls = inputs.parse_list("--chunk-size", chunk_size, int)
        inputs.positive("--seq-len", seq_len)
        Ls = _chunk_sizes(Ls, chunk_size == DEFAULT_INTENSITY_L, seq_len, at_most_S=True)
        grid = _shape_grid(dhv, state_bytes, causal_factor)
        for cfg in grid:
            _check_shape(cfg)
        gpus = inputs.gpus(comma_list("--gpu", gpu) or ["v100", "a100", "h100", "h200", "b200"], ceilings, hardware)
        plot_dir, fmt = _plot_dir(out, figure_format) if plots else (None, "png")
        curves = _intensity_curves(variant, Ls, grid, dqk=dqk, pqk=pqk, counts=counts, gpus=gpus)
        dhvs = _joined(grid, "d_hv")
        p_qk = inputs.dqk_pqk(grid[0]["d_hv"], dqk, pqk)[1]
        path = None
        if plots:
            path = _intensity_plot(curves, gpus, variant=variant, seq_len=seq_len, dhvs=dhvs, p_qk=p_qk,
                                   plot_dir=plot_dir, fmt=fmt)
        if as_json:
            _echo_json(_intensity_json(curves, gpus, grid, variant=variant, counts=counts, dqk=dqk, p_qk=p_qk,
                                       seq_len=seq_len, ceilings=ceilings, path=path))
            return
        con = _console()
        _print_intensity_tables(con, curves, gpus, Ls, variant=variant, dhvs=dhvs, p_qk=p_qk)
        _print_plots(con, [path])


# ------------------------------------------------------------------ optimal-chunk


def _curve_table(title: str, curves: list[dict], columns: list):
    """A table of ``curves`` (one row each, named by its ``label``: states, F_c) with one
    right-aligned column per ``(header, value of a curve)`` of ``columns``, to 1 decimal."""
    t = _table(title)
    t.add_column("states, F_c")
    for header, _ in columns:
        t.add_column(header, justify="right")
    for c in curves:
        t.add_row(c["label"], *(f"{value(c):.1f}" for _, value in columns))
    return t


def _check_dqk_pqk(dqk, pqk) -> None:
    """UserError for --dqk and --pqk given together, or either not positive (the checks of
    :func:`tflabench.analysis.analytic_inputs.dqk_pqk`, which do not depend on d_hv)."""
    inputs.dqk_pqk(1, dqk, pqk)


def _state_causal_pairs(grid: list[dict]) -> list[tuple]:
    """The (state bytes, F_causal) pairs of the combinations, each once, in the grid's order."""
    return list(dict.fromkeys((cfg["bytes_Cmn"], cfg["F_causal"]) for cfg in grid))


def _optimal_chunk_rows(variant: str, gpus, grid: list[dict], *, dqk, pqk, bytes_qkv, counts, batch, heads,
                        seq_len) -> list[dict]:
    """``optimal-chunk``: the model's optima (:func:`optimal_chunk_rows`) for every combination in
    ``grid``, each row tagged with its state bytes and F_causal, GPU by GPU in ``gpus``' order."""
    rows = []
    for sb, fc in _state_causal_pairs(grid):
        for r in optimal_chunk_rows(variant, gpus, _distinct(grid, "d_hv"), d_qk=dqk, p_qk=pqk, F_causal=fc,
                                    bytes_qkv=bytes_qkv, bytes_Cmn=sb, counts=counts, batch=batch, heads=heads,
                                    seq_len=seq_len):
            rows.append({**r, "bytes_Cmn": sb, "F_causal": fc})
    rows.sort(key=lambda r: [g.key for g in gpus].index(r["gpu"]))
    return rows


def _optimal_chunk_plots(gpus, grid: list[dict], *, variant: str, dqk, pqk, counts: str, plot_dir: Path,
                         fmt: str) -> list:
    """Draw the optimum over d_hv and accelerator intensity, one figure per state size and
    F_causal (named by them when there are several); returns the figures' paths."""
    from tflabench.report.plots.analytic import optimal_chunk_figure

    p = (dqk / grid[0]["d_hv"]) if dqk is not None else (pqk if pqk is not None else 0.5)
    figures = _state_causal_pairs(grid)
    paths = []
    for sb, fc in figures:  # the figure spans d_hv itself: one per state size and F_causal
        tag = "" if len(figures) == 1 else f"_{_state_name(sb)}_fc{fc:g}"
        paths.append(optimal_chunk_figure(
            gpus, variant=variant, p_qk=p, F_causal=fc, bytes_Cmn=sb,
            counts=counts, path=plot_dir / f"optimal_chunk_{variant}{tag}.{fmt}"))
    return paths


def _print_optimal_chunk_table(con, rows: list[dict], gpus, *, variant: str, counts: str, batch: int, heads: int,
                               seq_len: int) -> None:
    """The optima, one row per GPU and combination (states and F_c columns only where they vary,
    else a line naming them), then what the columns mean."""
    several = len({(r["bytes_Cmn"], r["F_causal"]) for r in rows}) > 1
    t = _table((f"Optimal chunk size, mLSTM{variant} chunkwise forward (counts={counts}, "
                f"{inputs.ceilings_text(gpus)}; "
                f"runtime for B={batch}, NH={heads}, S={seq_len})"))
    cols = ["GPU", "I_acc", "d_hv", "d_qk"] + (["states", "F_c"] if several else []) + [
        "L_flop", "L_runtime", "numeric", "best 2^k", "ms at 2^k", "L_max"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("GPU", "states") else "right")
    for r in rows:
        t.add_row(lit(r["gpu"]), f"{r['I_acc']:.1f}", str(r["d_hv"]), f"{r['d_qk']:g}",
                  *([_state_name(r["bytes_Cmn"]), f"{r['F_causal']:g}"] if several else []),
                  f"{r['L_opt_flop']:.2f}", f"{r['L_opt_runtime']:.2f}",
                  f"{r['L_opt_runtime_numeric']:.2f}", str(r["L_pow2_runtime"]),
                  f"{r['runtime_ms_pow2']:.3f}", f"{r['L_opt_runtime_max']:.1f}")
    con.print(t)
    if not several:
        con.print(f"[dim]states {_state_name(rows[0]['bytes_Cmn'])}, F_causal {rows[0]['F_causal']:g}[/dim]")
    con.print("[dim]L_flop: FLOP-optimal, eq. 111; L_runtime: runtime-optimal (sum form), eq. 121; "
              "numeric: golden-section argmin of the runtime; best 2^k and its predicted ms "
              "(sum form, eq. 116); L_max: argmin of the max form (eq. 114), the ridge crossing[/dim]")


@app.command("optimal-chunk")
def optimal_chunk(
    dhv: str = _opt("dhv", extra=" (one with --measure)"),
    gpu: Optional[List[str]] = typer.Option(
        None, "--gpu", help=_H_GPU + " Default h100,h200; with --measure the GPU measured on (one)."),
    variant: str = _opt("variant"), dqk: Optional[int] = _opt("dqk"), pqk: Optional[float] = _opt("pqk"),
    state_bytes: str = _opt("state_bytes", extra=" (one with --measure)"), qkv_bytes: float = _opt("qkv_bytes"),
    causal_factor: str = _opt("causal_factor", extra=" (one with --measure)"), counts: str = _opt("counts"),
    ceilings: str = ceilings_option(),
    seq_len: int = _opt("seq_len", extra=" (for the predicted runtime; caps L)"),
    batch: int = _opt("batch", extra=" (for the predicted runtime)"),
    heads: int = _opt("heads", extra=" (for the predicted runtime)"),
    plots: bool = plots_option("Draw the optimum over d_hv and over accelerator intensity (with --measure: the "
                               "measured sweep beside the model)."),
    out: Optional[Path] = _opt("out", extra=" With --measure: the results root, OUT/<sweep name>/<timestamp>/ "
                               "(default results), figures in its plots/."),
    figure_format: str = _opt("figure_format"), hardware: Optional[Path] = _opt("hardware"),
    as_json: bool = _opt("as_json"),
    measure: bool = typer.Option(
        False, "--measure", help="On a GPU: sweep the chunk size of a kernel through `run`'s machinery "
        "(isolated workers, warm-up, numerics gate) and compare the measured optimum with the model's."),
    kernel: Optional[List[str]] = typer.Option(
        None, "--kernel", help="With --measure, comma-separated: ours (default), mlstm_kernels, or a custom "
        "kernel module:function / path/file.py:function taking chunk_size=."),
    chunk_sizes: str = typer.Option(
        "64,128,256,512,1024", "--chunk-size", "-L", show_default=False,
        help="With --measure: chunk sizes swept." + _H_LIST + " Default 64, 128, 256, 512, 1024."),
    mode: str = typer.Option("fwd,fwdbw", "--mode", help="With --measure: " + _H_MODE),
    dtype: str = typer.Option("bfloat16", "--dtype", help="With --measure: input dtype."),
    warmup: int = typer.Option(10, "--warmup", help="With --measure: untimed calls per case."),
    iterations: int = typer.Option(30, "--iterations", help="With --measure: timed calls per case."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="With --measure: progress bar."),
) -> None:
    """FLOP-optimal (eq. 111) and runtime-optimal (eq. 121) chunk size, continuous and best power of two.

    Runtime is the paper's sum form (eq. 116); the max form (eq. 114) optimum is shown too. One row per GPU and combination of --dhv, --state-bytes and --causal-factor. With --measure (GPU only) the chunk size is swept on the GPU and the measured optimum, the measured/model time ratio per L and the peak memory are shown beside the model's.

    Example: tflabench optimal-chunk --dhv 512 --gpu h100,h200 --state-bytes 2

    Example: tflabench optimal-chunk --measure --kernel ours,mlstm_kernels --dhv 512 --heads 8 --dqk 256
    """
    if measure:
        _optimal_chunk_measure(
            dhv=dhv, gpu=gpu, variant=variant, dqk=dqk, pqk=pqk, state_bytes=state_bytes,
            causal_factor=causal_factor, counts=counts, ceilings=ceilings, seq_len=seq_len,
            batch=batch, heads=heads, out=out, hardware=hardware, as_json=as_json, kernel=kernel or ["ours"],
            chunk_sizes=chunk_sizes, modes=mode, dtype=dtype, warmup=warmup, iterations=iterations,
            progress=progress, plots=plots, figure_format=figure_format)
        return
    with user_errors():
        variant, counts = _variant_counts(variant, counts)
        grid = _shape_grid(dhv, state_bytes, causal_factor)
        _positive(seq_len=seq_len, batch=batch, heads=heads, qkv_bytes=qkv_bytes)
        _check_dqk_pqk(dqk, pqk)
        for cfg in grid:
            _check_shape(cfg)
        gpus = inputs.gpus(comma_list("--gpu", gpu) or ["h100", "h200"], ceilings, hardware)
        plot_dir, fmt = _plot_dir(out, figure_format) if plots else (None, "png")
        rows = _optimal_chunk_rows(variant, gpus, grid, dqk=dqk, pqk=pqk, bytes_qkv=qkv_bytes, counts=counts,
                                   batch=batch, heads=heads, seq_len=seq_len)
        paths = []
        if plots:
            paths = _optimal_chunk_plots(gpus, grid, variant=variant, dqk=dqk, pqk=pqk, counts=counts,
                                         plot_dir=plot_dir, fmt=fmt)
        if as_json:
            _echo_json({"results": rows, "plots": [_shown(x) for x in paths]})
            return
        con = _console()
        _print_optimal_chunk_table(con, rows, gpus, variant=variant, counts=counts, batch=batch, heads=heads,
                                   seq_len=seq_len)
        _print_plots(con, paths)


def _optimal_chunk_measure(*, dhv, gpu, variant, dqk, pqk, state_bytes, causal_factor, counts, ceilings,
                           seq_len, batch, heads, out, hardware, as_json, kernel, chunk_sizes, modes, dtype,
                           warmup, iterations, progress, plots, figure_format) -> None:
    """optimal-chunk --measure: validate, refuse without a GPU, run the sweep, show model vs measured."""
    with user_errors():
        from tflabench.run import chunk_measure as cm

        variant = inputs.one_of("--variant", variant, ("sig", "exp"))
        counts = inputs.one_of("--counts", counts, ("rows", "paper"))
        inputs.one_of("--ceilings", ceilings, ("auto", "datasheet", "measured"))
        inputs.one_of("--figure-format", figure_format, ("png", "svg", "pdf"))
        single = {}
        for name, text, kind in (("--dhv", dhv, int), ("--state-bytes", state_bytes, float),
                                 ("--causal-factor", causal_factor, float)):
            values = inputs.parse_list(name, text, kind)
            if len(values) != 1:
                raise UserError(f"{name}={text!r}: --measure sweeps one shape; give one value")
            single[name] = values[0]
        d_hv, sb, fc = single["--dhv"], single["--state-bytes"], single["--causal-factor"]
        inputs.positive("--dhv", d_hv)
        inputs.state_bytes(sb)
        d_qk, _ = inputs.dqk_pqk(d_hv, dqk, pqk)
        if float(d_qk) != int(d_qk):
            raise UserError(f"--pqk={pqk!r} gives d_qk={d_qk} (not an integer); give --dqk")
        inputs.causal(fc)
        spec = cm.SweepSpec(
            kernels=comma_list("--kernel", kernel), variant=variant, batch=batch, seq_len=seq_len, heads=heads,
            d_qk=int(d_qk), d_hv=d_hv, chunk_sizes=tuple(inputs.parse_list("--chunk-size", chunk_sizes, int)),
            modes=tuple(_modes(modes)), dtype=dtype, warmup=warmup, iterations=iterations).validate()
        gpu_names = comma_list("--gpu", gpu) or []
        if len(gpu_names) > 1:
            raise UserError("--gpu: --measure compares with one GPU's model; give one (or none: the GPU measured on)")
        cm.require_gpu()
        with interruptible(_sweep_interrupted_line):
            result, rs = cm.measure_chunk_sweep(spec, out_root=out or Path("results"), device="cuda",
                                                progress=progress)
        from tflabench.cli.run_cmds import _write_run_plots

        run_plots = _write_run_plots(result.directory) if plots else None
        _show_measured_sweep(rs, run_plots, gpu=gpu_names[0] if gpu_names else None, ceilings=ceilings,
                             hardware=hardware, F_causal=fc, counts=counts, bytes_Cmn=sb,
                             plot_dir=(rs.path / "plots") if plots else None, figure_format=figure_format,
                             as_json=as_json)


def _sweep_interrupted_line(stop: KeyboardInterrupt) -> str:
    """What an interrupted measured sweep leaves (the result set named on the exception, if any)."""
    directory = getattr(stop, "directory", None)
    return (f"interrupted: the rows measured so far are kept in {directory or 'the result set named above'}; "
            f"`tflabench report {directory or 'DIR'}` compares them with the model")


def _show_measured_sweep(rs, run_plots, *, gpu, ceilings, hardware, F_causal, counts, bytes_Cmn, plot_dir,
                         figure_format, as_json):
    """Render a measured chunk-size sweep: per-L table, optima, figure (CLI helper);
    ``run_plots``: the run's own figures (None: none drawn)."""
    from tflabench.analysis import model_vs_measured as mm

    g = mm.ceilings_for(rs.metadata, ceilings, gpu, hardware_file=hardware)
    sweeps = mm.chunk_sweeps(rs.rows, peak_flops_per_s=g.flops_per_s, beta=g.bytes_per_s, ceilings=g.ceilings,
                             F_causal=F_causal, counts=counts, bytes_Cmn=bytes_Cmn)
    path = None
    if sweeps and plot_dir is not None:
        from tflabench.report.plots.model_measured import chunk_sweep_figure
        from tflabench.report.plots.style import set_label

        path = chunk_sweep_figure(
            sweeps, path=Path(plot_dir) / f"optimal_chunk_measured.{figure_format}",
            title=f"Runtime over chunk size L, measured and modelled, {set_label(rs.metadata)}")
    figures = [_shown(p) for p in (run_plots or [])] + ([_shown(path)] if path else [])
    if as_json:
        _echo_json({"results": str(rs.path), "gpu": g.as_dict(), "sweeps": [s.as_dict() for s in sweeps],
                    "plots": figures})
        return
    con = _console()
    con.print(f"model: {mm.model_ceilings_text(g)}", markup=False)
    if not sweeps:
        con.print(f"no chunk size measured ok at two or more values: nothing to compare; see the rows in {rs.path}",
                  style="yellow", markup=False)
    for s in sweeps:
        t = _table(f"{s.title()}: measured optimum L={s.measured_L_opt}, model L={s.optima['L_opt_runtime']:.0f} "
                   f"(runtime-optimal), {s.optima['L_opt_flop']:.1f} (FLOP-optimal); {s.optima['source']}")
        for col in ("L", "measured ms", "model ms (sum)", "bound ms (max)", "measured / model", "peak GiB"):
            t.add_column(col, justify="right")
        for p in s.points:
            t.add_row(str(p["L"]), f"{p['ms_median']:.3f}", f"{p['model_ms_sum']:.3f}", f"{p['model_ms_max']:.3f}",
                      f"{p['ratio_sum']:.2f}", "-" if p["peak_mem_bytes"] is None else f"{p['peak_mem_bytes'] / 2**30:.2f}")
        con.print(t)
    con.print(f"results: {rs.path}", markup=False)
    for f in figures:
        con.print(f"plot: {f}", markup=False)


# ------------------------------------------------------------------ gpus


@app.command()
def gpus(
    ceilings: str = ceilings_option(), hardware: Optional[Path] = _opt("hardware"), as_json: bool = _opt("as_json"),
) -> None:
    """The GPU catalogue: dense bf16 FLOP/s, HBM bandwidth, intensity, measured ceilings, sources.

    Example: tflabench gpus --hardware my_gpus.yaml --json
    """
    with user_errors():
        from tflabench.hardware import list_gpus

        ceilings = inputs.one_of("--ceilings", ceilings, ("auto", "datasheet", "measured"))
        gs = list_gpus(ceilings, hardware_file=hardware)
        if as_json:
            _echo_json({"gpus": [g.as_dict() for g in gs]})
            return
        t = _table(f"GPU catalogue ({ceilings} ceilings where available)")
        for col in ("key", "name", "year", "TFLOP/s", "TB/s", "I_acc", "meas. TFLOP/s", "meas. TB/s", "src"):
            t.add_column(col, justify="left" if col in ("key", "name") else "right")
        sources: list[str] = []
        for g in gs:
            for s in (g.source, g.measured_note):
                if s and s not in sources:
                    sources.append(s)
            t.add_row(lit(g.key), lit(g.name), str(g.year or "-"),
                      _e(g.datasheet_flops_per_s / 1e12) if g.datasheet_flops_per_s else "-",
                      _e(g.datasheet_bytes_per_s / 1e12) if g.datasheet_bytes_per_s else "-",
                      f"{g.intensity_flop_per_byte:.1f}" + ("*" if g.ceilings == "measured" else ""),
                      _e(g.measured_flops_per_s / 1e12) if g.measured_flops_per_s else "-",
                      _e(g.measured_bytes_per_s / 1e12) if g.measured_bytes_per_s else "-",
                      ",".join(str(sources.index(s) + 1) for s in (g.source, g.measured_note) if s))
        con = _console()
        con.print(t)
        con.print("TFLOP/s: dense bf16; TB/s: HBM bandwidth; I_acc = alpha/beta in FLOP/byte"
                  + (" (* from measured ceilings)" if ceilings != "datasheet" else ""))
        for i, s in enumerate(sources, 1):
            con.print(f"[{i}] {s}", markup=False, highlight=False)
