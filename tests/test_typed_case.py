"""One typed case: a suite's parameters are parsed once, at the suite boundary, into the
backend's frozen ``Params``; the case carries them across the process boundary; the chunk
size that ran is its own column (``chunk_size_run``), never patched into the identity."""

from __future__ import annotations

import glob
import json
import pickle
from pathlib import Path

import pytest
import yaml

from tflabench.backends import get_backend, params_of_row
from tflabench.backends.base import Backend
from tflabench.backends.tfla import TflaParams
from tflabench.run import pool
from tflabench.run.measure import measure_case
from tflabench.run.suite_run import run_suite
from tflabench.store import results as R, schema
from tflabench.text_safety import case_label
from tflabench.store.suite import expand_cases, load_suite

ROOT = Path(__file__).resolve().parents[1]
#: an extra kernel beside cpu_demo's: chunk size "auto", run by the Triton interpreter (the
#: PyTorch reference takes fixed chunk sizes only)
AUTO_KERNEL = {"backend": "tfla", "label": "mLSTMsig TFLA auto",
               "params": {"variant": "sig", "chunk_size": "auto", "heads": 2, "d_qk": 32, "d_hv": 64,
                          "impl": "triton"},
               "modes": ["fwd"]}


class _InProcessWorker:
    """Stands in for :class:`tflabench.run.pool._Worker`: runs each case in this process, after
    the round trip a worker's pipe makes (pickle), so that parse_params is counted here."""

    def __init__(self, ctx, slot, gpu, log_path, device="cpu", threads=0, reaper=None):
        self.backend, self.start_error = None, None

    def run(self, case):
        return measure_case(pickle.loads(pickle.dumps(case)))

    def alive(self):
        return True

    def stop(self):
        pass

    kill = stop


