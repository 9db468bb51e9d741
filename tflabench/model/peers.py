"""Analytic counts of the peers, for the same roofline as TFLA (docs/model-counts.md §8).

The peers' own benchmark conventions count matmul FLOPs only (2 per multiply-add) and ignore
pointwise work; these functions follow them. Each docstring states its assumptions and sources;
docs/model.md summarises them. Every function returns a :class:`Counts` per call.

Not counted, for want of a published FLOP/byte count to cite: gated DeltaNet and DeltaNet
(the papers, Yang et al. ICLR 2025 and NeurIPS 2024, give the chunkwise WY form's asymptotic
cost, not its FLOPs and bytes per call) and Mamba-3. Their backends return no model kind and
``report`` says "no model" for them (docs/offline-peers.md, section 5).
"""

from __future__ import annotations

from tflabench.model._common import MODES, Counts, check_causal, check_choice, check_positive, n_chunks
from tflabench.model.backward import chunkwise_backward_byte_rows, chunkwise_backward_matmul_flops


def _check(mode, F_causal, **sizes):
    check_choice("mode", mode, MODES)
    for name, v in sizes.items():
        check_positive(name, v)
    return check_causal(F_causal)


def attention_counts(mode="fwd", *, B, NH, S, d_qk, d_hv=None, F_causal=0.5, bytes_qkv=2) -> Counts:
    """Causal softmax attention, FlashAttention accounting (docs/model-counts.md §8a).

    q, k: (B, NH, S, d_qk); v, o: (B, NH, S, d_hv); one KV head per query head.

    FLOPs: forward ``2·B·NH·S²·(d_qk + d_hv)·F_causal`` (QKᵀ and PV); backward
    ``2·B·NH·S²·(3·d_qk + 2·d_hv)·F_causal`` (recompute the scores QKᵀ, dP = dO·Vᵀ, dV = Pᵀ·dO, dQ = dS·K,
    dK = dSᵀ·Q), i.e. 2.5× the forward for d_qk = d_hv. Source: FlashAttention-2
    ``benchmarks/benchmark_flash_attention.py`` ``flops()`` (bwd 2.5×, fwd+bwd 3.5×) and Triton's
    ``06-fused-attention.py`` ("2.0(bwd) + 0.5(recompute)"). Softmax pointwise work not counted.

    Bytes (minimal, [D]): forward reads Q, K, V, writes O and the fp32 log-sum-exp:
    ``B·NH·S·((2·d_qk + 2·d_hv)·bytes_qkv + 4)``; backward reads Q, K, V, O, dO, LSE, writes dQ, dK,
    dV and writes+reads D = rowsum(dO∘O): ``B·NH·S·((4·d_qk + 4·d_hv)·bytes_qkv + 12)``. A lower bound:
    tiled kernels re-read K, V per query tile unless L2 catches it.
    """
    d_hv = d_qk if d_hv is None else d_hv
    Fc = _check(mode, F_causal, B=B, NH=NH, S=S, d_qk=d_qk, d_hv=d_hv, bytes_qkv=bytes_qkv)
    fwd = 2 * B * NH * S**2 * (d_qk + d_hv) * Fc
    fwd_bytes = B * NH * S * ((2 * d_qk + 2 * d_hv) * bytes_qkv + 4)
    rows = {"fwd_matmul": fwd}
    brows = {"fwd": fwd_bytes}
    if mode == "fwdbw":
        rows["bwd_matmul"] = 2 * B * NH * S**2 * (3 * d_qk + 2 * d_hv) * Fc
        brows["bwd"] = B * NH * S * ((4 * d_qk + 4 * d_hv) * bytes_qkv + 12)
    flops = sum(rows.values())
    return Counts(flops, sum(brows.values()), rows, brows, matmul_flops=flops,
                  notes=("FlashAttention accounting: matmul FLOPs only, bwd = recompute + 4 matmuls; "
                         "minimal bytes",))


