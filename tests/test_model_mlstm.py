"""Forward counts of the mLSTM (paper App. F, Tables 8-17) against docs/model-counts.md's oracles.

Every expected number below is the paper's formula evaluated at the stated settings
(docs/model-counts.md §6; the oracle named in each test); "paper" mode values are checked to half a
unit of the last printed digit plus 1e-6 relative, as its §6 prescribes.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from tflabench.errors import UserError
from tflabench.model import FOps, counts_for_case, mlstm_counts
from tflabench.model.mlstm import chunkwise_flop_rows, chunkwise_paper_total


def close_printed(value: float, printed: str) -> bool:
    """|value - printed| <= half a unit in the printed last digit + 1e-6 relative (§6 intro)."""
    p = float(printed)
    mant = printed.lower().split("e")[0]
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    exp = int(printed.lower().split("e")[1]) if "e" in printed.lower() else 0
    half_unit = 0.5 * 10.0 ** (exp - decimals)
    return abs(value - p) <= half_unit + 1e-6 * abs(p)


PRIMES = FOps(exp=2, log=3, sig=5, max=7, mask=11, abs=13)
FIX = dict(d_qk=64, d_hv=128, F_causal=0.5, bytes_qkv=2, bytes_if=2, bytes_Cmn=4)


# ------------------------------------------------------------------ O9 (§6.9): exact row fixtures

#: §6.9 rows per formulation (chunkwise: per head and chunk), columns exp F=1, sig F=1, exp
#: primes, sig primes (tests/data/model_counts.yaml)
O9_ROWS = yaml.safe_load((Path(__file__).parent / "data" / "model_counts.yaml").read_text())["O9"]

# §6.9 chunkwise rows per head and chunk: exp F=1, sig F=1, exp primes, sig primes
CHUNK_ROWS = {name: tuple(row) for name, row in O9_ROWS["chunk"].items()}
CHUNK_SUMS = (2962437, 2933505, 2979020, 2937154)

PAR_ROWS = {name: tuple(row) for name, row in O9_ROWS["par"].items()}
PAR_SUMS = (13206400, 13075584, 14716160, 14192768)

REC_ROWS = {name: tuple(row) for name, row in O9_ROWS["rec"].items()}
REC_SUMS = (49740, 49218, 49772, 49226)

COLUMNS = [("exp", FOps()), ("sig", FOps()), ("exp", PRIMES), ("sig", PRIMES)]

O9_FIXTURES = {  # formulation: (settings, rows, sums)
    # T = L = 64: one chunk, so the per-call rows are the per-chunk rows of Table 8
    "chunkwise": (dict(S=64, L=64), CHUNK_ROWS, CHUNK_SUMS),
    "parallel": (dict(S=256), PAR_ROWS, PAR_SUMS),
    "recurrent": (dict(S=1), REC_ROWS, REC_SUMS),
}


@pytest.mark.parametrize("col", range(4))
@pytest.mark.parametrize("formulation", list(O9_FIXTURES))
def test_rows_match_exact_fixtures_O9(formulation, col):
    variant, F = COLUMNS[col]
    settings, rows, sums = O9_FIXTURES[formulation]
    c = mlstm_counts(variant, formulation, F_ops=F, **settings, **FIX)
    for row, vals in rows.items():
        assert c.flop_rows[row] == vals[col], row
    assert c.flops == sums[col]


def test_bytes_match_tables_9_11_13_O9():
    # §6.9: Table 9 (per chunk), Table 11 (T = 256), Table 13 (load + store; not the paper's swap, I5)
    e = mlstm_counts("exp", "chunkwise", S=64, L=64, **FIX).byte_rows
    s = mlstm_counts("sig", "chunkwise", S=64, L=64, **FIX).byte_rows
    assert [e[k] for k in ("recurrent_load", "recurrent_store", "parallel_load", "parallel_store")] == [
        24832, 33028, 66052, 16896]
    assert [s[k] for k in ("recurrent_load", "recurrent_store", "parallel_load", "parallel_store")] == [
        24832, 32768, 65792, 16384]
    assert sum(e.values()) == 140808 and sum(s.values()) == 139776
    pe = mlstm_counts("exp", "parallel", S=256, **FIX)
    ps = mlstm_counts("sig", "parallel", S=256, **FIX)
    assert (pe.byte_rows["load"], pe.byte_rows["store"], pe.bytes) == (132096, 67584, 199680)
    assert (ps.byte_rows["load"], ps.byte_rows["store"], ps.bytes) == (132096, 65536, 197632)
    re_ = mlstm_counts("exp", "recurrent", S=1, **FIX)
    rs = mlstm_counts("sig", "recurrent", S=1, **FIX)
    assert (re_.byte_rows["load"], re_.byte_rows["store"], re_.bytes) == (33544, 33284, 66828)
    assert (rs.byte_rows["load"], rs.byte_rows["store"], rs.bytes) == (33284, 33024, 66308)


def test_totals_per_sequence_rows_and_paper_O9():
    # §6.9: T = 256, L = 64, F_c = 1/2, per head and sequence
    kw = dict(S=256, L=64, **FIX)
    assert mlstm_counts("exp", "chunkwise", **kw).flops == 11849748
    assert mlstm_counts("exp", "chunkwise", counts="paper", **kw).flops == 11915284
    assert mlstm_counts("sig", "chunkwise", **kw).flops == 11734020
    assert mlstm_counts("sig", "chunkwise", counts="paper", **kw).flops == 11733780
    kw.pop("L")
    for variant, par, rec in (("exp", 13206400, 12733440), ("sig", 13075584, 12599808)):
        assert mlstm_counts(variant, "parallel", **kw).flops == par
        assert mlstm_counts(variant, "recurrent", **kw).flops == rec
        # parallel and recurrent totals are the same in both modes (§3 design)
        assert mlstm_counts(variant, "parallel", counts="paper", **kw).flops == par
        assert mlstm_counts(variant, "recurrent", counts="paper", **kw).flops == rec


def test_paper_mode_breakdown_sums_to_printed_total_with_adjustment_row():
    c = mlstm_counts("exp", "chunkwise", S=256, L=64, counts="paper", **FIX)
    assert c.flop_rows["paper_table17_adjustment"] == 11915284 - 11849748  # = 2T·d_hv (I2)
    assert c.flop_rows["paper_table17_adjustment"] == 2 * 256 * 128
    assert sum(c.flop_rows.values()) == c.flops


def test_paper_sig_total_is_built_with_the_exp_gates_row_I3():
    # §3 I3: Table 17 sig = T/L · (Table 8 sig rows with the exp Gates row), exactly
    for L, dqk, dhv, fc in ((64, 64, 128, 0.5), (16, 256, 512, 0.66), (128, 128, 256, 1.0)):
        sig = chunkwise_flop_rows("sig", L, dqk, dhv, fc)
        sig["gates"] = chunkwise_flop_rows("exp", L, dqk, dhv, fc)["gates"]
        assert math.isclose(sum(sig.values()), chunkwise_paper_total("sig", L, dqk, dhv, fc), rel_tol=1e-14)


def test_rows_mode_totals_equal_the_closed_forms_of_section_2_7():
    # §2.7 row-consistent totals: printed − 2T·d_hv (exp) and printed − T(4/L − 1) (sig)
    for T, L, dqk, dhv, fc in ((8192, 64, 256, 512, 0.66), (4096, 16, 64, 64, 0.5), (1024, 128, 32, 96, 1.0)):
        kw = dict(S=T, L=L, d_qk=dqk, d_hv=dhv, F_causal=fc)
        e_rows, e_pap = (mlstm_counts("exp", "chunkwise", counts=m, **kw).flops for m in ("rows", "paper"))
        s_rows, s_pap = (mlstm_counts("sig", "chunkwise", counts=m, **kw).flops for m in ("rows", "paper"))
        assert math.isclose(e_pap - e_rows, 2 * T * dhv, rel_tol=1e-9)
        assert math.isclose(s_pap - s_rows, T * (4 / L - 1), rel_tol=1e-9, abs_tol=1e-6)
        # exp − sig (rows) = 2TL·F_c + 2T·F_c + T(4d_qk + d_hv + 1) + (T/L)(2d_qk + 4)
        expect = 2 * T * L * fc + 2 * T * fc + T * (4 * dqk + dhv + 1) + (T / L) * (2 * dqk + 4)
        assert math.isclose(e_rows - s_rows, expect, rel_tol=1e-12)


def test_table_14_is_table_8_at_unit_factors_and_fixes_I1():
    # §2.3: Table 14 simplified rows, e.g. sig gates 0.5L² + 7.5L + 1, cum_fgates 0.5L² + 4.5L (I1)
    L, dqk, dhv, fc = 48.0, 32.0, 80.0, 0.7
    s = chunkwise_flop_rows("sig", L, dqk, dhv, fc)
    e = chunkwise_flop_rows("exp", L, dqk, dhv, fc)
    assert s["gates"] == 0.5 * L**2 + 7.5 * L + 1
    assert s["cum_fgates"] == 0.5 * L**2 + 4.5 * L
    assert e["gates"] == 0.5 * L**2 + 6.5 * L + 5
    assert e["cum_fgates"] == 0.5 * L**2 + 2.5 * L
    assert math.isclose(e["gate_matrix"], fc * (5 * L**2 + 2 * L))
    assert math.isclose(s["gate_matrix"], 3 * fc * L**2)
    assert e["output_combination"] == 2 * L * dhv + 4 * L


def test_whole_call_scales_with_batch_heads_and_chunks_section_2_1():
    one = mlstm_counts("sig", "chunkwise", S=64, L=64, **FIX)
    many = mlstm_counts("sig", "chunkwise", S=256, L=64, B=3, NH=5, **FIX)
    assert many.flops == one.flops * 3 * 5 * 4
    assert many.bytes == one.bytes * 3 * 5 * 4
    rec = mlstm_counts("exp", "recurrent", S=100, B=2, NH=3, **FIX)
    assert rec.flops == REC_SUMS[0] * 2 * 3 * 100


# ------------------------------------------------------------------ O1 (§6.1): exp-vs-sig excess

O1 = {  # (d, F_c): recurrent, parallel, cwp paper L=16,64,128,256,1024, cwp rows L=16,64,128,256,1024
    (64, 0.50): ("1.859", "1.476", ("2.473", "2.055", "1.729", "1.403", "0.972"), ("1.802", "1.542", "1.344", "1.148", "0.887")),
    (64, 0.66): ("1.859", "1.493", ("2.416", "1.931", "1.597", "1.292", "0.926"), ("1.769", "1.468", "1.265", "1.081", "0.860")),
    (64, 1.00): ("1.859", "1.512", ("2.309", "1.735", "1.409", "1.149", "0.874"), ("1.705", "1.350", "1.153", "0.995", "0.829")),
    (512, 0.50): ("0.228", "0.194", ("0.334", "0.326", "0.314", "0.292", "0.219"), ("0.240", "0.235", "0.228", "0.215", "0.171")),
    (512, 0.66): ("0.228", "0.194", ("0.332", "0.322", "0.307", "0.281", "0.202"), ("0.240", "0.233", "0.223", "0.208", "0.160")),
    (512, 1.00): ("0.228", "0.195", ("0.330", "0.314", "0.292", "0.260", "0.179"), ("0.238", "0.228", "0.215", "0.195", "0.146")),
}


@pytest.mark.parametrize("key", list(O1))
def test_exp_vs_sig_flop_excess_O1(key):
    d, fc = key
    rec, par, cwp_paper, cwp_rows = O1[key]
    kw = dict(S=8192, d_qk=d, d_hv=d, F_causal=fc)

    def excess(form, counts="rows", L=None):
        e = mlstm_counts("exp", form, L=L, counts=counts, **kw).flops
        s = mlstm_counts("sig", form, L=L, counts=counts, **kw).flops
        return 100 * (e / s - 1)

    assert close_printed(excess("recurrent"), rec)
    assert close_printed(excess("parallel"), par)
    for L, p, r in zip((16, 64, 128, 256, 1024), cwp_paper, cwp_rows):
        assert close_printed(excess("chunkwise", "paper", L), p), (L, "paper")
        assert close_printed(excess("chunkwise", "rows", L), r), (L, "rows")


# ------------------------------------------------------------------ §6.7: limits L = 1 and L = T


def _limit_formulas(mode, variant, T, dqk, dhv, fc):
    """§6.7: (cwp(L=1) − rec, cwp(L=T) − par) per head, full sequence."""
    if mode == "paper" and variant == "sig":
        return (T * (2 * fc * dhv + 2 * fc * dqk + 6 * fc + dhv + dqk + 15),
                T**2 * (4 * fc - 5.5) + T * (4 * dhv * dqk + dhv + 2 * dqk + 6.5) + 2 * dhv * dqk + 5)
    if mode == "paper":
        return (T * (2 * fc * dhv + 2 * fc * dqk + 10 * fc + 3 * dhv + dqk + 7),
                T**2 * (2 * fc - 5.5) + T * (4 * dhv * dqk + 4 * dhv + 6 * dqk + 10.5) + 2 * dhv * dqk + 2 * dqk + 5)
    if variant == "sig":
        return (T * (2 * fc * dhv + 2 * fc * dqk + 6 * fc + dhv + dqk + 12),
                T**2 * (4 * fc - 5.5) + T * (4 * dhv * dqk + dhv + 2 * dqk + 7.5) + 2 * dhv * dqk + 1)
    return (T * (2 * fc * dhv + 2 * fc * dqk + 10 * fc + dhv + dqk + 7),
            T**2 * (2 * fc - 5.5) + T * (4 * dhv * dqk + 2 * dhv + 6 * dqk + 10.5) + 2 * dhv * dqk + 2 * dqk + 5)


@pytest.mark.parametrize("mode", ["paper", "rows"])
@pytest.mark.parametrize("variant", ["sig", "exp"])
@pytest.mark.parametrize("T,dqk,dhv,fc", [(8192, 256, 512, 0.66), (512, 64, 128, 0.5), (96, 24, 40, 1.0)])
def test_chunkwise_limits_differ_from_recurrent_and_parallel_exactly_as_section_6_7(mode, variant, T, dqk, dhv, fc):
    # I9: "L = 1 matches the recurrent, L = T the parallel count" holds only up to these differences
    kw = dict(S=T, d_qk=dqk, d_hv=dhv, F_causal=fc, counts=mode)
    cwp1 = mlstm_counts(variant, "chunkwise", L=1, **kw).flops
    cwpT = mlstm_counts(variant, "chunkwise", L=T, **kw).flops
    rec = mlstm_counts(variant, "recurrent", **kw).flops
    par = mlstm_counts(variant, "parallel", **kw).flops
    d1, dT = _limit_formulas(mode, variant, T, dqk, dhv, fc)
    assert math.isclose(cwp1 - rec, d1, rel_tol=1e-9)
    assert math.isclose(cwpT - par, dT, rel_tol=1e-9)


LIMIT_RATIOS = [  # §6.7 table (paper mode, T = 8192): cwp(1)/rec, cwp(T)/par, min_L cwp/rec, argmin L
    ("sig", 256, 512, 0.50, "1.00198", "1.07818", "0.70393", "18.43"),
    ("sig", 256, 512, 0.66, "1.00229", "1.05998", "0.70931", "16.04"),
    ("sig", 256, 512, 1.00, "1.00296", "1.04055", "0.71889", "13.03"),
    ("sig", 128, 256, 0.50, "1.00400", "1.03209", "0.72015", "13.00"),
    ("sig", 128, 256, 0.66, "1.00462", "1.02565", "0.72776", "11.32"),
    ("sig", 128, 256, 1.00, "1.00596", "1.01876", "0.74134", "9.20"),
    ("sig", 64, 128, 0.50, "1.00817", "1.00267", "0.74403", "9.14"),
    ("sig", 64, 128, 0.66, "1.00944", "1.00449", "0.75482", "7.96"),
    ("sig", 64, 128, 1.00, "1.01213", "1.00645", "0.77406", "6.47"),
    ("exp", 256, 512, 0.50, "1.00326", "1.07710", "0.70540", "18.43"),
    ("exp", 256, 512, 0.66, "1.00357", "1.05884", "0.71078", "16.05"),
    ("exp", 256, 512, 1.00, "1.00424", "1.03936", "0.72035", "13.04"),
    ("exp", 128, 256, 0.50, "1.00653", "1.02979", "0.72304", "13.01"),
    ("exp", 128, 256, 0.66, "1.00716", "1.02327", "0.73064", "11.32"),
    ("exp", 128, 256, 1.00, "1.00850", "1.01630", "0.74419", "9.20"),
    ("exp", 64, 128, 0.50, "1.01311", "0.99807", "0.74961", "9.16"),
    ("exp", 64, 128, 0.66, "1.01438", "0.99974", "0.76037", "7.97"),
    ("exp", 64, 128, 1.00, "1.01707", "1.00154", "0.77954", "6.48"),
]


@pytest.mark.parametrize("row", LIMIT_RATIOS, ids=lambda r: f"{r[0]}-{r[2]}-{r[3]}")
def test_limit_ratios_and_optimum_versus_recurrent_section_6_7(row):
    from tflabench.model.analysis import golden_min

    variant, dqk, dhv, fc, r1, rT, rmin, Lmin = row
    kw = dict(S=8192, d_qk=dqk, d_hv=dhv, F_causal=fc, counts="paper")
    rec = mlstm_counts(variant, "recurrent", **kw).flops
    par = mlstm_counts(variant, "parallel", **kw).flops

    def cwp(L):
        return mlstm_counts(variant, "chunkwise", L=L, chunks="real", **kw).flops

    assert close_printed(cwp(1) / rec, r1)
    assert close_printed(cwp(8192) / par, rT)
    L_star = golden_min(cwp, 1.0, 8192.0)
    assert close_printed(L_star, Lmin)
    assert close_printed(cwp(L_star) / rec, rmin)


# ------------------------------------------------------------------ chunk-count decisions (§2.1)


def test_chunk_count_conventions_divide_pad_real():
    kw = dict(S=1000, d_qk=64, d_hv=128)
    with pytest.raises(UserError, match="does not divide"):
        mlstm_counts("sig", "chunkwise", L=64, **kw)
    pad = mlstm_counts("sig", "chunkwise", L=64, chunks="pad", **kw)
    real = mlstm_counts("sig", "chunkwise", L=64, chunks="real", **kw)
    per_chunk = mlstm_counts("sig", "chunkwise", S=64, L=64, d_qk=64, d_hv=128).flops
    assert pad.flops == per_chunk * 16  # ceil(1000/64) = 16 padded chunks
    assert math.isclose(real.flops, per_chunk * 1000 / 64)


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(variant="foo"), "variant"),
        (dict(formulation="blocked"), "formulation"),
        (dict(S=0), "S="),
        (dict(S=-8), "S="),
        (dict(d_hv=0), "d_hv"),
        (dict(p_qk=0.0, d_qk=None), "p_qk"),
        (dict(p_qk=-1.0, d_qk=None), "p_qk"),
        (dict(p_qk=0.5), "not both"),
        (dict(L=0), "L="),
        (dict(L=512), "1 <= L <= S"),
        (dict(L=48), "does not divide"),
        (dict(F_causal=0.3), "F_causal"),
        (dict(counts="printed"), "counts"),
        (dict(counts="paper", F_ops=FOps(exp=2)), "F_exp"),
        (dict(B=0), "B"),
        (dict(bytes_Cmn=0), "bytes_Cmn"),
    ],
)
def test_bad_input_raises_one_line_user_error_naming_the_parameter(kwargs, match):
    base = dict(variant="sig", formulation="chunkwise", S=256, L=64, d_hv=128, d_qk=64)
    base.update(kwargs)
    variant = base.pop("variant")
    formulation = base.pop("formulation")
    with pytest.raises(UserError, match=match) as exc:
        mlstm_counts(variant, formulation, **base)
    assert "\n" not in str(exc.value)


def test_counts_for_case_answers_every_kind_and_mode_with_positive_counts():
    from tflabench.model import KINDS

    for kind in KINDS:
        for mode in ("fwd", "fwdbw"):
            c = counts_for_case(kind, mode, B=2, NH=4, S=1000, d_qk=64, d_hv=128, d_state=32)
            assert c.flops > 0 and c.bytes > 0 and c.intensity_flop_per_byte > 0, (kind, mode)
            if mode == "fwdbw":
                fwd = counts_for_case(kind, "fwd", B=2, NH=4, S=1000, d_qk=64, d_hv=128, d_state=32)
                assert c.flops > 2 * fwd.flops and c.bytes > fwd.bytes, kind


def test_counts_for_case_mlstm_equals_padded_chunkwise_forward_counts():
    c = counts_for_case("mlstm_sig", "fwd", B=2, NH=3, S=8192, d_qk=256, d_hv=512, L=256,
                        bytes_qkv=2, bytes_Cmn=4, F_causal=0.66, counts="paper")
    # O4 per-call totals (§6.4) at B = NH = 8 scale linearly: 4.126877e11 · (2·3)/(8·8)
    assert close_printed(c.flops * 64 / 6, "4.126877e11")
    assert close_printed(c.bytes * 64 / 6, "4.567597e9")
    # L > T is one chunk of length T (the kernel's behaviour for short sequences)
    short = counts_for_case("mlstm_exp", "fwd", B=1, NH=1, S=100, d_qk=16, d_hv=16, L=128)
    assert short.flops == mlstm_counts("exp", "chunkwise", S=100, L=100, d_qk=16, d_hv=16).flops


def test_counts_for_case_rejects_unknown_kind_mode_and_sizes():
    with pytest.raises(UserError, match="kind"):
        counts_for_case("retnet", "fwd", B=1, NH=1, S=64, d_qk=8, d_hv=8)
    with pytest.raises(UserError, match="mode"):
        counts_for_case("mlstm_sig", "bwd", B=1, NH=1, S=64, d_qk=8, d_hv=8)
    with pytest.raises(UserError, match="S="):
        counts_for_case("mlstm_sig", "fwd", B=1, NH=1, S=0, d_qk=8, d_hv=8)
