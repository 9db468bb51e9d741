"""Theoretical runtime, arithmetic intensity, roofline and optimal chunk sizes (paper App. G, F.5).

For the chunkwise mLSTM forward, FLOPs per head and chunk are ``a·L² + b·L + c`` and bytes per
head and chunk ``m·L + n`` (docs/model-counts.md §4.1), so per call

    FLOPs(L) = B·NH·(S/L)·(a·L² + b·L + c),   Bytes(L) = B·NH·(S/L)·(m·L + n).

The coefficients are read off the table rows of :mod:`tflabench.model.mlstm` (``rows`` mode) or
the printed Table 17 (``paper`` mode), so they follow every table decision made there. The paper
derives eqs. 111 and 116-121 for mLSTMsig only; the mLSTMexp versions here are the same algebra
applied to the mLSTMexp rows (derived, docs/model-counts.md §4.1, §4.5, §4.6).

Assumptions behind eqs. 116, 118, 121 (paper App. G): chunkwise forward only; N_c = S/L real;
one ceiling ``peak_flops_per_s`` for all FLOPs although pointwise ones do not run on tensor cores; no
recomputation, reloads or kernel-launch gaps; compute and memory do not overlap (sum form,
eq. 113) — the max form (eq. 114, perfect overlap) is offered too and equals the roofline bound.
"""

from __future__ import annotations

import math

from tflabench.errors import UserError
from tflabench.model._common import (
    COUNT_MODES,
    VARIANTS,
    check_causal,
    check_choice,
    check_positive,
    resolve_d_qk,
)
from tflabench.model.mlstm import (
    chunkwise_byte_rows,
    chunkwise_flop_rows,
    chunkwise_paper_total,
    mlstm_counts,
)

COMBINES = ("sum", "max")
GOLDEN = (math.sqrt(5) - 1) / 2


# ------------------------------------------------------------------ basic relations


def runtime(flops, bytes, peak_flops_per_s, beta, combine: str = "sum") -> float:
    """Theoretical runtime in seconds, paper eqs. 112-114.

    ``tau_FLOPs = flops/peak_flops_per_s``, ``tau_Bytes = bytes/beta``; ``combine="sum"`` (eq. 113, no overlap,
    the paper's choice for its runtime figures) or ``"max"`` (eq. 114, perfect overlap).
    peak_flops_per_s in FLOP/s, beta in byte/s.
    """
    check_choice("combine", combine, COMBINES)
    t_f, t_b = flops / peak_flops_per_s, bytes / beta
    return t_f + t_b if combine == "sum" else max(t_f, t_b)


def intensity(flops, bytes) -> float:
    """Arithmetic intensity FLOPs / bytes in FLOP/byte (paper eq. 117)."""
    return flops / bytes


def roofline(I, peak_flops_per_s, beta) -> float:
    """Attainable FLOP/s at intensity ``I`` (FLOP/byte): ``min(beta·I, peak_flops_per_s)`` (paper eq. 119)."""
    return min(beta * I, peak_flops_per_s)


def place_on_roofline(flops: float, bytes: float | None = None, ms: float | None = None, *,
                       peak_flops_per_s: float | None = None, beta: float | None = None) -> dict:
    """One call (its FLOPs, HBM bytes and, if measured, its runtime) on the roofline: the one
    place where a call's intensity, achieved rate and bound are computed (the result columns,
    ``report``'s distance to the bound and ``roofline --results`` all use it).

    Args:
        flops: FLOPs of the call (the model's count at the call's own shape).
        bytes: HBM bytes of the call (None: unknown).
        ms: measured runtime in milliseconds (None: not measured).
        peak_flops_per_s, beta: the ceilings in FLOP/s and byte/s (None: no bound).

    Returns a dict with the keys whose inputs are given (positive):
    ``intensity_flop_per_byte`` ``I = flops / bytes`` (eq. 117); ``achieved_flops_per_s``
    ``flops / ms``; with the ceilings ``bound_flops_per_s`` ``P(I) = min(beta·I, peak_flops_per_s)``
    (eq. 119), ``roofline_ms`` ``flops / P(I) = max(flops / peak_flops_per_s, bytes / beta)`` (the max
    form, eq. 114) and ``bound`` (``compute`` where ``I >= peak_flops_per_s / beta``, else ``memory``);
    with a runtime too, ``fraction`` ``roofline_ms / ms`` (= achieved / attainable).
    """
    out: dict = {}
    if bytes:
        out["intensity_flop_per_byte"] = flops / bytes
    if ms:
        out["achieved_flops_per_s"] = flops / (ms * 1e-3)
    if bytes is not None and peak_flops_per_s and beta:
        t_flops, t_bytes = flops / peak_flops_per_s, bytes / beta
        out["roofline_ms"] = max(t_flops, t_bytes) * 1e3
        out["bound"] = "compute" if t_flops >= t_bytes else "memory"
        if out["roofline_ms"] > 0:
            out["bound_flops_per_s"] = flops / (out["roofline_ms"] * 1e-3)
        if ms:
            out["fraction"] = out["roofline_ms"] / ms
    return out