def ssd_counts(mode="fwd", *, B, S, NH, P, N, G=1, L=256, F_causal=0.5, bytes_x=2) -> Counts:
    """Mamba 2 SSD chunked scan (Dao & Gu 2024, Sec. 6; mamba_ssm 2.3.2 kernels;
    docs/model-counts.md §8b).

    x: (B, S, NH, P); B, C: (B, S, G, N); dt: (B, S, NH); chunk L; N_c = ceil(S/L) (padded chunks).

    Forward FLOPs per chunk: ``G·2L²N`` (C·Bᵀ, full L×L) + ``NH·(2F_c·L²P`` (masked scores · X,
    causal tiles skipped) ``+ 2L·N·P`` (chunk states) ``+ 2N·P`` (state passing scan)
    ``+ 2L·N·P)`` (output from states). Backward [D] (``_mamba_chunk_scan_combined_bwd``, CB and
    states recomputed): ``G·6L²N + NH·(6L²P + 10L·N·P + 4N·P)`` per chunk, no causal skipping assumed.

    Bytes forward (approximate, from the kernel call sequence): ``B·[3·S·NH·P·b_x + 4·S·G·N·b_x +
    N_c·NH·N·P·(8 + 2·b_x) + 8·N_c·G·L² + 24·S·NH]``. Bytes backward [D, rough]: x and dy read twice,
    dx written; B and C read twice, dB and dC written; states recomputed (fp32 write + read, plus
    the b_x copy) and dstates (fp32 write + read); CB and dCB (fp32, write + read); ≈48 bytes per
    (t, head) of dt/dA terms: ``B·[5·S·NH·P·b_x + 6·S·G·N·b_x + N_c·NH·N·P·(16 + 2·b_x) +
    16·N_c·G·L² + 48·S·NH]``.
    """
    Fc = _check(mode, F_causal, B=B, S=S, NH=NH, P=P, N=N, G=G, L=L, bytes_x=bytes_x)
    Nc = n_chunks(S, min(L, S), "pad")
    L = min(L, S)
    rows = {
        "fwd_scores_CB": B * Nc * G * 2 * L**2 * N,
        "fwd_scan_output": B * Nc * NH * 2 * Fc * L**2 * P,
        "fwd_chunk_states": B * Nc * NH * 2 * L * N * P,
        "fwd_state_passing": B * Nc * NH * 2 * N * P,
        "fwd_state_output": B * Nc * NH * 2 * L * N * P,
    }
    brows = {"fwd": B * (3 * S * NH * P * bytes_x + 4 * S * G * N * bytes_x
                         + Nc * NH * N * P * (8 + 2 * bytes_x) + 8 * Nc * G * L**2 + 24 * S * NH)}
    if mode == "fwdbw":
        rows["bwd_matmul"] = B * Nc * (G * 6 * L**2 * N + NH * (6 * L**2 * P + 10 * L * N * P + 4 * N * P))
        brows["bwd"] = B * (5 * S * NH * P * bytes_x + 6 * S * G * N * bytes_x
                            + Nc * NH * N * P * (16 + 2 * bytes_x) + 16 * Nc * G * L**2 + 48 * S * NH)
    flops = sum(rows.values())
    return Counts(flops, sum(brows.values()), rows, brows, matmul_flops=flops,
                  notes=("Mamba 2 SSD: matmul FLOPs (+ the 2NP state scan); approximate kernel bytes",))


