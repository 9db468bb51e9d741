"""tflabench compare: the gate against drift, tails, timers and sample counts, and the
terminal table at 80 columns (docs/ci.md, "How compare decides"; docs/compare-gate.md).

Result sets are built with ``tflabench.store.results.write_results``; noise is synthetic with
fixed seeds. One test runs a reduced copy of the CPU demo twice and compares the runs.
"""

from __future__ import annotations

import io
import json
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from tflabench.compare import gate as cmp, render, statistics
from tflabench.compare.thresholds import Thresholds
from tflabench.cli import app
from tflabench.store.conditions import timing_differences, timing_method
from tflabench.store.results import load_results, write_results

SUITE = "gate_demo"
GPU_META = dict(suite=SUITE, hostname="runner-1", gpu_name="NVIDIA H200", device="cuda", driver="570.86",
                cuda="12.8", torch="2.13.0", triton="3.6.0", python="3.12.3", tflabench="0.1.0", shard=None)
CPU_META = dict(suite=SUITE, hostname="runner-1", gpu_name=None, device="cpu", cpu="Example CPU",
                torch="2.13.0", triton="3.6.0", python="3.12.3", tflabench="0.1.0", shard=None,
                cpu_threads={"per_worker": 1, "cores": 2, "workers": 1, "set_by": "tflabench"},
                measurement={"device": "cpu", "numerics": {"check": True}}, compare={"time_threshold": 0.25})
KERNELS = ("mLSTMsig TFLA (reference)", "mLSTMexp TFLA (reference)", "torch SDPA math")
SEQ_LENS = (128, 256, 512)


def row(kernel: str, seq_len: int, samples, device: str = "cuda") -> dict:
    s = np.asarray(samples, dtype=float)
    return dict(
        suite=SUITE, kernel=kernel, backend=kernel.split()[0].lower(), family="mlstm", params={"L": 64},
        mode="fwd", dtype="float32", device=device, batch=2, seq_len=seq_len, heads=2, d_qk=32, d_hv=64,
        chunk_size=64, embedding_dim=128, status="ok", ms_median=float(np.median(s)), ms_mean=float(s.mean()),
        ms_min=float(s.min()), ms_max=float(s.max()), ms_q25=float(np.quantile(s, 0.25)),
        ms_q75=float(np.quantile(s, 0.75)), ms_samples=[float(x) for x in s], n_iter=len(s),
        peak_mem_bytes=float(2**26) if device == "cuda" else None,
    )


def rows(seed: int, factor: dict | float = 1.0, device: str = "cuda", spread: float = 0.02, n: int = 60) -> list:
    """One row per kernel and length: ``n`` samples of ``spread`` Gaussian noise around a
    median of ``1 + index`` ms times ``factor`` (a number, or a mapping per (kernel, S))."""
    rng = np.random.default_rng(seed)
    out = []
    for ki, kernel in enumerate(KERNELS):
        for si, seq_len in enumerate(SEQ_LENS):
            f = factor.get((kernel, seq_len), 1.0) if isinstance(factor, dict) else factor
            median = (1.0 + ki + si / 3) * f
            out.append(row(kernel, seq_len, median * (1 + spread * rng.standard_normal(n)), device))
    return out


def write(tmp_path: Path, name: str, data: list, **meta):
    base = CPU_META if data and data[0]["device"] == "cpu" else GPU_META
    return load_results(write_results(tmp_path / name, data, dict(base, **meta)))


def _run(*args):
    return CliRunner().invoke(app, ["compare", *map(str, args)])


# ----------------------------------------------------------------------------- statistics


def test_forty_thousand_samples_a_side_take_little_memory():
    """The interval and the tail are O(n log n): 40,000 samples a side (the most
    timing.iterations allows) fit in a few MB; the pairwise differences would need 12 GiB."""
    rng = np.random.default_rng(0)
    base = np.exp(0.02 * rng.standard_normal(40_000))
    new = 1.2 * np.exp(0.02 * rng.standard_normal(40_000))
    tracemalloc.start()
    try:
        decision = statistics.decide_time(float(np.median(base)), float(np.median(new)), base, new, Thresholds())
        tail = statistics.decide_tail(base, new, Thresholds())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20
    assert decision.verdict == "slower" and decision.low > 1.19 and decision.high < 1.21
    assert tail[1] == pytest.approx(1.2, rel=0.01) and tail[2] == pytest.approx(1.2, rel=0.01)


