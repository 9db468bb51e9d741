"""Forward FLOP and byte counts of the mLSTM (paper App. F, Tables 8-17).

Variants ``sig`` (mLSTMsig, sigmoid input gate) and ``exp`` (mLSTMexp, exponential input gate);
formulations ``chunkwise`` (what TFLA runs), ``parallel`` and ``recurrent``.

Two counting modes (docs/model-counts.md §3, "Two counting modes"):

- ``rows`` (default): every FLOP total is the sum of its table rows (Tables 8, 10, 12, with
  general F_OP factors); every byte total is load + store. This is what a kernel does.
- ``paper``: the chunkwise totals are the printed Table 17 expressions (which differ from the
  row sums: inconsistencies I2 and I3, docs/model-counts.md §3 — the printed mLSTMsig total was
  built with the mLSTMexp gates row, the mLSTMexp total has 4·d_hv where the rows give 2·d_hv). A
  breakdown then shows one extra row ``paper_table17_adjustment`` = printed − rows. Parallel and
  recurrent totals and all byte totals are the same as in ``rows`` (Table 13's swapped totals, I5,
  are not reproduced). Requires all F_OP = 1. The paper's figures and equations 111, 116, 118, 121
  use it.

Table 14-16 ("simplified") are Tables 8, 10, 12 evaluated at F_OP = 1 (``FOps()``), never typed
separately; the Table 14 mLSTMsig cum_fgates misprint (I1) is therefore not reproduced.
"""

from __future__ import annotations

from tflabench.errors import UserError
from tflabench.model._common import (COUNT_MODES, FORMULATIONS, VARIANTS, Counts, FOps, check_causal, check_choice,
                                     check_positive, n_chunks, resolve_d_qk)

CHUNKWISE_RECURRENT_ROWS = ("gates", "numerator", "denominator")
CHUNKWISE_PARALLEL_ROWS = (
    "cum_fgates",
    "gate_matrix",
    "intra_outputs",
    "inter_outputs",
    "output_combination",
)
CHUNKWISE_ROWS = CHUNKWISE_RECURRENT_ROWS + CHUNKWISE_PARALLEL_ROWS
PARALLEL_ROWS = ("cum_fgates", "gate_matrix", "attention_logits", "normalization", "outputs")
RECURRENT_ROWS = ("gates", "cell_update", "denominator_scale", "output")
PAPER_ADJUSTMENT_ROW = "paper_table17_adjustment"


# ------------------------------------------------------------------ per-unit table entries


def chunkwise_flop_rows(variant: str, L, d_qk, d_hv, F_causal, F: FOps = FOps()) -> dict:
    """FLOPs per head and chunk, paper Table 8 (Table 14 at F_OP = 1).

    The first three rows run in the recurrent (inter-chunk state) kernel, the rest in the
    parallel (output) kernel. ``L`` may be real (App. F/G treat it as such).
    """
    if variant == "exp":
        return {
            "gates": 2 * L + L * (L + 1) / 2 + L * (1 + F.exp + F.log + F.sig) + 3 + F.max + F.exp,
            "numerator": 2 * d_qk * d_hv + 2 * L * d_qk * d_hv + L * d_qk,
            "denominator": 2 * d_qk + 2 * L * d_qk,
            "cum_fgates": L * (L + 1) / 2 + L * (F.log + F.sig),
            "gate_matrix": F_causal * (L**2 * (3 + F.exp + F.max) + L * (1 + F.max)),
            "intra_outputs": F_causal * (2 * L**2 * (d_qk + d_hv) + 3 * L**2),
            "inter_outputs": 2 * L * d_qk * d_hv + 3 * L * d_qk,
            "output_combination": 2 * L * d_hv + L * (1 + F.max + F.abs + F.exp),
        }
    return {
        "gates": 2 * L + L * (L + 1) / 2 + L * F.exp + F.exp + 2 * L * (F.log + F.sig),
        "numerator": 2 * d_qk * d_hv + 2 * L * d_qk * d_hv + L * d_qk,
        "denominator": 0.0,
        "cum_fgates": L * (L + 1) / 2 + 2 * L * (F.log + F.sig),
        "gate_matrix": F_causal * L**2 * (2 + F.exp),
        "intra_outputs": F_causal * (2 * L**2 * (d_qk + d_hv) + 3 * L**2),
        "inter_outputs": 2 * L * d_qk * d_hv + L * d_qk,
        "output_combination": L * d_hv,
    }


