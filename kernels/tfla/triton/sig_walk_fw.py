"""mLSTMsig forward "walk": the chunk recurrence kept on chip.

One program = (d_hv block, b·head). It holds its block of the running state C (d_qk x B_DHV,
fp32) in registers and walks the chunks of its sequence in order, one chunk = one tile of L
rows (docs/tfla-kernels.md 2.4, mLSTMsig: no max state, no normaliser):

    H_k = diag(e^b · scale) (Q_k C_{k-1}) + (Q_k K_kᵀ · scale ⊙ e^D̃) V_k
    C_k = e^g C_{k-1} + K_kᵀ (ā ⊙ V_k)

so no chunk state travels through HBM: Q, K, V are read once and H written once. The loop
body is one straight chunk (no branches), so Triton's software pipeliner prefetches the next
chunk's Q, K, V tiles (TMA) while this one computes, and the tiles are small enough that
several programs share an SM and hide each other's latencies (the walk of versions 0-4 held
one program per SM; docs/kernels.md, "The forward walk").

Gate vectors come from :func:`tfla.triton.chunkwise_recurrent.chunk_gates` (b, ā's exponent
a, ī per position, g per chunk), so D̃_rs = (b_r - b_s) + ī_s is formed as in the parallel
H kernel. The calls it serves: mLSTMsig xl_chunk without normalisation, with or without the
last state (``tfla.mlstm_sig`` decides by :func:`walk_config`): without gradients alone, and
with gradients under ``chunk_size="auto"`` as the forward of the two-level backward, storing
the chunk states C_k of the backward's chunk (``states_every``) on the way (rule W6).

Where the grid is too small (rule W7), one program = (d_hv block, sequence segment, b·head):
``_sig_segment_states_kernel`` first runs each segment but the last from a zero state (in
``split`` sub-segments each, so that this pass too fills the GPU), and each walk program folds
its segment's start state from those states and their decays.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tfla.triton.common import (can_use_tma, cdiv, descriptor, dot_precision, gate_exponent, head_block,
                                launch, load_tile, pow2, store_tile)
from tfla.triton.tuning import DEFAULT, Tuning

INTERPRET = bool(triton.knobs.runtime.interpret)


@triton.jit
def _sig_walk_fw_kernel(
    Q, K, V, H, QD, KD, VD, HD, B_vec, A_vec, I_vec, G_ch, C0, N0, C_last, N_last, C_st, CD,
    C_seg, G_seg, S, NC, NC_st, NC_seg, SPLIT, d_qk, d_hv, scale,
    L: tl.constexpr, B_DQK: tl.constexpr, B_DHV: tl.constexpr, HAS_C0: tl.constexpr,
    HAS_N0: tl.constexpr, WITH_LAST: tl.constexpr, DOT_PREC: tl.constexpr,
    USE_TMA: tl.constexpr, STATES_EVERY: tl.constexpr, SEGMENTS: tl.constexpr,
):
    # STATES_EVERY R > 0: also store C_0 and the state after every R chunks into the chunk
    # states C_st (BNH, NC_st + 1, d_qk, d_hv) in the input dtype, the states of chunks of
    # R·L rows that the two-level backward reads (C_{NC_st} after the loop where R does not
    # divide NC: the padded chunks past S leave C unchanged); with USE_TMA through the
    # descriptor CD over its (BNH·(NC_st+1), d_qk, d_hv) view, and h then through pointers
    # at d_qk > 64 (two TMA store buffers would leave room for one program per SM at d_qk 128)
    # SEGMENTS > 1: this program walks chunks seg·NC_seg .. (seg+1)·NC_seg - 1 of its
    # sequence only, from the state at the segment's start, which it folds from the states
    # of the SPLIT sub-segments of each earlier segment started at zero (C_seg, G_seg:
    # _sig_segment_states_kernel)
    # 1-D grid, d_hv block fastest, then the segment: the programs of one head share its
    # Q and K tiles (L2)
    n_v = tl.cdiv(d_hv, B_DHV)
    pid = tl.program_id(0)
    pid_v = pid % n_v
    seg = (pid // n_v) % SEGMENTS
    bh = (pid // (n_v * SEGMENTS)).to(tl.int64)
    S_pad = NC * L
    v0 = pid_v * B_DHV
    rows = tl.arange(0, L)
    offs_k = tl.arange(0, B_DQK)
    offs_v = v0 + tl.arange(0, B_DHV)
    mask_c = (offs_k < d_qk)[:, None] & (offs_v < d_hv)[None, :]
    c_offs = bh * d_qk * d_hv + offs_k[:, None] * d_hv + offs_v[None, :]
    if HAS_C0:
        C = tl.load(C0 + c_offs, mask=mask_c, other=0.0).to(tl.float32)
    else:
        C = tl.zeros((B_DQK, B_DHV), dtype=tl.float32)
    # the normaliser state n, only for the last state (the walk serves unnormalised calls)
    if HAS_N0:
        n = tl.load(N0 + bh * d_qk + offs_k, mask=offs_k < d_qk, other=0.0).to(tl.float32)
    else:
        n = tl.zeros((B_DQK,), dtype=tl.float32)
    if SEGMENTS > 1:
        # C at the segment's start: C_{t+1} = e^{G_t} C_t + (sub-segment t's state from zero)
        n_sum = (SEGMENTS - 1) * SPLIT
        for t in range(seg * SPLIT):
            C = C * tl.exp(tl.load(G_seg + bh * n_sum + t)) + tl.load(
                C_seg + (bh * n_sum + t) * d_qk * d_hv + offs_k[:, None] * d_hv
                + offs_v[None, :], mask=mask_c, other=0.0)
        c_lo = seg * NC_seg
    else:
        c_lo = 0
    st_row = bh * (NC_st + 1)       # C_k is "row" st_row + k of the view
    if STATES_EVERY > 0:
        # C_0 (a later segment's start state is the last state its predecessor stores)
        if SEGMENTS == 1:
            store_tile(CD, C_st, C.to(C_st.dtype.element_ty), st_row, 0, v0, d_qk, d_hv, B_DQK,
                       B_DHV, USE_TMA)
        elif seg == 0:
            store_tile(CD, C_st, C.to(C_st.dtype.element_ty), st_row, 0, v0, d_qk, d_hv, B_DQK,
                       B_DHV, USE_TMA)
    for c in range(c_lo, c_lo + NC_seg):
        t0 = c * L
        q = load_tile(QD, Q, bh, t0, 0, S, d_qk, L, B_DQK, USE_TMA)
        k = load_tile(KD, K, bh, t0, 0, S, d_qk, L, B_DQK, USE_TMA)
        v = load_tile(VD, V, bh, t0, v0, S, d_hv, L, B_DHV, USE_TMA)
        b = tl.load(B_vec + bh * S_pad + t0 + rows)
        ii = tl.load(I_vec + bh * S_pad + t0 + rows)           # ī, -inf past S
        a = tl.load(A_vec + bh * S_pad + t0 + rows)            # a = g - b + ī, -inf past S
        g = tl.load(G_ch + bh * NC + c)
        # inter-chunk part, rows scaled by e^b · scale in fp32
        acc = tl.dot(q, C.to(q.dtype), input_precision=DOT_PREC) * (tl.exp(b) * scale)[:, None]
        # intra-chunk part; every exponent is <= 0 on and below the diagonal
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        d_log = gate_exponent(b, None, b, ii, rows, rows, False)
        s_bar = s * (tl.exp(d_log) * scale)
        acc = tl.dot(s_bar.to(v.dtype), v, acc, input_precision=DOT_PREC)
        store_tile(HD, H, acc.to(H.dtype.element_ty), bh, t0, v0, S, d_hv, L, B_DHV,
                   USE_TMA and (STATES_EVERY == 0 or B_DQK <= 64))
        # state update: C_k = e^g C_{k-1} + Kᵀ (ā ⊙ V)  (ā = 0 past S)
        a_bar = tl.exp(a)
        v_bar = (v.to(tl.float32) * a_bar[:, None]).to(v.dtype)
        C = tl.dot(tl.trans(k), v_bar, C * tl.exp(g), input_precision=DOT_PREC)
        if WITH_LAST:
            n = n * tl.exp(g) + tl.sum(k.to(tl.float32) * a_bar[:, None], 0)
        if STATES_EVERY > 0:
            if (c + 1) % STATES_EVERY == 0:
                store_tile(CD, C_st, C.to(C_st.dtype.element_ty), st_row + (c + 1) // STATES_EVERY,
                           0, v0, d_qk, d_hv, B_DQK, B_DHV, USE_TMA)
    if STATES_EVERY > 0:
        if NC % STATES_EVERY != 0:
            store_tile(CD, C_st, C.to(C_st.dtype.element_ty), st_row + NC_st, 0, v0, d_qk, d_hv,
                       B_DQK, B_DHV, USE_TMA)
    if WITH_LAST:
        tl.store(C_last + c_offs, C, mask=mask_c)
        tl.store(N_last + bh * d_qk + offs_k, n, mask=(offs_k < d_qk) & (offs_k * 0 + pid_v == 0))


@triton.jit
def _sig_segment_states_kernel(
    K, V, KD, VD, A_vec, G_ch, C_seg, G_seg, S, NC, NC_seg, n_sum, d_qk, d_hv,
    L: tl.constexpr, B_DQK: tl.constexpr, B_DHV: tl.constexpr,
    DOT_PREC: tl.constexpr, USE_TMA: tl.constexpr,
):
    # The state after (sub-)segment seg (chunks seg·NC_seg .. (seg+1)·NC_seg - 1) from a zero
    # state, C = e^g C + Kᵀ (ā ⊙ V) per chunk as in the walk, into C_seg (BNH, n_sum, d_qk,
    # d_hv) fp32, and its log decay G = Σ g into G_seg (BNH, n_sum); for the first n_sum
    # (those before the walk's last segment). Grid: (d_hv block, sub-segment, b·head).
    n_v = tl.cdiv(d_hv, B_DHV)
    pid = tl.program_id(0)
    pid_v = pid % n_v
    seg = (pid // n_v) % n_sum
    bh = (pid // (n_v * n_sum)).to(tl.int64)
    S_pad = NC * L
    v0 = pid_v * B_DHV
    rows = tl.arange(0, L)
    offs_k = tl.arange(0, B_DQK)
    offs_v = v0 + tl.arange(0, B_DHV)
    C = tl.zeros((B_DQK, B_DHV), dtype=tl.float32)
    g_sum = 0.0
    for c in range(seg * NC_seg, (seg + 1) * NC_seg):
        t0 = c * L
        k = load_tile(KD, K, bh, t0, 0, S, d_qk, L, B_DQK, USE_TMA)
        v = load_tile(VD, V, bh, t0, v0, S, d_hv, L, B_DHV, USE_TMA)
        a = tl.load(A_vec + bh * S_pad + t0 + rows)
        g = tl.load(G_ch + bh * NC + c)
        v_bar = (v.to(tl.float32) * tl.exp(a)[:, None]).to(v.dtype)
        C = tl.dot(tl.trans(k), v_bar, C * tl.exp(g), input_precision=DOT_PREC)
        g_sum += g
    mask_c = (offs_k < d_qk)[:, None] & (offs_v < d_hv)[None, :]
    tl.store(C_seg + (bh * n_sum + seg) * d_qk * d_hv + offs_k[:, None] * d_hv
             + offs_v[None, :], C, mask=mask_c)
    tl.store(G_seg + bh * n_sum + seg, g_sum, mask=pid_v == 0)


#: the most sequence segments the walk splits a sequence into, and the fewest chunks a
#: segment may have (rule W7)
MAX_SEGMENTS = 16
MIN_SEGMENT_CHUNKS = 8
#: programs per SM from which the walk runs the whole sequence in one segment (rule W4), and
#: the programs per SM a segmented walk aims at (rule W7)
WHOLE_PROGRAMS_PER_SM = 1.2
SEGMENT_TARGET_PER_SM = 1.5
#: the fewest chunks (of the segment-state pass) a sub-segment of that pass may have
MIN_SPLIT_CHUNKS = 4


def _segments_fit(segments: int, S: int, L: int, states_every: int, with_last: bool) -> bool:
    """Whether the walk can run over ``segments`` sequence segments: no last state (the
    segmented walk carries no normaliser state) and the chunks of S in equal segments of
    whole steps of ``states_every`` chunks."""
    step = segments * max(states_every, 1)
    return not with_last and S > 0 and cdiv(S, L) % step == 0


def walk_segments(programs: int, target: float, S: int, L: int, states_every: int = 1,
                  with_last: bool = False, whole: float | None = None) -> int | None:
    """The number of sequence segments the walk runs a grid of ``programs`` programs with so
    that it has at least ``target`` programs (rule W7): the smallest power of two that gets
    there, at most :data:`MAX_SEGMENTS`, dividing the number of chunks of S (in steps of
    ``states_every`` chunks) into segments of at least :data:`MIN_SEGMENT_CHUNKS` chunks;
    1 where the grid has ``whole`` programs (rule W4; None: ``target``); None where no such
    count exists (or ``with_last``: the segmented walk carries no normaliser state) and the
    two-level kernels run.

    Measured on one NVIDIA H100 against the two-level kernels in the same process
    (docs/kernels.md, rule W7; its numbers in docs/kernel-measurements.md)."""
    if programs >= (target if whole is None else whole):
        return 1
    seg = 2
    while programs * seg < target and seg < MAX_SEGMENTS:
        seg *= 2
    if (programs * seg < target or not _segments_fit(seg, S, L, states_every, with_last)
            or cdiv(S, L) // seg < MIN_SEGMENT_CHUNKS):
        return None
    return seg


def _int_at_least(x, low: int) -> bool:
    """Whether x is an int (not a bool) of at least ``low``."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= low


