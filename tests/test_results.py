"""Result sets: schema, round trip through every file format, appending writer, errors."""

from __future__ import annotations

import json
import math

import pytest

from tflabench.store import results as R
from tflabench.report.tables import timing_text
from tflabench.store import schema
from tflabench.text_safety import case_label
from tflabench.errors import UserError


def _row(**over):
    identity = dict(suite="s", kernel="k", backend="tfla", family="mlstm",
                    params={"variant": "sig", "chunk_size": 64}, mode="fwd", dtype="float32",
                    device="cpu", batch=2, seq_len=256, heads=4, d_qk=32, d_hv=64,
                    chunk_size=64, embedding_dim=256)
    identity.update({k: over.pop(k) for k in list(over) if k in schema.IDENTITY_COLUMNS})
    row = schema.new_row(**identity)
    row.update(status="ok", reason=None, ms_median=1.5, ms_mean=1.6, ms_min=1.0, ms_max=2.5,
               ms_q25=1.2, ms_q75=1.9, ms_samples=[1.0, 1.5, 2.5], n_iter=3, first_call_s=0.25,
               peak_mem_bytes=None, numerics_err=1e-7, numerics_ref="mlstm float64 reference",
               flops=2e9, bytes=1e8)
    row.update(over)
    return row


def _meta():
    return {"suite": "s", "suite_path": "suites/s.yaml", "suite_sha256": "ab" * 32,
            "date": "2026-11-22T00:00:00+00:00", "git_revision": "abc", "hostname": "h",
            "gpu_name": None, "gpu_count": 0, "driver": None, "cuda": None, "torch": "2.x",
            "triton": "3.6.0", "python": "3.11", "peers": {}, "tflabench": "0.1.0",
            "shard": None, "ceilings": None}


def _assert_same_rows(frame, rows):
    assert list(frame.columns) == list(schema.COLUMNS)
    assert len(frame) == len(rows)
    for got, want in zip(frame.to_dict("records"), rows):
        full = schema.complete_row(want)
        for col in schema.COLUMNS:
            g, w = got[col], full[col]
            if col in schema.NUMERIC_COLUMNS:
                if w is None:
                    assert math.isnan(g), col
                else:
                    assert g == pytest.approx(float(w)), col
            else:
                assert g == w, col


@pytest.mark.parametrize("keep", ["rows.jsonl", "results.parquet", "results.csv"])
def test_results_round_trip_through_each_file(tmp_path, keep):
    rows = [_row(), _row(mode="fwdbw", status="crash", reason="worker died (killed by SIGABRT)",
                         ms_median=None, ms_mean=None, ms_min=None, ms_max=None, ms_q25=None,
                         ms_q75=None, ms_samples=None, n_iter=None, first_call_s=None)]
    R.write_results(tmp_path, rows, _meta())
    if keep == "results.csv":
        schema.rows_frame(rows).to_csv(tmp_path / "results.csv", index=False)
    for name in ("rows.jsonl", "results.parquet", "results.csv"):
        if name != keep and (tmp_path / name).exists():
            (tmp_path / name).unlink()
    rs = R.load_results(tmp_path / keep)  # any file of the set names the set
    assert rs.path == tmp_path
    assert rs.metadata["suite"] == "s" and rs.metadata["triton"] == "3.6.0"
    _assert_same_rows(rs.rows, rows)
    assert json.loads(rs.rows.loc[0, "ms_samples"]) == [1.0, 1.5, 2.5]
    assert json.loads(rs.rows.loc[0, "params"]) == {"chunk_size": 64, "variant": "sig"}