def chunkwise_paper_total(variant: str, L, d_qk, d_hv, F_causal) -> float:
    """Printed Table 17 chunkwise total divided by N_chunk = S/L: FLOPs per head and chunk.

    Table 17 (per head, full sequence, batch 1; its caption's "per chunk" is wrong, I6):
    sig ``S·L·F_c·(2(d_qk+d_hv)+6) + S·L + S(4·d_qk·d_hv + 2·d_qk + d_hv + 11) + (S/L)(2·d_qk·d_hv + 5)``,
    exp ``S·L·F_c·(2(d_qk+d_hv)+8) + S·L + 2S·F_c + S(4·d_qk·d_hv + 6·d_qk + 4·d_hv + 13)
    + (S/L)(2·d_qk·d_hv + 2·d_qk + 5)``. F_OP = 1.
    """
    if variant == "exp":
        return (
            L**2 * F_causal * (2 * (d_qk + d_hv) + 8)
            + L**2
            + 2 * L * F_causal
            + L * (4 * d_qk * d_hv + 6 * d_qk + 4 * d_hv + 13)
            + (2 * d_qk * d_hv + 2 * d_qk + 5)
        )
    return (
        L**2 * F_causal * (2 * (d_qk + d_hv) + 6)
        + L**2
        + L * (4 * d_qk * d_hv + 2 * d_qk + d_hv + 11)
        + (2 * d_qk * d_hv + 5)
    )


def chunkwise_byte_rows(variant: str, L, d_qk, d_hv, bytes_qkv=2, bytes_if=2, bytes_Cmn=4) -> dict:
    """HBM bytes per head and chunk, paper Table 9 (loads and stores of both kernels).

    The recurrent kernel reads K, V and both gates and writes C_k (and n_k, m_k for exp); the
    parallel kernel reads Q, K, V, both gates and C_{k-1} (n, m) and writes H (for exp also the
    per-row normaliser and max state, 2L·bytes_Cmn). Initial/final state traffic not counted.
    """
    state = (d_qk * d_hv + d_qk + 1) if variant == "exp" else d_qk * d_hv
    return {
        "recurrent_load": L * (d_qk + d_hv) * bytes_qkv + 2 * L * bytes_if,
        "recurrent_store": state * bytes_Cmn,
        "parallel_load": L * (2 * d_qk + d_hv) * bytes_qkv + 2 * L * bytes_if + state * bytes_Cmn,
        "parallel_store": L * d_hv * bytes_qkv + (2 * L * bytes_Cmn if variant == "exp" else 0.0),
    }


def walk_byte_rows(variant: str, L, d_qk, d_hv, bytes_qkv=2, bytes_if=2, bytes_Cmn=4) -> dict:
    """HBM bytes per head and chunk of a kernel that walks the chunks with the state on chip
    (mLSTMsig's forward walk): Table 9's parallel-kernel loads and stores without C_{k-1}
    (n, m) and without the recurrent kernel, whose state never leaves the chip. ``bytes_Cmn``
    counts only mLSTMexp's per-row normaliser and max state written with H."""
    return {
        "walk_load": L * (2 * d_qk + d_hv) * bytes_qkv + 2 * L * bytes_if,
        "walk_store": L * d_hv * bytes_qkv + (2 * L * bytes_Cmn if variant == "exp" else 0.0),
    }


def parallel_flop_rows(variant: str, S, d_qk, d_hv, F_causal, F: FOps = FOps()) -> dict:
    """FLOPs per head and full sequence, paper Table 10 (Table 15 at F_OP = 1).

    Kept as printed (paper and authors' code agree): the gate matrix is not scaled by F_causal
    and the mLSTMsig gate matrix repeats the mLSTMexp row (docs/model-counts.md §2.5).
    """
    return {
        "cum_fgates": S * (S + 1) / 2 + (1 if variant == "exp" else 2) * S * (F.log + F.sig),
        "gate_matrix": S**2 * (3 + F.exp + F.max + F.mask),
        "attention_logits": F_causal * (2 * S**2 * d_qk + 2 * S**2),
        "normalization": (
            F_causal * (S**2 * (3 + F.abs) + S * (F.exp + F.max)) if variant == "exp" else 0.0
        ),
        "outputs": F_causal * 2 * S**2 * d_hv,
    }


