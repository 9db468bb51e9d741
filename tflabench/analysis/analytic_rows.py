"""The rows the analytic commands print (``flops``, ``roofline``, ``intensity``,
``optimal-chunk``): model counts at each point, each point on each GPU's roofline, the
intensity curves, the optimal chunk sizes. Plain dicts in SI units (FLOP, bytes, FLOP/s,
ms); the CLI renders them as tables or ``--json``.
"""

from __future__ import annotations

from tflabench.analysis.analytic_inputs import chunk_at_most
from tflabench.model import (chunkwise_coefficients, counts_for_case, l_ridge, mlstm_counts,
                             mlstm_fwdbw_counts, place_on_roofline)
from tflabench.model.analysis import optimal_chunk
from tflabench.model.parts import row_part, row_pass
from tflabench.store.schema import number


def count_row_kernel(formulation: str, row: str) -> str:
    """Which kernel a row of a count table belongs to: for chunkwise the ``recurrent
    kernel`` (the states: :func:`tflabench.model.parts.row_part`) or the ``parallel
    kernel`` (the rest), prefixed ``backward`` for ``bwd_*`` rows; else the formulation."""
    if formulation != "chunkwise":
        return formulation
    if row.endswith("paper_table17_adjustment"):
        return "(paper mode)"
    kernel = f"{row_part('mlstm_sig', row)} kernel"
    return f"backward {kernel}" if row_pass(row) == "bwd" else kernel


def mlstm_points(variant, mode, Ls, *, seq_len, batch, heads, dhv, d_qk, F_causal, bytes_qkv, bytes_if,
                 bytes_Cmn, counts) -> list[dict]:
    """Model FLOPs and bytes of the chunkwise mLSTM at each chunk size in ``Ls`` (padded
    chunks, App. F; ``fwdbw`` with the derived backward): dicts ``label`` (``L=64``), ``L``,
    ``flops``, ``bytes``, ``intensity_flop_per_byte``. Raises UserError for L > seq_len."""
    pts = []
    for L in Ls:
        chunk_at_most(L, seq_len)
        kw = dict(S=seq_len, d_hv=dhv, d_qk=d_qk, L=L, B=batch, NH=heads, F_causal=F_causal,
                  bytes_qkv=bytes_qkv, bytes_if=bytes_if, bytes_Cmn=bytes_Cmn, counts=counts, chunks="pad")
        c = (mlstm_counts(variant, "chunkwise", **kw) if mode == "fwd" else mlstm_fwdbw_counts(variant, **kw))
        pts.append({"label": f"L={L}", "L": L, "flops": c.flops, "bytes": c.bytes,
                    "intensity_flop_per_byte": c.intensity_flop_per_byte})
    return pts