def test_timing_text_says_how_a_set_was_timed():
    """report's "timed:" line: the method in words; a field the set predates counts with the
    value it was timed with; a set without a timing record says so."""
    timing = {"warmup": 10, "iterations": 30, "timeout_s": 300.0, "flush_l2": False, "sync_each": False}
    meta = lambda **t: {"measurement": {"timing": dict(timing, **t)}}  # noqa: E731
    assert timing_text(meta()) == "median of 30 calls queued back to back, after 10 warm-up calls"
    assert timing_text(meta(cuda_graph=True, warmup_s=5.0)) == (
        "median of 30 replays of one captured CUDA graph, after 10 warm-up calls and 5 s of them")
    assert timing_text(meta(sync_each=True, flush_l2=True)) == (
        "median of 30 calls, each after a synchronise, after 10 warm-up calls, L2 flushed before each")
    assert timing_text({}) == "not recorded" and timing_text({"measurement": {"timing": None}}) == "not recorded"


def test_metadata_has_every_contract_key(tmp_path):
    R.write_results(tmp_path, [_row()], {"suite": "s"})
    meta = json.loads((tmp_path / "metadata.json").read_text())
    assert set(schema.METADATA_KEYS) <= set(meta)
    assert meta["suite"] == "s" and meta["gpu_name"] is None


