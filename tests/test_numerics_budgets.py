"""Per-tensor numerics budgets: the gate of `run` catches a kernel that is 1 %
wrong in float32, 5 % wrong in bfloat16, or 5 % wrong in dk only; correct kernels pass.

Flawed kernels: tests/numerics_kernels.py (the float64 reference computed in float32, with
one flaw), measured through the `custom` backend. Expected errors come from the flaw
itself: output x 1.01 has max-normalised error 1e-2 (against a budget of 1e-3 in float32),
x 1.05 has 5e-2 (bf16 budget 2.5e-2), dk x 1.05 has 5e-2 on dk.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tflabench import numerics as N
from tflabench.store import results as R
from tflabench.store.schema import case_id, new_row
from tflabench.backends import get_backend
from tflabench.backends.base import Shape
from tflabench.run.measure import numerics_gate

ROOT = Path(__file__).resolve().parent.parent
KERNELS = "tests/numerics_kernels.py"
SHAPE = Shape(batch=1, seq_len=40, heads=2, d_qk=16, d_hv=16, dtype="float32")


@pytest.fixture(autouse=True)
def _in_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the custom backend loads tests/numerics_kernels.py relative to it


def _gate(function, dtype=torch.float32, mode="fwdbw", kwargs=None, backend="custom", params=None):
    b = get_backend(backend)
    p = params if params is not None else {"function": f"{KERNELS}:{function}", "heads": 2, "d_qk": 16,
                                           "d_hv": 16, "kwargs": kwargs or {}}
    shape = Shape(SHAPE.batch, SHAPE.seq_len, SHAPE.heads, SHAPE.d_qk, SHAPE.d_hv, str(dtype).split(".")[1])
    return numerics_gate(b, b.parse_params(p), shape, mode=mode, dtype=dtype, device="cpu", seed=0,
                         max_seq_len=40)


def test_one_percent_wrong_output_is_wrong_in_float32():
    result = _gate("scaled", mode="fwd", kwargs={"factor": 1.01})
    assert not result.passed
    assert result.worst == "out" and result.err == pytest.approx(1e-2, rel=1e-3)
    assert result.tolerance == N.DEFAULT_BUDGETS["float32"].out
    assert "on out exceeds its budget" in result.reason()
    both = _gate("scaled", kwargs={"factor": 1.01})   # fwdbw: the gradients are 1 % off as well
    assert not both.passed and all(e == pytest.approx(1e-2, rel=1e-2) for n, e in both.errors.items() if n != "df")
    # df is judged against its summand scale (docs/numerics.md): 1 % of max|df| is less there
    df = next(e for e in both.verdict.errors if e.name == "df")
    assert df.scale is not None and df.scale.value > df.ref_max
    assert df.max_norm == pytest.approx(1e-2 * df.ref_max / df.scale.value, rel=1e-2)


def test_exact_kernel_passes_in_float32_with_every_tensor_checked():
    result = _gate("scaled", kwargs={"factor": 1.0})
    assert result.passed, result.reason()
    assert set(result.errors) == {"out", "dq", "dk", "dv", "di", "df"}
    assert max(result.errors.values()) < 1e-5   # float32 arithmetic of the same formula


def test_five_percent_wrong_output_is_wrong_in_bfloat16_while_the_exact_one_passes():
    wrong = _gate("scaled", dtype=torch.bfloat16, mode="fwd", kwargs={"factor": 1.05})
    assert not wrong.passed and wrong.worst == "out"
    assert wrong.err == pytest.approx(5e-2, abs=5e-3)   # 5 % plus bf16 rounding (2^-8)
    exact = _gate("scaled", dtype=torch.bfloat16, mode="fwd", kwargs={"factor": 1.0})
    assert exact.passed and exact.err < N.DEFAULT_BUDGETS["bfloat16"].out / 4


def test_five_percent_error_in_dk_only_is_wrong_and_named():
    result = _gate("dk_off", kwargs={"factor": 1.05})
    assert not result.passed
    assert result.worst == "dk" and result.err == pytest.approx(5e-2, rel=1e-3)
    assert result.errors["out"] < 1e-6 and result.errors["dq"] < 1e-5   # only dk is off
    columns = result.columns("float32")
    assert columns["numerics_worst"] == "dk" and columns["tf32"] == "no"
    detail = json.loads(columns["numerics_detail"])
    assert detail["dk"][0] == pytest.approx(5e-2, rel=1e-3) and detail["dk"][2] == N.DEFAULT_BUDGETS["float32"].grad
    assert detail["dk"][1] == pytest.approx(5e-2, rel=1e-3)   # relF of a uniform 5 % error is 5 %


@pytest.mark.parametrize("params", [
    {"variant": "sig", "chunk_size": 16, "heads": 2, "d_qk": 16, "d_hv": 16, "impl": "triton"},
    {"variant": "exp", "chunk_size": 16, "heads": 2, "d_qk": 16, "d_hv": 16, "impl": "triton"},
    {"variant": "exp", "algorithm": "limit_chunk", "chunk_size": 16, "heads": 2, "d_qk": 16, "d_hv": 16,
     "impl": "triton"},
    {"variant": "sig", "chunk_size": 16, "heads": 2, "d_qk": 16, "d_hv": 16, "impl": "reference"},
], ids=["sig_xl", "exp_xl", "exp_limit", "sig_reference"])
def test_our_kernels_and_the_reference_pass_the_gate_in_float32(monkeypatch, params):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    result = _gate(None, backend="tfla", params=params)
    assert result.passed, result.reason()
    assert set(result.errors) == {"out", "dq", "dk", "dv", "di", "df"}


def test_sdpa_math_passes_the_gate():
    result = _gate(None, backend="sdpa", params={"impl": "math", "heads": 2, "d_hv": 16})
    assert result.passed and set(result.errors) == {"out", "dq", "dk", "dv"}


def test_budget_rows_by_tensor_class_and_tf32():
    assert N.tensor_class("out") == "out" and N.tensor_class("last_C") == "state"
    assert N.tensor_class("dk") == "grad" and N.tensor_class("dC0") == "grad"
    assert {N.tensor_class(n) for n in ("di", "df", "dg", "ddt", "dA")} == {"gate_grad"}
    # float32 with TF32 dots, or unknown dots, uses the looser tf32 row
    assert N.budget("dq", "float32", tf32=False) == N.DEFAULT_BUDGETS["float32"].grad
    assert N.budget("dq", "float32", tf32=True) == N.DEFAULT_BUDGETS["tf32"].grad
    assert N.budget("dq", "float32", tf32=None) == N.DEFAULT_BUDGETS["tf32"].grad
    assert N.budget("df", "bfloat16") > N.budget("dk", "bfloat16")   # gate gradients looser
    # a 1 % float32 error and a 5 % bfloat16 error exceed these budgets
    assert N.budget("out", "float32", False) < 1e-2 and N.budget("out", "bfloat16") < 5e-2
    assert N.budget("dk", "bfloat16") < 5e-2 and N.budget("dk", "float32", False) < 5e-2
    # overrides: a suite's partial row, and the single tolerance that wins over all
    assert N.budget("out", "bfloat16", overrides={"bfloat16": {"out": 0.2}}) == 0.2
    assert N.budget("df", "bfloat16", overrides={"bfloat16": {"out": 0.2}}) == N.DEFAULT_BUDGETS["bfloat16"].gate_grad
    assert N.budget("df", "bfloat16", tolerance=0.3) == 0.3
    assert N.tf32_text("float32", None) == "unknown" and N.tf32_text("bfloat16", True) is None


def test_non_finite_where_the_reference_is_finite_always_fails():
    ref = torch.tensor([1.0, 2.0, float("nan")])
    e = N.tensor_error("dk", torch.tensor([1.0, float("inf"), 0.0]), ref, 1e9)
    assert e.nonfinite == 1 and e.ref_nonfinite == 1 and not e.passed
    ok = N.tensor_error("dk", torch.tensor([1.0, 2.0, float("nan")]), ref, 1e-9)   # NaN where ref is NaN
    assert ok.passed and ok.max_norm == 0.0


def test_backends_report_tf32_dots():
    for name, params in (("tfla", {}), ("sdpa", {"impl": "math"}), ("custom", {"function": "a.b:c"})):
        b = get_backend(name)
        assert b.uses_tf32(b.parse_params(params), torch.float32, "cpu") is False
    custom = get_backend("custom")
    assert custom.uses_tf32(custom.parse_params({"function": "a.b:c"}), torch.float32, "cuda") is None
    for name in ("mlstm_kernels", "fla", "mamba2"):
        b = get_backend(name)
        assert b.uses_tf32(b.parse_params({}), torch.float32, "cuda") is True
        assert b.uses_tf32(b.parse_params({}), torch.bfloat16, "cuda") is False


def test_run_rows_keep_their_case_ids():
    # numerics_case (a verify column) is left out of the hash when None: stored reference
    # rows of a run (numerics_case None) match their ids, as do rows written before it existed.
    rows = [json.loads(line) for line in
            (ROOT / "results/reference/h200/chunk_tradeoff/rows.jsonl").read_text().splitlines()[:5]]
    for row in rows:
        assert case_id(row) == row["case_id"]
        assert case_id({k: v for k, v in row.items() if k != "numerics_case"}) == row["case_id"]
    assert case_id({**rows[0], "numerics_case": "f_closed"}) != rows[0]["case_id"]


def test_compare_reports_ok_to_wrong_as_a_new_failure(tmp_path):
    from tflabench.compare.gate import compare_results

    ident = dict(suite="s", kernel="k", backend="custom", family="custom", params={}, mode="fwd",
                 dtype="float32", device="cpu", batch=1, seq_len=40, heads=2, d_qk=16, d_hv=16,
                 chunk_size=None, embedding_dim=32)
    ok = {**new_row(**ident), "status": "ok", "ms_median": 1.0, "numerics_err": 1e-6}
    wrong = {**new_row(**ident), "status": "wrong", "numerics_err": 1e-2, "numerics_worst": "out",
             "reason": "numerics: max-normalised error 0.01 on out exceeds its budget 0.001"}
    base = R.load_results(R.write_results(tmp_path / "base", [ok], {"suite": "s"}))
    new = R.load_results(R.write_results(tmp_path / "new", [wrong], {"suite": "s"}))
    comparison = compare_results(base, new)
    record = comparison.cases.iloc[0]
    assert record["outcome"] == "new_failure" and record["detail"] == "ok -> wrong"
    assert comparison.exit_status("failure") == 1
    assert new.rows.iloc[0]["numerics_worst"] == "out"   # the new column survives the round trip


def test_suite_budgets_reach_the_case_and_bad_values_are_refused(tmp_path):
    from tflabench.errors import UserError
    from tflabench.store.suite import expand_cases, load_suite

    text = (ROOT / "suites/cpu_demo.yaml").read_text()
    good = tmp_path / "good.yaml"
    good.write_text(text.replace("numerics: {check: true, max_seq_len: 256}",
                                 "numerics: {check: true, max_seq_len: 256, budgets: {float32: {out: 1e-4}}}"))
    case = expand_cases(load_suite(good), device="cpu")[0]
    assert json.loads(case.numerics_budgets) == {"float32": {"out": 1e-4}}
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("numerics: {check: true, max_seq_len: 256}",
                                "numerics: {check: true, budgets: {float32: {dk: 1e-4}}}"))
    with pytest.raises(UserError, match=r"numerics\.budgets\.float32\.dk: unknown field"):
        load_suite(bad)