def peer_points(mode, *, seq_len, batch, heads, dhv, d_qk, F_causal, bytes_qkv) -> list[dict]:
    """The peers at a comparable shape (causal FlashAttention with d_qk heads, simple GLA
    L=64, Mamba2 SSD Q=256 with as many 64-wide heads as the mLSTM's state holds): dicts
    ``label``, ``kind``, ``flops``, ``bytes``, ``intensity_flop_per_byte``."""
    pts = []
    for kind, label, kw in (
        ("attention_causal", "FlashAttn causal", dict(NH=heads, d_qk=d_qk, d_hv=d_qk)),
        ("simple_gla", "simple GLA L=64", dict(NH=heads, d_qk=d_qk, d_hv=dhv)),
        ("mamba2_ssd", "Mamba2 SSD Q=256",
         dict(NH=max(1, heads * dhv // 64), d_qk=128, d_hv=64, d_state=128)),
    ):
        c = counts_for_case(kind, mode, B=batch, S=seq_len, F_causal=F_causal, bytes_qkv=bytes_qkv, **kw)
        pts.append({"label": label, "kind": kind, "flops": c.flops, "bytes": c.bytes,
                    "intensity_flop_per_byte": c.intensity_flop_per_byte})
    return pts


def roofline_rows(gpus, points) -> list[dict]:
    """Each model point on each GPU's roofline (:func:`tflabench.model.place_on_roofline`):
    ``gpu``, ``ceilings``, ``label``, ``L``, ``flops``, ``bytes``, ``intensity_flop_per_byte``,
    ``attainable_tflops_per_s`` (eq. 119), ``bound``, ``roofline_ms`` (max form, eq. 114),
    ``sum_form_ms`` (eq. 113/116)."""
    rows = []
    for g in gpus:
        for p in points:
            placed = place_on_roofline(p["flops"], p["bytes"], peak_flops_per_s=g.flops_per_s, beta=g.bytes_per_s)
            rows.append({
                "gpu": g.key, "ceilings": g.ceilings, "label": p["label"], "L": p.get("L"),
                "flops": p["flops"], "bytes": p["bytes"], "intensity_flop_per_byte": p["intensity_flop_per_byte"],
                "attainable_tflops_per_s": placed["bound_flops_per_s"] / 1e12, "bound": placed["bound"],
                "roofline_ms": placed["roofline_ms"],
                "sum_form_ms": (p["flops"] / g.flops_per_s + p["bytes"] / g.bytes_per_s) * 1e3,
            })
    return rows


def measured_points(frame) -> list[dict]:
    """The ``ok`` rows of a result set (DataFrame) as points for a roofline figure:
    ``label`` (kernel and mode), ``kernel``, ``mode``, ``chunk_size``, ``seq_len``,
    ``intensity_flop_per_byte`` and ``flops_per_s`` (achieved), from the rows' model counts
    and median times (:func:`tflabench.model.place_on_roofline`), else from their
    ``intensity_flop_per_byte`` and ``tflops_per_s`` columns. Rows with neither are left out."""
    if "status" in frame.columns:
        frame = frame[frame["status"] == "ok"]
    pts = []
    for r in frame.to_dict("records"):
        flops, nbytes, ms = number(r.get("flops")), number(r.get("bytes")), number(r.get("ms_median"))
        placed = place_on_roofline(flops, nbytes, ms) if flops else {}
        inten = placed.get("intensity_flop_per_byte", number(r.get("intensity_flop_per_byte")))
        perf = placed.get("achieved_flops_per_s")
        if perf is None and number(r.get("tflops_per_s")) is not None:
            perf = number(r.get("tflops_per_s")) * 1e12
        if inten is None or perf is None or inten <= 0 or perf <= 0:
            continue
        name = next((r[c] for c in ("kernel", "backend") if isinstance(r.get(c), str) and r.get(c)), "?")
        mode = r.get("mode") if isinstance(r.get("mode"), str) else ""
        pts.append({"label": f"{name} {mode}".strip(), "kernel": str(name), "mode": str(mode),
                    "chunk_size": number(r.get("chunk_size")), "seq_len": number(r.get("seq_len")),
                    "intensity_flop_per_byte": inten, "flops_per_s": perf})
    return pts


def intensity_curves(variant, Ls, *, state_bytes, causal_factors, d_hv, d_qk, counts, gpus) -> list[dict]:
    """Arithmetic intensity over chunk size (eq. 118) per state width and F_causal:
    dicts ``label`` (``fp32, F_c=0.66``), ``bytes_Cmn``, ``F_causal``, ``coefficients``
    (:func:`tflabench.model.chunkwise_coefficients`), ``intensity`` (L -> FLOP/byte) and
    ``L_at_I_acc`` (GPU key -> the chunk size where the kernel turns compute-bound,
    :func:`tflabench.model.l_ridge`)."""
    curves = []
    for sb in state_bytes:
        for fc in causal_factors:
            co = chunkwise_coefficients(variant, d_hv=d_hv, d_qk=d_qk, F_causal=fc, bytes_Cmn=sb, counts=counts)
            inten = {L: (co["a"] * L * L + co["b"] * L + co["c"]) / (co["m"] * L + co["n"]) for L in Ls}
            cross = {g.key: min(l_ridge(co, g.intensity_flop_per_byte), float("inf")) for g in gpus}
            dtype = {4: "fp32", 2: "bf16"}.get(sb, f"{sb:g} B")
            curves.append({"label": f"{dtype}, F_c={fc:g}", "bytes_Cmn": sb, "F_causal": fc,
                           "coefficients": co, "intensity": inten, "L_at_I_acc": cross})
    return curves


def optimal_chunk_rows(variant, gpus, d_hvs, *, d_qk, p_qk, F_causal, bytes_qkv, bytes_Cmn, counts,
                       batch, heads, seq_len) -> list[dict]:
    """The model's optimal chunk sizes (eqs. 111, 121, 114; :func:`tflabench.model.analysis.optimal_chunk`)
    for each GPU and d_hv: its dict plus ``gpu``, ``gpu_name``, ``ceilings``. ``d_qk`` or
    ``p_qk`` (None: 0.5, the paper's)."""
    rows = []
    for g in gpus:
        for d in d_hvs:
            r = optimal_chunk(variant, peak_flops_per_s=g.flops_per_s, beta=g.bytes_per_s, d_hv=d,
                              d_qk=d_qk, p_qk=None if d_qk is not None else (p_qk if p_qk is not None else 0.5),
                              F_causal=F_causal, bytes_qkv=bytes_qkv, bytes_if=bytes_qkv,
                              bytes_Cmn=bytes_Cmn, counts=counts, B=batch, NH=heads, S=seq_len)
            rows.append({"gpu": g.key, "gpu_name": g.name, "ceilings": g.ceilings, **r})
    return rows


__all__ = ["count_row_kernel", "intensity_curves", "measured_points", "mlstm_points", "optimal_chunk_rows",
           "peer_points", "roofline_rows"]
