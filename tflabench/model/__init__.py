"""The analytic FLOP/byte model of TFLA and its peers (paper App. F and G; docs/model.md).

No torch, numpy or matplotlib is imported here: the analytic commands must start cold in < 2 s.

Main entry points:

- :func:`counts_for_case` — the harness's one call per result row (docs/ARCHITECTURE.md,
  "Contract: the model").
- :func:`mlstm_counts` — forward counts, Tables 8-17, ``counts="rows"|"paper"``.
- :func:`mlstm_backward_counts`, :func:`mlstm_fwdbw_counts` — the derived backward.
- :func:`attention_counts`, :func:`ssd_counts`, :func:`gla_counts` — peers.
- runtime, intensity, roofline and optimal chunk sizes in :mod:`tflabench.model.analysis`.
"""

from __future__ import annotations

from tflabench.errors import UserError
from tflabench.model._common import (
    COUNT_MODES,
    FORMULATIONS,
    MODES,
    VARIANTS,
    Counts,
    FOps,
    check_choice,
    check_positive,
)
from tflabench.model.backward import mlstm_backward_counts, mlstm_fwdbw_counts
from tflabench.model.mlstm import mlstm_counts
from tflabench.model.peers import attention_counts, gla_counts, ssd_counts
from tflabench.model.analysis import (
    chunkwise_coefficients,
    intensity,
    l_opt_flop,
    l_opt_flop_numeric,
    l_opt_runtime,
    l_opt_runtime_numeric,
    l_ridge,
    l_opt_runtime_max_numeric,
    best_power_of_two,
    place_on_roofline,
    roofline,
    runtime,
)

#: One vocabulary for shapes (docs/model.md, "Symbols"): the harness's spelled-out names
#: (suite fields, result columns, CLI options: batch, heads, seq_len, d_qk, d_hv,
#: chunk_size) -> the paper's symbols, which the model (:func:`counts_for_case`) and the
#: kernels use: B, NH, S (the paper's T: tokens per sequence), d_qk, d_hv, L. Where a name
#: crosses from the harness into the model it is translated by this table.
SHAPE_SYMBOLS: dict[str, str] = {"batch": "B", "heads": "NH", "seq_len": "S", "d_qk": "d_qk", "d_hv": "d_hv",
                                 "chunk_size": "L"}

KINDS = ("mlstm_sig", "mlstm_exp", "mlstm_exp_limit", "attention_causal", "mamba2_ssd", "gla",
         "simple_gla", "gla_fused", "simple_gla_fused")

#: Default chunk sizes when a case gives none (kernel defaults: xl_chunk 128, limit_chunk 64,
#: fla 64, mamba_ssm 256).
DEFAULT_CHUNK = {"mlstm_sig": 128, "mlstm_exp": 128, "mlstm_exp_limit": 64, "gla": 64,
                 "simple_gla": 64, "gla_fused": 64, "simple_gla_fused": 64, "mamba2_ssd": 256}


#: the plan algorithms (``tfla.plan.ALGORITHMS``) whose forward walks the chunks with the
#: state on chip (mLSTMsig's walk; docs/kernels.md): the model counts their forward without
#: state traffic (:func:`plan_counts_kwargs`)
WALK_ALGORITHMS = ("walk", "walk_segments", "walk_two_level", "walk_segments_two_level")


def plan_counts_kwargs(kind: str, algorithm: str | None) -> dict:
    """The :func:`counts_for_case` keyword arguments that make the count the algorithm's that
    ran (a row's ``algorithm``): ``{"states_on_chip": True}`` for an mLSTMsig walk, else {}."""
    return {"states_on_chip": True} if kind == "mlstm_sig" and algorithm in WALK_ALGORITHMS else {}


