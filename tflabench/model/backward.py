"""Backward and forward+backward counts of TFLA mLSTM (derived here; the paper counts the forward only).

Derivation (docs/model.md "Forward + backward"; docs/model-counts.md §9; docs/tfla-kernels.md 3,
docs/tfla-tiling.md 4; paper App. B.3 eqs. 57-92 and C.3 eqs. 101-103). The chunkwise backward of
``xl_chunk`` runs, per head and chunk of length L:

- K0 (optional, default on, as ``recompute_states_in_bw=True`` of mlstm_kernels): rerun the
  forward recurrent kernel, ``C_k = ḡ·C_{k-1} + K̄ᵀV``: the forward's gates/numerator(/denominator)
  rows of Table 8 and Table 9's recurrent-kernel bytes.
- K1: reverse state-gradient recurrence ``δC_{k-1} = ḡ·δC_k + Q̄ᵀ·δH̃`` (docs/tfla-kernels.md 3.2):
  gate vectors as the forward ``gates`` row, ``Q̄ = b̄⊙Q`` (L·d_qk), ``Q̄ᵀδH̃`` (2L·d_qk·d_hv),
  decay and add (2·d_qk·d_hv); mLSTMexp also ``δH̃ = δH/(n_out+eps)`` (L·d_hv + L).
- K2-K4 (δV, δK, δQ; docs/tfla-kernels.md 3.3): rebuild the gate matrix D (forward cum_fgates +
  gate_matrix rows), intra matmuls, inter matmuls ``K̄·δC_k``, ``V·δC_kᵀ``, ``δH̃·C_{k-1}ᵀ``
  (2L·d_qk·d_hv each) and their row scalings (4L·d_qk), products with D and the scale (4F_c·L²
  unique), and the intra + inter additions (L(2d_qk + d_hv)).
- K5: gate gradients (docs/tfla-kernels.md 3.4): two row-wise dot products q·dq, k·dk (4L·d_qk),
  their difference and the reverse cumulative sum (2L), sigmoid factors (mLSTMsig: both gates,
  2L(F_sig + 1); mLSTMexp: forget gate only, L(F_sig + 1)).

Intra-chunk matmuls (``F_c = F_causal``): ``convention="unique"`` counts every distinct product
once, FlashAttention's convention: recompute the scores ``QKᵀ`` (2F_c·L²·d_qk), ``S̄ᵀδH̃`` (2F_c·L²·d_hv),
``δS̄ = δH̃Vᵀ`` (2F_c·L²·d_hv), ``δSᵀQ`` and ``δS·K`` (2F_c·L²·d_qk each), i.e.
``2F_c·L²(3·d_qk + 2·d_hv)``; ``convention="executed"`` counts what the three-kernel split runs
(S recomputed in δV, δS̄ in both δK and δQ, D rebuilt in each): ``6F_c·L²(d_qk + d_hv)``.

The matmul part is exact for the algorithm (tested against FlopCounterMode on a float64 PyTorch
chunkwise backward that mirrors K0-K5); the pointwise part follows the forward tables' conventions
and is an estimate (a few percent of the total). Bytes are an estimate (loads and stores each
kernel names; reloads inside a kernel not counted, as in App. F).
"""

from __future__ import annotations

from tflabench.errors import UserError
from tflabench.model._common import (VARIANTS, Counts, FOps, check_causal, check_choice, check_positive, n_chunks,
                                     resolve_d_qk)
from tflabench.model.mlstm import chunkwise_flop_rows, chunkwise_byte_rows, mlstm_counts

CONVENTIONS = ("unique", "executed")
KERNEL_SPLITS = ("xl_chunk", "limit_chunk")


def chunkwise_backward_matmul_flops(L, d_qk, d_hv, F_causal, *, recompute_states=True,
                                    convention="unique") -> float:
    """Tensor-core FLOPs per head and chunk of the chunkwise backward (docs/model-counts.md §9).

    unique: ``2F_c·L²(3d_qk + 2d_hv) + 8L·d_qk·d_hv``; executed: ``6F_c·L²(d_qk + d_hv) + 8L·d_qk·d_hv``;
    plus ``2L·d_qk·d_hv`` for the state recompute (K0).
    """
    if convention == "unique":
        intra = 2 * F_causal * L**2 * (3 * d_qk + 2 * d_hv)
    else:
        intra = 6 * F_causal * L**2 * (d_qk + d_hv)
    mm = intra + 8 * L * d_qk * d_hv
    if recompute_states:
        mm += 2 * L * d_qk * d_hv
    return mm


