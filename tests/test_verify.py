"""`tflabench verify`: the grid, the per-case verdict, the CLI and its exit status.

The deliberately unstable kernel (tests/numerics_kernels.py:unstable) is exact except that
its backward rescales the forget-gate gradient through exp(-4.5 f), which overflows in
float32 for f < -19.7: it must fail (NaN in df) in the f_closed regime (f ~ N(-20, 2)) and
pass in the others. Expected errors of the passing cases: float32 arithmetic of the float64
formula, far below the float32 budgets.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tflabench.run import verify_run as V
from tflabench.run.verify_case import regimes_for, verify_case
from tflabench.analysis.verify_summary import cell_summary
from tflabench.cli import app
from tflabench.errors import UserError
from tflabench.numerics import VerifySettings
from tflabench.store.results import load_results
from tflabench.store.suite import load_suite

ROOT = Path(__file__).resolve().parent.parent

SUITE = """
name: unstable_check
device: cpu
dtype: float32
modes: [fwdbw]
numerics:
  verify:
    regimes: [standard, f_open, f_closed, i_closed]
    seq_lens: [24]
    initial_state: [false]
    modes: [fwdbw]
    heads: 1
model: {embedding_dim: 16}
sweep: {batch: 1, seq_len: 24}
kernels:
  - backend: custom
    label: unstable
    params: {function: tests/numerics_kernels.py:unstable, heads: 2, d_qk: 8, d_hv: 8}
  - backend: custom
    label: aborting
    params: {function: tests/numerics_kernels.py:aborting, heads: 2, d_qk: 8, d_hv: 8}
  - backend: tfla
    label: mLSTMsig reference
    params: {variant: sig, chunk_size: 16, heads: 2, d_qk: 8, d_hv: 8, impl: reference}