# ------------------------------------------------------------------ chunkwise polynomials


def chunkwise_coefficients(variant: str = "sig", *, d_hv, d_qk=None, p_qk=None, F_causal=0.66,
                           bytes_qkv=2, bytes_if=2, bytes_Cmn=4, counts: str = "rows") -> dict:
    """Coefficients ``a, b, c`` (FLOPs per head and chunk) and ``m, n`` (bytes per head and chunk).

    Read off Tables 8/9 (``rows``) or Table 17/9 (``paper``) at F_OP = 1 by evaluating the
    polynomials at L = -1, 0, 1 (they are exactly quadratic / linear in L). In paper mode for
    mLSTMsig they are those of eq. 116: ``a = F_c(2p_qk·d_hv + 2d_hv + 6) + 1``,
    ``b = 4p_qk·d_hv² + 2p_qk·d_hv + d_hv + 11``, ``c = 2p_qk·d_hv² + 5``,
    ``m = 4·bytes_if + 3(1+p_qk)·d_hv·bytes_qkv``, ``n = 2p_qk·d_hv²·bytes_Cmn``.

    Raises:
        UserError: bad variant/counts, non-positive sizes, F_causal outside [0.5, 1].
    """
    check_choice("variant", variant, VARIANTS)
    check_choice("counts", counts, COUNT_MODES)
    d_qk = resolve_d_qk(d_hv, d_qk, p_qk)
    F_causal = check_causal(F_causal)
    for name, v in (("bytes_qkv", bytes_qkv), ("bytes_if", bytes_if), ("bytes_Cmn", bytes_Cmn)):
        check_positive(name, v)

    def flops(L):
        if counts == "paper":
            return chunkwise_paper_total(variant, L, d_qk, d_hv, F_causal)
        return sum(chunkwise_flop_rows(variant, L, d_qk, d_hv, F_causal).values())

    def nbytes(L):
        return sum(chunkwise_byte_rows(variant, L, d_qk, d_hv, bytes_qkv, bytes_if, bytes_Cmn).values())

    f0, fp, fm = flops(0), flops(1), flops(-1)
    return {
        "a": (fp + fm) / 2 - f0,
        "b": (fp - fm) / 2,
        "c": f0,
        "m": nbytes(1) - nbytes(0),
        "n": nbytes(0),
    }


def l_opt_flop(coeffs: dict) -> float:
    """FLOP-optimal real chunk size ``sqrt(c/a)`` (paper eq. 111 in paper mode, sig).

    Printed eq. 111: ``sqrt((2·d_hv²·p_qk + 5) / (2·F_c·(d_hv(1 + p_qk) + 3) + 1))``; rows mode has
    1 instead of 5 (docs/model-counts.md §4.5). Independent of S (for L <= S).
    """
    return math.sqrt(coeffs["c"] / coeffs["a"])


def l_opt_runtime(coeffs: dict, I_acc) -> float:
    """Runtime-optimal real chunk size of the sum form, ``sqrt((c + I_acc·n)/a)`` (paper eq. 121).

    Printed eq. 121: ``sqrt((2·d_hv²·p_qk + 5 + 2·I_acc·d_hv²·p_qk·bytes_Cmn) /
    (2·F_c·(d_hv(1 + p_qk) + 3) + 1))``. Depends on the hardware only through
    ``I_acc = peak_flops_per_s/beta``, and not on bytes_if or bytes_qkv (they only enter m).
    """
    check_positive("I_acc", I_acc)
    return math.sqrt((coeffs["c"] + I_acc * coeffs["n"]) / coeffs["a"])


def l_ridge(coeffs: dict, I_acc) -> float:
    """Chunk size where ``I_algo(L) = I_acc`` (the roofline ridge), docs/model-counts.md §4.7 [derived].

    Positive root of ``a·L² + (b − I_acc·m)·L + (c − I_acc·n) = 0``. With ``c < I_acc·n`` the
    argmin of the max-form runtime is ``max(l_opt_flop, l_ridge)``.
    """
    a, b, c, m, n = (coeffs[k] for k in "abcmn")
    B = b - I_acc * m
    C = c - I_acc * n
    disc = B * B - 4 * a * C
    if disc < 0:
        return math.nan
    return (-B + math.sqrt(disc)) / (2 * a)


def l_opt_runtime_max(coeffs: dict, I_acc) -> float:
    """Argmin of the max-form runtime (eq. 114): ``max(l_opt_flop, l_ridge)`` (§4.7, derived)."""
    lr = l_ridge(coeffs, I_acc)
    lf = l_opt_flop(coeffs)
    return lf if math.isnan(lr) else max(lf, lr)


