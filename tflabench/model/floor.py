"""The physical floor of a call: the fewest HBM bytes and FLOPs any implementation of the
computation needs, at the GPU's ceilings (docs/model.md, "Parts and the physical floor").

``T_floor = max(W_min / peak_flops_per_s, Q_min / beta)`` where

- ``Q_min`` (compulsory traffic) counts every input read once per pass that needs it and
  every output written once, nothing else (no states, no reloads, no intermediate
  tensors); per token and head:

  - mLSTM forward: read q, k (d_qk each), v (d_hv) and both gate pre-activations, write h
    (d_hv); backward: read q, k, v, the gates and dh, write dq, dk, dv, di, df.
  - causal attention forward: read q, k, v, write o and its row log-sum-exp (4 bytes);
    backward: read q, k, v, o, do and the log-sum-exp, write dq, dk, dv.

- ``W_min``: mLSTM: the chunkwise model's FLOPs (Tables 8/10 rows; the derived backward,
  unique convention) at F_causal = 1/2 (useful work only) at the FLOP-optimal real chunk
  size (eq. 111: FLOPs per token are ``a·L + b + c/L``, minimised over L in [1, S]);
  attention: its FLOPs at F_causal = 1/2.

The model's roofline bound (:func:`tflabench.model.counts_for_case`) prices what TFLA's
kernels move (states C_k in HBM, inputs read by both kernels): it lies above the floor,
and the gap is the price of the algorithm; the floor is what no kernel can beat.
"""

from __future__ import annotations

from tflabench.errors import UserError
from tflabench.model._common import Counts, check_choice, check_positive
from tflabench.model.analysis import golden_min
from tflabench.model.backward import mlstm_fwdbw_counts
from tflabench.model.mlstm import mlstm_counts
from tflabench.model.peers import attention_counts

#: Kinds (:data:`tflabench.model.KINDS`) with a floor; others return None.
FLOOR_KINDS = ("mlstm_sig", "mlstm_exp", "mlstm_exp_limit", "attention_causal")


def compulsory_bytes(kind: str, mode: str, *, B, NH, S, d_qk, d_hv, bytes_qkv=2, bytes_gate=4) -> dict:
    """``Q_min`` of one call by pass and direction: ``{"fwd_read", "fwd_write"[, "bwd_read",
    "bwd_write"]}`` in bytes (module docstring). ``bytes_gate``: bytes per gate element
    (float32 gates of 16-bit activations: 4). Raises UserError for a kind without a floor."""
    check_choice("kind", kind, FLOOR_KINDS)
    check_choice("mode", mode, ("fwd", "fwdbw"))
    tokens = B * NH * S
    qk, v = 2 * d_qk * bytes_qkv, d_hv * bytes_qkv
    if kind.startswith("mlstm"):
        gates = 2 * bytes_gate
        rows = {"fwd_read": qk + v + gates, "fwd_write": v}
        if mode == "fwdbw":
            rows["bwd_read"] = qk + v + gates + v
            rows["bwd_write"] = qk + v + gates
    else:
        lse = 4
        rows = {"fwd_read": qk + v, "fwd_write": v + lse}
        if mode == "fwdbw":
            rows["bwd_read"] = qk + 3 * v + lse
            rows["bwd_write"] = qk + v
    return {k: float(tokens * b) for k, b in rows.items()}


def minimal_flops(kind: str, mode: str, *, B, NH, S, d_qk, d_hv) -> tuple[dict, float | None]:
    """``W_min`` of one call by pass (``{"fwd"[, "bwd"]}``, FLOPs) and, for mLSTM, the real
    chunk size where the model's FLOPs are least (None for attention). Module docstring."""
    check_choice("kind", kind, FLOOR_KINDS)
    if kind == "attention_causal":
        c = attention_counts(mode, B=B, NH=NH, S=S, d_qk=d_qk, d_hv=d_hv, F_causal=0.5)
        return _by_pass(c), None
    variant = "sig" if kind == "mlstm_sig" else "exp"
    kw = dict(S=S, d_hv=d_hv, d_qk=d_qk, B=B, NH=NH, F_causal=0.5, chunks="real")

    def counts(L: float) -> Counts:
        if mode == "fwd":
            return mlstm_counts(variant, "chunkwise", L=L, **kw)
        return mlstm_fwdbw_counts(variant, L=L, **kw)

    L_min = golden_min(lambda L: counts(L).flops, 1.0, float(S)) if S > 1 else 1.0
    return _by_pass(counts(L_min)), L_min


def _by_pass(c: Counts) -> dict:
    out = {"fwd": 0.0}
    for row, value in c.flop_rows.items():
        key = "bwd" if row.startswith("bwd") else "fwd"
        out[key] = out.get(key, 0.0) + value
    return out


def physical_floor(kind: str, mode: str, *, B, NH, S, d_qk, d_hv, bytes_qkv=2, bytes_gate=4) -> Counts | None:
    """The floor's counts of one call: :class:`~tflabench.model.Counts` with ``flops`` =
    ``W_min`` (rows by pass) and ``bytes`` = ``Q_min`` (rows ``fwd_read`` ...); its time at
    ceilings peak_flops_per_s, beta is ``max(flops / peak_flops_per_s, bytes / beta)``
    (:func:`tflabench.model.analysis.runtime` with ``combine="max"``). None for a kind
    without a floor (Mamba 2 SSD, GLA).

    Raises:
        UserError: unknown mode, non-positive sizes.
    """
    if kind not in FLOOR_KINDS:
        return None
    for name, value in (("B", B), ("NH", NH), ("S", S), ("d_qk", d_qk), ("d_hv", d_hv),
                        ("bytes_qkv", bytes_qkv), ("bytes_gate", bytes_gate)):
        check_positive(name, value)
    if mode not in ("fwd", "fwdbw"):
        raise UserError(f"mode={mode!r} is not valid; allowed: fwd|fwdbw")
    brows = compulsory_bytes(kind, mode, B=B, NH=NH, S=S, d_qk=d_qk, d_hv=d_hv,
                             bytes_qkv=bytes_qkv, bytes_gate=bytes_gate)
    frows, L_min = minimal_flops(kind, mode, B=B, NH=NH, S=S, d_qk=d_qk, d_hv=d_hv)
    note = "physical floor: compulsory bytes; FLOPs at F_causal 1/2" + (
        f", chunk size {L_min:.1f} (FLOP-optimal)" if L_min is not None else "")
    return Counts(sum(frows.values()), sum(brows.values()), frows, brows, notes=(note,))


__all__ = ["FLOOR_KINDS", "compulsory_bytes", "minimal_flops", "physical_floor"]