"""


@pytest.fixture
def suite_file(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the custom kernel's path is relative to the checkout
    path = tmp_path / "unstable_check.yaml"
    path.write_text(SUITE)
    return path


def test_grid_per_family_lengths_and_states():
    loaded = load_suite(ROOT / "suites/verify_cpu.yaml")
    cases = V.verify_cases(loaded, device="cpu")
    by_kernel: dict[str, list] = {}
    for c in cases:
        by_kernel.setdefault(c.kernel, []).append(c)
    sig = by_kernel["mLSTMsig TFLA xl_chunk (ours)"]
    regimes = {json.loads(c.verify)["regime"] for c in sig}
    assert regimes == {"standard", "f_open", "f_closed", "i_open", "i_closed", "wide", "qk_large", "qk_small"}
    assert {c.seq_len for c in sig} == {9, 32, 41} and {c.batch for c in sig} == {1}
    assert {c.numerics_case for c in sig if json.loads(c.verify)["initial_state"]} >= {"f_closed+init"}
    assert len(sig) == 8 * 3 * 2   # regimes x lengths x (with, without initial state), fwdbw only
    sdpa = by_kernel["torch SDPA math"]   # attention: no gates, no state
    assert {json.loads(c.verify)["regime"] for c in sdpa} == {"standard", "qk_large", "qk_small"}
    assert not any(json.loads(c.verify)["initial_state"] for c in sdpa)
    assert all(c.suite == "verify_cpu-verify" for c in cases)
    assert len({c.case_id for c in cases}) == len(cases)   # every case its own row


def test_default_lengths_straddle_the_chunk():
    assert V.default_seq_lens(16) == [9, 32, 41]
    assert V.default_seq_lens(128) == [65, 256, 321]
    assert V.default_seq_lens(None) == [33, 128, 161]
    assert regimes_for("mamba2", VerifySettings()) == ["standard", "f_open", "f_closed"]


def test_bad_verify_settings_are_refused_before_anything_runs(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(SUITE.replace("regimes: [standard, f_open, f_closed, i_closed]", "regimes: [f_shut]"))
    with pytest.raises(UserError, match=r"numerics\.verify.*unknown regime 'f_shut'"):
        load_suite(bad)
    result = CliRunner().invoke(app, ["verify", str(bad)])
    assert result.exit_code == 2 and "unknown regime 'f_shut'" in result.output
    assert "Traceback" not in result.output
    result = CliRunner().invoke(app, ["verify", "--kernel", "tfla", "--seq-len", "0"])
    assert result.exit_code == 2 and "seq_lens[0]: must be an integer in [1, 16777216] (got 0)" in result.output


def test_verify_case_in_process_reports_each_tensor(suite_file):
    cases = [c for c in V.verify_cases(load_suite(suite_file), device="cpu") if c.kernel == "mLSTMsig reference"]
    closed = next(c for c in cases if c.numerics_case == "f_closed")
    out = verify_case(closed)
    assert out["status"] == "ok", out["reason"]
    detail = json.loads(out["numerics_detail"])
    assert set(detail) == {"out", "last_C", "dq", "dk", "dv", "di", "df"}   # no n: mLSTMsig without normaliser
    assert out["numerics_nonfinite"] == 0 and out["numerics_err"] < 1e-5
    assert "regime f_closed" in out["numerics_ref"] and out["tf32"] == "no"
    assert out["numerics_ref"].endswith("; df vs summand scale")   # df judged against its summands
    assert detail["df"][4].startswith("vs summand scale") and all(len(v) == 4 for k, v in detail.items() if k != "df")


def test_unstable_kernel_fails_only_where_forget_gates_are_strongly_closed(suite_file, tmp_path):
    result = CliRunner().invoke(app, ["verify", str(suite_file), "--out", str(tmp_path / "out"),
                                      "--no-progress"])
    assert result.exit_code == 1, result.output   # a case failed its budget
    directory = next((tmp_path / "out" / "unstable_check-verify").iterdir())
    rows = load_results(directory).rows
    unstable = rows[rows["kernel"] == "unstable"].set_index("numerics_case")
    assert unstable.loc["f_closed", "status"] == "wrong"
    assert unstable.loc["f_closed", "numerics_worst"] == "df"
    assert unstable.loc["f_closed", "numerics_nonfinite"] > 0
    assert "non-finite values in df" in unstable.loc["f_closed", "reason"]
    for regime in ("standard", "f_open", "i_closed"):
        assert unstable.loc[regime, "status"] == "ok", unstable.loc[regime, "reason"]
        assert unstable.loc[regime, "numerics_err"] < 1e-4
    aborting = rows[rows["kernel"] == "aborting"].set_index("numerics_case")   # a worker that dies is a row
    assert aborting.loc["f_closed", "status"] == "crash" and "SIGABRT" in aborting.loc["f_closed", "reason"]
    assert (aborting.drop(index="f_closed")["status"] == "ok").all()   # a new worker ran the rest
    reference = rows[rows["kernel"] == "mLSTMsig reference"]
    assert set(reference["status"]) == {"ok"}   # the same regimes are fine for a stable kernel
    assert (directory / "plots" / "verify_heatmap.png").stat().st_size > 10_000
    assert load_results(directory).metadata["kind"] == "verify"
    table = cell_summary(rows)
    cell = table[(table["kernel"] == "unstable") & (table["regime"] == "f_closed")].iloc[0]
    assert cell["failed"] == 1 and cell["status"] == "wrong"
    assert "unstable" in result.output and "FAIL" in result.output

    # report reads verify sets: the summary per kernel and regime, the heat map redrawn
    shown = CliRunner().invoke(app, ["report", str(directory), "--out", str(tmp_path / "plots")])
    assert shown.exit_code == 0, shown.output
    assert "worst case per kernel and regime" in shown.output and "1 wrong" in shown.output
    assert "1 crash" in shown.output
    assert (tmp_path / "plots" / "verify_heatmap.png").exists()

    # compare reads verify sets: the same set against itself has no new failure
    same = CliRunner().invoke(app, ["compare", str(directory), str(directory), "--fail-on", "failure"])
    assert same.exit_code == 0, same.output


def test_one_kernel_without_a_suite(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    params = '{"variant": "exp", "chunk_size": 16, "heads": 1, "d_qk": 8, "d_hv": 8, "impl": "reference"}'
    result = CliRunner().invoke(app, ["verify", "--kernel", "tfla", "--params", params, "--device", "cpu",
                                      "--regime", "i_open", "--seq-len", "9", "--initial-state", "yes",
                                      "--out", str(tmp_path), "--no-progress", "--no-plots"])
    assert result.exit_code == 0, result.output
    rows = load_results(next((tmp_path / "verify-tfla-verify").iterdir())).rows
    assert list(rows["numerics_case"]) == ["i_open+init"] and list(rows["status"]) == ["ok"]
    assert "last_C" in json.loads(rows.iloc[0]["numerics_detail"]) and "dC0" in json.loads(rows.iloc[0]["numerics_detail"])
    bad = CliRunner().invoke(app, ["verify", "--kernel", "tfla", "--params", "{not json"])
    assert bad.exit_code == 2 and "--params: not JSON" in bad.output


def test_verify_locks_its_result_set_and_a_second_writer_is_refused(suite_file, tmp_path, monkeypatch):
    from tflabench.store import results as R
    from tflabench.store.lock import LOCK_FILE, ResultSetLock

    loaded = load_suite(suite_file)
    cases = [c for c in V.verify_cases(loaded, device="cpu") if c.kernel == "mLSTMsig reference"][:1]
    directory = tmp_path / "set"
    directory.mkdir()
    monkeypatch.setattr(R, "new_result_directory", lambda root, name: directory)
    with ResultSetLock(directory):   # another writer holds the set
        with pytest.raises(UserError, match="is being written by another run"):
            V.run_verify(loaded, cases, out_root=tmp_path, progress=False)
    assert not (directory / R.METADATA_FILE).exists() and not (directory / R.ROWS_FILE).exists()

    seen = []

    def fake_run_cases(cases, directory, **kw):   # the lock is held while the rows are written
        seen.append(ResultSetLock(directory).held())
        with pytest.raises(UserError, match="is being written by another run"):
            ResultSetLock(directory).acquire()
        return []

    monkeypatch.setattr(V, "run_cases", fake_run_cases)
    V.run_verify(loaded, cases, out_root=tmp_path, progress=False)
    assert seen == [True] and not (directory / LOCK_FILE).exists()   # released afterwards