def parallel_byte_rows(variant: str, S, d_qk, d_hv, bytes_qkv=2, bytes_if=2, bytes_Cmn=4) -> dict:
    """HBM bytes per head and full sequence, paper Table 11 (S×S matrices never reach HBM)."""
    return {
        "load": S * (2 * d_qk + d_hv) * bytes_qkv + 2 * S * bytes_if,
        "store": S * d_hv * bytes_qkv + (2 * S * bytes_Cmn if variant == "exp" else 0.0),
    }


def recurrent_flop_rows(variant: str, d_qk, d_hv, F: FOps = FOps()) -> dict:
    """FLOPs per head and time step, paper Table 12 (Table 16 at F_OP = 1)."""
    if variant == "exp":
        return {
            "gates": 4 + 2 * F.exp + F.log + F.sig + F.max,
            "cell_update": 4 * d_qk * d_hv,
            "denominator_scale": 6 * d_qk + d_hv + 1 + F.abs + F.max,
            "output": 2 * d_hv * d_qk + d_qk,
        }
    return {
        "gates": 2 * F.sig,
        "cell_update": 4 * d_qk * d_hv,
        "denominator_scale": 0.0,
        "output": 2 * d_hv * d_qk + d_qk,
    }


def recurrent_byte_rows(variant: str, d_qk, d_hv, bytes_qkv=2, bytes_if=2, bytes_Cmn=4) -> dict:
    """HBM bytes per head and time step, paper Table 13 (states materialised every step).

    Totals are load + store in both modes: the paper prints the exp and sig totals swapped (I5).
    """
    state = (d_qk * d_hv + d_qk + 1) if variant == "exp" else d_qk * d_hv
    return {
        "load": (2 * d_qk + d_hv) * bytes_qkv + 2 * bytes_if + state * bytes_Cmn,
        "store": d_hv * bytes_qkv + state * bytes_Cmn,
    }


def chunkwise_matmul_flops(L, d_qk, d_hv, F_causal) -> float:
    """Tensor-core FLOPs per head and chunk of the chunkwise forward (docs/model-counts.md §2.2).

    ``2L·d_qk·d_hv`` (K̄ᵀV) + ``2L·d_qk·d_hv`` (Q̄C) + ``2F_causal·L²(d_qk + d_hv)`` (QKᵀ, S̄V).
    """
    return 4 * L * d_qk * d_hv + 2 * F_causal * L**2 * (d_qk + d_hv)


# ------------------------------------------------------------------ whole call