def chunkwise_backward_flop_rows(variant, L, d_qk, d_hv, F_causal, F: FOps = FOps(), *,
                                 recompute_states=True, convention="unique") -> dict:
    """Backward FLOPs per head and chunk, by kernel (module docstring for each term)."""
    fwd = chunkwise_flop_rows(variant, L, d_qk, d_hv, F_causal, F)
    rows = {}
    if recompute_states:
        rows["bwd_state_recompute"] = fwd["gates"] + fwd["numerator"] + fwd["denominator"]
    k1 = fwd["gates"] + 2 * L * d_qk * d_hv + 2 * d_qk * d_hv + L * d_qk
    if variant == "exp":
        k1 += L * d_hv + L
    rows["bwd_state_gradients"] = k1
    n_rebuild = 1 if convention == "unique" else 3
    rows["bwd_gate_matrix"] = n_rebuild * (fwd["cum_fgates"] + fwd["gate_matrix"])
    if convention == "unique":
        intra = 2 * F_causal * L**2 * (3 * d_qk + 2 * d_hv) + 4 * F_causal * L**2
    else:
        intra = 6 * F_causal * L**2 * (d_qk + d_hv) + 6 * F_causal * L**2
    rows["bwd_intra"] = intra
    rows["bwd_inter"] = 3 * 2 * L * d_qk * d_hv + 4 * L * d_qk
    rows["bwd_combination"] = L * (2 * d_qk + d_hv)
    sig_factors = 2 * L * (F.sig + 1) if variant == "sig" else L * (F.sig + 1)
    rows["bwd_gate_gradients"] = 4 * L * d_qk + 2 * L + sig_factors
    return rows


def chunkwise_backward_byte_rows(variant, L, d_qk, d_hv, bytes_qkv=2, bytes_if=2, bytes_Cmn=4, *,
                                 recompute_states=True, kernel_split="xl_chunk") -> dict:
    """Backward HBM bytes per head and chunk (estimate, docs/model-counts.md §9 "Backward bytes").

    xl_chunk: K1 load ``L(d_qk+d_hv)·b_qkv + 2L·b_if``, store ``d_qk·d_hv·b_Cmn``; K2 (δV) load
    ``L(2d_qk+d_hv)·b_qkv + 2L·b_if + d_qk·d_hv·b_Cmn``, store ``L·d_hv·b_qkv``; K3, K4 (δK, δQ) each
    load ``L(d_qk+2d_hv)·b_qkv + 2L·b_if + d_qk·d_hv·b_Cmn``, store ``L·d_qk·b_qkv``; K5 load
    ``4L·d_qk·b_qkv + 2L·b_if``, store ``2L·b_if``; K0 = Table 9's recurrent kernel. mLSTMexp adds
    the saved n_out and m^comb (fp32 → ``bytes_Cmn``) read by K1-K4: ``8L·b_Cmn``.
    limit_chunk: one fused dQ/dK/dV kernel loading Q, K, V, δH, both gates, C_{k-1}, δC_k and
    storing δQ, δK, δV (docs/tfla-tiling.md 4.9).
    """
    rows = {}
    if recompute_states:
        fwd = chunkwise_byte_rows(variant, L, d_qk, d_hv, bytes_qkv, bytes_if, bytes_Cmn)
        rows["bwd_state_recompute"] = fwd["recurrent_load"] + fwd["recurrent_store"]
    dd = d_qk * d_hv
    rows["bwd_state_gradients"] = L * (d_qk + d_hv) * bytes_qkv + 2 * L * bytes_if + dd * bytes_Cmn
    if kernel_split == "xl_chunk":
        dv = L * (2 * d_qk + d_hv) * bytes_qkv + 2 * L * bytes_if + dd * bytes_Cmn + L * d_hv * bytes_qkv
        dk_dq = 2 * (L * (d_qk + 2 * d_hv) * bytes_qkv + 2 * L * bytes_if + dd * bytes_Cmn
                     + L * d_qk * bytes_qkv)
        rows["bwd_qkv_gradients"] = dv + dk_dq
    else:
        rows["bwd_qkv_gradients"] = (
            L * (2 * d_qk + 2 * d_hv) * bytes_qkv + 2 * L * bytes_if + 2 * dd * bytes_Cmn
            + L * (2 * d_qk + d_hv) * bytes_qkv
        )
    rows["bwd_gate_gradients"] = 4 * L * d_qk * bytes_qkv + 2 * L * bytes_if + 2 * L * bytes_if
    if variant == "exp":
        n_kernels = 4 if kernel_split == "xl_chunk" else 2
        rows["bwd_normalizer_loads"] = n_kernels * 2 * L * bytes_Cmn
    return rows