@pytest.mark.parametrize("sizes", [(1, 1), (3, 7), (50, 40), (201, 199)])
def test_pairwise_difference_quantile_is_the_quantile_of_all_pairs(sizes):
    rng = np.random.default_rng(sum(sizes))
    x, y = np.round(rng.normal(size=sizes[0]), 2), np.round(rng.normal(size=sizes[1]) + 0.3, 2)
    pairs = np.subtract.outer(y, x).ravel()  # the definition, at sizes where it is cheap
    for q in (0.01, 0.3, 0.5, 0.99):
        assert statistics.pairwise_difference_quantile(x, y, q) == pytest.approx(np.quantile(pairs, q), abs=1e-12)


def test_a_tail_regression_is_its_own_finding(tmp_path):
    """90 calls at 1.0 ms and 10 at 100 ms against 100 at 1.0 ms: the median holds, the
    mean is 10.9x: a tail finding that fails the default gate."""
    base = write(tmp_path, "a", [row(KERNELS[0], 128, np.ones(100))])
    new = write(tmp_path, "b", [row(KERNELS[0], 128, np.r_[np.ones(90), np.full(10, 100.0)])])
    comparison = cmp.compare_results(base, new)
    case = comparison.cases.iloc[0]
    assert case["outcome"] == "tail" and case["time_verdict"] != "slower"
    assert case["mean_ratio"] == pytest.approx(10.9) and "tail" in case["detail"]
    assert comparison.exit_status("any") == 1 and comparison.exit_status("regression") == 1
    assert "tail" in render.to_markdown(comparison).split("### Changed cases")[1]
    one_stall = write(tmp_path, "c", [row(KERNELS[0], 128, np.r_[np.ones(99), [100.0]])])
    assert cmp.compare_results(base, one_stall).cases.iloc[0]["outcome"] != "tail"


# ----------------------------------------------------------------------------- timing method


def test_timing_method_reads_the_timer_from_the_threads():
    one = timing_method(CPU_META)
    assert one == {"timer": "process_time", "threads": 1, "cpu": "Example CPU", "hostname": "runner-1"}
    four = dict(CPU_META, cpu_threads={"per_worker": 4})
    assert timing_method(four)["timer"] == "perf_counter"
    assert timing_differences(CPU_META, four) == [("timer", "process_time", "perf_counter"), ("threads", 1, 4)]
    assert timing_method(GPU_META)["timer"] == "cuda_events" and timing_method(GPU_META)["threads"] is None
    assert timing_method({})["timer"] is None


def test_a_candidate_with_its_own_numerics_budgets_is_unchecked(tmp_path):
    base = write(tmp_path, "a", rows(1), measurement={"numerics": {"check": True, "tolerance": None}})
    new = write(tmp_path, "b", rows(2, factor=0.5), measurement={"numerics": {"check": True, "tolerance": 1.0}})
    comparison = cmp.compare_results(base, new)
    assert comparison.counts["improvement"] == 0 and comparison.cases["unchecked"].all()
    assert any("other numerics.tolerance than the base" in w for w in comparison.warnings)
    same = write(tmp_path, "c", rows(2, factor=0.5), measurement={"numerics": {"check": True, "tolerance": None}})
    assert cmp.compare_results(base, same).counts["improvement"] == len(KERNELS) * len(SEQ_LENS)


def test_sets_of_two_timers_are_never_judged(tmp_path):
    base = write(tmp_path, "a", rows(1, device="cpu"))
    new = write(tmp_path, "b", rows(2, factor=0.5, device="cpu"), cpu_threads={"per_worker": 4})
    comparison = cmp.compare_results(base, new)
    assert set(comparison.cases["undecided_kind"]) == {"timer"}
    assert any(w.startswith("timer differs: base 'process_time', new 'perf_counter'") for w in comparison.warnings)
    assert comparison.exit_status("any") == 1  # counted toward the undecided share


# ----------------------------------------------------------------------------- drift


def test_cpu_drift_between_runs_is_undecided_and_passes_but_a_3x_slowdown_fails(tmp_path):
    """On the CPU whole cases move by up to 2x between runs of the same code while their
    samples agree: undecided by drift, not counted, the pair passes; 3x still fails."""
    drift = {(KERNELS[0], 128): 1.9, (KERNELS[1], 256): 0.6, (KERNELS[2], 512): 1.4}
    base = write(tmp_path, "a", rows(1, device="cpu"))
    comparison = cmp.compare_results(base, write(tmp_path, "b", rows(2, factor=drift, device="cpu")))
    drifted = comparison.cases[comparison.cases["undecided_kind"] == "drift"]
    assert len(drifted) == len(drift) and comparison.counts["regression"] == 0
    assert comparison.exit_status("any") == 0
    assert "within the drift between runs" in render.verdict_line(comparison)

    slowed = write(tmp_path, "c", rows(2, factor={(KERNELS[0], 128): 3.0}, device="cpu"))
    comparison = cmp.compare_results(base, slowed)
    assert comparison.counts["regression"] == 1 and comparison.exit_status("any") == 1