@pytest.fixture(scope="module")
def demo_suite(tmp_path_factory):
    """suites/cpu_demo.yaml, cut to one short shape and three timed calls, with AUTO_KERNEL."""
    data = yaml.safe_load((ROOT / "suites" / "cpu_demo.yaml").read_text())
    data["timing"] = {"warmup": 0, "iterations": 3, "timeout_s": 600}
    data["numerics"] = {"check": True, "max_seq_len": 64}
    data["sweep"] = {"batch": 1, "seq_len": [128]}
    data["kernels"].append(AUTO_KERNEL)
    path = tmp_path_factory.mktemp("suite") / "cpu_demo.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def demo_run(demo_suite, tmp_path_factory):
    """The suite loaded and run in this process: (parse_params calls while loading, while
    running, the result set)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_INTERPRET", "1")
    calls: list[str] = []
    original = Backend.parse_params

    def counting(self, raw):
        calls.append(self.name)
        return original(self, raw)

    mp.setattr(Backend, "parse_params", counting)
    mp.setattr(pool, "_Worker", _InProcessWorker)
    try:
        loaded = load_suite(demo_suite)
        at_load = list(calls)
        calls.clear()
        result = run_suite(loaded, out_root=tmp_path_factory.mktemp("out"), progress=False)
        in_run = list(calls)
    finally:
        mp.undo()
    return at_load, in_run, R.load_results(result.directory)


def test_a_suite_is_parsed_once_per_kernel_configuration_and_never_while_it_runs(demo_run):
    at_load, in_run, rs = demo_run
    assert sorted(at_load) == ["sdpa", "tfla", "tfla", "tfla"]   # one per kernel entry (no lists here)
    assert in_run == []                                          # the run's expansion and the cases: none
    assert len(rs.rows) == 3 * 2 + 1 and set(rs.rows["status"]) == {"ok"}


def test_chunk_size_run_is_written_for_fixed_and_auto_chunk_sizes(demo_run):
    rows = {(r["kernel"], r["mode"]): r for r in demo_run[2].rows.to_dict("records")}
    fixed = rows[("mLSTMsig TFLA (reference)", "fwdbw")]
    assert fixed["chunk_size"] == 64 and fixed["chunk_size_run"] == 64
    auto = rows[("mLSTMsig TFLA auto", "fwd")]
    assert auto["chunk_size"] != auto["chunk_size"]                    # NaN: the identity keeps None
    assert auto["chunk_size_run"] >= 16 and auto["algorithm"]         # the plan's size and algorithm
    assert schema.chunk_size_ran(auto) == auto["chunk_size_run"]
    sdpa = rows[("torch SDPA math", "fwd")]
    assert sdpa["chunk_size_run"] != sdpa["chunk_size_run"]            # no chunks: NaN
    # each row's id is its case's: the run wrote nothing into the identity
    cases = {(c.kernel, c.mode): c for c in expand_cases(load_suite(demo_run[2].metadata["suite_path"]))}
    assert {key: r["case_id"] for key, r in rows.items()} == {key: c.case_id for key, c in cases.items()}
    case = cases[("mLSTMsig TFLA auto", "fwd")]
    assert case.chunk_size is None and case.params.chunk_size == "auto"


def test_a_case_crosses_the_process_boundary_with_its_typed_params(demo_suite):
    cases = expand_cases(load_suite(demo_suite), device="cpu")
    for case in cases:
        again = pickle.loads(pickle.dumps(case))
        assert again == case and again.case_id == case.case_id and again.params_json == case.params_json
        assert type(again.params) is type(case.params) and again.params == case.params
    tfla = next(c for c in cases if c.backend == "tfla")
    assert isinstance(tfla.params, TflaParams) and tfla.params.chunk_size == 64
    with pytest.raises(Exception):        # frozen: a worker cannot change what the case is
        tfla.params.chunk_size = 128
    assert json.loads(tfla.params_json) == tfla.params.model_dump(mode="json")


def test_a_layer_case_and_a_missing_backends_case_pickle_too(monkeypatch):
    layer = get_backend("layer").parse_params({"mixer": "mlstm", "cell": "tfla",
                                               "cell_params": {"chunk_size": 32, "impl": "reference"}})
    again = pickle.loads(pickle.dumps(layer))
    assert again == layer and get_backend("layer").chunk_size(again) == 32
    from tflabench.backends import _MissingBackend

    missing = _MissingBackend("gone", "tflabench.backends.gone", "ImportError").parse_params({"x": 1})
    assert pickle.loads(pickle.dumps(missing)) == missing


REFERENCE_SETS = sorted(glob.glob(str(ROOT / "results" / "reference" / "*" / "*" / "rows.jsonl")))


@pytest.mark.parametrize("rows_file", REFERENCE_SETS, ids=lambda p: "/".join(Path(p).parts[-3:-1]))
def test_case_ids_of_reference_sets_recompute_from_their_rows_and_their_suites(rows_file):
    rows = [json.loads(line) for line in Path(rows_file).read_text().splitlines() if line.strip()]
    assert rows
    for row in rows:   # the identity's chunk_size is the one the typed params fix (None for auto)
        identity = {col: row.get(col) for col in schema.IDENTITY_COLUMNS[1:]}
        identity["chunk_size"] = get_backend(row["backend"]).chunk_size(params_of_row(row))
        assert R.case_id(identity) == row["case_id"], row["kernel"]
    suite = ROOT / "suites" / f"{Path(rows_file).parent.name}.yaml"
    ids = {c.case_id for c in expand_cases(load_suite(suite), device="cuda")}
    assert {row["case_id"] for row in rows} <= ids


def test_sets_without_chunk_size_run_load_and_read_the_size_that_ran_from_chunk_size(tmp_path):
    old = schema.new_row(suite="s", kernel="k", backend="tfla", family="mlstm",
                    params={"variant": "sig", "chunk_size": "auto"}, mode="fwd", dtype="bfloat16",
                    device="cuda", batch=1, seq_len=256, heads=2, d_qk=64, d_hv=128, chunk_size=None,
                    embedding_dim=256)
    old_id = old["case_id"]
    old.update(status="ok", chunk_size=128)   # how earlier runs wrote the size an auto case ran
    del old["chunk_size_run"]
    (tmp_path / R.ROWS_FILE).write_text(json.dumps(old) + "\n")
    (tmp_path / R.METADATA_FILE).write_text(json.dumps({"suite": "s"}))
    row = R.load_results(tmp_path).rows.to_dict("records")[0]
    assert row["case_id"] == old_id and row["chunk_size_run"] != row["chunk_size_run"]   # unknown: NaN
    assert schema.chunk_size_ran(row) == 128 and "L128" in case_label(row)