def _is_block(x) -> bool:
    """Whether x can be a d_hv block of the segment-state pass: a power of two >= 16 (the
    smallest tl.dot side)."""
    return _int_at_least(x, 16) and not x & (x - 1)


def _pass_chunks(S: int, L: int, segments: int) -> tuple[int, int]:
    """(chunk, chunks per segment) of the segment-state pass: chunks of 2L where a segment
    holds an even number of chunks of L, else of L."""
    per_seg = cdiv(S, L) // segments
    return (L, per_seg) if per_seg % 2 else (2 * L, per_seg // 2)


def segment_split(programs: int, target: float, S: int, L: int, segments: int) -> int:
    """Sub-segments per segment in the segment-state pass (rule W8): the smallest power of two
    that gives its grid of ``programs`` programs (per sub-segment) at least ``target``
    programs, dividing each segment's chunks of the pass (:func:`_pass_chunks`) into
    sub-segments of at least :data:`MIN_SPLIT_CHUNKS` chunks; 1 without segments. Each pass
    program walks its sub-segment's chunks one after the other, so a grid of one program per
    SM spends its time waiting on each step. Measured on one H200, Figure 4's heads, fwd+bwd
    (docs/kernels.md, rule W8; its numbers in docs/kernel-measurements.md)."""
    if segments <= 1:
        return 1
    _, chunks = _pass_chunks(S, L, segments)
    split = 1
    while (programs * split < target and chunks % (2 * split) == 0
           and chunks // (2 * split) >= MIN_SPLIT_CHUNKS):
        split *= 2
    return split


def walk_config(L: int, d_qk: int, d_hv: int, BNH: int, dtype: torch.dtype,
                n_sms: int = 0, with_last: bool = False, tuning: Tuning = DEFAULT,
                train: bool = False, S: int = 0, states_every: int = 1) -> dict | None:
    """The walk's launch configuration for one call, or None where the parallel kernels run.

    The rule (measured on the H200, bf16, forward; docs/kernels.md, rules W1-W5):
    the walk runs at L = 64 in 16-bit dtypes with d_qk <= 128 and d_hv <= 256, with d_hv
    blocks of 128 for d_qk <= 64 and of 64 above, 4 warps, 2 stages, and only where the
    grid has at least :data:`WHOLE_PROGRAMS_PER_SM` (1.2) programs per SM (each program walks
    the whole sequence, so a smaller grid leaves SMs idle; ``n_sms`` 0, as in the
    interpreter, means no bound; 1.2 lies between the grids measured faster, 1.45 per SM,
    and slower, 0.97, rule W4).
    For d_qk > 64 without the last state (``with_last``) the registers are capped at 240
    (``maxnreg``): uncapped, ptxas gives these programs 252 and they ran like one per SM
    (the same h bit for bit); with the last state or at d_qk <= 64 a cap was slower.
    Where the rule takes a call, the walk beat the parallel kernels at their own best L.
    Not measured faster, so not taken: L 128, d_qk 256, fp32 inputs, a grid of one program
    per SM. ``tuning.walk``'s keys win (``enabled`` False: never walk). The measured numbers
    of rules W1-W8: docs/kernel-measurements.md.

    Where the grid has fewer programs (W7), the walk runs over sequence segments, as many as
    bring the grid to :data:`SEGMENT_TARGET_PER_SM` (1.5) programs per SM
    (:func:`walk_segments`; ``S`` the sequence length, 0: unknown, no segments;
    ``states_every`` the training walk's R), each program walking one segment from a start
    state that a first pass over K and V (``_sig_segment_states_kernel``) gives; where no
    segment count applies, None. ``tuning.walk["SEGMENTS"]`` sets the count (None where it
    does not divide the chunks or with ``with_last``).

    ``train``: the call needs gradients, so the walk also stores the chunk states for the
    two-level backward (``states_every``; rule W6): the same rule (``tuning.walk["train"]``
    False: never), measured on one NVIDIA H100, bf16, fwd+bwd against the two-level forward
    at L 128 in the same process. In this mode the kernel writes h with pointer stores at
    d_qk > 64: with TMA stores of both h and C_k a program needs 115,736 bytes of shared
    memory at d_qk 128 and only one fits an SM (slower); at d_qk <= 64 both through TMA fit
    two (82,968 bytes), 1 % faster at the small heads.

    The segment-state pass has its own d_hv block (``tuning.walk["SEGMENT_B_DHV"]``, default
    B_DHV) and runs each segment in :func:`segment_split` sub-segments (rule W8; at least
    ``SEGMENT_PROGRAMS_PER_SM`` = 2 programs per SM; ``SEGMENT_SPLIT`` sets the count), its
    tiles in 4 pipeline stages (``SEGMENT_STAGES``; faster than 3 or 2 at Figure 4's S 65536,
    rule W8).

    Returns: dict(L, B_DHV, num_warps, num_stages, maxnreg, segments, segment_split,
    segment_b_dhv, segment_stages) for :func:`sig_walk_fw`, or None.

    Raises:
        ValueError: ``tuning.walk["SEGMENTS"]`` or ``["SEGMENT_SPLIT"]`` is not an integer
            >= 1, or ``["SEGMENT_B_DHV"]`` not a power of two >= 16, or
            ``["SEGMENT_STAGES"]`` not an integer >= 1.
    """
    over = tuning.walk
    if not over.get("enabled", True) or (train and not over.get("train", True)):
        return None
    if (L != 64 or d_qk > 128 or d_hv > 256 or dtype not in (torch.bfloat16, torch.float16)):
        return None
    b_hv = over.get("B_DHV", head_block(d_hv, 128 if d_qk <= 64 else 64))
    programs = cdiv(d_hv, b_hv) * BNH
    if "SEGMENTS" in over:
        segments = over["SEGMENTS"]
        if not _int_at_least(segments, 1):
            raise ValueError(f"Tuning.walk SEGMENTS: got {segments!r}; allowed: an integer >= 1")
        if segments > 1 and not _segments_fit(segments, S, L, states_every, with_last):
            return None
    else:
        target = over.get("SEGMENT_TARGET_PER_SM", SEGMENT_TARGET_PER_SM) * n_sms
        whole = over.get("MIN_PROGRAMS_PER_SM", WHOLE_PROGRAMS_PER_SM) * n_sms
        segments = walk_segments(programs, target, S, L, states_every, with_last, whole)
        if segments is None:
            return None
    cap = 240 if (d_qk > 64 and not with_last) else None
    seg_b_hv = over.get("SEGMENT_B_DHV", b_hv)
    if not _is_block(seg_b_hv):
        raise ValueError(f"Tuning.walk SEGMENT_B_DHV: got {seg_b_hv!r}; allowed: a power of "
                         "two >= 16")
    if "SEGMENT_SPLIT" in over and not _int_at_least(over["SEGMENT_SPLIT"], 1):
        raise ValueError(f"Tuning.walk SEGMENT_SPLIT: got {over['SEGMENT_SPLIT']!r}; allowed: "
                         "an integer >= 1")
    stages = over.get("SEGMENT_STAGES", 4)
    if not _int_at_least(stages, 1):
        raise ValueError(f"Tuning.walk SEGMENT_STAGES: got {stages!r}; allowed: an integer >= 1")
    split = over.get("SEGMENT_SPLIT", segment_split(
        cdiv(d_hv, seg_b_hv) * (segments - 1) * BNH,
        over.get("SEGMENT_PROGRAMS_PER_SM", 2) * n_sms, S, L, segments))
    return dict(L=L, B_DHV=b_hv, num_warps=over.get("num_warps", 4),
                num_stages=over.get("num_stages", 2), maxnreg=over.get("maxnreg", cap),
                segments=segments, segment_split=split, segment_b_dhv=seg_b_hv,
                segment_stages=stages)


def sig_walk_fw(q, k, v, i, f, C0, n0=None, *, L: int, B_DHV: int, num_warps: int,
                num_stages: int, maxnreg: int | None = None, with_last: bool = False,
                states_every: int = 0, segments: int = 1, segment_split: int = 1,
                segment_b_dhv: int = 0, segment_stages: int = 4, gates_2l=None):
    """h (BNH, S, d_hv) in the input dtype: mLSTMsig without normalisation (paper eqs. 22-23);
    with ``with_last`` (h, C_S (BNH, d_qk, d_hv) fp32, n_S (BNH, d_qk) fp32).

    ``states_every`` R > 0 (training): also the chunk states of chunks of R·L rows, C_st
    (BNH, N + 1, d_qk, d_hv) in the input dtype with N = ceil(S / (R·L)), C_st[:, 0] = C0 (or
    0), as :func:`tfla.triton.chunkwise_recurrent.recurrent_fw` stores them for the
    backward; the return value is then (h, C_last, n_last, C_st) (C_last, n_last None
    without ``with_last``). 16-bit: they are stored through a TMA descriptor (only where
    due: a branch in the loop) and h through pointers at d_qk > 64 (rule W6); fp32 or where
    TMA does not apply: pointer stores.

    ``segments`` G > 1 (rule W7): each program walks one of G equal segments of the chunks;
    a first launch (``_sig_segment_states_kernel``, chunks of 2L where a segment holds an
    even number of chunks, d_hv blocks of ``segment_b_dhv``, 0: ``B_DHV``, ``segment_stages``
    pipeline stages) gives the states after each of the ``segment_split`` sub-segments of the
    first G - 1 segments from zero and their log decays, from which each program forms its
    segment's start state.

    q, k (BNH, S, d_qk), v (BNH, S, d_hv) contiguous in a 16-bit or fp32 dtype; i, f (BNH, S)
    gate pre-activations; C0 (BNH, d_qk, d_hv), n0 (BNH, d_qk) or None. L: the chunk (a power
    of two, >= 16; one tile of L rows); the other arguments as :func:`walk_config` returns them.
    ``gates_2l``: ``chunk_gates(i, f, L=2·L, is_exp=False)`` where the caller has them (the
    training walk's backward runs at 2L), so that a segment-state pass at chunks of 2L does
    not compute them again.

    Raises:
        ValueError: ``segments`` > 1 with ``with_last``, or not dividing the chunks of S in
            steps of ``states_every``; ``segment_split`` not dividing a segment's chunks of
            the segment-state pass; ``segment_b_dhv`` neither 0 nor a power of two >= 16.
    """
    from tfla.triton.chunkwise_recurrent import chunk_gates

    BNH, S, d_qk = q.shape
    d_hv = v.shape[-1]
    NC = cdiv(S, L)
    b_vec, a_vec, i_vec, _, g_ch, _ = chunk_gates(i, f, L=L, is_exp=False)
    h = torch.empty((BNH, S, d_hv), device=q.device, dtype=q.dtype)
    C_last = n_last = C_st = h
    NC_st = 0
    if states_every:
        NC_st = cdiv(S, states_every * L)
        C_st = torch.empty((BNH, NC_st + 1, d_qk, d_hv), device=q.device, dtype=q.dtype)
    if with_last:
        C_last = torch.empty((BNH, d_qk, d_hv), device=q.device, dtype=torch.float32)
        n_last = torch.empty((BNH, d_qk), device=q.device, dtype=torch.float32)
    b_qk = max(16, pow2(d_qk))
    C_view = C_st.view(-1, d_qk, d_hv) if states_every else C_st
    use_tma = q.dtype in (torch.bfloat16, torch.float16) and can_use_tma(
        q, k, v, h, C_view, blocks=(L, b_qk, B_DHV))
    n_v = cdiv(d_hv, B_DHV)
    C_seg = G_seg = h
    NC_seg = NC
    if segments > 1:
        if not _segments_fit(segments, S, L, states_every, with_last):
            raise ValueError(f"sig_walk_fw: segments={segments} needs no last state and a "
                             f"number of chunks ({NC}) divisible by segments x states_every "
                             f"({segments} x {max(states_every, 1)})")
        NC_seg = NC // segments
        L_pass, per_seg = _pass_chunks(S, L, segments)
        if segment_split < 1 or per_seg % segment_split:
            raise ValueError(f"sig_walk_fw: segment_split={segment_split} must divide the "
                             f"{per_seg} chunks of {L_pass} of each segment")
        if segment_b_dhv and not _is_block(segment_b_dhv):
            raise ValueError(f"sig_walk_fw: segment_b_dhv={segment_b_dhv} must be 0 (the "
                             "walk's B_DHV) or a power of two >= 16 (the smallest tl.dot side)")
        C_seg, G_seg = _segment_states(k, v, i, f, L=L_pass, segments=segments,
                                       split=segment_split, B_DHV=segment_b_dhv or B_DHV,
                                       b_qk=b_qk, stages=segment_stages,
                                       gates=gates_2l if L_pass == 2 * L else None)
    grid = (n_v * segments * BNH,)
    extra = {"maxnreg": maxnreg} if maxnreg else {}
    launch(
        _sig_walk_fw_kernel, grid,
        q, k, v, h, descriptor(q, (1, L, b_qk), use_tma), descriptor(k, (1, L, b_qk), use_tma),
        descriptor(v, (1, L, B_DHV), use_tma),
        descriptor(h, (1, L, B_DHV), use_tma and (not states_every or b_qk <= 64)),
        b_vec, a_vec, i_vec, g_ch, C0 if C0 is not None else h, n0 if n0 is not None else h,
        C_last, n_last, C_st, descriptor(C_view, (1, b_qk, B_DHV), use_tma and states_every),
        C_seg, G_seg, S, NC, NC_st, NC_seg, segment_split, d_qk, d_hv, d_qk ** -0.5,
        L=L, B_DQK=b_qk, B_DHV=B_DHV, HAS_C0=C0 is not None, HAS_N0=n0 is not None,
        WITH_LAST=with_last, DOT_PREC=dot_precision(q.dtype), USE_TMA=use_tma,
        STATES_EVERY=states_every, SEGMENTS=segments, num_warps=num_warps,
        num_stages=num_stages, **extra,
    )
    if states_every:
        return (h, C_last, n_last, C_st) if with_last else (h, None, None, C_st)
    return (h, C_last, n_last) if with_last else h


def _segment_states(k, v, i, f, *, L: int, segments: int, split: int, B_DHV: int, b_qk: int,
                    stages: int, gates=None):
    """The states after each of the ``split`` sub-segments of the first ``segments`` - 1
    segments of the sequence, each started from zero (C_seg (BNH, (segments - 1)·split, d_qk,
    d_hv) fp32), and their log decays (G_seg (BNH, (segments - 1)·split) fp32), from chunks
    of L (``_sig_segment_states_kernel``, ``stages`` pipeline stages); ``gates``:
    ``chunk_gates`` of i, f at L where the caller has them."""
    from tfla.triton.chunkwise_recurrent import chunk_gates

    BNH, S, d_qk = k.shape
    d_hv = v.shape[-1]
    NC = cdiv(S, L)
    if gates is None:
        gates = chunk_gates(i, f, L=L, is_exp=False)
    _, a_vec, _, _, g_ch, _ = gates
    n_sum = (segments - 1) * split
    C_seg = torch.empty((BNH, n_sum, d_qk, d_hv), device=k.device, dtype=torch.float32)
    G_seg = torch.empty((BNH, n_sum), device=k.device, dtype=torch.float32)
    use_tma = k.dtype in (torch.bfloat16, torch.float16) and can_use_tma(
        k, v, blocks=(L, b_qk, B_DHV))
    n_v = cdiv(d_hv, B_DHV)
    launch(_sig_segment_states_kernel, (n_v * n_sum * BNH,),
           k, v, descriptor(k, (1, L, b_qk), use_tma), descriptor(v, (1, L, B_DHV), use_tma),
           a_vec, g_ch, C_seg, G_seg, S, NC, NC // (segments * split), n_sum, d_qk, d_hv,
           L=L, B_DQK=b_qk, B_DHV=B_DHV, DOT_PREC=dot_precision(k.dtype),
           USE_TMA=use_tma, num_warps=4 if B_DHV <= 64 else 8, num_stages=stages)
    return C_seg, G_seg