def counts_for_case(kind: str, mode: str, *, B, NH, S, d_qk, d_hv, L=None, d_state=None,
                    bytes_qkv=2, bytes_Cmn=4, F_causal=0.5, counts="rows",
                    states_on_chip: bool = False) -> Counts:
    """FLOPs and HBM bytes of one benchmark case (one kernel call), for a result row.

    Args:
        kind: ``mlstm_sig``, ``mlstm_exp`` (TFLA xl_chunk), ``mlstm_exp_limit`` (limit_chunk),
            ``attention_causal`` (FlashAttention accounting), ``mamba2_ssd``, ``gla``, ``simple_gla``,
            and the non-materialising ``gla_fused``, ``simple_gla_fused`` (fla's fused chunk
            forms, Lightning Attention 2: no chunk state in HBM).
        mode: ``fwd`` or ``fwdbw`` (forward + backward).
        B, NH, S: batch, heads, sequence length (the paper's T; :data:`SHAPE_SYMBOLS`). d_qk, d_hv: head dims (for attention d_qk and
            d_v; for Mamba 2, d_hv is the head dim P). L: chunk size (default per kind:
            DEFAULT_CHUNK); L > S is clamped to S (a single chunk), S not a multiple of L is
            counted with padded chunks N_c = ceil(S/L). d_state: Mamba 2 state dim N (default d_qk).
        bytes_qkv: bytes per element of inputs/outputs (also used for the gates). bytes_Cmn: bytes
            per state element (mLSTM; fla GLA keeps states in the input dtype: bytes_qkv).
        F_causal: fraction of each causal score matrix counted, the same for every kind so that
            achieved FLOP/s compare like for like (0.5: useful work only, FlashAttention's habit).
        counts: ``rows`` or ``paper`` (mLSTM forward only; see :mod:`tflabench.model.mlstm`).
        states_on_chip: (mLSTM) the forward keeps the chunk states on chip, as the walk of
            :data:`WALK_ALGORITHMS` does (:func:`tflabench.model.mlstm.mlstm_counts`).

    Returns:
        :class:`Counts` (``.flops``, ``.bytes``, ``.intensity_flop_per_byte``, breakdown rows).

    Raises:
        UserError: unknown kind/mode/counts, non-positive sizes, F_causal outside [0.5, 1].
    """
    check_choice("kind", kind, KINDS)
    check_choice("mode", mode, MODES)
    check_choice("counts", counts, COUNT_MODES)
    for name, v in (("B", B), ("NH", NH), ("S", S), ("d_qk", d_qk), ("d_hv", d_hv)):
        check_positive(name, v)
    if L is None:
        L = DEFAULT_CHUNK.get(kind)
    if L is not None:
        check_positive("L", L)
        L = min(L, S)
    if kind.startswith("mlstm"):
        variant = "sig" if kind == "mlstm_sig" else "exp"
        kw = dict(S=S, d_hv=d_hv, L=L, d_qk=d_qk, B=B, NH=NH, F_causal=F_causal,
                  bytes_qkv=bytes_qkv, bytes_if=bytes_qkv, bytes_Cmn=bytes_Cmn, chunks="pad",
                  states_on_chip=states_on_chip)
        if mode == "fwd":
            return mlstm_counts(variant, "chunkwise", counts=counts, **kw)
        split = "limit_chunk" if kind == "mlstm_exp_limit" else "xl_chunk"
        return mlstm_fwdbw_counts(variant, counts=counts, kernel_split=split, **kw)
    if kind == "attention_causal":
        return attention_counts(mode, B=B, NH=NH, S=S, d_qk=d_qk, d_hv=d_hv, F_causal=F_causal,
                                bytes_qkv=bytes_qkv)
    if kind == "mamba2_ssd":
        N = d_qk if d_state is None else d_state
        return ssd_counts(mode, B=B, S=S, NH=NH, P=d_hv, N=N, G=1, L=L, F_causal=F_causal,
                          bytes_x=bytes_qkv)
    fused = kind.endswith("_fused")
    return gla_counts(kind.removesuffix("_fused"), mode, B=B, NH=NH, S=S, d_qk=d_qk, d_hv=d_hv, L=L,
                      F_causal=F_causal, bytes_qkv=bytes_qkv, states_in_hbm=not fused)


__all__ = [
    "SHAPE_SYMBOLS", "COUNT_MODES", "FORMULATIONS", "KINDS", "WALK_ALGORITHMS", "plan_counts_kwargs", "MODES", "VARIANTS", "Counts", "FOps", "UserError",
    "attention_counts", "best_power_of_two", "check_positive", "chunkwise_coefficients",
    "counts_for_case", "gla_counts", "intensity", "l_opt_flop", "l_opt_flop_numeric",
    "l_opt_runtime", "l_opt_runtime_max_numeric", "l_opt_runtime_numeric", "l_ridge",
    "mlstm_backward_counts", "mlstm_counts", "mlstm_fwdbw_counts", "place_on_roofline", "roofline", "runtime",
    "ssd_counts",
]
