"""One timing method per result set (issue 47.3; docs/result-sets.md, "One timing method per
set"): `run --resume` and `merge` refuse to join rows timed by another timer, thread count,
CPU model or host (on the CPU), with one line naming what differs, and leave
``metadata.json`` as it was."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from tflabench.store import results as R
from tflabench.cli import app
from tflabench.store.conditions import join_differences
from tflabench.errors import UserError
from tflabench.store.shard import merge_results

runner = CliRunner()

KERNEL = "import torch\n\ndef good(q, k, v):\n    return torch.nn.functional.scaled_dot_product_attention(q, k, v)\n"


def _suite(tmp_path):
    (tmp_path / "kern.py").write_text(KERNEL)
    data = {"name": "timing_join", "device": "cpu", "dtype": "float32", "modes": ["fwd"],
            "timing": {"warmup": 1, "iterations": 2, "timeout_s": 60},
            "numerics": {"max_seq_len": 32}, "model": {"embedding_dim": 32},
            "sweep": {"batch": 1, "seq_len": [16, 32]},
            "kernels": [{"backend": "custom", "label": "good",
                         "params": {"function": f"{tmp_path / 'kern.py'}:good", "layout": "attention", "heads": 2}}]}
    path = tmp_path / "timing_join.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    """A CPU set measured with one thread per worker, its run killed after one of two cases."""
    tmp_path = tmp_path_factory.mktemp("killed")
    suite = _suite(tmp_path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        result = runner.invoke(app, ["run", str(suite), "--out", str(tmp_path / "out"), "--no-progress",
                                     "--no-plots"])
    assert result.exit_code == 0, result.output
    directory = next((tmp_path / "out").glob("*/*/metadata.json")).parent
    rows = directory / R.ROWS_FILE
    rows.write_text(rows.read_text().splitlines()[0] + "\n")
    return suite, directory


def _copy(directory, tmp_path):
    import shutil

    return shutil.copytree(directory, tmp_path / "set")


def test_a_resume_with_another_thread_count_is_refused_and_the_set_left_as_it_was(killed_run, tmp_path,
                                                                                   monkeypatch):
    suite, original = killed_run
    directory = _copy(original, tmp_path)
    before = {name: (directory / name).read_bytes() for name in (R.METADATA_FILE, R.ROWS_FILE)}
    assert json.loads(before[R.METADATA_FILE])["cpu_threads"]["per_worker"] == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    line = _one_error_line(runner.invoke(app, ["run", str(suite), "--resume", str(directory), "--no-progress",
                                               "--no-plots"]))
    # one timer per set: process CPU time with one thread, wall time with two
    assert '"perf_counter" in this run but "process_time" in the result set' in line
    assert "CPU threads per worker" in line and "OMP_NUM_THREADS=1" in line and "without --resume" in line
    assert {name: (directory / name).read_bytes() for name in before} == before  # nothing rewritten
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the thread count it began with: the resume goes on
    done = runner.invoke(app, ["run", str(suite), "--resume", str(directory), "--no-progress", "--no-plots"])
    assert done.exit_code == 0, done.output
    rs = R.load_results(directory)
    assert len(rs.rows) == 2 and rs.metadata["cpu_threads"]["per_worker"] == 1


@pytest.mark.parametrize("key, value, named", [("cpu", "Another CPU 1234", "CPU model (cpu)"),
                                                ("hostname", "another-host", "host (hostname)")])
def test_a_resume_on_another_cpu_or_host_is_refused(killed_run, tmp_path, monkeypatch, key, value, named):
    suite, original = killed_run
    directory = _copy(original, tmp_path)
    meta = json.loads((directory / R.METADATA_FILE).read_text())
    meta[key] = value
    (directory / R.METADATA_FILE).write_text(json.dumps(meta))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    line = _one_error_line(runner.invoke(app, ["run", str(suite), "--resume", str(directory), "--no-progress",
                                               "--no-plots"]))
    assert f"{named} is" in line and json.dumps(value) in line and "resume on the machine it began on" in line
    assert json.loads((directory / R.METADATA_FILE).read_text())[key] == value


CPU_META = dict(suite="merge_timing", suite_sha256="ab" * 32, git_revision="1" * 40, hostname="node-1",
                cpu="Example CPU 9000", gpu_name=None, torch="2.13.0", triton="3.6.0", python="3.12.3", peers={},
                tflabench="0.1.0", device="cpu", measurement={"device": "cpu", "timing": {"iterations": 3}},
                cpu_threads={"per_worker": 1, "cores": 2, "workers": 1, "set_by": "tflabench"})


def _rows(seq_lens):
    return [dict(suite="merge_timing", kernel="k", backend="tfla", family="mlstm", params={}, mode="fwd",
                 dtype="float32", device="cpu", batch=1, seq_len=s, heads=2, d_qk=16, d_hv=16, chunk_size=16,
                 embedding_dim=32, status="ok", ms_median=1.0, ms_samples=[1.0] * 3) for s in seq_lens]


def _shards(tmp_path, second: dict):
    one = R.write_results(tmp_path / "s1", _rows([16]), dict(CPU_META, shard="1/2"))
    two = R.write_results(tmp_path / "s2", _rows([32]), dict(CPU_META, shard="2/2", **second))
    return [one, two]


@pytest.mark.parametrize("second, named", [
    ({"cpu_threads": {"per_worker": 4, "cores": 8, "workers": 1, "set_by": "OMP_NUM_THREADS"}}, "timer"),
    ({"cpu": "Another CPU 1234"}, "CPU model (cpu)"),
    ({"hostname": "node-2"}, "host (hostname)"),
])
def test_merge_refuses_cpu_shards_timed_another_way(tmp_path, second, named):
    dirs = _shards(tmp_path, second)
    with pytest.raises(UserError, match="was timed another way") as exc:
        merge_results(dirs, tmp_path / "merged")
    assert f"({named} " in str(exc.value) and not (tmp_path / "merged").exists()
    line = _one_error_line(runner.invoke(app, ["merge", *map(str, dirs), "--out", str(tmp_path / "m2")]))
    assert "was timed another way" in line and not (tmp_path / "m2").exists()
    if "cpu_threads" in second:  # both fields named: the timer first, the thread count after it
        assert "also different: CPU threads per worker" in line


def test_merge_joins_gpu_shards_of_several_hosts_but_not_of_two_timers(tmp_path):
    gpu = dict(CPU_META, device="cuda", cpu=None, cpu_threads=None, gpu_name="NVIDIA H100 80GB HBM3",
               measurement={"device": "cuda", "timing": {"iterations": 3, "cuda_graph": False}})
    a = R.write_results(tmp_path / "g1", _rows([16]), dict(gpu, shard="1/2"))
    b = R.write_results(tmp_path / "g2", _rows([32]), dict(gpu, shard="2/2", hostname="node-2"))
    merged = R.load_results(merge_results([a, b], tmp_path / "merged"))
    assert merged.metadata["hostname"] == "node-1,node-2" and len(merged.rows) == 2
    graph = dict(gpu, measurement={"device": "cuda", "timing": {"iterations": 3, "cuda_graph": True}})
    assert join_differences(gpu, graph) == [("timer", "cuda_events", "cuda_graph")]
    assert join_differences(gpu, dict(gpu, hostname="node-2", cpu="Other")) == []
