"""Commands of the analytic model: flops, roofline, intensity, optimal-chunk, gpus.

Thin: parse, check the options (:mod:`tflabench.analytic_inputs`), compute the rows
(:mod:`tflabench.analytic_rows`), render (rich tables or ``--json``), plot
(:mod:`tflabench.plots.analytic`, imported only when a plot is drawn).
No torch, pandas or matplotlib import on the paths that print numbers only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import List, Optional

import typer

from tflabench import analytic_inputs as inputs
from tflabench.analytic_rows import (count_row_kernel, intensity_curves, measured_points, mlstm_points,
                                     optimal_chunk_rows, peer_points, roofline_rows)
from tflabench.cli import app, user_errors
from tflabench.errors import UserError
from tflabench.model import mlstm_counts, mlstm_fwdbw_counts

# ------------------------------------------------------------------ shared option vocabulary

_H_VARIANT = "mLSTM variant: sig (sigmoid input gate) or exp (exponential input gate)."
_H_FORM = "Formulation: chunkwise (TFLA), parallel or recurrent."
_H_T = "Sequence length T (tokens)."
_H_B = "Batch size N_batch."
_H_NH = "Number of heads N_head."
_H_DHV = "Value/hidden head dimension d_hv."
_H_DQK = "Query/key head dimension d_qk (give --dqk or --pqk, not both)."
_H_PQK = "p_qk = d_qk / d_hv (default 0.5, the paper's)."
_H_STATE = "Bytes per state element C, n, m (bytes_Cmn): 4 (fp32) or 2 (bf16)."
_H_QKV = "Bytes per q, k, v, h element (bytes_qkv)."
_H_IF = "Bytes per gate pre-activation element (bytes_if)."
_H_CAUSAL = "F_causal: fraction of each L x L matrix computed, in [0.5, 1] (0.66: the paper's figures)."
_H_COUNTS = "rows: totals are the sums of the table rows (default); paper: printed Table 17 / eqs. 111-121."
_H_CEIL = "Ceilings: datasheet or measured (measured: recorded by `tflabench calibrate`)."
_H_GPU = "GPU key or name (repeat for several); see `tflabench gpus`."
_H_JSON = "Print machine-readable JSON instead of tables."
_H_HW = "YAML file adding or overriding GPUs (else $TFLABENCH_HARDWARE or ~/.config/tflabench/gpus.yaml)."
_H_OUT = "Plot file (.png, .svg, .pdf) or directory; default results/plots/<name>.png."
_H_MODE = "fwd (forward, the paper's model) or fwdbw (forward + derived backward, docs/model.md)."

DEFAULT_ROOFLINE_L = "64,128,256,512,1024,2048,4096"
DEFAULT_INTENSITY_L = "16,32,64,128,256,512,1024,2048,4096"


def _echo_json(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, default=_json_default))


def _json_default(o):
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, float) and not math.isfinite(o):
        return None
    raise TypeError(type(o).__name__)


def _console():
    from rich.console import Console

    con = Console()
    if not con.is_terminal:  # piped or captured: do not squeeze the tables into 80 columns
        con = Console(width=max(con.width, 120))
    return con


def _table(title):
    from rich import box
    from rich.table import Table

    return Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)


def _e(x) -> str:
    if x is None:
        return "-"
    return f"{x:.4g}" if abs(x) < 1e5 else f"{x:.4e}"


# ------------------------------------------------------------------ flops


@app.command()
def flops(
    variant: str = typer.Option("sig", "--variant", help=_H_VARIANT),
    formulation: str = typer.Option("chunkwise", "--formulation", help=_H_FORM),
    chunk_size: int = typer.Option(128, "--chunk-size", "-L", help="Chunk size L (chunkwise only)."),
    seq_len: int = typer.Option(8192, "--seq-len", "-T", help=_H_T),
    batch: int = typer.Option(8, "--batch", help=_H_B),
    heads: int = typer.Option(8, "--heads", help=_H_NH),
    dhv: int = typer.Option(512, "--dhv", help=_H_DHV),
    dqk: Optional[int] = typer.Option(None, "--dqk", help=_H_DQK),
    pqk: Optional[float] = typer.Option(None, "--pqk", help=_H_PQK),
    state_bytes: float = typer.Option(4, "--state-bytes", help=_H_STATE),
    qkv_bytes: float = typer.Option(2, "--qkv-bytes", help=_H_QKV),
    gate_bytes: float = typer.Option(2, "--gate-bytes", help=_H_IF),
    causal_factor: float = typer.Option(0.66, "--causal-factor", help=_H_CAUSAL),
    counts: str = typer.Option("rows", "--counts", help=_H_COUNTS),
    mode: str = typer.Option("fwd", "--mode", help=_H_MODE),
    pad: bool = typer.Option(False, "--pad", help="Allow L not dividing T: count ceil(T/L) padded chunks."),
    as_json: bool = typer.Option(False, "--json", help=_H_JSON),
) -> None:
    """FLOP and byte counts of one mLSTM configuration, by part, with intensity (paper App. F).

    Example: tflabench flops --variant exp -L 256 -T 8192 --dhv 512 --pqk 0.5
    """
    with user_errors():
        variant = inputs.one_of("--variant", variant, ("sig", "exp"))
        formulation = inputs.one_of("--formulation", formulation, ("chunkwise", "parallel", "recurrent"))
        counts = inputs.one_of("--counts", counts, ("rows", "paper"))
        mode = inputs.one_of("--mode", mode, ("fwd", "fwdbw"))
        for name, v in (("--seq-len", seq_len), ("--batch", batch), ("--heads", heads), ("--dhv", dhv),
                        ("--chunk-size", chunk_size), ("--state-bytes", state_bytes),
                        ("--qkv-bytes", qkv_bytes), ("--gate-bytes", gate_bytes)):
            inputs.positive(name, v)
        d_qk, p_qk = inputs.dqk_pqk(dhv, dqk, pqk)
        inputs.causal(causal_factor)
        inputs.counted_shape(formulation, mode, chunk_size, seq_len, pad)
        kw = dict(T=seq_len, d_hv=dhv, d_qk=d_qk, N_batch=batch, N_head=heads, F_causal=causal_factor,
                  bytes_qkv=qkv_bytes, bytes_if=gate_bytes, bytes_Cmn=state_bytes,
                  chunks="pad" if pad else "divide")
        L = chunk_size if formulation == "chunkwise" else None
        if mode == "fwd":
            c = mlstm_counts(variant, formulation, L=L, counts=counts, **kw)
        else:
            c = mlstm_fwdbw_counts(variant, L=L, counts=counts, **kw)
        config = {"variant": variant, "formulation": formulation, "mode": mode, "counts": counts,
                  "N_batch": batch, "N_head": heads, "T": seq_len, "L": L, "d_qk": d_qk, "d_hv": dhv,
                  "p_qk": p_qk, "F_causal": causal_factor, "bytes_qkv": qkv_bytes,
                  "bytes_if": gate_bytes, "bytes_Cmn": state_bytes, "pad": pad}
        if as_json:
            _echo_json({"config": config, **c.as_dict()})
            return
        _render_counts(config, c)


def _render_counts(config: dict, c) -> None:
    con = _console()
    form = config["formulation"]
    title = (f"mLSTM{config['variant']} {form} {config['mode']}: B={config['N_batch']} NH={config['N_head']} "
             f"T={config['T']}" + (f" L={config['L']}" if config["L"] else "")
             + f" d_qk={_e(config['d_qk'])} d_hv={config['d_hv']} F_causal={config['F_causal']} "
             f"counts={config['counts']}")
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


def load_rows(path):
    """The rows (DataFrame) of the result set at ``path``; UserError when it is none."""
    from tflabench.results import load_results

    return load_results(path).rows


def _measured_points(path) -> list[dict]:
    """``roofline --results``: the measured points of a result set; UserError when none is usable."""
    pts = measured_points(load_rows(path))
    if not pts:
        raise UserError(f"--results={str(path)!r} has no rows with status ok and usable flops/bytes/tflops_per_s")
    return pts


@app.command()
def roofline(
    gpu: List[str] = typer.Option(["h100"], "--gpu", help=_H_GPU),
    chunk_size: str = typer.Option(DEFAULT_ROOFLINE_L, "--chunk-size", "-L", help="Chunk sizes, comma-separated."),
    variant: str = typer.Option("sig", "--variant", help=_H_VARIANT),
    mode: str = typer.Option("fwd", "--mode", help=_H_MODE),
    seq_len: int = typer.Option(8192, "--seq-len", "-T", help=_H_T),
    batch: int = typer.Option(8, "--batch", help=_H_B),
    heads: int = typer.Option(8, "--heads", help=_H_NH),
    dhv: int = typer.Option(512, "--dhv", help=_H_DHV),
    dqk: Optional[int] = typer.Option(None, "--dqk", help=_H_DQK),
    pqk: Optional[float] = typer.Option(None, "--pqk", help=_H_PQK),
    state_bytes: float = typer.Option(4, "--state-bytes", help=_H_STATE),
    qkv_bytes: float = typer.Option(2, "--qkv-bytes", help=_H_QKV),
    causal_factor: float = typer.Option(0.66, "--causal-factor", help=_H_CAUSAL),
    counts: str = typer.Option("rows", "--counts", help=_H_COUNTS),
    ceilings: str = typer.Option("datasheet", "--ceilings", help=_H_CEIL),
    peers: bool = typer.Option(False, "--peers", help="Also place FlashAttention, simple GLA and Mamba 2 SSD (same B, T)."),
    results: Optional[Path] = typer.Option(
        None, "--results", help="Result set whose measured rows to place, each at its own shape, on the first "
        "--gpu's roofline (a second figure, *_measured.png, and a distance-to-the-bound table)."),
    plot: bool = typer.Option(True, "--plot/--no-plot", help="Draw the figure (default on)."),
    out: Optional[Path] = typer.Option(None, "--out", help=_H_OUT),
    hardware: Optional[Path] = typer.Option(None, "--hardware", help=_H_HW),
    as_json: bool = typer.Option(False, "--json", help=_H_JSON),
) -> None:
    """Roofline (eq. 119) of TFLA's chunkwise kernel for chunk sizes, optionally with measured points.

    Defaults: the paper's roofline figure (mLSTMsig, d_hv 512, p_qk 0.5, B 8, NH 8, T 8192, F_causal 0.66).

    Example: tflabench roofline --gpu h100 --gpu h200 -L 64,128,256 --results results/h100_7b/latest
    """
    with user_errors():
        variant = inputs.one_of("--variant", variant, ("sig", "exp"))
        mode = inputs.one_of("--mode", mode, ("fwd", "fwdbw"))
        counts = inputs.one_of("--counts", counts, ("rows", "paper"))
        Ls = inputs.parse_list("--chunk-size", chunk_size, int)
        for name, v in (("--seq-len", seq_len), ("--batch", batch), ("--heads", heads), ("--dhv", dhv),
                        ("--state-bytes", state_bytes), ("--qkv-bytes", qkv_bytes)):
            inputs.positive(name, v)
        if chunk_size == DEFAULT_ROOFLINE_L:  # defaults longer than the sequence: drop, not an error
            Ls = [L for L in Ls if L <= seq_len] or [seq_len]
        for L in Ls:
            inputs.positive("--chunk-size", L)
        d_qk, p_qk = inputs.dqk_pqk(dhv, dqk, pqk)
        inputs.causal(causal_factor)
        gpus = inputs.gpus(gpu, ceilings, hardware)
        pts = mlstm_points(variant, mode, Ls, T=seq_len, batch=batch, heads=heads, dhv=dhv, d_qk=d_qk,
                            F_causal=causal_factor, bytes_qkv=qkv_bytes, bytes_if=qkv_bytes,
                            bytes_Cmn=state_bytes, counts=counts)
        peer_pts = (peer_points(mode, T=seq_len, batch=batch, heads=heads, dhv=dhv, d_qk=d_qk,
                                 F_causal=causal_factor, bytes_qkv=qkv_bytes) if peers else [])
        measured = _measured_points(results) if results is not None else []
        table = roofline_rows(gpus, pts + peer_pts)
        placement, distance = [], []
        if measured:  # each measured row against its own bound, on the first GPU's roofline
            from tflabench.model_vs_measured import distance_to_bound, roofline_placement

            placement = roofline_placement(load_rows(results), alpha=gpus[0].flops_per_s,
                                           beta=gpus[0].bytes_per_s)
            distance = distance_to_bound(placement)
        path = measured_path = None
        if plot:
            from tflabench.plots import plot_path
            from tflabench.plots.analytic import roofline_figure

            name = f"roofline_{'_'.join(g.key for g in gpus)}_{variant}_{mode}.png"
            path = roofline_figure(
                gpus, pts, path=plot_path(out, name), peer_points=peer_pts,
                title=(f"Roofline, mLSTM{variant} chunkwise {mode} (d_hv={dhv}, p_qk={p_qk:g}, "
                       f"F_causal={causal_factor}, bytes_Cmn={state_bytes:g}, {ceilings} ceilings)"),
            )
            if placement:
                from tflabench.plots.model_measured import roofline_measured_figure

                measured_path = roofline_measured_figure(
                    placement, gpus[0], path=path.with_name(f"{path.stem}_measured{path.suffix}"),
                    title=(f"{results}: every case against the {gpus[0].name} roofline at its own shape "
                           f"({gpus[0].ceilings} ceilings)"))
        if as_json:
            _echo_json({
                "config": {"variant": variant, "mode": mode, "counts": counts, "T": seq_len, "N_batch": batch,
                           "N_head": heads, "d_hv": dhv, "d_qk": d_qk, "p_qk": p_qk, "F_causal": causal_factor,
                           "bytes_Cmn": state_bytes, "bytes_qkv": qkv_bytes, "ceilings": ceilings},
                "gpus": [g.as_dict() for g in gpus],
                "points": table,
                "measured": measured,
                "placement": placement,
                "distance_to_bound": distance,
                "plot": str(path) if path else None,
                "measured_plot": str(measured_path) if measured_path else None,
            })
            return
        con = _console()
        for g in gpus:
            t = _table(f"{g.name}: {g.flops_per_s / 1e12:.0f} TFLOP/s, {g.bytes_per_s / 1e12:.3g} TB/s, "
                            f"I_acc {g.intensity_flop_per_byte:.1f} FLOP/byte ({g.ceilings})")
            for col in ("point", "FLOPs", "bytes", "I", "TFLOP/s", "bound", "ms max", "ms sum"):
                t.add_column(col, justify="left" if col in ("point", "bound") else "right")
            for r in (r for r in table if r["gpu"] == g.key):
                t.add_row(r["label"], f"{r['flops']:.3e}", f"{r['bytes']:.3e}",
                          f"{r['intensity_flop_per_byte']:.1f}", f"{r['attainable_tflops_per_s']:.1f}",
                          r["bound"], f"{r['roofline_ms']:.3f}", f"{r['sum_form_ms']:.3f}")
            con.print(t)
        con.print("[dim]I: FLOP/byte (eq. 117); TFLOP/s: attainable, min(beta*I, alpha) (eq. 119); "
                  "ms max: roofline bound FLOPs/attainable = max form (eq. 114); ms sum: eq. 113/116[/dim]")
        if measured:
            con.print(f"{len(measured)} measured points from {results}, each placed at its own shape "
                      f"on the {gpus[0].name} roofline ({gpus[0].ceilings} ceilings):")
            from tflabench.tables import distance_table

            con.print(distance_table(distance))
        if path:
            con.print(f"plot: {path}")
        if measured_path:
            con.print(f"plot: {measured_path}")


# ------------------------------------------------------------------ intensity


@app.command()
def intensity(
    gpu: List[str] = typer.Option(["v100", "a100", "h100", "b200"], "--gpu", help=_H_GPU),
    chunk_size: str = typer.Option(DEFAULT_INTENSITY_L, "--chunk-size", "-L",
                                   help="Chunk sizes for the table, comma-separated."),
    variant: str = typer.Option("sig", "--variant", help=_H_VARIANT),
    seq_len: int = typer.Option(8192, "--seq-len", "-T", help=_H_T),
    dhv: int = typer.Option(512, "--dhv", help=_H_DHV),
    dqk: Optional[int] = typer.Option(None, "--dqk", help=_H_DQK),
    pqk: Optional[float] = typer.Option(None, "--pqk", help=_H_PQK),
    state_bytes: str = typer.Option("4,2", "--state-bytes", help="State bytes, comma-separated (4: float32, 2: bfloat16)."),
    causal_factor: str = typer.Option("0.66", "--causal-factor", help="F_causal values, comma-separated, in [0.5, 1]."),
    counts: str = typer.Option("rows", "--counts", help=_H_COUNTS),
    ceilings: str = typer.Option("datasheet", "--ceilings", help=_H_CEIL),
    plot: bool = typer.Option(True, "--plot/--no-plot", help="Draw the figure (default on)."),
    out: Optional[Path] = typer.Option(None, "--out", help=_H_OUT),
    hardware: Optional[Path] = typer.Option(None, "--hardware", help=_H_HW),
    as_json: bool = typer.Option(False, "--json", help=_H_JSON),
) -> None:
    """Arithmetic intensity over chunk size (eq. 118) for float32 and bfloat16 states, with GPUs' I_acc.

    Also gives the chunk size where the kernel turns compute-bound on each GPU (I_algo = I_acc).

    Example: tflabench intensity --dhv 512 --state-bytes 4,2 --causal-factor 0.5,0.66,1
    """
    with user_errors():
        variant = inputs.one_of("--variant", variant, ("sig", "exp"))
        counts = inputs.one_of("--counts", counts, ("rows", "paper"))
        Ls = inputs.parse_list("--chunk-size", chunk_size, int)
        sbs = inputs.parse_list("--state-bytes", state_bytes)
        fcs = inputs.parse_list("--causal-factor", causal_factor)
        for name, v in (("--seq-len", seq_len), ("--dhv", dhv)):
            inputs.positive(name, v)
        if chunk_size == DEFAULT_INTENSITY_L:  # defaults longer than the sequence: drop, not an error
            Ls = [L for L in Ls if L <= seq_len] or [seq_len]
        for L in Ls:
            inputs.positive("--chunk-size", L)
            inputs.chunk_at_most(L, seq_len)
        for s in sbs:
            inputs.positive("--state-bytes", s)
        for f in fcs:
            inputs.causal(f)
        d_qk, p_qk = inputs.dqk_pqk(dhv, dqk, pqk)
        gpus = inputs.gpus(gpu, ceilings, hardware)
        curves = intensity_curves(variant, Ls, state_bytes=sbs, causal_factors=fcs, d_hv=dhv, d_qk=d_qk,
                                  counts=counts, gpus=gpus)
        path = None
        if plot:
            from tflabench.plots import plot_path
            from tflabench.plots.analytic import intensity_figure

            path = intensity_figure(
                curves, gpus, T=seq_len, path=plot_path(out, f"intensity_{variant}_dhv{dhv}.png"),
                title=f"Arithmetic intensity of mLSTM{variant} chunkwise (d_hv={dhv}, p_qk={p_qk:g}, {ceilings} ceilings)",
            )
        if as_json:
            _echo_json({
                "config": {"variant": variant, "counts": counts, "d_hv": dhv, "d_qk": d_qk, "p_qk": p_qk,
                           "T": seq_len, "ceilings": ceilings},
                "gpus": [g.as_dict() for g in gpus],
                "curves": [{**c, "intensity": {str(k): v for k, v in c["intensity"].items()}} for c in curves],
                "plot": str(path) if path else None,
            })
            return
        con = _console()
        t = _table(f"I_algo (FLOP/byte) over chunk size L, mLSTM{variant} chunkwise, d_hv={dhv}, "
                        f"p_qk={p_qk:g} (eq. 118)")
        t.add_column("states, F_c")
        for L in Ls:
            t.add_column(f"{L}", justify="right")
        for c in curves:
            t.add_row(c["label"], *(f"{c['intensity'][L]:.1f}" for L in Ls))
        con.print(t)
        x = _table("chunk size L where I_algo = I_acc (compute-bound above)")
        x.add_column("states, F_c")
        for g in gpus:
            x.add_column(f"{g.key} ({g.intensity_flop_per_byte:.1f})", justify="right")
        for c in curves:
            x.add_row(c["label"], *(f"{c['L_at_I_acc'][g.key]:.1f}" for g in gpus))
        con.print(x)
        if path:
            con.print(f"plot: {path}")


# ------------------------------------------------------------------ optimal-chunk


@app.command("optimal-chunk")
def optimal_chunk(
    dhv: str = typer.Option("512", "--dhv", help="d_hv values, comma-separated (one with --measure)."),
    gpu: Optional[List[str]] = typer.Option(
        None, "--gpu", help=_H_GPU + " Default h100; with --measure the GPU measured on."),
    variant: str = typer.Option("sig", "--variant", help=_H_VARIANT),
    dqk: Optional[int] = typer.Option(None, "--dqk", help=_H_DQK),
    pqk: Optional[float] = typer.Option(None, "--pqk", help=_H_PQK),
    state_bytes: float = typer.Option(4, "--state-bytes", help=_H_STATE),
    qkv_bytes: float = typer.Option(2, "--qkv-bytes", help=_H_QKV),
    causal_factor: float = typer.Option(0.66, "--causal-factor", help=_H_CAUSAL),
    counts: str = typer.Option("rows", "--counts", help=_H_COUNTS),
    ceilings: Optional[str] = typer.Option(
        None, "--ceilings", help=_H_CEIL + " Default datasheet; with --measure auto (measured where recorded)."),
    seq_len: int = typer.Option(8192, "--seq-len", "-T", help=_H_T + " (for the predicted runtime; caps L)"),
    batch: int = typer.Option(8, "--batch", help=_H_B + " (for the predicted runtime)"),
    heads: int = typer.Option(8, "--heads", help=_H_NH + " (for the predicted runtime)"),
    plot: bool = typer.Option(False, "--plot", help="Draw the optimum over d_hv and over accelerator intensity."),
    out: Optional[Path] = typer.Option(None, "--out", help=_H_OUT),
    hardware: Optional[Path] = typer.Option(None, "--hardware", help=_H_HW),
    as_json: bool = typer.Option(False, "--json", help=_H_JSON),
    measure: bool = typer.Option(
        False, "--measure", help="On a GPU: sweep the chunk size of a kernel through `run`'s machinery "
        "(isolated workers, warm-up, numerics gate) and compare the measured optimum with the model's."),
    kernel: Optional[List[str]] = typer.Option(
        None, "--kernel", help="With --measure (repeatable): ours (default), mlstm_kernels, or a custom "
        "kernel module:function / path/file.py:function taking chunk_size=."),
    chunk_sizes: str = typer.Option(
        "64,128,256,512,1024", "--chunk-size", "-L", help="With --measure: chunk sizes swept, comma-separated."),
    modes: str = typer.Option("fwd,fwdbw", "--modes", help="With --measure: fwd, fwdbw or both."),
    dtype: str = typer.Option("bfloat16", "--dtype", help="With --measure: input dtype."),
    warmup: int = typer.Option(10, "--warmup", help="With --measure: untimed calls per case."),
    iterations: int = typer.Option(30, "--iterations", help="With --measure: timed calls per case."),
    results_root: Path = typer.Option(
        Path("results"), "--results-root", help="With --measure: root of the result set "
        "(ROOT/<sweep name>/<timestamp>/; the suite file in ROOT/suites/)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="With --measure: progress bar."),
) -> None:
    """FLOP-optimal (eq. 111) and runtime-optimal (eq. 121) chunk size, continuous and best power of two.

    Runtime is the paper's sum form (eq. 116); the max form (eq. 114) optimum is shown too.
    With --measure (GPU only) the chunk size is swept on the GPU and the measured optimum,
    the measured/model time ratio per L and the peak memory are shown beside the model's.

    Example: tflabench optimal-chunk --dhv 512 --gpu h100 --gpu h200 --state-bytes 2

    Example: tflabench optimal-chunk --measure --kernel ours --kernel mlstm_kernels --dhv 512 --heads 8 --dqk 256
    """
    if measure:
        _optimal_chunk_measure(
            dhv=dhv, gpu=gpu, variant=variant, dqk=dqk, pqk=pqk, state_bytes=state_bytes,
            causal_factor=causal_factor, counts=counts, ceilings=ceilings or "auto", seq_len=seq_len,
            batch=batch, heads=heads, out=out, hardware=hardware, as_json=as_json, kernel=kernel or ["ours"],
            chunk_sizes=chunk_sizes, modes=modes, dtype=dtype, warmup=warmup, iterations=iterations,
            results_root=results_root, progress=progress)
        return
    gpu = gpu or ["h100"]
    ceilings = ceilings or "datasheet"
    with user_errors():
        variant = inputs.one_of("--variant", variant, ("sig", "exp"))
        counts = inputs.one_of("--counts", counts, ("rows", "paper"))
        dhvs = inputs.parse_list("--dhv", dhv, int)
        for d in dhvs:
            inputs.positive("--dhv", d)
        for name, v in (("--seq-len", seq_len), ("--batch", batch), ("--heads", heads),
                        ("--state-bytes", state_bytes), ("--qkv-bytes", qkv_bytes)):
            inputs.positive(name, v)
        inputs.dqk_pqk(dhvs[0], dqk, pqk)   # --dqk or --pqk, valid
        inputs.causal(causal_factor)
        gpus = inputs.gpus(gpu, ceilings, hardware)
        rows = optimal_chunk_rows(variant, gpus, dhvs, d_qk=dqk, p_qk=pqk, F_causal=causal_factor,
                                  bytes_qkv=qkv_bytes, bytes_Cmn=state_bytes, counts=counts, batch=batch,
                                  heads=heads, T=seq_len)
        path = None
        if plot:
            from tflabench.plots import plot_path
            from tflabench.plots.analytic import optimal_chunk_figure

            p = (dqk / dhvs[0]) if dqk is not None else (pqk if pqk is not None else 0.5)
            path = optimal_chunk_figure(
                gpus, variant=variant, p_qk=p, F_causal=causal_factor, bytes_Cmn=state_bytes,
                counts=counts, path=plot_path(out, f"optimal_chunk_{variant}.png"),
            )
        if as_json:
            _echo_json({"results": rows, "plot": str(path) if path else None})
            return
        con = _console()
        t = _table((f"Optimal chunk size, mLSTM{variant} chunkwise forward (F_causal={causal_factor}, "
                         f"bytes_Cmn={state_bytes:g}, counts={counts}, {ceilings} ceilings; runtime for "
                         f"B={batch}, NH={heads}, T={seq_len})"))
        for col in ("GPU", "I_acc", "d_hv", "d_qk", "L_flop", "L_runtime", "numeric", "best 2^k",
                    "ms at 2^k", "L_max"):
            t.add_column(col, justify="left" if col == "GPU" else "right")
        for r in rows:
            t.add_row(r["gpu"], f"{r['I_acc']:.1f}", str(r["d_hv"]), f"{r['d_qk']:g}",
                      f"{r['L_opt_flop']:.2f}", f"{r['L_opt_runtime']:.2f}",
                      f"{r['L_opt_runtime_numeric']:.2f}", str(r["L_pow2_runtime"]),
                      f"{r['runtime_ms_pow2']:.3f}", f"{r['L_opt_runtime_max']:.1f}")
        con.print(t)
        con.print("[dim]L_flop: FLOP-optimal, eq. 111; L_runtime: runtime-optimal (sum form), eq. 121; "
                  "numeric: golden-section argmin of the runtime; best 2^k and its predicted ms "
                  "(sum form, eq. 116); L_max: argmin of the max form (eq. 114), the ridge crossing[/dim]")
        if path:
            con.print(f"plot: {path}")


def _optimal_chunk_measure(*, dhv, gpu, variant, dqk, pqk, state_bytes, causal_factor, counts, ceilings,
                           seq_len, batch, heads, out, hardware, as_json, kernel, chunk_sizes, modes, dtype,
                           warmup, iterations, results_root, progress) -> None:
    """optimal-chunk --measure: validate, refuse without a GPU, run the sweep, show model vs measured."""
    with user_errors():
        from tflabench import chunk_measure as cm

        variant = inputs.one_of("--variant", variant, ("sig", "exp"))
        counts = inputs.one_of("--counts", counts, ("rows", "paper"))
        inputs.one_of("--ceilings", ceilings, ("auto", "datasheet", "measured"))
        dhvs = inputs.parse_list("--dhv", dhv, int)
        if len(dhvs) != 1:
            raise UserError(f"--dhv={dhv!r}: --measure sweeps one shape; give one d_hv")
        d_hv = dhvs[0]
        inputs.positive("--dhv", d_hv)
        inputs.positive("--state-bytes", state_bytes)
        d_qk, _ = inputs.dqk_pqk(d_hv, dqk, pqk)
        if float(d_qk) != int(d_qk):
            raise UserError(f"--pqk={pqk!r} gives d_qk={d_qk} (not an integer); give --dqk")
        inputs.causal(causal_factor)
        spec = cm.SweepSpec(
            kernels=list(kernel), variant=variant, batch=batch, seq_len=seq_len, heads=heads, d_qk=int(d_qk),
            d_hv=d_hv, chunk_sizes=tuple(inputs.parse_list("--chunk-size", chunk_sizes, int)),
            modes=tuple(m.strip() for m in modes.split(",") if m.strip()), dtype=dtype, warmup=warmup,
            iterations=iterations).validate()
        if gpu and len(gpu) > 1:
            raise UserError("--gpu: --measure compares with one GPU's model; give one --gpu (or none: the GPU measured on)")
        cm.require_gpu()
        import signal

        def _term(signum, frame):  # a device job's time limit sends SIGTERM: stop like Ctrl-C
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, _term)
        try:
            result, rs = cm.measure_chunk_sweep(spec, out_root=results_root, device="cuda", progress=progress)
        except KeyboardInterrupt:
            typer.echo("interrupted: the rows measured so far are kept in the result set named above "
                       "('writing to DIR'); `tflabench report DIR` compares them with the model", err=True)
            raise typer.Exit(130) from None
        finally:
            signal.signal(signal.SIGTERM, previous)
        from tflabench.cli.run_cmds import _write_run_plots

        _show_measured_sweep(rs, _write_run_plots(result.directory), gpu=gpu[0] if gpu else None, ceilings=ceilings, hardware=hardware,
                             F_causal=causal_factor, counts=counts, bytes_Cmn=state_bytes, out=out,
                             as_json=as_json)


def _show_measured_sweep(rs, run_plots, *, gpu, ceilings, hardware, F_causal, counts, bytes_Cmn, out, as_json):
    """Render a measured chunk-size sweep: per-L table, optima, figure (CLI helper);
    ``run_plots``: the run's own figures (None: none drawn)."""
    from tflabench import model_vs_measured as mm

    g = mm.ceilings_for(rs.metadata, ceilings, gpu, hardware_file=hardware)
    sweeps = mm.chunk_sweeps(rs.rows, alpha=g.flops_per_s, beta=g.bytes_per_s, ceilings=g.ceilings,
                             F_causal=F_causal, counts=counts, bytes_Cmn=bytes_Cmn)
    path = None
    if sweeps and out is not None:
        from tflabench.plots import plot_path
        from tflabench.plots.model_measured import chunk_sweep_figure

        path = chunk_sweep_figure(sweeps, path=plot_path(out, "optimal_chunk_measured.png"),
                                  title=f"{rs.metadata.get('suite')} on {rs.metadata.get('gpu_name')}")
    figures = [str(p) for p in (run_plots or [])] + ([str(path)] if path else [])
    if as_json:
        _echo_json({"results": str(rs.path), "gpu": g.as_dict(), "sweeps": [s.as_dict() for s in sweeps],
                    "plots": figures})
        return
    con = _console()
    con.print(f"model: {mm.model_ceilings_text(g)}")
    if not sweeps:
        con.print("[yellow]no chunk size measured ok at two or more values: nothing to compare[/]; "
                  f"see the rows in {rs.path}")
    for s in sweeps:
        t = _table(f"{s.title()}: measured optimum L={s.measured_L_opt}, model L={s.optima['L_opt_runtime']:.0f} "
                   f"(runtime-optimal), {s.optima['L_opt_flop']:.1f} (FLOP-optimal); {s.optima['source']}")
        for col in ("L", "measured ms", "model ms (sum)", "bound ms (max)", "measured / model", "peak GiB"):
            t.add_column(col, justify="right")
        for p in s.points:
            t.add_row(str(p["L"]), f"{p['ms_median']:.3f}", f"{p['model_ms_sum']:.3f}", f"{p['model_ms_max']:.3f}",
                      f"{p['ratio_sum']:.2f}", "-" if p["peak_mem_bytes"] is None else f"{p['peak_mem_bytes'] / 2**30:.2f}")
        con.print(t)
    con.print(f"results: {rs.path}")
    for f in figures:
        con.print(f"plot: {f}")