def mlstm_counts(variant: str, formulation: str = "chunkwise", *, S, d_hv, L=None, d_qk=None, p_qk=None,
                 B=1, NH=1, F_causal=0.5, F_ops: FOps | None = None, bytes_qkv=2, bytes_if=2, bytes_Cmn=4,
                 counts: str = "rows", chunks: str = "divide", states_on_chip: bool = False) -> Counts:
    """Forward FLOPs and HBM bytes of one mLSTM call (paper App. F, Tables 8-17).

    Args:
        variant: ``"sig"`` (mLSTMsig) or ``"exp"`` (mLSTMexp).
        formulation: ``"chunkwise"`` (Tables 8, 9), ``"parallel"`` (10, 11), ``"recurrent"`` (12, 13).
        S: sequence length (tokens). d_hv: value/hidden head dim. d_qk or p_qk (= d_qk/d_hv,
            default 0.5): query/key head dim. L: chunk size (chunkwise only, 1 <= L <= S).
        B, NH: batch size and number of heads (the tables are per head, batch 1).
        F_causal: fraction of each L×L (S×S) matrix computed, in [0.5, 1].
        F_ops: F_OP factors (default all 1).
        bytes_qkv, bytes_if, bytes_Cmn: bytes per element of q/k/v/h, gate pre-activations, states.
        counts: ``"rows"`` or ``"paper"`` (module docstring).
        chunks: N_c convention: ``"divide"`` (S % L == 0 required), ``"pad"`` (ceil) or ``"real"``.
        states_on_chip: (chunkwise) one kernel walks the chunks and keeps C_k (n_k, m_k) on chip,
            as mLSTMsig's forward walk does (docs/kernels.md): the byte rows are Q, K, V and
            the gates read once and H written (:func:`walk_byte_rows`), no state traffic; the
            FLOP rows are the chunkwise ones.

    Returns:
        :class:`Counts` per call: ``flop_rows`` named as the tables' rows (plus
        ``paper_table17_adjustment`` in paper mode, chunkwise), ``byte_rows`` per kernel and
        direction, ``matmul_flops`` the tensor-core part (None for recurrent).

    Raises:
        UserError: unknown variant/formulation/counts, sizes <= 0, L outside [1, S] or not dividing
            S (``chunks="divide"``), F_causal outside [0.5, 1], F_OP != 1 with ``counts="paper"``.
    """
    check_choice("variant", variant, VARIANTS)
    check_choice("formulation", formulation, FORMULATIONS)
    check_choice("counts", counts, COUNT_MODES)
    F = F_ops if F_ops is not None else FOps()
    if counts == "paper" and not F.all_one():
        raise UserError(
            f"{F.first_not_one()} is not allowed with counts='paper'; Table 17 is defined only for F_OP = 1"
        )
    d_qk = resolve_d_qk(d_hv, d_qk, p_qk)
    for name, v in (("S", S), ("B", B), ("NH", NH)):
        check_positive(name, v)
    for name, v in (("bytes_qkv", bytes_qkv), ("bytes_if", bytes_if), ("bytes_Cmn", bytes_Cmn)):
        check_positive(name, v)
    F_causal = check_causal(F_causal)
    NB = B * NH
    notes = [f"{variant} {formulation} forward, counts={counts}"]

    if formulation == "chunkwise":
        if L is None:
            raise UserError("L (chunk size) is required for the chunkwise formulation")
        Nc = n_chunks(S, L, chunks)
        rows = chunkwise_flop_rows(variant, L, d_qk, d_hv, F_causal, F)
        if counts == "paper":
            rows[PAPER_ADJUSTMENT_ROW] = chunkwise_paper_total(
                variant, L, d_qk, d_hv, F_causal
            ) - sum(rows.values())
            notes.append("paper mode: total = printed Table 17 (includes the I2/I3 discrepancy)")
        brows = (walk_byte_rows if states_on_chip else chunkwise_byte_rows)(
            variant, L, d_qk, d_hv, bytes_qkv, bytes_if, bytes_Cmn)
        if states_on_chip:
            notes.append("states on chip: one kernel walks the chunks (no C_k in HBM)")
        mm = chunkwise_matmul_flops(L, d_qk, d_hv, F_causal)
        factor = NB * Nc
    elif formulation == "parallel":
        rows = parallel_flop_rows(variant, S, d_qk, d_hv, F_causal, F)
        brows = parallel_byte_rows(variant, S, d_qk, d_hv, bytes_qkv, bytes_if, bytes_Cmn)
        mm = 2 * F_causal * S**2 * (d_qk + d_hv)
        factor = NB
    else:
        rows = recurrent_flop_rows(variant, d_qk, d_hv, F)
        brows = recurrent_byte_rows(variant, d_qk, d_hv, bytes_qkv, bytes_if, bytes_Cmn)
        mm = None
        factor = NB * S
    return Counts(
        flops=sum(rows.values()),
        bytes=sum(brows.values()),
        flop_rows=rows,
        byte_rows=brows,
        matmul_flops=mm,
        notes=tuple(notes),
    ).scaled(factor)


def total_flops_per_sequence(variant, formulation, *, S, d_hv, L=None, d_qk=None, p_qk=None,
                             F_causal=0.5, counts="rows") -> float:
    """Table 17 style total: FLOPs per head, full sequence, batch 1, with N_c = S/L real."""
    return mlstm_counts(
        variant, formulation, S=S, d_hv=d_hv, L=L, d_qk=d_qk, p_qk=p_qk,
        F_causal=F_causal, counts=counts, chunks="real",
    ).flops