# ------------------------------------------------------------------ numeric searches


def golden_min(fn, lo, hi, *, log=True, rtol=1e-12, max_iter=400) -> float:
    """Argmin of a unimodal ``fn`` on [lo, hi] by golden-section search (in log L when ``log``)."""
    tr = (math.log if log else (lambda x: x))
    inv = (math.exp if log else (lambda x: x))
    a, b = tr(lo), tr(hi)
    c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    fc, fd = fn(inv(c)), fn(inv(d))
    for _ in range(max_iter):
        if abs(b - a) <= rtol * max(1.0, abs(a) + abs(b)):
            break
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - GOLDEN * (b - a)
            fc = fn(inv(c))
        else:
            a, c, fc = c, d, fd
            d = a + GOLDEN * (b - a)
            fd = fn(inv(d))
    return inv((a + b) / 2)


def powers_of_two(lo, hi) -> list[int]:
    """All powers of two in [lo, hi]."""
    out, p = [], 1
    while p <= hi:
        if p >= lo:
            out.append(p)
        p *= 2
    return out


def best_power_of_two(fn, L_cont, S) -> int:
    """Best power of two for a convex-in-L objective: the better of the two bracketing ``L_cont``.

    Clamped to [1, S] (docs/model-counts.md §4.8: for the sum form this was the global best power
    of two in 240/240 configurations).
    """
    cands = [p for p in powers_of_two(1, S)]
    if not cands:
        raise UserError(f"S={S!r} is not valid; it must be >= 1")
    below = [p for p in cands if p <= L_cont]
    above = [p for p in cands if p >= L_cont]
    pick = ([below[-1]] if below else []) + ([above[0]] if above else [])
    return min(pick, key=fn)


def _call_counts(variant, L, *, S, d_hv, d_qk, B, NH, F_causal, bytes_qkv, bytes_if,
                 bytes_Cmn, counts):
    return mlstm_counts(variant, "chunkwise", S=S, d_hv=d_hv, L=L, d_qk=d_qk, B=B,
                        NH=NH, F_causal=F_causal, bytes_qkv=bytes_qkv, bytes_if=bytes_if,
                        bytes_Cmn=bytes_Cmn, counts=counts, chunks="real")


def chunkwise_runtime(variant: str = "sig", *, L, peak_flops_per_s, beta, S=8192, d_hv=512, d_qk=None, p_qk=None,
                      B=8, NH=8, F_causal=0.66, bytes_qkv=2, bytes_if=2, bytes_Cmn=4,
                      counts="rows", combine="sum") -> float:
    """Theoretical runtime (s) of a chunkwise mLSTM forward call at real chunk size L (eq. 115/116).

    Built from the full counts (:func:`tflabench.model.mlstm.mlstm_counts`, N_c = S/L real), so it
    is an independent check of the closed forms. Defaults: the paper's Fig. 17 setting.
    """
    d_qk = resolve_d_qk(d_hv, d_qk, p_qk)
    c = _call_counts(variant, L, S=S, d_hv=d_hv, d_qk=d_qk, B=B, NH=NH,
                     F_causal=F_causal, bytes_qkv=bytes_qkv, bytes_if=bytes_if,
                     bytes_Cmn=bytes_Cmn, counts=counts)
    return runtime(c.flops, c.bytes, peak_flops_per_s, beta, combine)


def l_opt_flop_numeric(variant="sig", *, d_hv, d_qk=None, p_qk=None, F_causal=0.66, counts="rows",
                       S=2**20) -> float:
    """Numeric argmin over real L in [1, S] of the chunkwise FLOPs (check of eq. 111)."""
    d_qk = resolve_d_qk(d_hv, d_qk, p_qk)

    def f(L):
        return _call_counts(variant, L, S=S, d_hv=d_hv, d_qk=d_qk, B=1, NH=1,
                            F_causal=F_causal, bytes_qkv=2, bytes_if=2, bytes_Cmn=4,
                            counts=counts).flops

    return golden_min(f, 1.0, float(S))


def l_opt_runtime_numeric(variant="sig", *, peak_flops_per_s, beta, d_hv, d_qk=None, p_qk=None, F_causal=0.66,
                          bytes_qkv=2, bytes_if=2, bytes_Cmn=4, counts="rows", combine="sum",
                          S=2**20) -> float:
    """Numeric argmin over real L in [1, S] of the runtime (check of eq. 121 / §4.7)."""
    d_qk = resolve_d_qk(d_hv, d_qk, p_qk)

    def f(L):
        return chunkwise_runtime(variant, L=L, peak_flops_per_s=peak_flops_per_s, beta=beta, S=S, d_hv=d_hv, d_qk=d_qk,
                                 B=1, NH=1, F_causal=F_causal, bytes_qkv=bytes_qkv,
                                 bytes_if=bytes_if, bytes_Cmn=bytes_Cmn, counts=counts,
                                 combine=combine)

    return golden_min(f, 1.0, float(S))


