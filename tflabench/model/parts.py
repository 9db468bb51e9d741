"""The model's parts: a call's counts split by pass and by kernel kind (docs/model.md,
"Parts and the physical floor").

A chunkwise mLSTM call runs two kinds of kernel per pass (paper §3, App. F): the
*recurrent* kernel (the inter-chunk states C_k: Table 8's ``gates``, ``numerator``,
``denominator`` rows and Table 9's ``recurrent_*`` bytes; in the backward the state
recompute and the state gradients δC_k) and the *parallel* kernel (the outputs per chunk,
every other row; in the backward δQ, δK, δV and the gate gradients). ``tflabench flops``
labels its rows with :func:`row_part`; ``report`` sets each part's measured kernel time
(``run --profile``) against the part's own roofline bound (:func:`split_parts`).

Peers' models (attention, Mamba 2 SSD, GLA) are not split by kernel: attention's rows are
its parallel form (one kernel per pass); the others' rows make one ``whole`` part per pass.
"""

from __future__ import annotations

from tflabench.model._common import Counts

#: Passes, in order: the forward and the backward of one call.
PASSES = ("fwd", "bwd")
#: Parts of a pass, in order. ``whole``: the pass as one part (a fused kernel, such as
#: mLSTMsig's forward walk, or a model without the split).
PARTS = ("recurrent", "parallel", "whole")
#: Rows (without their ``fwd_`` / ``bwd_`` prefix) that belong to the recurrent kernel:
#: Table 8's state rows, Table 9's recurrent bytes, the backward's state recompute and
#: state-gradient kernels (:mod:`tflabench.model.backward`).
RECURRENT_ROWS = frozenset({"gates", "numerator", "denominator", "recurrent_load", "recurrent_store",
                            "state_recompute", "state_gradients"})
#: Model kinds (:data:`tflabench.model.KINDS`) whose rows split into recurrent and parallel.
SPLIT_KINDS = ("mlstm_sig", "mlstm_exp", "mlstm_exp_limit")
#: Kinds whose whole computation is the parallel form (one kernel per pass).
PARALLEL_KINDS = ("attention_causal",)


def row_pass(row: str) -> str:
    """``fwd`` or ``bwd`` for a row name of :class:`~tflabench.model.Counts` (``bwd_...``
    rows belong to the backward; every other row to the forward)."""
    return "bwd" if row.startswith("bwd") else "fwd"


def row_part(kind: str, row: str) -> str:
    """The part (:data:`PARTS`) a row of ``kind``'s counts belongs to: for the chunkwise
    mLSTM kinds ``recurrent`` (:data:`RECURRENT_ROWS`) or ``parallel``; ``parallel`` for
    attention; ``whole`` for every other kind. ``paper_table17_adjustment`` (the printed
    totals' difference, ``counts="paper"``) counts as parallel."""
    if kind in PARALLEL_KINDS:
        return "parallel"
    if kind not in SPLIT_KINDS:
        return "whole"
    name = row
    for prefix in ("fwd_", "bwd_"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return "recurrent" if name in RECURRENT_ROWS else "parallel"


def split_parts(kind: str, counts: Counts) -> dict[tuple[str, str], Counts]:
    """``counts`` of one call of ``kind`` split into ``(pass, part)`` -> Counts (FLOPs and
    bytes of that part; rows kept), each pass's parts in :data:`PARTS` order. Row names
    are those of :func:`tflabench.model.counts_for_case` (``fwd_``/``bwd_`` prefixes for
    ``fwdbw``; unprefixed rows are the forward). The parts' sums are ``counts``' totals."""
    flops: dict[tuple[str, str], dict] = {}
    nbytes: dict[tuple[str, str], dict] = {}
    for row, value in counts.flop_rows.items():
        flops.setdefault((row_pass(row), row_part(kind, row)), {})[row] = value
    for row, value in counts.byte_rows.items():
        nbytes.setdefault((row_pass(row), row_part(kind, row)), {})[row] = value
    keys = [(p, q) for p in PASSES for q in PARTS if (p, q) in flops or (p, q) in nbytes]
    return {key: Counts(sum(flops.get(key, {}).values()), sum(nbytes.get(key, {}).values()),
                        flops.get(key, {}), nbytes.get(key, {})) for key in keys}


__all__ = ["PASSES", "PARTS", "RECURRENT_ROWS", "row_pass", "row_part", "split_parts"]
