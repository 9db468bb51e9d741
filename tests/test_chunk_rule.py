"""chunk_size="auto" against the best fixed chunk size (tflabench.analysis.chunk_rule): the
pairing per shape and mode, the gap, the limit, the sweep analysis leaving auto's row out,
and the table `report` prints for a set of suites/chunk_rule_*.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tflabench.analysis import model_vs_measured as mm
from tflabench.analysis.chunk_rule import GAP_LIMIT, auto_gaps
from tflabench.cli import app
from tflabench.store import results as R, schema
from tflabench.store.suite import load_suite

pytestmark = pytest.mark.usefixtures("isolated_cwd")   # tests/conftest.py

SUITES = Path(__file__).resolve().parents[1] / "suites"
SHAPE = dict(batch=8, seq_len=8192, heads=16, d_qk=128, d_hv=256)


def _row(asked, ms, *, ran=None, mode="fwd", seq_len=8192, status="ok", kernel="sig 128/256"):
    shape = {**SHAPE, "seq_len": seq_len}
    row = schema.new_row(suite="chunk_rule_fit", kernel=kernel, backend="tfla", family="mlstm",
                    params={"chunk_size": asked, "variant": "sig"}, mode=mode, dtype="bfloat16", device="cuda",
                    chunk_size=ran if asked == "auto" else asked, embedding_dim=4096, **shape)
    row.update(status=status, ms_median=ms if status == "ok" else None)
    return row


def test_auto_is_paired_with_the_best_fixed_chunk_size_of_its_own_shape_and_mode():
    rows = [_row(64, 3.0), _row(128, 2.0), _row(256, 2.5), _row("auto", 2.2, ran=256),
            _row(64, 1.0, mode="fwdbw"), _row(128, 1.5, mode="fwdbw"), _row("auto", 1.01, ran=64, mode="fwdbw"),
            _row(128, 9.0, seq_len=512)]                 # no auto row: no pair
    gaps = {g.shape["mode"]: g for g in auto_gaps(rows)}
    assert set(gaps) == {"fwd", "fwdbw"}
    fwd = gaps["fwd"]
    assert (fwd.best_L, fwd.best_ms, fwd.auto_ms, fwd.auto_L) == (128, 2.0, 2.2, 256)
    assert fwd.gap == pytest.approx(0.1) and not fwd.within
    assert fwd.fixed == ((64, 3.0), (128, 2.0), (256, 2.5))
    assert gaps["fwdbw"].gap == pytest.approx(0.01) and gaps["fwdbw"].within


def test_failed_rows_are_left_out_and_a_faster_auto_has_a_negative_gap():
    rows = [_row(64, None, status="crash"), _row(128, 2.0), _row("auto", 1.9, ran=None)]
    (gap,) = auto_gaps(rows)
    assert gap.best_L == 128 and gap.gap == pytest.approx(-0.05) and gap.within and gap.auto_L is None
    assert auto_gaps([_row(64, None, status="crash"), _row("auto", 1.9)]) == []


def test_sizes_read_as_floats_pair_and_print_as_ints():
    """Rows read through pandas hold sizes as floats: they still pair with each other, and the
    shape keeps ints (the table prints B=4, not B=4.0)."""
    rows = [{**_row(64, 2.0), "batch": 4.0, "seq_len": 8192.0}, {**_row("auto", 2.1, ran=64), "batch": 4}]
    (gap,) = auto_gaps(rows)
    assert gap.shape["batch"] == 4 and isinstance(gap.shape["batch"], int)
    assert isinstance(gap.shape["seq_len"], int)


def test_the_limit_is_five_percent():
    assert GAP_LIMIT == 0.05
    (inside,) = auto_gaps([_row(128, 2.0), _row("auto", 2.0 * (1 + GAP_LIMIT), ran=64)])
    (outside,) = auto_gaps([_row(128, 2.0), _row("auto", 2.0 * (1 + GAP_LIMIT) + 1e-9, ran=64)])
    assert inside.within and not outside.within


def test_a_gap_where_auto_ran_the_best_fixed_plan_is_marked_as_measurement_spread():
    """auto that ran the best fixed chunk size with the same algorithm is one configuration
    measured twice: ``same_plan``, and the table's headline says so; another chunk size or
    another algorithm (or none recorded) is the rule's own choice."""
    from tflabench.report.tables import auto_gap_table

    def alg(row, name):
        return {**row, "algorithm": name}

    (same,) = auto_gaps([alg(_row(128, 2.0), "two_level"), alg(_row("auto", 2.2, ran=128), "two_level")])
    (other_L,) = auto_gaps([alg(_row(128, 2.0), "two_level"), alg(_row("auto", 2.2, ran=64), "two_level")])
    (other_alg,) = auto_gaps([alg(_row(128, 2.0), "two_level"), alg(_row("auto", 2.2, ran=128), "walk")])
    (unknown,) = auto_gaps([_row(128, 2.0), _row("auto", 2.2, ran=128)])
    assert same.same_plan and not same.within
    assert not (other_L.same_plan or other_alg.same_plan or unknown.same_plan)
    def text(table):
        from rich.console import Console

        console = Console(record=True, width=400)
        console.print(table)
        return " ".join(console.export_text().split())

    assert "0 of 2 shapes within 5 %; 1 of the 2 beyond ran the best fixed L's own plan" in text(
        auto_gap_table([same, other_L]))
    assert "own plan" not in text(auto_gap_table([other_L, other_alg]))


def test_the_sweep_analysis_leaves_auto_out():
    rows = [_row(64, 3.0), _row(128, 2.0), _row("auto", 0.5, ran=128)]
    (sweep,) = mm.chunk_sweeps(rows, peak_flops_per_s=989e12, beta=3.35e12)
    assert [p["L"] for p in sweep.points] == [64, 128] and sweep.measured_ms_opt == 2.0


def test_report_prints_the_gap_table(tmp_path):
    rows = [_row(64, 3.0), _row(128, 2.0), _row("auto", 2.3, ran=64)]
    directory = R.write_results(tmp_path / "set", rows, {"suite": "chunk_rule_fit", "gpu_name": "NVIDIA H100 80GB HBM3"})
    result = CliRunner().invoke(app, ["report", str(directory), "--no-plots"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert 'chunk_size "auto" against the best fixed chunk size: 0 of 1 shapes within 5 %' in result.output
    assert "+15.0 %" in result.output


@pytest.mark.parametrize("name", ["chunk_rule_fit", "chunk_rule_heldout"])
def test_the_rule_suites_run_auto_beside_every_fixed_chunk_at_each_head_layout(name):
    loaded = load_suite(SUITES / f"{name}.yaml")
    ours = [k for k in loaded.suite.kernels if k.backend == "tfla"]
    layouts = {(k.params["d_qk"], k.params["d_hv"]) for k in ours}
    assert all(k.params["chunk_size"] == ["auto", 64, 128, 256] for k in ours)
    assert loaded.suite.timing.cuda_graph       # GPU time: the host's cost is measured apart
    if name == "chunk_rule_heldout":       # never tuned on, 48 to 512, some not powers of two
        assert min(min(p) for p in layouts) == 48 and max(max(p) for p in layouts) == 512
        assert any(d & (d - 1) for p in layouts for d in p)
        peers = [k for k in loaded.suite.kernels if k.backend != "tfla"]   # the peer at 192/384
        assert [(k.params["op"], k.params["d_qk"], k.params["d_hv"]) for k in peers] == [("chunk_simple_gla", 192, 384)]
    else:
        assert (128, 256) in layouts and (256, 512) in layouts