def l_opt_runtime_max_numeric(variant="sig", **kw) -> float:
    """Numeric argmin of the max-form runtime (eq. 114); same arguments as l_opt_runtime_numeric."""
    return l_opt_runtime_numeric(variant, combine="max", **kw)


# ------------------------------------------------------------------ the optimal-chunk report


def optimal_chunk(variant: str = "sig", *, peak_flops_per_s, beta, d_hv=512, d_qk=None, p_qk=None,
                  F_causal=0.66, bytes_qkv=2, bytes_if=2, bytes_Cmn=4, counts="rows",
                  B=8, NH=8, S=8192) -> dict:
    """FLOP- and runtime-optimal chunk sizes for one accelerator (eqs. 111, 121; §4.7, §4.8).

    Returns a dict: ``I_acc`` (FLOP/byte), ``L_opt_flop`` (eq. 111, closed form) and
    ``L_opt_flop_numeric``, ``L_opt_runtime`` (eq. 121, sum form) and ``L_opt_runtime_numeric``,
    ``L_opt_runtime_max`` (argmin of the max form, §4.7) and its numeric search, the best powers of
    two ``L_pow2_flop``, ``L_pow2_runtime`` (sum form) with their predicted runtimes
    ``runtime_ms_pow2`` (sum and max form, for B·NH heads of length S) and
    ``runtime_ms_opt`` at the continuous optimum. Continuous optima are clamped to [1, S] for the
    power-of-two choice.
    """
    check_positive("peak_flops_per_s", peak_flops_per_s)
    check_positive("beta", beta)
    for name, v in (("S", S), ("B", B), ("NH", NH)):
        check_positive(name, v)
    d_qk = resolve_d_qk(d_hv, d_qk, p_qk)
    co = chunkwise_coefficients(variant, d_hv=d_hv, d_qk=d_qk, F_causal=F_causal,
                                bytes_qkv=bytes_qkv, bytes_if=bytes_if, bytes_Cmn=bytes_Cmn,
                                counts=counts)
    I_acc = peak_flops_per_s / beta
    common = dict(S=S, d_hv=d_hv, d_qk=d_qk, B=B, NH=NH, F_causal=F_causal,
                  bytes_qkv=bytes_qkv, bytes_if=bytes_if, bytes_Cmn=bytes_Cmn, counts=counts)

    def rt(L, combine="sum"):
        return chunkwise_runtime(variant, L=L, peak_flops_per_s=peak_flops_per_s, beta=beta, combine=combine, **common)

    def fl(L):
        return _call_counts(variant, L, **common).flops

    lf, lr, lmax = l_opt_flop(co), l_opt_runtime(co, I_acc), l_opt_runtime_max(co, I_acc)
    p_f = best_power_of_two(fl, lf, S)
    p_r = best_power_of_two(rt, lr, S)
    p_m = best_power_of_two(lambda L: rt(L, "max"), lmax, S)
    search = dict(d_hv=d_hv, d_qk=d_qk, F_causal=F_causal, counts=counts)
    rsearch = dict(search, peak_flops_per_s=peak_flops_per_s, beta=beta, bytes_qkv=bytes_qkv, bytes_if=bytes_if,
                   bytes_Cmn=bytes_Cmn)
    Lc = min(max(lr, 1.0), S)
    return {
        "variant": variant,
        "counts": counts,
        "d_hv": d_hv,
        "d_qk": d_qk,
        "p_qk": d_qk / d_hv,
        "F_causal": F_causal,
        "bytes_Cmn": bytes_Cmn,
        "peak_flops_per_s": peak_flops_per_s,
        "beta_bytes_per_s": beta,
        "I_acc": I_acc,
        "L_opt_flop": lf,
        "L_opt_flop_numeric": l_opt_flop_numeric(variant, **search),
        "L_opt_runtime": lr,
        "L_opt_runtime_numeric": l_opt_runtime_numeric(variant, **rsearch),
        "L_opt_runtime_max": lmax,
        "L_opt_runtime_max_numeric": l_opt_runtime_numeric(variant, combine="max", **rsearch),
        "L_ridge": l_ridge(co, I_acc),
        "L_pow2_flop": p_f,
        "L_pow2_runtime": p_r,
        "L_pow2_runtime_max": p_m,
        "runtime_ms_opt": rt(Lc) * 1e3,
        "runtime_ms_pow2": rt(p_r) * 1e3,
        "runtime_ms_pow2_max_form": rt(p_m, "max") * 1e3,
        "setting": {"B": B, "NH": NH, "S": S},
        "coefficients": co,
    }
