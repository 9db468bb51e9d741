"""Runtime, intensity, roofline and optimal chunk sizes (paper App. G, eq. 111) against
docs/model-counts.md's oracles O2-O6 (§6.2-6.5, §7) and its closed-form/numeric checks (§6.8).

O2-O6 are `paper` mode; tolerance: half a unit in the last printed digit + 1e-6 relative (§6).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import yaml

from tflabench.hardware import get_gpu
from tflabench.model import mlstm_counts, roofline, runtime
from tflabench.model.analysis import (
    best_power_of_two,
    chunkwise_coefficients,
    chunkwise_runtime,
    l_opt_flop,
    l_opt_flop_numeric,
    l_opt_runtime,
    l_opt_runtime_max,
    l_opt_runtime_numeric,
    l_ridge,
    optimal_chunk,
    powers_of_two,
)

def close_printed(value: float, printed: str) -> bool:
    """|value - printed| <= half a unit in the printed last digit + 1e-6 relative (§6 intro)."""
    mant, _, exp = printed.lower().partition("e")
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    half_unit = 0.5 * 10.0 ** ((int(exp) if exp else 0) - decimals)
    return abs(value - float(printed)) <= half_unit + 1e-6 * abs(float(printed))


GPUS = ("v100", "a100", "h100", "b200")


def ceilings(key):
    g = get_gpu(key)
    return g.flops_per_s, g.bytes_per_s


# ------------------------------------------------------------------ §4.1 coefficients


@pytest.mark.parametrize("dhv,p,fc,sb", [(512, 0.5, 0.66, 4), (128, 1.0, 0.5, 2), (64, 0.25, 1.0, 4)])
def test_coefficients_equal_the_printed_polynomials_of_section_4_1(dhv, p, fc, sb):
    paper = chunkwise_coefficients("sig", d_hv=dhv, p_qk=p, F_causal=fc, bytes_Cmn=sb, counts="paper")
    rows = chunkwise_coefficients("sig", d_hv=dhv, p_qk=p, F_causal=fc, bytes_Cmn=sb, counts="rows")
    a = fc * (2 * p * dhv + 2 * dhv + 6) + 1
    expect_paper = dict(a=a, b=4 * p * dhv**2 + 2 * p * dhv + dhv + 11, c=2 * p * dhv**2 + 5,
                        m=6 * dhv * (1 + p) + 8, n=2 * p * dhv**2 * sb)
    expect_rows = dict(expect_paper, b=expect_paper["b"] + 1, c=2 * p * dhv**2 + 1)
    for k in "abcmn":
        assert math.isclose(paper[k], expect_paper[k], rel_tol=1e-12), k
        assert math.isclose(rows[k], expect_rows[k], rel_tol=1e-12), k
    # mLSTMexp rows mode [D] (§4.1)
    e = chunkwise_coefficients("exp", d_hv=dhv, p_qk=p, F_causal=fc, bytes_Cmn=sb)
    expect_exp = dict(a=fc * (2 * p * dhv + 2 * dhv + 8) + 1, b=4 * p * dhv**2 + 6 * p * dhv + 2 * dhv + 13 + 2 * fc,
                      c=2 * p * dhv**2 + 2 * p * dhv + 5, m=8 + 3 * (1 + p) * dhv * 2 + 2 * sb,
                      n=2 * (p * dhv**2 + p * dhv + 1) * sb)
    for k in "abcmn":
        assert math.isclose(e[k], expect_exp[k], rel_tol=1e-12), k


# ------------------------------------------------------------------ O2 (§6.2): eq. 111

O2 = {  # (d_hv, p_qk): paper F_c 0.5, 0.66, 1.0 ; rows where it differs at 3 decimals
    (64, 0.5): (("6.404", "5.581", "4.540"), ("6.401", "5.578", "4.537")),
    (128, 0.5): (("9.144", "7.964", "6.474"), ("9.143", "7.963", "6.473")),
    (256, 0.5): (("12.997", "11.316", "9.196"), None),
    (512, 0.5): (("18.427", "16.042", "13.034"), ("18.427", "16.041", "13.034")),
    (1024, 0.5): (("26.094", "22.714", "18.454"), None),
    (64, 1.0): (("7.880", "6.865", "5.583"), ("7.878", "6.864", "5.581")),
    (128, 1.0): (("11.227", "9.777", "7.946"), ("11.227", "9.776", "7.946")),
    (256, 1.0): (("15.938", "13.876", "11.275"), ("15.938", "13.875", "11.275")),
    (512, 1.0): (("22.583", "19.659", "15.973"), None),
    (1024, 1.0): (("31.969", "27.827", "22.608"), None),
}


@pytest.mark.parametrize("key", list(O2))
def test_flop_optimal_chunk_size_eq_111_O2(key):
    dhv, p = key
    paper, rows = O2[key]
    rows = rows or paper
    for fc, pv, rv in zip((0.5, 0.66, 1.0), paper, rows):
        lp = l_opt_flop(chunkwise_coefficients("sig", d_hv=dhv, p_qk=p, F_causal=fc, counts="paper"))
        lr = l_opt_flop(chunkwise_coefficients("sig", d_hv=dhv, p_qk=p, F_causal=fc, counts="rows"))
        assert close_printed(lp, pv)
        assert close_printed(lr, rv)
        # the printed eq. 111
        printed = math.sqrt((2 * dhv**2 * p + 5) / (2 * fc * (dhv * (1 + p) + 3) + 1))
        assert math.isclose(lp, printed, rel_tol=1e-12)


def test_flop_optimal_chunk_size_mlstm_exp_rows_O2():
    # O2 mLSTMexp rows-mode [R, D], p_qk = 0.5
    for dhv, vals in ((64, ("6.422", "5.596", "4.552")), (512, ("18.434", "16.047", "13.039"))):
        for fc, v in zip((0.5, 0.66, 1.0), vals):
            co = chunkwise_coefficients("exp", d_hv=dhv, p_qk=0.5, F_causal=fc)
            assert abs(l_opt_flop(co) - float(v)) <= 5e-4 + 1e-4 * float(v)


# ------------------------------------------------------------------ O3 (§6.3): eq. 121

O3 = [  # GPU, bytes_Cmn, d_hv, F_c 0.5 / 0.66 / 1.0 (paper mode, p_qk = 0.5)
    ("v100", 4, 128, "211.34", "184.06", "149.63"), ("v100", 4, 512, "425.96", "370.81", "301.30"),
    ("v100", 2, 128, "149.58", "130.28", "105.91"), ("v100", 2, 512, "301.48", "262.45", "213.25"),
    ("a100", 4, 128, "232.37", "202.38", "164.52"), ("a100", 4, 512, "468.34", "407.70", "331.28"),
    ("a100", 2, 128, "164.44", "143.21", "116.42"), ("a100", 2, 512, "331.43", "288.51", "234.43"),
    ("h100", 4, 128, "314.32", "273.75", "222.54"), ("h100", 4, 512, "633.51", "551.48", "448.10"),
    ("h100", 2, 128, "222.35", "193.65", "157.43"), ("h100", 2, 512, "448.15", "390.12", "316.99"),
    ("b200", 4, 128, "312.71", "272.35", "221.40"), ("b200", 4, 512, "630.26", "548.66", "445.81"),
    ("b200", 2, 128, "221.21", "192.66", "156.62"), ("b200", 2, 512, "445.85", "388.13", "315.37"),
]


@pytest.mark.parametrize("row", O3, ids=lambda r: f"{r[0]}-{r[1]}-{r[2]}")
def test_runtime_optimal_chunk_size_eq_121_O3(row):
    gpu, sb, dhv, *vals = row
    I_acc = get_gpu(gpu).intensity_flop_per_byte
    for fc, v in zip((0.5, 0.66, 1.0), vals):
        lp = l_opt_runtime(chunkwise_coefficients("sig", d_hv=dhv, p_qk=0.5, F_causal=fc, bytes_Cmn=sb,
                                                  counts="paper"), I_acc)
        assert close_printed(lp, v)
        printed = math.sqrt((2 * dhv**2 * 0.5 + 5 + 2 * I_acc * dhv**2 * 0.5 * sb)
                            / (2 * fc * (dhv * 1.5 + 3) + 1))
        assert math.isclose(lp, printed, rel_tol=1e-12)
        lr = l_opt_runtime(chunkwise_coefficients("sig", d_hv=dhv, p_qk=0.5, F_causal=fc, bytes_Cmn=sb), I_acc)
        assert math.isclose(lr, float(v), rel_tol=1e-4)


def test_runtime_optimal_chunk_size_mlstm_exp_rows_O3():
    I = get_gpu("h100").intensity_flop_per_byte
    for dhv, v in ((128, 274.134), (512, 551.666)):  # O3 mLSTMexp rows mode, H100, bytes_Cmn 4, F_c .66
        co = chunkwise_coefficients("exp", d_hv=dhv, p_qk=0.5, F_causal=0.66, bytes_Cmn=4)
        assert abs(l_opt_runtime(co, I) - v) <= 5e-4 + 1e-4 * v


def test_eq_121_does_not_depend_on_bytes_if_or_bytes_qkv_section_4_6():
    kw = dict(d_hv=512, p_qk=0.5, F_causal=0.66, bytes_Cmn=4)
    a = l_opt_runtime(chunkwise_coefficients("sig", bytes_qkv=2, bytes_if=2, **kw), 295.0)
    b = l_opt_runtime(chunkwise_coefficients("sig", bytes_qkv=4, bytes_if=1, **kw), 295.0)
    assert math.isclose(a, b, rel_tol=1e-14)


def test_eq_121_on_h200_datasheet_and_measured_section_5():
    # §5 [R]: datasheet 529.34 / 460.80 / 374.42; measured 774e12 / 4.23e12: 498.87 / 434.28 / 352.87
    h200 = get_gpu("h200")
    for (peak_flops_per_s, beta), vals in (((h200.flops_per_s, h200.bytes_per_s), ("529.34", "460.80", "374.42")),
                                ((774e12, 4.23e12), ("498.87", "434.28", "352.87"))):
        for fc, v in zip((0.5, 0.66, 1.0), vals):
            co = chunkwise_coefficients("sig", d_hv=512, p_qk=0.5, F_causal=fc, bytes_Cmn=4, counts="paper")
            assert close_printed(l_opt_runtime(co, peak_flops_per_s / beta), v)


# ------------------------------------------------------------------ O4 (§6.4): runtimes

#: (GPU, F_c): eq. 116 ms at L = 32 ... 8192, argmin(sum), argmin(max) (tests/data/model_counts.yaml)
O4 = {(gpu, float(fc)): (row["ms"], row["argmin_sum"], row["argmin_max"])
      for gpu, by_fc in yaml.safe_load((Path(__file__).parent / "data" / "model_counts.yaml").read_text())["O4"].items()
      for fc, row in by_fc.items()}
FIG17 = dict(d_hv=512, p_qk=0.5, NH=8, B=8, S=8192, bytes_qkv=2, bytes_if=2, bytes_Cmn=4)


@pytest.mark.parametrize("key", list(O4), ids=lambda k: f"{k[0]}-{k[1]}")
def test_theoretical_runtime_eq_116_and_its_argmins_O4(key):
    gpu, fc = key
    ms, amin_sum, amin_max = O4[key]
    peak_flops_per_s, beta = ceilings(gpu)
    Ls = [32 * 2**i for i in range(9)]
    for L, v in zip(Ls, ms.split()):
        t = chunkwise_runtime("sig", L=L, peak_flops_per_s=peak_flops_per_s, beta=beta, F_causal=fc, counts="paper", **FIG17)
        assert close_printed(t * 1e3, v), L
    search = dict(peak_flops_per_s=peak_flops_per_s, beta=beta, d_hv=512, p_qk=0.5, F_causal=fc, bytes_Cmn=4, counts="paper")
    assert close_printed(l_opt_runtime_numeric("sig", **search), amin_sum)
    assert close_printed(l_opt_runtime_numeric("sig", combine="max", **search), amin_max)
    co = chunkwise_coefficients("sig", d_hv=512, p_qk=0.5, F_causal=fc, bytes_Cmn=4, counts="paper")
    assert close_printed(l_opt_runtime_max(co, peak_flops_per_s / beta), amin_max)  # §4.7 closed form
    assert close_printed(l_ridge(co, peak_flops_per_s / beta), amin_max)


def test_max_form_runtime_at_L_256_O4():
    # O4: eq. 114 at L = 256, F_c = 0.66: V100 5.075 ms, A100 2.361, H100 1.363, B200 0.593
    for gpu, v in zip(GPUS, ("5.075", "2.361", "1.363", "0.593")):
        peak_flops_per_s, beta = ceilings(gpu)
        t = chunkwise_runtime("sig", L=256, peak_flops_per_s=peak_flops_per_s, beta=beta, F_causal=0.66, counts="paper",
                              combine="max", **FIG17)
        assert close_printed(t * 1e3, v)
        # the roofline bound and the max form are the same statement (§4.4)
        c = mlstm_counts("sig", "chunkwise", L=256, F_causal=0.66, counts="paper",
                         **{k: v for k, v in FIG17.items()})
        assert math.isclose(c.flops / roofline(c.intensity_flop_per_byte, peak_flops_per_s, beta), t, rel_tol=1e-12)
        assert math.isclose(runtime(c.flops, c.bytes, peak_flops_per_s, beta, "max"), t, rel_tol=1e-12)


O4_TOTALS = {  # §6.4 per-call totals, F_c = 0.66: sig paper, sig rows, exp paper, exp rows, sig bytes, exp bytes
    64: ("3.117506e11", "3.117511e11", "3.131430e11", "3.126062e11", "1.101005e10", "1.103109e10"),
    128: ("3.448594e11", "3.448600e11", "3.462940e11", "3.457572e11", "6.715081e9", "6.727696e9"),
    256: ("4.126877e11", "4.126882e11", "4.142098e11", "4.136730e11", "4.567597e9", "4.576002e9"),
    1024: ("8.224759e11", "8.224764e11", "8.245288e11", "8.239919e11", "2.956984e9", "2.962231e9"),
}


@pytest.mark.parametrize("L", list(O4_TOTALS))
def test_per_call_totals_at_fig_17_settings_O4(L):
    sp, sr, ep, er, sb, eb = O4_TOTALS[L]
    kw = dict(L=L, F_causal=0.66, **FIG17)
    assert close_printed(mlstm_counts("sig", "chunkwise", counts="paper", **kw).flops, sp)
    assert close_printed(mlstm_counts("sig", "chunkwise", counts="rows", **kw).flops, sr)
    assert close_printed(mlstm_counts("exp", "chunkwise", counts="paper", **kw).flops, ep)
    assert close_printed(mlstm_counts("exp", "chunkwise", counts="rows", **kw).flops, er)
    assert close_printed(mlstm_counts("sig", "chunkwise", **kw).bytes, sb)
    assert close_printed(mlstm_counts("exp", "chunkwise", **kw).bytes, eb)


# ------------------------------------------------------------------ O5 (§6.5): intensity

#: d_hv, bytes_Cmn, F_c, I at L = 16, 64, 256, 1024, 4096, crossing L V100/A100/H100/B200
#: (tests/data/model_counts.yaml)
O5 = [tuple(row) for row in yaml.safe_load((Path(__file__).parent / "data" / "model_counts.yaml").read_text())["O5"]]


@pytest.mark.parametrize("row", O5, ids=lambda r: f"{r[0]}-{r[1]}-{r[2]}")
def test_arithmetic_intensity_eq_118_and_ridge_crossing_O5(row):
    dhv, sb, fc, Is, cross = row
    for L, v in zip((16, 64, 256, 1024, 4096), Is.split()):
        c = mlstm_counts("sig", "chunkwise", S=8192, L=L, d_hv=dhv, p_qk=0.5, F_causal=fc, bytes_Cmn=sb,
                         counts="paper", B=3, NH=5)  # I does not depend on B, NH
        assert close_printed(c.intensity_flop_per_byte, v), L
    co = chunkwise_coefficients("sig", d_hv=dhv, p_qk=0.5, F_causal=fc, bytes_Cmn=sb, counts="paper")
    for gpu, v in zip(GPUS, cross.split()):
        Lx = l_ridge(co, get_gpu(gpu).intensity_flop_per_byte)
        assert close_printed(Lx, v), gpu
        I_at = (co["a"] * Lx**2 + co["b"] * Lx + co["c"]) / (co["m"] * Lx + co["n"])
        assert math.isclose(I_at, get_gpu(gpu).intensity_flop_per_byte, rel_tol=1e-9)


# ------------------------------------------------------------------ O6 (§7): measured H100 points

O6 = [  # L, fwd ms, FLOPs F_c .5/.66/1, FLOP/s (.66), I .5/.66/1, H100 roofline at I(.66)
    (64, 7.411136, "3.0347e11 3.1175e11 3.2934e11", "4.2065e13", "27.6 28.3 29.9", "9.4856e13"),
    (128, 6.376000, "3.2830e11 3.4486e11 3.8004e11", "5.4087e13", "48.9 51.4 56.6", "1.7204e14"),
    (256, 6.301056, "3.7957e11 4.1269e11 4.8306e11", "6.5495e13", "83.1 90.4 105.8", "3.0268e14"),
    (512, 7.300192, "4.8292e11 5.4915e11 6.8988e11", "7.5224e13", "138.2 157.2 197.5", "5.2654e14"),
    (1024, 9.552736, "6.9002e11 8.2248e11 1.1039e12", "8.6098e13", "233.4 278.1 373.3", "9.3179e14"),
    (2048, 12.895072, "1.1044e12 1.3693e12 1.9323e12", "1.0619e14", "410.8 509.3 718.7", "9.8900e14"),
    (4096, 21.660032, "1.9333e12 2.4631e12 3.5890e12", "1.1372e14", "756.9 964.3 1405.1", "9.8900e14"),
]


@pytest.mark.parametrize("row", O6, ids=lambda r: f"L{r[0]}")
def test_measured_h100_points_flops_intensity_and_roofline_O6(row):
    L, ms, flops, fps, Is, roof = row
    peak_flops_per_s, beta = ceilings("h100")
    for fc, f, i in zip((0.5, 0.66, 1.0), flops.split(), Is.split()):
        c = mlstm_counts("sig", "chunkwise", L=L, F_causal=fc, counts="paper", **FIG17)
        assert close_printed(c.flops, f)
        assert close_printed(c.intensity_flop_per_byte, i)
        if fc == 0.66:
            assert close_printed(c.flops / (ms * 1e-3), fps)
            assert close_printed(roofline(c.intensity_flop_per_byte, peak_flops_per_s, beta), roof)


# ------------------------------------------------------------------ §6.8: closed form vs numeric


@pytest.mark.parametrize("gpu", GPUS)
def test_eq_121_equals_numeric_argmin_and_best_power_of_two_brackets_it_section_6_8(gpu):
    peak_flops_per_s, beta = ceilings(gpu)
    worst = 0.0
    for sb, dhv, p, fc in itertools.product((2, 4), (64, 128, 256, 512, 1024), (0.5, 1.0), (0.5, 0.66, 1.0)):
        for counts in ("paper", "rows"):
            co = chunkwise_coefficients("sig", d_hv=dhv, p_qk=p, F_causal=fc, bytes_Cmn=sb, counts=counts)
            closed = l_opt_runtime(co, peak_flops_per_s / beta)
            numeric = l_opt_runtime_numeric("sig", peak_flops_per_s=peak_flops_per_s, beta=beta, d_hv=dhv, p_qk=p, F_causal=fc,
                                            bytes_Cmn=sb, counts=counts)
            worst = max(worst, abs(numeric / closed - 1))
        # powers of two: the bracketing choice is the global best power of two (§4.8)
        T = 2**16

        def rt(L):
            return chunkwise_runtime("sig", L=L, peak_flops_per_s=peak_flops_per_s, beta=beta, S=T, d_hv=dhv, p_qk=p, F_causal=fc,
                                     bytes_Cmn=sb, counts="paper", B=1, NH=1)

        all_p2 = min(powers_of_two(1, T), key=rt)
        assert best_power_of_two(rt, closed, T) == all_p2
    assert worst < 1e-6  # §6.8 reports 4.65e-8 for golden section


def test_eq_111_equals_numeric_argmin_of_the_flops_section_6_8():
    worst = 0.0
    for dhv, p, fc in itertools.product((16, 32, 64, 128, 256, 512, 1024), (0.25, 0.5, 1.0), (0.5, 0.66, 1.0)):
        for variant, counts in (("sig", "paper"), ("sig", "rows"), ("exp", "rows")):
            closed = l_opt_flop(chunkwise_coefficients(variant, d_hv=dhv, p_qk=p, F_causal=fc, counts=counts))
            numeric = l_opt_flop_numeric(variant, d_hv=dhv, p_qk=p, F_causal=fc, counts=counts)
            worst = max(worst, abs(numeric / closed - 1))
    assert worst < 1e-6  # §6.8: 1.54e-7


def test_optimal_chunk_report_h100_fig_17_setting():
    peak_flops_per_s, beta = ceilings("h100")
    r = optimal_chunk("sig", peak_flops_per_s=peak_flops_per_s, beta=beta, d_hv=512, p_qk=0.5, F_causal=0.66, bytes_Cmn=4,
                      counts="paper")
    assert close_printed(r["L_opt_flop"], "16.042")  # O2
    assert close_printed(r["L_opt_runtime"], "551.48")  # O3
    assert math.isclose(r["L_opt_runtime_numeric"], r["L_opt_runtime"], rel_tol=1e-6)
    assert close_printed(r["L_opt_runtime_max"], "1098.4")  # O4 argmin(max)
    assert math.isclose(r["L_opt_runtime_max_numeric"], r["L_opt_runtime_max"], rel_tol=1e-6)
    assert r["L_pow2_runtime"] == 512 and r["L_pow2_flop"] == 16
    assert close_printed(r["runtime_ms_pow2"], "1.598")  # O4 H100 F_c .66 L = 512