# ------------------------------------------------------------------ gpus


@app.command()
def gpus(
    ceilings: str = typer.Option("datasheet", "--ceilings", help=_H_CEIL),
    hardware: Optional[Path] = typer.Option(None, "--hardware", help=_H_HW),
    as_json: bool = typer.Option(False, "--json", help=_H_JSON),
) -> None:
    """The GPU catalogue: dense bf16 FLOP/s, HBM bandwidth, intensity, measured ceilings, sources.

    Example: tflabench gpus --hardware my_gpus.yaml --json
    """
    with user_errors():
        from tflabench.hardware import list_gpus

        ceilings = inputs.one_of("--ceilings", ceilings, ("datasheet", "measured"))
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
            t.add_row(g.key, g.name, str(g.year or "-"),
                      _e(g.datasheet_flops_per_s / 1e12) if g.datasheet_flops_per_s else "-",
                      _e(g.datasheet_bytes_per_s / 1e12) if g.datasheet_bytes_per_s else "-",
                      f"{g.intensity_flop_per_byte:.1f}" + ("*" if g.ceilings == "measured" else ""),
                      _e(g.measured_flops_per_s / 1e12) if g.measured_flops_per_s else "-",
                      _e(g.measured_bytes_per_s / 1e12) if g.measured_bytes_per_s else "-",
                      ",".join(str(sources.index(s) + 1) for s in (g.source, g.measured_note) if s))
        con = _console()
        con.print(t)
        con.print("TFLOP/s: dense bf16; TB/s: HBM bandwidth; I_acc = alpha/beta in FLOP/byte"
                  + (" (* from measured ceilings)" if ceilings == "measured" else ""))
        for i, s in enumerate(sources, 1):
            con.print(f"[{i}] {s}", markup=False, highlight=False)