def test_row_writer_flushes_each_row_before_close(tmp_path):
    writer = R.RowWriter(tmp_path)
    writer.append(_row(seq_len=128))
    lines = (tmp_path / "rows.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["seq_len"] == 128
    writer.append(_row(seq_len=256))
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == 2
    writer.close()
    assert R.measured_case_ids(tmp_path) == {_row(seq_len=128)["case_id"], _row(seq_len=256)["case_id"]}


def test_partial_last_line_of_killed_run_is_ignored(tmp_path):
    with R.RowWriter(tmp_path) as w:
        w.append(_row())
    with open(tmp_path / "rows.jsonl", "a") as fh:
        fh.write('{"case_id": "abc", "sta')  # the run died mid-write
    rs = R.load_results(tmp_path)
    assert len(rs.rows) == 1


def test_finalize_writes_table_with_last_row_per_case(tmp_path):
    with R.RowWriter(tmp_path) as w:
        w.append(_row(status="timeout", ms_median=None))
        w.append(_row(status="ok", ms_median=3.0))  # same case re-measured by a resume
    path = R.finalize(tmp_path)
    import pandas as pd

    table = pd.read_parquet(path)
    assert len(table) == 1 and table.loc[0, "status"] == "ok" and table.loc[0, "ms_median"] == 3.0


def test_missing_or_corrupt_result_set_raises_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        R.load_results(tmp_path / "nope")
    with pytest.raises(UserError, match="not a result set"):
        R.load_results(tmp_path)
    whole = json.dumps(_row())
    (tmp_path / "rows.jsonl").write_text(f"{whole}\nnot json\n{whole}\n")
    with pytest.raises(UserError, match="line 2 is not JSON"):
        R.load_results(tmp_path)
    (tmp_path / "rows.jsonl").write_text(whole + "\n" + json.dumps(dict(_row(), a=1)) + "\n")
    with pytest.raises(UserError, match="line 2 has the field 'a', which is not a result column"):
        R.load_results(tmp_path)
    (tmp_path / "rows.jsonl").write_text(whole + "\n" + json.dumps({"suite": "s"}) + "\n")
    with pytest.raises(UserError, match="line 2 lacks the field 'case_id', which every result row has"):
        R.load_results(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "results.parquet").write_bytes(b"not parquet")
    with pytest.raises(UserError, match="cannot read"):
        R.load_results(bad)


def test_case_id_depends_on_identity_only():
    a = _row()
    same_params_as_text = schema.case_id(dict(a, params=json.dumps({"variant": "sig", "chunk_size": 64}, indent=1)))
    assert same_params_as_text == a["case_id"]
    assert schema.case_id(dict(a, batch=2.0, ms_median=99.0, status="crash")) == a["case_id"]
    assert schema.case_id(dict(a, mode="fwdbw")) != a["case_id"]
    assert schema.case_id(dict(a, params={"variant": "exp", "chunk_size": 64})) != a["case_id"]


def test_unknown_column_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown result columns"):
        R.write_results(tmp_path, [dict(_row(), runtime=1.0)], {})


def test_model_columns_follow_their_definitions():
    # flops 2e12 and bytes 1e9 at 10 ms against ceilings 1e15 FLOP/s and 2e12 byte/s:
    # intensity 2e12/1e9 = 2000 FLOP/byte; achieved 2e12 / 10e-3 s = 200 TFLOP/s;
    # roofline bound max(2e12/1e15, 1e9/2e12) s = 2 ms (compute bound); fraction 2/10.
    row = schema.fill_model_columns({"flops": 2e12, "bytes": 1e9, "ms_median": 10.0}, 1e15, 2e12)
    assert row["intensity_flop_per_byte"] == pytest.approx(2000.0)
    assert row["tflops_per_s"] == pytest.approx(200.0)
    assert row["roofline_ms"] == pytest.approx(2.0)
    assert row["roofline_fraction"] == pytest.approx(0.2)
    no_ceilings = schema.fill_model_columns({"flops": 2e12, "bytes": 1e9, "ms_median": None})
    assert "roofline_ms" not in no_ceilings and "tflops_per_s" not in no_ceilings


def test_new_result_directory_is_unique(tmp_path):
    import datetime as dt

    now = dt.datetime(2026, 11, 22, 1, 2, 3)
    a = R.new_result_directory(tmp_path, "suite", now)
    b = R.new_result_directory(tmp_path, "suite", now)
    assert a.name == "20261122-010203" and b.name == "20261122-010203-2"
    assert a.parent == tmp_path / "suite"


def test_number_keeps_finite_values_only():
    """One parser for numeric cells: a missing, non-numeric, NaN or infinite value is no
    measurement (rows store NaN and inf as null), a numeric string or numpy scalar is."""
    import numpy as np

    assert schema.number("2.5") == 2.5 and schema.number(np.float32(0.5)) == 0.5 and schema.number(3) == 3.0
    for bad in (None, "", "n/a", float("nan"), float("inf"), -float("inf"), np.nan, True, [1]):
        assert schema.number(bad) is None, bad


def test_case_label_is_one_format_for_cases_and_rows():
    row = {"kernel": "mLSTMsig", "backend": "tfla", "mode": "fwdbw", "dtype": "bfloat16", "batch": 8.0,
           "seq_len": 8192, "heads": 8, "d_qk": 256, "d_hv": 512, "chunk_size": float("nan"),
           "numerics_case": None}
    assert case_label(row) == "mLSTMsig fwdbw bfloat16 B8 S8192 NH8 d256/512"
    assert case_label({**row, "chunk_size": 128, "numerics_case": "f_closed+init"}) == \
        "mLSTMsig fwdbw bfloat16 B8 S8192 NH8 d256/512 L128 f_closed+init"
    assert case_label({**row, "kernel": None, "d_qk": None}, shape_only=True) == "B8 S8192 NH8 d?/512"
    assert case_label({"backend": "sdpa"}) == "sdpa"


def test_model_columns_are_the_roofline_placement_of_the_row():
    """fill_model_columns and the report's placement give the same numbers for one row
    (one definition: tflabench.model.place_on_roofline)."""
    from tflabench.model import place_on_roofline

    row = schema.fill_model_columns({"flops": 3e12, "bytes": 2e9, "ms_median": 4.0}, 1e15, 3e12)
    placed = place_on_roofline(3e12, 2e9, 4.0, peak_flops_per_s=1e15, beta=3e12)
    assert row["roofline_ms"] == placed["roofline_ms"] == pytest.approx(3.0)          # compute: 3e12 / 1e15
    assert row["roofline_fraction"] == placed["fraction"] == pytest.approx(0.75)
    assert row["tflops_per_s"] == pytest.approx(placed["achieved_flops_per_s"] / 1e12) == pytest.approx(750)
    assert placed["bound"] == "compute" and placed["bound_flops_per_s"] == pytest.approx(1e15)
    inf = schema.fill_model_columns({"flops": float("inf"), "bytes": 2e9, "ms_median": 4.0}, 1e15, 3e12)
    assert inf.get("roofline_ms") is None and inf.get("intensity_flop_per_byte") is None