def mlstm_backward_counts(variant: str, *, S, d_hv, L, d_qk=None, p_qk=None, B=1, NH=1,
                          F_causal=0.5, F_ops: FOps | None = None, bytes_qkv=2, bytes_if=2, bytes_Cmn=4,
                          recompute_states: bool = True, convention: str = "unique",
                          kernel_split: str = "xl_chunk", chunks: str = "divide") -> Counts:
    """Backward-only FLOPs and bytes of one chunkwise TFLA mLSTM call (derived; module docstring).

    Args as :func:`tflabench.model.mlstm.mlstm_counts` (chunkwise), plus
        recompute_states: count K0, the state recompute (default True, as mlstm_kernels).
        convention: ``"unique"`` (each distinct product once) or ``"executed"`` (xl_chunk's split).
        kernel_split: ``"xl_chunk"`` (separate δQ, δK, δV kernels) or ``"limit_chunk"`` (fused).

    Returns:
        :class:`Counts` per call with ``flop_rows``/``byte_rows`` named ``bwd_*``.

    Raises:
        UserError: as mlstm_counts; unknown convention or kernel_split.
    """
    check_choice("variant", variant, VARIANTS)
    check_choice("convention", convention, CONVENTIONS)
    check_choice("kernel_split", kernel_split, KERNEL_SPLITS)
    F = F_ops if F_ops is not None else FOps()
    d_qk = resolve_d_qk(d_hv, d_qk, p_qk)
    for name, v in (("B", B), ("NH", NH), ("bytes_qkv", bytes_qkv),
                    ("bytes_if", bytes_if), ("bytes_Cmn", bytes_Cmn)):
        check_positive(name, v)
    F_causal = check_causal(F_causal)
    if L is None:
        raise UserError("L (chunk size) is required for the chunkwise backward")
    Nc = n_chunks(S, L, chunks)
    if kernel_split == "limit_chunk":
        convention = "unique"
    rows = chunkwise_backward_flop_rows(variant, L, d_qk, d_hv, F_causal, F,
                                        recompute_states=recompute_states, convention=convention)
    brows = chunkwise_backward_byte_rows(variant, L, d_qk, d_hv, bytes_qkv, bytes_if, bytes_Cmn,
                                         recompute_states=recompute_states,
                                         kernel_split=kernel_split)
    mm = chunkwise_backward_matmul_flops(L, d_qk, d_hv, F_causal,
                                         recompute_states=recompute_states, convention=convention)
    note = (f"{variant} chunkwise backward (derived, docs/model.md): convention={convention}, "
            f"recompute_states={recompute_states}, kernel_split={kernel_split}")
    return Counts(flops=sum(rows.values()), bytes=sum(brows.values()), flop_rows=rows,
                  byte_rows=brows, matmul_flops=mm, notes=(note,)).scaled(B * NH * Nc)


def mlstm_fwdbw_counts(variant: str, *, counts: str = "rows", **kw) -> Counts:
    """Forward (paper Tables 8/9, ``counts`` rows|paper) + derived backward of chunkwise TFLA.

    Keyword arguments are those of :func:`mlstm_backward_counts` (the forward ignores
    ``recompute_states``, ``convention`` and ``kernel_split``).
    """
    fwd_kw = {k: v for k, v in kw.items() if k not in ("recompute_states", "convention", "kernel_split")}
    kw.pop("states_on_chip", None)   # the forward's alone: the backward recomputes its states
    fwd = mlstm_counts(variant, "chunkwise", counts=counts, **fwd_kw)
    fwd = Counts(fwd.flops, fwd.bytes, {f"fwd_{k}": v for k, v in fwd.flop_rows.items()},
                 {f"fwd_{k}": v for k, v in fwd.byte_rows.items()}, fwd.matmul_flops, fwd.notes)
    return fwd + mlstm_backward_counts(variant, **kw)