def gla_counts(kind="simple_gla", mode="fwd", *, B, NH, S, d_qk, d_hv, L=64, F_causal=0.5,
               bytes_qkv=2, bytes_h=None, bytes_g=None, states_in_hbm=True) -> Counts:
    """Chunkwise GLA / simple GLA as fla's ``chunk_gla`` / ``chunk_simple_gla``
    (docs/model-counts.md §8c), and their fused (non-materialising) forms.

    q, k: (B, NH, S, d_qk); v, o: (B, NH, S, d_hv); gate g: (B, NH, S) (simple GLA, scalar decay) or
    (B, NH, S, d_qk) (GLA, decay per key channel). Chunk L (fla default 64), N_c = ceil(S/L).

    Forward FLOPs per head and chunk: state ``(K∘decay)ᵀV`` 2L·d_qk·d_hv (+ 2·d_qk·d_hv decay),
    inter ``(Q∘decay)·h`` 2L·d_qk·d_hv, intra ``2F_c·L²(d_qk + d_hv)`` (fla computes the L×L tile whole:
    pass F_causal=1 for the executed count). GLA's extra O(L·d_qk) gating and its diagonal
    sub-blocks done elementwise are lower order and not counted (as the doc).

    Bytes forward: Table 9 mLSTMsig with states in ``bytes_h`` (fla: input dtype,
    ``states_in_fp32=False``; default = bytes_qkv) and the gate read twice: ``2L·bytes_g`` (simple)
    or ``2L·d_qk·bytes_g`` (GLA). Backward [D]: fla recomputes the states in fp32 and runs the
    reverse state-gradient recurrence and the dq/dk/dg, dv kernels — the same matmul structure as
    the TFLA backward, so the TFLA model (unique convention, with state recompute; bytes with
    4-byte states) is used with d_qk → d_qk, d_hv → d_hv.

    ``states_in_hbm=False`` counts the non-materialising (fused) form: fla's
    ``fused_chunk_simple_gla`` / ``fused_chunk_gla`` and Lightning Attention 2 (paper App. A,
    E.3) walk the chunks in order in one program per (batch, head, value block), the state in
    registers. FLOPs as above (the same products; the backward recomputes the states in a
    forward walk, then walks back for dk, dv, dg). Bytes: every input once and the output once
    forward, ``L(2d_k + 2d_v)·bytes_qkv + L·bytes_g`` per chunk, no state; backward two walks
    each reading q, k, v, g and δo and together writing δq, δk, δv, δg,
    ``2(L(2d_k + 2d_v)·bytes_qkv + gate) + (L(2d_k + d_hv)·bytes_qkv + gate)``.
    """
    check_choice("kind", kind, ("gla", "simple_gla"))
    Fc = _check(mode, F_causal, B=B, NH=NH, S=S, d_qk=d_qk, d_hv=d_hv, L=L, bytes_qkv=bytes_qkv)
    bytes_h = bytes_qkv if bytes_h is None else bytes_h
    bytes_g = bytes_qkv if bytes_g is None else bytes_g
    L = min(L, S)
    Nc = n_chunks(S, L, "pad")
    BHN = B * NH * Nc
    rows = {
        "fwd_state": BHN * (2 * L * d_qk * d_hv + 2 * d_qk * d_hv),
        "fwd_inter": BHN * 2 * L * d_qk * d_hv,
        "fwd_intra": BHN * 2 * Fc * L**2 * (d_qk + d_hv),
    }
    mm = BHN * (4 * L * d_qk * d_hv + 2 * Fc * L**2 * (d_qk + d_hv))
    gate_elems = L if kind == "simple_gla" else L * d_qk
    if mode == "fwdbw":
        bmm = BHN * chunkwise_backward_matmul_flops(L, d_qk, d_hv, Fc, recompute_states=True)
        rows["bwd_matmul"] = bmm + BHN * 2 * 2 * d_qk * d_hv  # + decay of h (recompute) and of dh
        mm += bmm
    if not states_in_hbm:
        io = L * (2 * d_qk + 2 * d_hv) * bytes_qkv + gate_elems * bytes_g
        brows = {"fwd": BHN * io}
        if mode == "fwdbw":
            brows["bwd"] = BHN * (2 * io + L * (2 * d_qk + d_hv) * bytes_qkv + gate_elems * bytes_g)
        return Counts(sum(rows.values()), sum(brows.values()), rows, brows, matmul_flops=mm,
                      notes=(f"fused {kind} (no chunk state in HBM): matmul FLOPs (+ state decay)",))
    brows = {"fwd": BHN * (2 * gate_elems * bytes_g + 3 * L * (d_qk + d_hv) * bytes_qkv
                           + 2 * d_qk * d_hv * bytes_h)}
    if mode == "fwdbw":
        b = chunkwise_backward_byte_rows("sig", L, d_qk, d_hv, bytes_qkv, bytes_g, 4,
                                         recompute_states=True)
        brows["bwd"] = BHN * sum(b.values())
    return Counts(sum(rows.values()), sum(brows.values()), rows, brows, matmul_flops=mm,
                  notes=(f"fla chunk_{kind}: matmul FLOPs (+ state decay); backward as TFLA's model",))