def test_an_aa_partner_measures_the_drift(tmp_path):
    """On a GPU set without spread warnings the samples decide alone: +6 % is a
    regression at 3 %; an A/A partner of the base 8 % away widens the test to undecided."""
    base = write(tmp_path, "a", rows(1))
    new = write(tmp_path, "b", rows(2, factor=1.06))
    partner = write(tmp_path, "aa", rows(3, factor=1.08))
    assert cmp.compare_results(base, new).counts["regression"] == len(KERNELS) * len(SEQ_LENS)
    comparison = cmp.compare_results(base, new, history=[partner])
    assert comparison.counts["regression"] == 0 and comparison.exit_status("any") == 0
    assert set(comparison.cases["undecided_kind"]) == {"drift"}
    assert comparison.cases["drift"].iloc[0] == pytest.approx(0.08, abs=0.01)
    assert _run(tmp_path / "a", tmp_path / "b").exit_code == 1
    assert _run(tmp_path / "a", tmp_path / "b", "--aa", tmp_path / "aa").exit_code == 0
    far = write(tmp_path, "c", rows(2, factor=1.25))
    assert cmp.compare_results(base, far, history=[partner]).counts["regression"] == len(KERNELS) * len(SEQ_LENS)


def test_two_runs_of_the_cpu_demo_pass_the_default_gate(tmp_path):
    """`tflabench run` twice (a reduced copy of suites/cpu_demo.yaml) and `compare`: exit 0."""
    demo = Path(__file__).resolve().parents[1] / "suites" / "cpu_demo.yaml"
    text = demo.read_text()
    assert "compare: {time_threshold: 0.25}" in text  # the demo's own threshold, kept below
    suite = tmp_path / "cpu_demo_pair.yaml"
    suite.write_text(
        "name: cpu_demo_pair\ndevice: cpu\ndtype: float32\nmodes: [fwd]\nseed: 0\n"
        "timing: {warmup: 3, iterations: 20, timeout_s: 120}\nnumerics: {check: true, max_seq_len: 256}\n"
        "model: {embedding_dim: 128}\nsweep: {tokens: 512, seq_len: [128, 256]}\n"
        "compare: {time_threshold: 0.25}\nkernels:\n"
        "  - backend: tfla\n    label: mLSTMsig TFLA (reference)\n"
        "    params: {variant: sig, algorithm: xl_chunk, chunk_size: 64, heads: 2, d_qk: 32, d_hv: 64, "
        "impl: reference}\n"
        "  - backend: sdpa\n    label: torch SDPA math\n    params: {impl: math, heads: 2, d_hv: 64}\n")
    runner = CliRunner()
    sets = []
    for name in ("a", "b"):
        result = runner.invoke(app, ["run", str(suite), "--out", str(tmp_path / name), "--no-progress",
                                     "--no-plots"])
        assert result.exit_code == 0, result.output
        (path,) = (tmp_path / name / "cpu_demo_pair").iterdir()
        sets.append(path)
    result = _run(*sets, "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["exit_status"] == 0 and report["counts"]["regression"] == 0 and report["fails_on"] == []


# ----------------------------------------------------------------------------- the table


def _render(comparison, width: int, **kwargs) -> str:
    console = Console(file=io.StringIO(), width=width, highlight=False, no_color=True)
    render.render_table(comparison, console, show_unchanged=True, **kwargs)
    return console.file.getvalue()


def test_the_table_reads_at_80_columns_and_cuts_no_number(tmp_path):
    base = write(tmp_path, "a", rows(1, device="cpu"))
    new = write(tmp_path, "b", rows(2, factor={(KERNELS[0], 128): 3.0, (KERNELS[2], 256): 0.3}, device="cpu"))
    comparison = cmp.compare_results(base, new)
    text = _render(comparison, 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    for r in comparison.cases.to_dict("records"):
        for number in (render._fmt_ms(r["base_ms"]), render._fmt_ms(r["new_ms"]), render._fmt_change(r["time_ratio"]),
                       f"res={render._fmt_resolution(r['resolution'])}", f"tail={render._fmt_tail(r)}"):
            assert re.search(rf"(?<![\d.]){re.escape(number)}(?![\d.%])", text), number
    assert "kernels: mLSTMexp = mLSTMexp TFLA (reference)" in text
    assert "mem=" in text
    wide = _render(comparison, 80, wide=True)
    assert "resolution" in wide and "memory" in wide and "mLSTMsig TFLA (reference) fwd" in wide


def test_short_kernel_names_stay_apart():
    names = render.short_kernel_names(["mLSTMsig TFLA (reference)", "mLSTMsig TFLA (triton)", "fa2"])
    assert names == {"mLSTMsig TFLA (reference)": "mLSTMsig", "mLSTMsig TFLA (triton)": "mLSTMsig#2"}
