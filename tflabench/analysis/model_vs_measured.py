"""Where the analytic model meets the measurement: chunk-size sweeps, per-shape roofline
placement and the distance of every result row to its own bound.

Three computations, each on result rows (:attr:`tflabench.store.results.ResultSet.rows`, or a list
of row dicts) and one GPU's ceilings ``peak_flops_per_s`` (FLOP/s) and ``beta`` (byte/s):

- :func:`chunk_sweeps` / :func:`analyse_chunk_sweep`: a chunked mLSTM kernel measured at
  several chunk sizes L at one shape and mode, beside the model's runtime curve (paper
  eq. 116: sum form of Tables 8/9 for the forward; the derived backward of docs/model.md
  for ``fwdbw``) and the model's optima (eq. 111 FLOP-optimal, eq. 121 runtime-optimal,
  §4.7 max-form optimum); the measured optimum is the L of the lowest median time.
- :func:`roofline_placement`: every ``ok`` row placed against the roofline at its *own*
  shape: its model FLOPs and bytes (the row's ``flops``/``bytes`` columns, computed at the
  row's shape by :func:`tflabench.model.counts_for_case`; an mLSTM row of ``chunk_size:
  auto`` counted again at the chunk size that ran), its intensity, the attainable
  FLOP/s there (eq. 119) and the fraction of it achieved (= ``roofline_fraction``).
- :func:`distance_to_bound`: per kernel and mode, the median, worst and best fraction.

No torch is imported; pandas only to read a DataFrame when one is given. Units are in the
names (``ms``, ``flops_per_s``, ``bytes``); L is in tokens.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable

from tflabench import hardware
from tflabench.errors import UserError
from tflabench.model import (SHAPE_SYMBOLS, WALK_ALGORITHMS, counts_for_case, mlstm_counts, mlstm_fwdbw_counts, place_on_roofline,
                             plan_counts_kwargs, runtime)
from tflabench.model.analysis import golden_min, optimal_chunk
from tflabench.store.schema import chunk_size_ran, number, row_params
from tflabench.text_safety import case_label

#: Families whose chunk-size sweeps the mLSTM model describes (backend family ``mlstm``).
MODEL_FAMILIES = ("mlstm",)
#: Identity of one sweep: everything but the chunk size.
SWEEP_KEYS = ("kernel", "mode", "dtype", "batch", "seq_len", "heads", "d_qk", "d_hv")
#: A point is an outlier of its kernel when its fraction of the bound differs from the
#: kernel's (and mode's) median by more than this factor.
OUTLIER_FACTOR = 1.25


# ------------------------------------------------------------------ rows


def _records(rows) -> list[dict]:
    """Row dicts from a DataFrame, a list of dicts or a ResultSet."""
    if hasattr(rows, "rows"):
        rows = rows.rows
    if hasattr(rows, "to_dict"):
        return rows.to_dict("records")
    return [dict(r) for r in rows]


def row_variant(row: dict) -> str | None:
    """``sig`` / ``exp`` for an mLSTM row (family ``mlstm``, or a ``custom`` kernel with
    ``layout: mlstm``; its params' ``variant``, default ``sig``), else None."""
    p = row_params(row)
    family = row.get("family")
    if family not in MODEL_FAMILIES and not (family == "custom" and p.get("layout", "mlstm") == "mlstm"):
        return None
    v = p.get("variant", "sig")
    return v if v in ("sig", "exp") else None


def row_kernel_split(row: dict) -> str:
    """``limit_chunk`` for a row of a one-level limit_chunk kernel (its params' ``algorithm``),
    else ``xl_chunk`` (the backward model's kernel split, docs/model.md)."""
    return "limit_chunk" if row_params(row).get("algorithm") == "limit_chunk" else "xl_chunk"


# ------------------------------------------------------------------ the model at one shape


def model_counts_at(variant: str, mode: str, L: float, *, batch, seq_len, heads, d_qk, d_hv,
                    F_causal=0.66, bytes_qkv=2, bytes_Cmn=4, counts="rows", chunks="pad",
                    kernel_split="xl_chunk"):
    """Model FLOPs and HBM bytes of one chunkwise mLSTM call at chunk size ``L``.

    Forward: paper Tables 8/9 (``counts`` rows|paper); ``fwdbw``: forward + the derived
    backward (docs/model.md; ``kernel_split`` ``xl_chunk`` or ``limit_chunk``). ``chunks="pad"`` counts ``ceil(S/L)`` chunks
    (what a kernel executes; equal to ``S/L`` when L divides S), ``"real"`` uses ``S/L``
    for the continuous curves. Returns :class:`tflabench.model.Counts`.

    Raises:
        UserError: bad sizes, variant or mode (from :mod:`tflabench.model`).
    """
    kw = dict(S=seq_len, d_hv=d_hv, L=min(L, seq_len), d_qk=d_qk, B=batch, NH=heads,
              F_causal=F_causal, bytes_qkv=bytes_qkv, bytes_if=bytes_qkv, bytes_Cmn=bytes_Cmn,
              counts=counts, chunks=chunks)
    if mode == "fwd":
        return mlstm_counts(variant, "chunkwise", **kw)
    if mode == "fwdbw":
        return mlstm_fwdbw_counts(variant, kernel_split=kernel_split, **kw)
    raise UserError(f"mode={mode!r} is not valid; allowed: fwd|fwdbw")


def model_ms(counts, peak_flops_per_s, beta, combine="sum") -> float:
    """Theoretical runtime in ms of ``counts`` (paper eqs. 112-114: ``sum`` no overlap,
    ``max`` perfect overlap = the roofline bound). peak_flops_per_s FLOP/s, beta byte/s."""
    return runtime(counts.flops, counts.bytes, peak_flops_per_s, beta, combine) * 1e3


def model_optima(variant: str, mode: str, *, batch, seq_len, heads, d_qk, d_hv, peak_flops_per_s, beta,
                 F_causal=0.66, bytes_qkv=2, bytes_Cmn=4, counts="rows", kernel_split="xl_chunk") -> dict:
    """The model's optimal chunk sizes at one shape (tokens, real numbers, clamped to [1, S]).

    Forward: ``L_opt_flop`` (eq. 111), ``L_opt_runtime`` (eq. 121, sum form),
    ``L_opt_runtime_max`` (argmin of the max form, §4.7; the ridge crossing) in closed form
    (:func:`tflabench.model.analysis.optimal_chunk`). ``fwdbw``: the same three found by
    golden-section search on the forward+backward counts (derived; the paper models the
    forward only). Also ``I_acc`` and ``source`` (which equations).
    """
    S = float(seq_len)
    if mode == "fwd":
        r = optimal_chunk(variant, peak_flops_per_s=peak_flops_per_s, beta=beta, d_hv=d_hv, d_qk=d_qk, F_causal=F_causal,
                          bytes_qkv=bytes_qkv, bytes_if=bytes_qkv, bytes_Cmn=bytes_Cmn, counts=counts,
                          B=batch, NH=heads, S=seq_len)
        out = {k: min(max(r[k], 1.0), S) for k in ("L_opt_flop", "L_opt_runtime", "L_opt_runtime_max")}
        out["source"] = "eq. 111 / eq. 121 / §4.7 (closed forms, forward)"
    else:
        def c(L):
            return model_counts_at(variant, mode, L, batch=batch, seq_len=seq_len, heads=heads, d_qk=d_qk,
                                   d_hv=d_hv, F_causal=F_causal, bytes_qkv=bytes_qkv, bytes_Cmn=bytes_Cmn,
                                   counts=counts, chunks="real", kernel_split=kernel_split)

        out = {
            "L_opt_flop": golden_min(lambda L: c(L).flops, 1.0, S),
            "L_opt_runtime": golden_min(lambda L: model_ms(c(L), peak_flops_per_s, beta, "sum"), 1.0, S),
            "L_opt_runtime_max": golden_min(lambda L: model_ms(c(L), peak_flops_per_s, beta, "max"), 1.0, S),
            "source": "numeric argmin of the forward+backward model (derived, docs/model.md)",
        }
    out["I_acc"] = peak_flops_per_s / beta
    return out


# ------------------------------------------------------------------ chunk-size sweeps


@dataclasses.dataclass
class ChunkSweep:
    """One kernel measured over chunk sizes at one shape and mode, with the model beside it.

    Attributes:
        kernel, backend, mode, dtype, variant: identity (variant ``sig``/``exp``).
        shape: ``batch``, ``seq_len``, ``heads``, ``d_qk``, ``d_hv``.
        points: one dict per measured L, ascending: ``L``, ``ms_median`` (measured),
            ``peak_mem_bytes``, ``model_ms_sum`` (eq. 116 / sum form), ``model_ms_max``
            (roofline bound, eq. 114), ``ratio_sum`` = measured / model_ms_sum,
            ``ratio_max`` = measured / model_ms_max.
        measured_L_opt, measured_ms_opt: the L of the lowest median time and that time.
        optima: :func:`model_optima` (``L_opt_flop``, ``L_opt_runtime``, ``L_opt_runtime_max``).
        model_L_pow2: the measured L (of those swept) the model's sum form ranks fastest.
        peak_flops_per_s, beta, ceilings: the ceilings the model used (FLOP/s, byte/s, their name).
        F_causal, counts: model options.
    """

    kernel: str
    backend: str
    mode: str
    dtype: str
    variant: str
    shape: dict
    points: list[dict]
    measured_L_opt: int
    measured_ms_opt: float
    optima: dict
    model_L_pow2: int
    peak_flops_per_s: float
    beta: float
    ceilings: str
    F_causal: float
    counts: str
    bytes_Cmn: float = 4
    kernel_split: str = "xl_chunk"

    def model_curve(self, Ls: Iterable[float], combine="sum") -> list[float]:
        """Model runtime (ms) at real chunk sizes ``Ls`` (N_c = S/L), for drawing."""
        return [model_ms(model_counts_at(self.variant, self.mode, L, **self.shape, F_causal=self.F_causal,
                                         counts=self.counts, chunks="real", bytes_Cmn=self.bytes_Cmn,
                                         kernel_split=self.kernel_split), self.peak_flops_per_s, self.beta, combine)
                for L in Ls]

    def title(self) -> str:
        s = self.shape
        return (f"{self.kernel} {self.mode}: B={s['batch']} S={s['seq_len']} NH={s['heads']} "
                f"d_qk={s['d_qk']} d_hv={s['d_hv']} {self.dtype}")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def chunk_sweeps(rows, *, peak_flops_per_s, beta, ceilings="datasheet", F_causal=0.66, counts="rows",
                 bytes_Cmn=4) -> list[ChunkSweep]:
    """Every chunk-size sweep of an mLSTM kernel in ``rows``, analysed against the model.

    A sweep is the ``ok`` rows with a ``ms_median`` that share :data:`SWEEP_KEYS` and have
    more than one distinct chunk size that ran (``chunk_size_run``), of family ``mlstm`` (the model covers chunkwise
    mLSTM only). Rows of other families are skipped. See :class:`ChunkSweep`.

    Args:
        rows: result rows (DataFrame, list of dicts or ResultSet).
        peak_flops_per_s, beta: ceilings in FLOP/s and byte/s (e.g. the GPU's measured ones).
        F_causal: fraction of each L×L tile the model counts (0.66: the paper's figures).
        counts: ``rows`` or ``paper`` (Table 17 / eq. 116 exactly).
        bytes_Cmn: bytes per state element (4: float32 states, as the TFLA kernels).
    """
    groups: dict[tuple, list[dict]] = {}
    for r in _records(rows):
        if r.get("status") != "ok" or number(r.get("ms_median")) is None or chunk_size_ran(r) is None:
            continue
        if row_variant(r) is None or row_params(r).get("chunk_size") == "auto":
            continue      # auto's row is no point of the sweep (tflabench.analysis.chunk_rule)
        groups.setdefault(tuple(r.get(k) for k in SWEEP_KEYS), []).append(r)
    out = []
    for key, group in groups.items():
        by_L: dict[int, dict] = {}
        for r in group:  # one row per L that ran (the last one wins, as rows.jsonl's later rows)
            by_L[int(chunk_size_ran(r))] = r
        if len(by_L) < 2:
            continue
        first = group[0]
        shape = {k: int(first[k]) for k in ("batch", "seq_len", "heads", "d_qk", "d_hv")}
        out.append(analyse_chunk_sweep(
            [by_L[L] for L in sorted(by_L)], variant=row_variant(first), peak_flops_per_s=peak_flops_per_s, beta=beta,
            ceilings=ceilings, F_causal=F_causal, counts=counts, bytes_Cmn=bytes_Cmn, shape=shape))
    out.sort(key=lambda s: (s.shape["d_hv"], s.shape["seq_len"], s.mode, s.kernel))
    return out


def analyse_chunk_sweep(rows: list[dict], *, variant: str, peak_flops_per_s, beta, shape: dict, ceilings="datasheet",
                        F_causal=0.66, counts="rows", bytes_Cmn=4) -> ChunkSweep:
    """One sweep: ``rows`` of one kernel, mode and shape, one per chunk size (see
    :func:`chunk_sweeps`). Raises UserError when fewer than two chunk sizes are given."""
    if len(rows) < 2:
        raise UserError("a chunk-size sweep needs rows at two or more chunk sizes")
    first = rows[0]
    mode = first["mode"]
    split = row_kernel_split(first)
    points = []
    for r in sorted(rows, key=chunk_size_ran):
        L = int(chunk_size_ran(r))
        c = model_counts_at(variant, mode, L, **shape, F_causal=F_causal, counts=counts, bytes_Cmn=bytes_Cmn,
                            kernel_split=split)
        ms = float(r["ms_median"])
        m_sum, m_max = model_ms(c, peak_flops_per_s, beta, "sum"), model_ms(c, peak_flops_per_s, beta, "max")
        points.append({"L": L, "ms_median": ms, "peak_mem_bytes": number(r.get("peak_mem_bytes")),
                       "model_ms_sum": m_sum, "model_ms_max": m_max,
                       "ratio_sum": ms / m_sum, "ratio_max": ms / m_max})
    best = min(points, key=lambda p: p["ms_median"])
    optima = model_optima(variant, mode, **shape, peak_flops_per_s=peak_flops_per_s, beta=beta, F_causal=F_causal,
                          bytes_Cmn=bytes_Cmn, counts=counts, kernel_split=split)
    return ChunkSweep(
        kernel=str(first.get("kernel")), backend=str(first.get("backend")), mode=mode,
        dtype=str(first.get("dtype")), variant=variant, shape=dict(shape), points=points,
        measured_L_opt=best["L"], measured_ms_opt=best["ms_median"], optima=optima,
        model_L_pow2=min(points, key=lambda p: p["model_ms_sum"])["L"], peak_flops_per_s=peak_flops_per_s, beta=beta,
        ceilings=ceilings, F_causal=F_causal, counts=counts, bytes_Cmn=bytes_Cmn, kernel_split=split)


# ------------------------------------------------------------------ roofline at each row's shape


def roofline_placement(rows, *, peak_flops_per_s, beta) -> list[dict]:
    """Each ``ok`` row with model FLOPs and bytes placed on the roofline at its own shape.

    For a row with model ``flops`` and ``bytes`` (computed at the row's own batch, length,
    heads and chunk size) and median time ``t``: intensity ``I = flops / bytes`` (eq. 117),
    achieved ``flops / t``, attainable ``P(I) = min(beta·I, peak_flops_per_s)`` (eq. 119) and
    ``fraction = achieved / P(I)`` (= ``roofline_ms / ms_median``, the row's
    ``roofline_fraction`` under the same ceilings). Rows without counts (e.g. a custom
    kernel) or without a time are left out.

    Returns dicts: ``kernel``, ``mode``, ``backend``, ``params`` (the row's, for the figure's
    kernel styles), ``case`` (the shape, :func:`tflabench.text_safety.case_label`), ``seq_len``,
    ``batch``, ``chunk_size``, ``intensity_flop_per_byte``, ``achieved_flops_per_s``,
    ``bound_flops_per_s``, ``fraction``, ``bound`` (``memory``/``compute``),
    ``roofline_ms``, ``ms_median``, ``outlier`` (see :func:`mark_outliers`).
    """
    out = []
    for r in _records(rows):
        flops, nbytes, ms = number(r.get("flops")), number(r.get("bytes")), number(r.get("ms_median"))
        if r.get("status") != "ok" or not flops or not nbytes or not ms or ms <= 0:
            continue
        ran = _counts_at_chunk_run(r)
        if ran is not None:
            flops, nbytes = ran
        placed = place_on_roofline(flops, nbytes, ms, peak_flops_per_s=peak_flops_per_s, beta=beta)
        out.append({
            "kernel": str(r.get("kernel") or r.get("backend") or "?"), "mode": str(r.get("mode") or ""),
            "backend": r.get("backend"), "params": r.get("params"),
            "case": case_label(r, shape_only=True), "batch": number(r.get("batch")),
            "seq_len": number(r.get("seq_len")), "chunk_size": chunk_size_ran(r),
            **{k: placed[k] for k in ("intensity_flop_per_byte", "achieved_flops_per_s", "bound_flops_per_s",
                                      "fraction", "bound", "roofline_ms")},
            "ms_median": ms,
        })
    mark_outliers(out)
    return out


#: Bytes per element of the dtypes a row names (the model's ``bytes_qkv``).
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def _counts_at_chunk_run(row: dict) -> tuple[float, float] | None:
    """(flops, bytes) of an mLSTM row whose suite asked for ``chunk_size: auto`` or that ran a
    walk (the row's ``algorithm``), counted at the chunk size that ran (the row's
    ``chunk_size_run``: :func:`tflabench.store.results.chunk_size_ran`) for the algorithm
    that ran (a walk keeps its states on chip:
    :func:`tflabench.model.plan_counts_kwargs`), so that each row sits at its own intensity
    and under its own bound; None for every other row (its recorded counts were made at its
    own chunk size). docs/model.md: intensity rises with L, so one assumed L would stack rows of
    different chunk sizes at one intensity."""
    variant, L = row_variant(row), chunk_size_ran(row)
    walk = row.get("algorithm") in WALK_ALGORITHMS
    if variant is None or not L or (row_params(row).get("chunk_size") != "auto" and not walk):
        return None
    shape = {k: number(row.get(k)) for k in ("batch", "seq_len", "heads", "d_qk", "d_hv")}
    if not all(shape.values()) or row.get("mode") not in ("fwd", "fwdbw"):
        return None
    kind = "mlstm_sig" if variant == "sig" else (
        "mlstm_exp_limit" if row_kernel_split(row) == "limit_chunk" else "mlstm_exp")
    try:
        c = counts_for_case(kind, row["mode"], **{SHAPE_SYMBOLS[k]: int(v) for k, v in shape.items()}, L=int(L),
                            bytes_qkv=_DTYPE_BYTES.get(str(row.get("dtype")), 2),
                            **plan_counts_kwargs(kind, row.get("algorithm")))
    except (UserError, ValueError, NotImplementedError):
        return None
    return float(c.flops), float(c.bytes)


def mark_outliers(points: list[dict], factor: float = OUTLIER_FACTOR) -> list[dict]:
    """Set ``outlier`` on each point: True when its ``fraction`` differs from the median of
    its kernel and mode by more than ``factor`` (either way). Returns ``points``."""
    groups: dict[tuple, list[dict]] = {}
    for p in points:
        groups.setdefault((p["kernel"], p["mode"]), []).append(p)
    for group in groups.values():
        med = _median([p["fraction"] for p in group])
        for p in group:
            p["outlier"] = bool(med > 0 and max(p["fraction"] / med, med / p["fraction"]) > factor)
    return points


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return math.nan
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def distance_to_bound(placement: list[dict]) -> list[dict]:
    """Per kernel and mode: how far the measurements sit from their own roofline bound.

    Args:
        placement: :func:`roofline_placement` output.

    Returns dicts, in the order kernels first appear: ``kernel``, ``mode``, ``n`` (cases),
    ``median_fraction``, ``worst_fraction`` and ``worst_case`` (the case with the lowest
    fraction), ``best_fraction`` and ``best_case``, ``bound`` (``memory``, ``compute`` or
    ``both``: where the cases' intensities sit against I_acc).
    """
    groups: dict[tuple, list[dict]] = {}
    for p in placement:
        groups.setdefault((p["kernel"], p["mode"]), []).append(p)
    out = []
    for (kernel, mode), group in groups.items():
        worst = min(group, key=lambda p: p["fraction"])
        best = max(group, key=lambda p: p["fraction"])
        bounds = {p["bound"] for p in group}
        out.append({"kernel": kernel, "mode": mode, "n": len(group),
                    "median_fraction": _median([p["fraction"] for p in group]),
                    "worst_fraction": worst["fraction"], "worst_case": worst["case"],
                    "best_fraction": best["fraction"], "best_case": best["case"],
                    "bound": bounds.pop() if len(bounds) == 1 else "both"})
    return out


# ------------------------------------------------------------------ ceilings of a result set


def ceilings_for(metadata: dict, ceilings: str = "auto", gpu: str | None = None, hardware_file=None):
    """The GPU whose ceilings the model uses for a result set (:class:`tflabench.hardware.GPU`).

    ``gpu`` (a catalogue key or name) or else the set's ``gpu_name``; ``ceilings``:
    ``measured`` (``tflabench calibrate``'s or the catalogue's), ``datasheet``, or ``auto``
    (measured where recorded, else datasheet).

    Raises:
        UserError: no GPU named and the set was measured on none (a CPU run), or a GPU
            that is not in the catalogue (add it with ``--hardware``).
    """
    if ceilings not in ("auto", "measured", "datasheet"):
        raise UserError(f"--ceilings={ceilings!r} is not valid; allowed: auto|measured|datasheet")
    name = gpu
    if name is None:
        gpu_name = (metadata or {}).get("gpu_name")
        if not gpu_name:
            raise UserError("the result set was measured on no GPU (a CPU run); name one with --gpu "
                            "to place its rows against that GPU's roofline")
        name = hardware.detect_gpu(gpu_name, hardware_file=hardware_file)
        if name is None:
            raise UserError(f"GPU {gpu_name!r} of the result set is not in the catalogue; add it in a "
                            "hardware YAML file (--hardware FILE) or name one with --gpu")
    return hardware.get_gpu(name, ceilings, hardware_file=hardware_file)


def model_ceilings_text(gpu) -> str:
    """One line naming the ceilings a model comparison used (for tables and reports)."""
    return (f"{gpu.name}, {gpu.ceilings} ceilings: {gpu.flops_per_s / 1e12:.0f} TFLOP/s, "
            f"{gpu.bytes_per_s / 1e12:.3g} TB/s, I_acc {gpu.intensity_flop_per_byte:.1f} FLOP/byte "
            f"({gpu.ceilings_source})")


__all__ = ["ChunkSweep", "analyse_chunk_sweep", "ceilings_for", "chunk_sweeps",
           "distance_to_bound", "mark_outliers", "model_ceilings_text", "model_counts_at", "model_ms", "model_optima",
           "roofline_placement", "row_kernel_split", "row_variant"]
