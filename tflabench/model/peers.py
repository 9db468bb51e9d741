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


def attention_counts(mode="fwd", *, B, H, T, d_qk, d_v=None, F_causal=0.5, bytes_qkv=2) -> Counts:
    """Causal softmax attention, FlashAttention accounting (docs/model-counts.md §8a).

    q, k: (B, H, T, d_qk); v, o: (B, H, T, d_v); one KV head per query head.

    FLOPs: forward ``2·B·H·T²·(d_qk + d_v)·F_causal`` (QKᵀ and PV); backward
    ``2·B·H·T²·(3·d_qk + 2·d_v)·F_causal`` (recompute S, dP = dO·Vᵀ, dV = Pᵀ·dO, dQ = dS·K,
    dK = dSᵀ·Q), i.e. 2.5× the forward for d_qk = d_v. Source: FlashAttention-2
    ``benchmarks/benchmark_flash_attention.py`` ``flops()`` (bwd 2.5×, fwd+bwd 3.5×) and Triton's
    ``06-fused-attention.py`` ("2.0(bwd) + 0.5(recompute)"). Softmax pointwise work not counted.

    Bytes (minimal, [D]): forward reads Q, K, V, writes O and the fp32 log-sum-exp:
    ``B·H·T·((2·d_qk + 2·d_v)·bytes_qkv + 4)``; backward reads Q, K, V, O, dO, LSE, writes dQ, dK,
    dV and writes+reads D = rowsum(dO∘O): ``B·H·T·((4·d_qk + 4·d_v)·bytes_qkv + 12)``. A lower bound:
    tiled kernels re-read K, V per query tile unless L2 catches it.
    """
    d_v = d_qk if d_v is None else d_v
    Fc = _check(mode, F_causal, B=B, H=H, T=T, d_qk=d_qk, d_v=d_v, bytes_qkv=bytes_qkv)
    fwd = 2 * B * H * T**2 * (d_qk + d_v) * Fc
    fwd_bytes = B * H * T * ((2 * d_qk + 2 * d_v) * bytes_qkv + 4)
    rows = {"fwd_matmul": fwd}
    brows = {"fwd": fwd_bytes}
    if mode == "fwdbw":
        rows["bwd_matmul"] = 2 * B * H * T**2 * (3 * d_qk + 2 * d_v) * Fc
        brows["bwd"] = B * H * T * ((4 * d_qk + 4 * d_v) * bytes_qkv + 12)
    flops = sum(rows.values())
    return Counts(flops, sum(brows.values()), rows, brows, matmul_flops=flops,
                  notes=("FlashAttention accounting: matmul FLOPs only, bwd = recompute + 4 matmuls; "
                         "minimal bytes",))


def ssd_counts(mode="fwd", *, B, T, H, P, N, G=1, Q=256, F_causal=0.5, bytes_x=2) -> Counts:
    """Mamba 2 SSD chunked scan (Dao & Gu 2024, Sec. 6; mamba_ssm 2.3.2 kernels;
    docs/model-counts.md §8b).

    x: (B, T, H, P); B, C: (B, T, G, N); dt: (B, T, H); chunk Q; N_c = ceil(T/Q) (padded chunks).

    Forward FLOPs per chunk: ``G·2Q²N`` (C·Bᵀ, full Q×Q) + ``H·(2F_c·Q²P`` (masked scores · X,
    causal tiles skipped) ``+ 2Q·N·P`` (chunk states) ``+ 2N·P`` (state passing scan)
    ``+ 2Q·N·P)`` (output from states). Backward [D] (``_mamba_chunk_scan_combined_bwd``, CB and
    states recomputed): ``G·6Q²N + H·(6Q²P + 10Q·N·P + 4N·P)`` per chunk, no causal skipping assumed.

    Bytes forward (approximate, from the kernel call sequence): ``B·[3·T·H·P·b_x + 4·T·G·N·b_x +
    N_c·H·N·P·(8 + 2·b_x) + 8·N_c·G·Q² + 24·T·H]``. Bytes backward [D, rough]: x and dy read twice,
    dx written; B and C read twice, dB and dC written; states recomputed (fp32 write + read, plus
    the b_x copy) and dstates (fp32 write + read); CB and dCB (fp32, write + read); ≈48 bytes per
    (t, head) of dt/dA terms: ``B·[5·T·H·P·b_x + 6·T·G·N·b_x + N_c·H·N·P·(16 + 2·b_x) +
    16·N_c·G·Q² + 48·T·H]``.
    """
    Fc = _check(mode, F_causal, B=B, T=T, H=H, P=P, N=N, G=G, Q=Q, bytes_x=bytes_x)
    Nc = n_chunks(T, min(Q, T), "pad")
    Q = min(Q, T)
    rows = {
        "fwd_scores_CB": B * Nc * G * 2 * Q**2 * N,
        "fwd_scan_output": B * Nc * H * 2 * Fc * Q**2 * P,
        "fwd_chunk_states": B * Nc * H * 2 * Q * N * P,
        "fwd_state_passing": B * Nc * H * 2 * N * P,
        "fwd_state_output": B * Nc * H * 2 * Q * N * P,
    }
    brows = {"fwd": B * (3 * T * H * P * bytes_x + 4 * T * G * N * bytes_x
                         + Nc * H * N * P * (8 + 2 * bytes_x) + 8 * Nc * G * Q**2 + 24 * T * H)}
    if mode == "fwdbw":
        rows["bwd_matmul"] = B * Nc * (G * 6 * Q**2 * N + H * (6 * Q**2 * P + 10 * Q * N * P + 4 * N * P))
        brows["bwd"] = B * (5 * T * H * P * bytes_x + 6 * T * G * N * bytes_x
                            + Nc * H * N * P * (16 + 2 * bytes_x) + 16 * Nc * G * Q**2 + 48 * T * H)
    flops = sum(rows.values())
    return Counts(flops, sum(brows.values()), rows, brows, matmul_flops=flops,
                  notes=("Mamba 2 SSD: matmul FLOPs (+ the 2NP state scan); approximate kernel bytes",))


