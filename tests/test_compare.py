"""tflabench compare: matching, the per-case decision, warnings, outputs, exit status.

Result sets are built here with ``tflabench.store.results.write_results``. Timing noise is
synthetic with fixed seeds: per-iteration samples ``median * (1 + 0.03 * N(0, 1))`` with
about 5 % outliers 1.3-3x slower (a GPU that is preempted, a clock dip), plus a run-level
drift of ``N(0, 0.5 %)`` per run and case (thermal/clock state between two runs). A/A
stays quiet, 10 % (and 5 %) slowdowns are flagged (docs/ci.md, "Why this rule").
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from tflabench.compare import caveats, gate as cmp, render, statistics
from tflabench.compare.thresholds import Thresholds, UNDECIDED_SHARE, load_thresholds_file, resolve_thresholds
from tflabench.cli import app
from tflabench.errors import UserError
from tflabench.store.results import load_results, write_results
from tflabench.text_safety import case_label

SUITE = "cmp_demo"
METADATA = dict(
    suite=SUITE, suite_path="suites/cmp_demo.yaml", suite_sha256="ab" * 32, date="2025-01-01T00:00:00",
    git_revision="0" * 40, hostname="runner-1", gpu_name="NVIDIA H200", gpu_count=1, driver="570.86",
    cuda="12.8", torch="2.13.0", triton="3.6.0", python="3.12.3", peers={"fla": "0.3.0"}, tflabench="0.1.0",
    shard=None, ceilings=None,
)
SEQ_LENS = (512, 1024, 2048, 4096, 8192)
BACKENDS = ("tfla_sig", "tfla_exp", "fa2")
N_ITER = 50


def noisy_samples(median_ms: float, seed: int, n: int = N_ITER, drift_sd: float = 0.005) -> np.ndarray:
    """Per-iteration times (ms): 3 % Gaussian spread, ~5 % outliers 1.3-3x, run drift."""
    rng = np.random.default_rng(seed)
    drift = 1.0 + drift_sd * rng.standard_normal()
    samples = median_ms * drift * (1.0 + 0.03 * rng.standard_normal(n))
    outliers = rng.random(n) < 0.05
    samples[outliers] *= rng.uniform(1.3, 3.0, int(outliers.sum()))
    return samples


def make_row(backend: str, seq_len: int, *, samples=None, status: str = "ok", reason=None,
             peak_mem_bytes: float = 64 * 2**20, with_samples: bool = True, q=None) -> dict:
    row = dict(
        suite=SUITE, kernel=backend, backend=backend, family="mlstm", params={"chunk_size": 64}, mode="fwd",
        dtype="bfloat16", device="cuda", batch=1, seq_len=seq_len, heads=8, d_qk=256, d_hv=512,
        chunk_size=64, embedding_dim=4096, status=status, reason=reason,
    )
    if status == "ok":
        s = np.asarray(samples, dtype=float)
        q25, q75 = q if q is not None else (float(np.quantile(s, 0.25)), float(np.quantile(s, 0.75)))
        row.update(
            ms_median=float(np.median(s)), ms_mean=float(s.mean()), ms_min=float(s.min()), ms_max=float(s.max()),
            ms_q25=q25, ms_q75=q75, ms_samples=[float(x) for x in s] if with_samples else None,
            n_iter=len(s), peak_mem_bytes=peak_mem_bytes,
        )
    return row


def base_median_ms(backend: str, seq_len: int) -> float:
    # arbitrary, distinct per case (the decision is relative)
    return 0.05 * seq_len / 512 * (1 + BACKENDS.index(backend))


def suite_rows(run_seed: int, slow: dict | None = None, **overrides) -> list[dict]:
    """One row per (backend, seq_len); ``slow`` maps (backend, seq_len) -> time factor."""
    rows = []
    for bi, backend in enumerate(BACKENDS):
        for si, seq_len in enumerate(SEQ_LENS):
            factor = (slow or {}).get((backend, seq_len), 1.0)
            seed = run_seed * 1000 + bi * 10 + si
            rows.append(make_row(backend, seq_len, samples=noisy_samples(base_median_ms(backend, seq_len) * factor, seed)))
    return rows


def write(tmp_path, name, rows, **meta):
    return load_results(write_results(tmp_path / name, rows, dict(METADATA, **meta)))


def outcome_of(comparison, backend, seq_len):
    cases = comparison.cases
    hit = cases[(cases["backend"] == backend) & cases["case"].str.contains(f" S{seq_len} ")]
    assert len(hit) == 1
    return hit.iloc[0]


# ----------------------------------------------------------------------------- decisions


def test_identical_runs_report_no_change(tmp_path):
    rows = suite_rows(1)
    base, new = write(tmp_path, "a", rows), write(tmp_path, "b", rows)
    comparison = cmp.compare_results(base, new)
    assert set(comparison.cases["outcome"]) == {"unchanged"}
    assert len(comparison.cases) == len(BACKENDS) * len(SEQ_LENS)
    assert comparison.warnings == []
    assert comparison.exit_status("any") == 0
    # every backend's geometric-mean speed-up is exactly 1 (same medians)
    assert np.allclose(comparison.backends["geomean_speedup"], 1.0)


@pytest.mark.parametrize("run_seeds", [(1, 2), (3, 4), (5, 6)])
def test_same_noise_without_slowdown_is_not_flagged(tmp_path, run_seeds):
    base = write(tmp_path, "a", suite_rows(run_seeds[0]))
    new = write(tmp_path, "b", suite_rows(run_seeds[1]))
    comparison = cmp.compare_results(base, new)
    assert comparison.counts["regression"] == 0
    assert comparison.counts["improvement"] == 0
    assert comparison.exit_status("any") == 0


@pytest.mark.parametrize("factor", [1.10, 1.05])
@pytest.mark.parametrize("run_seeds", [(1, 2), (3, 4), (5, 6)])
def test_noisy_slowdown_is_flagged_and_only_that_case(tmp_path, factor, run_seeds):
    slowed = ("tfla_sig", 2048)
    base = write(tmp_path, "a", suite_rows(run_seeds[0]))
    new = write(tmp_path, "b", suite_rows(run_seeds[1], slow={slowed: factor}))
    comparison = cmp.compare_results(base, new)
    row = outcome_of(comparison, *slowed)
    assert row["outcome"] == "regression"
    assert row["time_verdict"] == "slower"
    assert row["test"] == "mannwhitneyu" and row["p_value"] < 0.01
    assert comparison.counts["regression"] == 1
    # worst first: the regression heads the table
    assert comparison.cases.iloc[0]["key"] == row["key"]
    assert comparison.exit_status("regression") == 1
    assert comparison.exit_status("failure") == 0


def test_speedup_is_an_improvement_not_a_failure(tmp_path):
    base = write(tmp_path, "a", suite_rows(1))
    new = write(tmp_path, "b", suite_rows(2, slow={("fa2", 4096): 0.8}))
    comparison = cmp.compare_results(base, new)
    assert outcome_of(comparison, "fa2", 4096)["outcome"] == "improvement"
    assert comparison.exit_status("any") == 0
    fa2 = comparison.backends.set_index("backend").loc["fa2"]
    # geometric mean over 5 cases, one of them 1/0.8 = 1.25x faster: about 1.25 ** (1/5) = 1.046
    assert 1.03 < fa2["geomean_speedup"] < 1.07


def test_median_shift_inside_a_wide_spread_is_undecided_not_same():
    # medians differ by 5 % (past the 3 % threshold) but 8 samples spread over +-50 %:
    # the rank test cannot tell them apart, and the samples cannot show the change is
    # inside the threshold either: undecided, with a resolution far above 3 %.
    base = np.linspace(0.5, 1.5, 8)
    new = base * 1.05
    decision = statistics.decide_time(float(np.median(base)), float(np.median(new)), base, new, Thresholds())
    assert decision.ratio == pytest.approx(1.05)
    assert decision.p_value > 0.01
    assert decision.verdict == "undecided"
    assert decision.low < 1.05 < decision.high
    assert decision.resolution > 0.2


def test_fifty_fold_slowdown_with_overlapping_samples_is_undecided():
    # a newcomer's noisy CPU run: 5 samples a side, the new median 49.5x the base's,
    # but the samples overlap (p about 0.15): the test cannot decide, so neither may we.
    base = np.array([1.0, 1.2, 2.0, 60.0, 80.0])
    new = np.array([1.1, 150.0, 99.0, 120.0, 1.3])
    decision = statistics.decide_time(float(np.median(base)), float(np.median(new)), base, new, Thresholds())
    assert decision.ratio == pytest.approx(49.5)
    assert decision.p_value > 0.01
    assert decision.verdict == "undecided"


def test_ratio_interval_covers_a_pure_shift_and_narrows_with_samples():
    rng = np.random.default_rng(0)
    few, many = 1.0 + 0.02 * rng.standard_normal(8), 1.0 + 0.02 * rng.standard_normal(200)
    for base in (few, many):
        low, estimate, high = statistics.ratio_interval(base, base * 1.2, 0.01)
        assert estimate == pytest.approx(1.2)
        assert low < 1.2 < high
    width_few = statistics.ratio_interval(few, few * 1.2, 0.01)
    width_many = statistics.ratio_interval(many, many * 1.2, 0.01)
    assert (width_many[2] - width_many[0]) < (width_few[2] - width_few[0]) / 2
    # 4 against 4 samples cannot reach one-sided 0.01 (1/70 = 0.014): no bound at all
    low, _, high = statistics.ratio_interval(few[:4], few[:4], 0.01)
    assert low == 0.0 and high == float("inf")


def test_tight_samples_of_the_same_speed_are_unchanged_with_a_small_resolution():
    rng = np.random.default_rng(1)
    base, new = 1.0 + 0.005 * rng.standard_normal(30), 1.0 + 0.005 * rng.standard_normal(30)
    decision = statistics.decide_time(float(np.median(base)), float(np.median(new)), base, new, Thresholds())
    assert decision.verdict == "same"
    assert 0 < decision.resolution < 0.01


def test_too_few_samples_for_the_level_are_undecided():
    base, new = np.array([1.0, 1.01, 0.99, 1.0]), np.array([1.0, 1.02, 0.98, 1.01])
    decision = statistics.decide_time(1.0, 1.005, base, new, Thresholds(min_samples=4))
    assert decision.verdict == "undecided" and decision.resolution == float("inf")


def test_iqr_rule_decides_when_samples_are_missing(tmp_path):
    base = write(tmp_path, "a", [
        make_row("tfla_sig", 512, samples=[1.0] * 3, q=(0.98, 1.02), with_samples=False),
        make_row("tfla_sig", 1024, samples=[2.0] * 3, q=(1.9, 2.1), with_samples=False),
    ])
    new = write(tmp_path, "b", [
        make_row("tfla_sig", 512, samples=[1.10] * 3, q=(1.08, 1.12), with_samples=False),  # IQRs apart
        make_row("tfla_sig", 1024, samples=[2.10] * 3, q=(2.0, 2.2), with_samples=False),  # IQRs overlap
    ])
    comparison = cmp.compare_results(base, new)
    apart, overlap = outcome_of(comparison, "tfla_sig", 512), outcome_of(comparison, "tfla_sig", 1024)
    assert (apart["outcome"], apart["test"]) == ("regression", "iqr")
    # quartile ratios 0.95-1.16 reach past the 3 % band: neither a change nor shown equal
    assert (overlap["outcome"], overlap["test"]) == ("undecided", "iqr")
    assert "could not decide" in overlap["detail"]


def test_memory_is_compared_with_its_own_threshold(tmp_path):
    s = noisy_samples(1.0, 7)
    mib = 2**20
    base = write(tmp_path, "a", [
        make_row("tfla_sig", 512, samples=s, peak_mem_bytes=100 * mib),
        make_row("tfla_sig", 1024, samples=s, peak_mem_bytes=100 * mib),
        make_row("tfla_sig", 2048, samples=s, peak_mem_bytes=4 * 1024),
    ])
    new = write(tmp_path, "b", [
        make_row("tfla_sig", 512, samples=s, peak_mem_bytes=120 * mib),   # +20 %: larger
        make_row("tfla_sig", 1024, samples=s, peak_mem_bytes=103 * mib),  # +3 %: under 5 %
        make_row("tfla_sig", 2048, samples=s, peak_mem_bytes=8 * 1024),   # +100 % but 4 KiB: under the floor
    ])
    comparison = cmp.compare_results(base, new)
    grown = outcome_of(comparison, "tfla_sig", 512)
    assert (grown["outcome"], grown["mem_verdict"], grown["time_verdict"]) == ("regression", "larger", "same")
    assert outcome_of(comparison, "tfla_sig", 1024)["outcome"] == "unchanged"
    assert outcome_of(comparison, "tfla_sig", 2048)["outcome"] == "unchanged"


@pytest.mark.parametrize("status", ["crash", "oom", "wrong", "timeout"])
def test_status_change_from_ok_is_a_new_failure(tmp_path, status):
    rows = suite_rows(1)
    new_rows = suite_rows(1)
    new_rows[3] = make_row(rows[3]["backend"], rows[3]["seq_len"], status=status, reason=f"{status} in worker")
    comparison = cmp.compare_results(write(tmp_path, "a", rows), write(tmp_path, "b", new_rows))
    row = outcome_of(comparison, rows[3]["backend"], rows[3]["seq_len"])
    assert row["outcome"] == "new_failure"
    assert row["detail"] == f"ok -> {status}"
    assert comparison.counts["new_failure"] == 1
    assert comparison.exit_status("failure") == 1
    assert comparison.exit_status("any") == 1
    assert comparison.exit_status("regression") == 0
    assert comparison.exit_status("none") == 0


def test_added_and_removed_cases_are_listed(tmp_path):
    rows = suite_rows(1)
    extra = make_row("tfla_sig", 16384, samples=noisy_samples(2.0, 99))
    base = write(tmp_path, "a", rows)
    new = write(tmp_path, "b", rows[1:] + [extra])
    comparison = cmp.compare_results(base, new)
    assert outcome_of(comparison, "tfla_sig", 16384)["outcome"] == "added"
    removed = outcome_of(comparison, rows[0]["backend"], rows[0]["seq_len"])
    # it ran ok in the base and is gone: the run lost coverage
    assert removed["outcome"] == "lost"
    assert (removed["base_status"], removed["new_status"]) == ("ok", None)
    assert comparison.exit_status("regression") == 0
    assert comparison.exit_status("failure") == 1


def test_added_case_that_fails_is_a_new_failure(tmp_path):
    rows = suite_rows(1)
    base = write(tmp_path, "a", rows)
    new = write(tmp_path, "b", rows + [make_row("tfla_exp", 16384, status="oom", reason="CUDA out of memory")])
    comparison = cmp.compare_results(base, new)
    assert outcome_of(comparison, "tfla_exp", 16384)["outcome"] == "new_failure"


def test_undecided_is_counted_listed_and_fails_only_on_its_own_choice(tmp_path):
    rows = suite_rows(1)
    new_rows = suite_rows(2)
    # one case's new samples spread +-50 %: its median moved 8 %, the test cannot tell
    noisy = noisy_samples(base_median_ms(*BACKENDS[:1], 512), 5) * np.linspace(0.58, 1.58, N_ITER)
    new_rows[0] = make_row(BACKENDS[0], 512, samples=noisy)
    comparison = cmp.compare_results(write(tmp_path, "a", rows), write(tmp_path, "b", new_rows))
    row = outcome_of(comparison, BACKENDS[0], 512)
    assert row["outcome"] == "undecided" and row["resolution"] > 0.03
    assert comparison.counts["undecided"] >= 1
    assert "undecided" in render.verdict_line(comparison, "any")
    assert comparison.exit_status("any") == 0 and comparison.exit_status("regression") == 0
    assert comparison.exit_status("undecided") == 1 and comparison.exit_status("regression,undecided") == 1
    changed = _markdown_tables(render.to_markdown(comparison))[1]
    assert any("undecided" in line and "S512" in line for line in changed)
    assert "resolution" in changed[0]
    report = render.to_json(comparison, "undecided")
    assert report["exit_status"] == 1 and report["resolution"]["cases"] == len(comparison.cases)
    with pytest.raises(UserError, match="'sometimes' is not one of"):
        comparison.exit_status("regression,sometimes")


def test_environment_mismatch_warns_and_still_compares(tmp_path):
    rows = suite_rows(1)
    base = write(tmp_path, "a", rows)
    new = write(tmp_path, "b", rows, gpu_name="NVIDIA H100 80GB HBM3", torch="2.14.0", triton="3.7.0")
    comparison = cmp.compare_results(base, new)
    warned = " ".join(comparison.warnings)
    for key in ("gpu_name", "torch", "triton"):
        assert f"{key} differs" in warned
    assert "driver differs" not in warned and "cuda differs" not in warned
    assert set(comparison.cases["outcome"]) == {"unchanged"}


def test_a_different_timing_method_warns_but_not_a_different_timeout(tmp_path):
    """timing.warmup_s 0 against 5 (count-only against sustained clocks) is a different
    method: warned, as a changed GPU is; timeout_s is a limit and stays silent."""
    rows = suite_rows(1)
    timing = {"warmup": 10, "iterations": 30, "timeout_s": 300.0, "flush_l2": False, "sync_each": False,
              "warmup_s": 0.0}
    base = write(tmp_path, "a", rows, measurement={"timing": timing})
    new = write(tmp_path, "b", rows, measurement={"timing": dict(timing, warmup_s=5.0, timeout_s=600.0)})
    warned = cmp.compare_results(base, new).warnings
    assert [w for w in warned if w.startswith("timing.")] == [
        "timing.warmup_s differs: base 0.0, new 5.0; the cases were timed by different methods, so timings "
        "may move for that reason alone"]
    same = write(tmp_path, "c", rows, measurement={"timing": dict(timing, timeout_s=600.0)})
    assert not [w for w in cmp.compare_results(base, same).warnings if w.startswith("timing.")]


def test_cuda_graph_timing_warns_against_a_set_that_predates_the_field(tmp_path):
    """A set written before timing.cuda_graph existed was timed eagerly: against a set of
    graph replays that is a different method (warned); against an eager set, silent."""
    rows = suite_rows(1)
    old = {"warmup": 10, "iterations": 30, "timeout_s": 300.0, "flush_l2": False, "sync_each": False}
    base = write(tmp_path, "a", rows, measurement={"timing": old})
    graphs = write(tmp_path, "b", rows, measurement={"timing": dict(old, warmup_s=0.0, cuda_graph=True)})
    eager = write(tmp_path, "c", rows, measurement={"timing": dict(old, warmup_s=0.0, cuda_graph=False)})
    assert [w for w in cmp.compare_results(base, graphs).warnings if w.startswith("timing.")] == [
        "timing.cuda_graph differs: base False, new True; the cases were timed by different methods, so "
        "timings may move for that reason alone"]
    assert not [w for w in cmp.compare_results(base, eager).warnings if w.startswith("timing.")]


# ----------------------------------------------------------------------------- thresholds


def test_suite_thresholds_from_base_metadata_then_file_then_option(tmp_path):
    slow = {("tfla_sig", 2048): 1.10}
    base = write(tmp_path, "a", suite_rows(1), compare={"time_threshold": 0.2})
    new = write(tmp_path, "b", suite_rows(2, slow=slow), compare={"time_threshold": 0.05})
    thresholds, source = resolve_thresholds(base.metadata)
    assert (thresholds.time_threshold, source["time_threshold"]) == (0.2, "base suite")
    assert cmp.compare_results(base, new, thresholds).counts["regression"] == 0

    path = tmp_path / "thresholds.yaml"
    path.write_text("compare:\n  time_threshold: 0.05\n  alpha: 0.001\n")
    thresholds, source = resolve_thresholds(base.metadata, load_thresholds_file(path))
    assert (thresholds.time_threshold, thresholds.alpha, source["alpha"]) == (0.05, 0.001, "thresholds file")
    assert cmp.compare_results(base, new, thresholds).counts["regression"] == 1

    thresholds, source = resolve_thresholds(
        base.metadata, load_thresholds_file(path), {"time_threshold": 0.5, "alpha": None})
    assert (thresholds.time_threshold, source["time_threshold"], thresholds.alpha) == (0.5, "option", 0.001)


def test_the_candidate_cannot_loosen_the_gate(tmp_path):
    """A candidate 3x slower whose own metadata asks for time_threshold 9.9 and alpha
    1e-300 still fails the default gate; a warning names what it asked for."""
    slow = {(b, s): 3.0 for b in BACKENDS for s in SEQ_LENS}
    base = write(tmp_path, "a", suite_rows(1))
    new = write(tmp_path, "b", suite_rows(2, slow=slow), compare={"time_threshold": 9.9, "alpha": 1e-300})
    comparison = cmp.compare_results(base, new)
    assert comparison.thresholds == Thresholds()
    assert comparison.counts["regression"] == len(BACKENDS) * len(SEQ_LENS)
    assert comparison.exit_status("any") == 1
    (warning,) = [w for w in comparison.warnings if w.startswith("new asks for")]
    assert "alpha 1e-300" in warning and "time_threshold 9.9" in warning and "ignored" in warning
    result = _run(tmp_path / "a", tmp_path / "b")
    assert result.exit_code == 1 and "FAIL" in result.stdout


def test_a_candidate_without_the_numerics_gate_is_marked_and_never_an_improvement(tmp_path):
    fast = {(b, s): 0.5 for b in BACKENDS for s in SEQ_LENS}
    base = write(tmp_path, "a", suite_rows(1), measurement={"numerics": {"check": True}})
    new = write(tmp_path, "b", suite_rows(2, slow=fast), measurement={"numerics": {"check": False}})
    comparison = cmp.compare_results(base, new)
    assert comparison.counts["improvement"] == 0
    assert set(comparison.cases["undecided_kind"]) == {"unchecked"}
    assert comparison.cases["unchecked"].all()
    assert any("numerics.check off" in w for w in comparison.warnings)
    assert comparison.exit_status("any") == 0  # not counted toward the undecided share
    assert "(unchecked)" in render.to_markdown(comparison)
    checked = write(tmp_path, "c", suite_rows(2, slow=fast), measurement={"numerics": {"check": True}})
    assert cmp.compare_results(base, checked).counts["improvement"] == len(BACKENDS) * len(SEQ_LENS)


def test_undecided_for_want_of_resolution_on_more_than_a_quarter_fails_the_default_gate(tmp_path):
    """Half the cases with samples spread +-50 %: undecided because the samples cannot
    resolve the 3 % threshold; more than UNDECIDED_SHARE of the cases, so `any` fails and
    says why."""
    rows, new_rows = suite_rows(1), suite_rows(2)
    for index in range(0, len(new_rows), 2):
        r = new_rows[index]
        new_rows[index] = make_row(r["backend"], r["seq_len"],
                                   samples=base_median_ms(r["backend"], r["seq_len"]) * np.linspace(0.5, 1.5, 8))
    comparison = cmp.compare_results(write(tmp_path, "a", rows), write(tmp_path, "b", new_rows))
    counted, compared = comparison.undecided_share()
    assert compared == len(rows) and counted / compared > UNDECIDED_SHARE
    assert comparison.counts["regression"] == 0 and comparison.exit_status("any") == 1
    assert "undecided for want of resolution" in render.verdict_line(comparison, "any")
    assert comparison.exit_status("regression,failure") == 0


def test_bad_threshold_file_is_a_user_error(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("time_treshold: 0.05\n")
    with pytest.raises(UserError, match="unknown threshold 'time_treshold'"):
        load_thresholds_file(path)
    path.write_text("alpha: 2\n")
    with pytest.raises(UserError, match="alpha"):
        load_thresholds_file(path)


# ----------------------------------------------------------------------------- rendering


def _markdown_tables(text: str) -> list[list[str]]:
    tables, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    if current:
        tables.append(current)
    return tables


def test_markdown_has_a_header_and_one_row_per_reported_case(tmp_path):
    rows = suite_rows(1)
    new_rows = suite_rows(2, slow={("tfla_sig", 2048): 1.10})
    new_rows[5] = make_row(rows[5]["backend"], rows[5]["seq_len"], status="crash", reason="segfault | core dumped")
    comparison = cmp.compare_results(write(tmp_path, "a", rows), write(tmp_path, "b", new_rows[1:]))
    text = render.to_markdown(comparison)
    tables = _markdown_tables(text)
    # per-backend table, changed cases, unchanged cases (in <details>)
    assert len(tables) == 3
    per_backend, changed, unchanged = tables
    assert re.match(r"^\|\s*backend\s*\|", per_backend[0]) and len(per_backend) == 2 + len(BACKENDS)
    for table in (changed, unchanged):
        assert "case" in table[0] and re.fullmatch(r"\|[:\-|]+\|", table[1])
        width = table[0].count(" | ")
        assert all(row.replace("\\|", "").count(" | ") == width for row in table[2:])
    n_changed = int((comparison.cases["outcome"] != "unchanged").sum())
    # the regression, the crash, the lost case, and any case the noise left undecided
    assert comparison.counts["regression"] == comparison.counts["new_failure"] == comparison.counts["lost"] == 1
    assert n_changed == 3 + comparison.counts["undecided"]
    assert len(changed) - 2 == n_changed
    assert len(unchanged) - 2 == len(comparison.cases) - n_changed
    assert "new failure" in changed[2] and "regression" in changed[3]  # worst first
    assert "<details>" in text


def test_json_report_lists_every_case(tmp_path):
    base = write(tmp_path, "a", suite_rows(1))
    new = write(tmp_path, "b", suite_rows(2, slow={("fa2", 512): 1.2}))
    report = json.loads(json.dumps(render.to_json(cmp.compare_results(base, new))))
    assert len(report["cases"]) == len(BACKENDS) * len(SEQ_LENS)
    assert report["exit_status"] == 1 and report["counts"]["regression"] == 1
    assert report["cases"][0]["outcome"] == "regression"


# ----------------------------------------------------------------------------- command line


def _run(*args, env=None):
    return CliRunner().invoke(app, ["compare", *map(str, args)], env=env)


def test_cli_exit_status_follows_fail_on(tmp_path):
    write(tmp_path, "a", suite_rows(1))
    write(tmp_path, "b", suite_rows(2, slow={("tfla_exp", 1024): 1.10}))
    assert _run(tmp_path / "a", tmp_path / "a").exit_code == 0
    assert _run(tmp_path / "a", tmp_path / "b").exit_code == 1
    assert _run(tmp_path / "a", tmp_path / "b", "--fail-on", "failure").exit_code == 0
    assert _run(tmp_path / "a", tmp_path / "b", "--fail-on", "none").exit_code == 0
    assert _run(tmp_path / "a", tmp_path / "b", "--time-threshold", "0.2").exit_code == 0
    assert _run(tmp_path / "a", tmp_path / "a", "--fail-on", "failure,undecided").exit_code == 0
    _one_line_error(_run(tmp_path / "a", tmp_path / "b", "--fail-on", "regresion"), "--fail-on")


def test_cli_writes_markdown_json_and_step_summary(tmp_path):
    write(tmp_path, "a", suite_rows(1))
    write(tmp_path, "b", suite_rows(2, slow={("tfla_exp", 1024): 1.10}))
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    result = _run(tmp_path / "a", tmp_path / "b", "--markdown", tmp_path / "r.md", "--json", tmp_path / "r.json",
                  "--step-summary", env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert result.exit_code == 1
    markdown = (tmp_path / "r.md").read_text()
    assert markdown.startswith("## tflabench compare")
    assert summary.read_text().startswith("earlier step\n## tflabench compare")
    assert json.loads((tmp_path / "r.json").read_text())["counts"]["regression"] == 1


def test_cli_warns_about_environment_mismatch(tmp_path):
    write(tmp_path, "a", suite_rows(1))
    write(tmp_path, "b", suite_rows(1), driver="575.00")
    result = _run(tmp_path / "a", tmp_path / "b", "--format", "markdown")
    assert result.exit_code == 0
    assert "driver differs: base '570.86', new '575.00'" in result.output


def _one_line_error(result, fragment):
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0]
    assert "Traceback" not in result.output


def test_missing_file_is_unusable_input(tmp_path):
    write(tmp_path, "a", suite_rows(1))
    _one_line_error(_run(tmp_path / "a", tmp_path / "nope"), "does not exist")


def test_different_suites_are_unusable_input(tmp_path):
    write(tmp_path, "a", suite_rows(1))
    write(tmp_path, "b", [dict(r, suite="other") for r in suite_rows(1)], suite="other")
    _one_line_error(_run(tmp_path / "a", tmp_path / "b"), "different suites")


def test_corrupt_table_is_unusable_input(tmp_path):
    write(tmp_path, "a", suite_rows(1))
    b = write_results(tmp_path / "b", suite_rows(1), METADATA)
    lines = (b / "rows.jsonl").read_text().splitlines()
    lines[2] = lines[2][: len(lines[2]) // 2]  # a torn line in the middle, not the tail
    (b / "rows.jsonl").write_text("\n".join(lines) + "\n")
    _one_line_error(_run(tmp_path / "a", b), "not JSON")


def test_corrupt_samples_are_unusable_input(tmp_path):
    rows = suite_rows(1)
    write(tmp_path, "a", rows)
    bad = [dict(r) for r in rows]
    bad[0]["ms_samples"] = "[1.0, 2.0"
    write(tmp_path, "b", bad)
    _one_line_error(_run(tmp_path / "a", tmp_path / "b"), "ms_samples")


def test_directory_that_is_not_a_result_set_is_unusable_input(tmp_path):
    write(tmp_path, "a", suite_rows(1))
    (tmp_path / "empty").mkdir()
    _one_line_error(_run(tmp_path / "a", tmp_path / "empty"), "not a result set")


def test_empty_new_run_warns_and_loses_every_case(tmp_path):
    base = write(tmp_path, "a", suite_rows(1))
    new = write(tmp_path, "b", [])
    comparison = cmp.compare_results(base, new)
    assert any("new holds no case rows" in w for w in comparison.warnings)
    assert comparison.counts["lost"] == len(BACKENDS) * len(SEQ_LENS)
    assert comparison.exit_status("failure") == 1


def test_noisy_run_is_warned_about(tmp_path):
    rows = suite_rows(1)
    noisy = suite_rows(2)
    # one case's samples spread +-50 % (IQR / median about 0.5, past the 10 % warning level)
    noisy[4] = make_row(noisy[4]["backend"], noisy[4]["seq_len"], samples=np.linspace(0.5, 1.5, N_ITER))
    comparison = cmp.compare_results(write(tmp_path, "a", rows), write(tmp_path, "b", noisy))
    assert [w for w in comparison.warnings if w.startswith("base:")] == []
    (warning,) = [w for w in comparison.warnings if w.startswith("new:")]
    assert "1 case(s) spread more than 10%" in warning and "S8192" in warning


def test_noisy_cases_are_named_widest_first(tmp_path):
    rows = suite_rows(1)
    rows[2] = make_row(rows[2]["backend"], rows[2]["seq_len"], samples=np.linspace(0.5, 1.5, N_ITER))
    rows[7] = make_row(rows[7]["backend"], rows[7]["seq_len"], samples=np.linspace(0.8, 1.2, N_ITER))
    noisy = caveats.noisy_cases(write(tmp_path, "a", rows).rows)
    assert [label for label, _ in noisy] == [case_label(rows[2]), case_label(rows[7])]
    assert noisy[0][1] == pytest.approx(0.5, abs=0.02) and noisy[1][1] == pytest.approx(0.2, abs=0.02)


def test_run_ends_with_a_warning_naming_the_noisy_cases(tmp_path, capsys):
    from tflabench.cli.run_cmds import _warn_noisy

    rows = suite_rows(1)
    rows[2] = make_row(rows[2]["backend"], rows[2]["seq_len"], samples=np.linspace(0.5, 1.5, N_ITER))
    _warn_noisy(write(tmp_path, "a", rows).rows)
    err = capsys.readouterr().err
    assert err.startswith("warning: 1 case(s) spread more than 10%") and case_label(rows[2]) in err
    assert "timing.iterations" in err
    _warn_noisy(write(tmp_path, "b", suite_rows(2)).rows)
    assert capsys.readouterr().err == ""


def test_noise_warnings_say_whether_the_traced_gpu_slowed_down(tmp_path, capsys):
    """With `run --gpu-trace` columns the warnings say during how many spread cases the
    driver reported a slowdown; without them they point at the option."""
    from tflabench.cli.run_cmds import _warn_noisy

    rows = suite_rows(1)
    for i in (2, 7):
        rows[i] = make_row(rows[i]["backend"], rows[i]["seq_len"], samples=np.linspace(0.5, 1.5, N_ITER))
    rows[2]["gpu_slowdowns"], rows[7]["gpu_slowdowns"] = "sw_power_cap,sw_thermal_slowdown", ""
    rows[3]["gpu_slowdowns"] = "hw_slowdown"  # a steady case: not counted
    traced = write(tmp_path, "a", rows).rows
    (warning,) = caveats.noise_warnings(traced, "new")
    assert "the GPU reported sw_power_cap, sw_thermal_slowdown during 1 of the 2 traced one(s)" in warning
    assert "hw_slowdown" not in warning
    _warn_noisy(traced)
    assert "The GPU reported sw_power_cap, sw_thermal_slowdown during 1 of the 2 traced one(s)." in capsys.readouterr().err
    rows[2]["gpu_slowdowns"] = ""
    (warning,) = caveats.noise_warnings(write(tmp_path, "b", rows).rows, "new")
    assert "the GPU reported no slowdown reason during the 2 traced one(s)" in warning
    untraced = suite_rows(1)
    untraced[2] = rows[2] | {"gpu_slowdowns": None}
    (warning,) = caveats.noise_warnings(write(tmp_path, "c", untraced).rows, "new")
    assert "GPU reported" not in warning
    _warn_noisy(write(tmp_path, "d", untraced).rows)
    assert "`run --gpu-trace` records whether the GPU slowed down" in capsys.readouterr().err
    on_cpu = [dict(r, device="cpu") for r in untraced]
    _warn_noisy(write(tmp_path, "e", on_cpu).rows)
    err = capsys.readouterr().err
    assert err.startswith("warning: 1 case(s) spread") and "gpu-trace" not in err