def gla_counts(kind="simple_gla", mode="fwd", *, B, H, T, d_k, d_v, L=64, F_causal=0.5,
               bytes_qkv=2, bytes_h=None, bytes_g=None, states_in_hbm=True) -> Counts:
    """Chunkwise GLA / simple GLA as fla's ``chunk_gla`` / ``chunk_simple_gla``
    (docs/model-counts.md §8c), and their fused (non-materialising) forms.

    q, k: (B, H, T, d_k); v, o: (B, H, T, d_v); gate g: (B, H, T) (simple GLA, scalar decay) or
    (B, H, T, d_k) (GLA, decay per key channel). Chunk L (fla default 64), N_c = ceil(T/L).

    Forward FLOPs per head and chunk: state ``(K∘decay)ᵀV`` 2L·d_k·d_v (+ 2·d_k·d_v decay),
    inter ``(Q∘decay)·h`` 2L·d_k·d_v, intra ``2F_c·L²(d_k + d_v)`` (fla computes the L×L tile whole:
    pass F_causal=1 for the executed count). GLA's extra O(L·d_k) gating and its diagonal
    sub-blocks done elementwise are lower order and not counted (as the doc).

    Bytes forward: Table 9 mLSTMsig with states in ``bytes_h`` (fla: input dtype,
    ``states_in_fp32=False``; default = bytes_qkv) and the gate read twice: ``2L·bytes_g`` (simple)
    or ``2L·d_k·bytes_g`` (GLA). Backward [D]: fla recomputes the states in fp32 and runs the
    reverse state-gradient recurrence and the dq/dk/dg, dv kernels — the same matmul structure as
    the TFLA backward, so the TFLA model (unique convention, with state recompute; bytes with
    4-byte states) is used with d_qk → d_k, d_hv → d_v.

    ``states_in_hbm=False`` counts the non-materialising (fused) form: fla's
    ``fused_chunk_simple_gla`` / ``fused_chunk_gla`` and Lightning Attention 2 (paper App. A,
    E.3) walk the chunks in order in one program per (batch, head, value block), the state in
    registers. FLOPs as above (the same products; the backward recomputes the states in a
    forward walk, then walks back for dk, dv, dg). Bytes: every input once and the output once
    forward, ``L(2d_k + 2d_v)·bytes_qkv + L·bytes_g`` per chunk, no state; backward two walks
    each reading q, k, v, g and δo and together writing δq, δk, δv, δg,
    ``2(L(2d_k + 2d_v)·bytes_qkv + gate) + (L(2d_k + d_v)·bytes_qkv + gate)``.
    """
    check_choice("kind", kind, ("gla", "simple_gla"))
    Fc = _check(mode, F_causal, B=B, H=H, T=T, d_k=d_k, d_v=d_v, L=L, bytes_qkv=bytes_qkv)
    bytes_h = bytes_qkv if bytes_h is None else bytes_h
    bytes_g = bytes_qkv if bytes_g is None else bytes_g
    L = min(L, T)
    Nc = n_chunks(T, L, "pad")
    BHN = B * H * Nc
    rows = {
        "fwd_state": BHN * (2 * L * d_k * d_v + 2 * d_k * d_v),
        "fwd_inter": BHN * 2 * L * d_k * d_v,
        "fwd_intra": BHN * 2 * Fc * L**2 * (d_k + d_v),
    }
    mm = BHN * (4 * L * d_k * d_v + 2 * Fc * L**2 * (d_k + d_v))
    gate_elems = L if kind == "simple_gla" else L * d_k
    if mode == "fwdbw":
        bmm = BHN * chunkwise_backward_matmul_flops(L, d_k, d_v, Fc, recompute_states=True)
        rows["bwd_matmul"] = bmm + BHN * 2 * 2 * d_k * d_v  # + decay of h (recompute) and of dh
        mm += bmm
    if not states_in_hbm:
        io = L * (2 * d_k + 2 * d_v) * bytes_qkv + gate_elems * bytes_g
        brows = {"fwd": BHN * io}
        if mode == "fwdbw":
            brows["bwd"] = BHN * (2 * io + L * (2 * d_k + d_v) * bytes_qkv + gate_elems * bytes_g)
        return Counts(sum(rows.values()), sum(brows.values()), rows, brows, matmul_flops=mm,
                      notes=(f"fused {kind} (no chunk state in HBM): matmul FLOPs (+ state decay)",))
    brows = {"fwd": BHN * (2 * gate_elems * bytes_g + 3 * L * (d_k + d_v) * bytes_qkv
                           + 2 * d_k * d_v * bytes_h)}
    if mode == "fwdbw":
        b = chunkwise_backward_byte_rows("sig", L, d_k, d_v, bytes_qkv, bytes_g, 4,
                                         recompute_states=True)
        brows["bwd"] = BHN * sum(b.values())
    return Counts(sum(rows.values()), sum(brows.values()), rows, brows, matmul_flops=mm,
                  notes=(f"fla chunk_{kind}: matmul FLOPs (+ state decay); backward as TFLA's model",))
