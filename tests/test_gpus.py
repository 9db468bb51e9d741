"""Several GPUs: which GPUs a run may use (CUDA_VISIBLE_DEVICES), each row's GPU, the set's
GPUs (also across merged shards), and compare's warning across GPU models."""

from __future__ import annotations

import pytest

from tflabench import environment
from tflabench.compare.gate import compare_results
from tflabench.environment import GpuDevice, GpuInfo, gpus_used, visible_gpus
from tflabench.store.results import load_results, write_results
from tflabench.store.schema import new_row
from tflabench.store.shard import merge_results

HOST = GpuInfo([GpuDevice("0", "NVIDIA H200", "GPU-aaaa-0"), GpuDevice("1", "NVIDIA H200", "GPU-bbbb-1"),
                GpuDevice("2", "NVIDIA H100 80GB HBM3", "GPU-cccc-2")], "580.1", "nvidia-smi")


def test_visible_gpus_follow_cuda_visible_devices_like_cuda(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [d.index for d in visible_gpus(HOST)] == ["0", "1", "2"]               # unset: every GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [d.index for d in visible_gpus(HOST)] == ["1"]
    assert [d.index for d in visible_gpus(HOST, "2,0")] == ["2", "0"]            # CUDA's order
    assert [d.index for d in visible_gpus(HOST, "GPU-bbbb")] == ["1"]            # a UUID prefix
    assert [d.index for d in visible_gpus(HOST, "1,7,0")] == ["1"]               # ends at a bad entry
    assert visible_gpus(HOST, "") == []
    torch_only = GpuInfo([GpuDevice("0", "NVIDIA H200")], None, "torch")          # torch applied it already
    assert visible_gpus(torch_only, "3") == torch_only.devices


def test_gpus_used_lists_each_slot_with_its_model(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert gpus_used(None, HOST) == [{"index": "1", "name": "NVIDIA H200"}]      # an unpinned worker's GPU
    assert gpus_used(["0", "2"], HOST) == [{"index": "0", "name": "NVIDIA H200"},
                                           {"index": "2", "name": "NVIDIA H100 80GB HBM3"}]
    assert gpus_used(["5"], HOST) == [{"index": "5", "name": None}]
    assert gpus_used(None, GpuInfo([], None)) == []
    monkeypatch.setattr(environment, "gpu_info", lambda: HOST)
    env = environment.collect()
    assert env["gpu_name"] == "NVIDIA H200" and env["gpu_count"] == 1


def _set(path, gpu_names, metadata_gpu="NVIDIA H200", **meta):
    rows = []
    for n, gpu in enumerate(gpu_names):
        row = new_row(suite="s", kernel="k", backend="sdpa", family="attention", params={}, mode="fwd",
                      dtype="bfloat16", device="cuda", batch=1, seq_len=128 * (n + 1), heads=2, d_qk=64,
                      d_hv=64, chunk_size=None, embedding_dim=128)
        row.update(status="ok", ms_median=1.0, ms_q25=0.99, ms_q75=1.01, ms_samples=[1.0] * 9,
                   gpu_index=None if gpu is None else str(n % 2), gpu_name=gpu)
        rows.append(row)
    return load_results(write_results(path, rows, {"suite": "s", "gpu_name": metadata_gpu, **meta}))


def test_compare_warns_once_when_rows_ran_on_different_gpu_models(tmp_path):
    base = _set(tmp_path / "base", ["NVIDIA H200"] * 4)
    same = _set(tmp_path / "same", ["NVIDIA H200"] * 4)
    mixed = _set(tmp_path / "mixed", ["NVIDIA H200", "NVIDIA H100 80GB HBM3"] * 2)
    assert not [w for w in compare_results(base, same).warnings if "GPU models" in w]
    comparison = compare_results(base, mixed)
    (line,) = [w for w in comparison.warnings if "GPU models" in w]
    assert "2 of 4 case(s)" in line and "NVIDIA H200 -> NVIDIA H100 80GB HBM3" in line
    assert set(comparison.cases["outcome"]) == {"unchanged"}  # a warning, not a verdict
    # sets written before rows named their GPU: the run's gpu_name stands for every row
    old = _set(tmp_path / "old", [None] * 4, metadata_gpu="NVIDIA H100 80GB HBM3")
    (line,) = [w for w in compare_results(base, old).warnings if "GPU models" in w]
    assert "4 of 4" in line


def test_merge_keeps_the_gpus_of_every_shard(tmp_path):
    one = _set(tmp_path / "one", ["NVIDIA H200"], shard="1/2", gpus_used=[{"index": "0", "name": "NVIDIA H200"}])
    two = _set(tmp_path / "two", ["NVIDIA H200"], shard="2/2", gpus_used=[{"index": "1", "name": "NVIDIA H200"}])
    rows = two.rows.copy()
    rows["seq_len"] = 4096.0
    rows["case_id"] = None
    write_results(tmp_path / "two", rows.to_dict("records"), two.metadata)
    merged = load_results(merge_results([tmp_path / "one", tmp_path / "two"], tmp_path / "merged"))
    assert merged.metadata["gpus_used"] == [{"index": "0", "name": "NVIDIA H200"},
                                            {"index": "1", "name": "NVIDIA H200"}]
    assert sorted(merged.rows["gpu_index"]) == ["0", "0"] and set(merged.rows["gpu_name"]) == {"NVIDIA H200"}


@pytest.mark.parametrize("value", [1, "1"])
def test_gpu_index_is_text(tmp_path, value):
    row = new_row(suite="s", kernel="k", backend="sdpa", family="attention", params={}, mode="fwd",
                  dtype="bfloat16", device="cuda", batch=1, seq_len=128, heads=2, d_qk=64, d_hv=64,
                  chunk_size=None, embedding_dim=128)
    row.update(status="ok", gpu_index=value, ms_median=1.0, n_iter=1, ms_samples=[1.0])
    rs = load_results(write_results(tmp_path / "set", [row], {"suite": "s"}))
    assert rs.rows["gpu_index"].tolist() == ["1"]


def test_run_with_gpus_on_a_machine_without_gpus_is_refused_with_exit_2(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from tflabench.run import pool as worker_pool
    from tflabench.cli import app

    monkeypatch.setattr(worker_pool, "gpu_info", lambda: GpuInfo([], None))
    for option in ("0,1", "all"):
        result = CliRunner().invoke(app, ["run", "--gpus", option, "--out", str(tmp_path), "--no-progress"])
        assert result.exit_code == 2, result.output
        assert "no GPU is visible here" in result.stderr and len(result.stderr.strip().splitlines()) == 1
        assert "Traceback" not in result.output
    assert not any(tmp_path.iterdir())  # nothing was started


KILLED = '''
import os, signal, torch

def good(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

def killed_on_gpu_1(q, k, v):
    # the worker of the slot pinned to GPU "1" dies by SIGKILL in its first case (once)
    marker = os.environ["KILL_MARKER"]
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "1" and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return good(q, k, v)
'''


def test_a_worker_killed_on_one_gpu_loses_only_its_case_and_the_other_gpu_goes_on(tmp_path, monkeypatch):
    """Two fake GPU slots on the CPU (the pool's slots are CUDA_VISIBLE_DEVICES values; a
    CPU worker pinned to "1" runs like one on GPU 1): SIGKILL of the worker on slot "1"
    makes that one case a crash row; every other case is measured, and slot "0"'s worker
    runs on, the same process throughout."""
    import yaml

    from tflabench.store.suite import expand_cases, load_suite
    from tflabench.run.suite_run import run_suite

    kfile = tmp_path / "killed_kernels.py"
    kfile.write_text(KILLED)
    monkeypatch.setenv("KILL_MARKER", str(tmp_path / "killed"))
    data = {"name": "two_gpus", "device": "cpu", "dtype": "float32", "modes": ["fwd"],
            "timing": {"warmup": 1, "iterations": 2, "timeout_s": 60}, "numerics": {"max_seq_len": 32},
            "model": {"embedding_dim": 32}, "sweep": {"batch": 1, "seq_len": [8, 16, 32, 64, 128, 256]},
            "kernels": [{"backend": "custom", "label": "killed",
                         "params": {"function": f"{kfile}:killed_on_gpu_1", "layout": "attention", "heads": 2}}]}
    (tmp_path / "two_gpus.yaml").write_text(yaml.safe_dump(data))
    loaded = load_suite(tmp_path / "two_gpus.yaml")
    result = run_suite(loaded, out_root=tmp_path / "results", gpus=["0", "1"], progress=False,
                       max_kernel_failures=0)

    assert sorted(r["case_id"] for r in result.rows) == sorted(c.case_id for c in expand_cases(loaded))
    crashed = [r for r in result.rows if r["status"] == "crash"]
    assert len(crashed) == 1 and "SIGKILL" in crashed[0]["reason"]
    assert {r["status"] for r in result.rows if r is not crashed[0]} == {"ok"}
    assert result.rows.index(crashed[0]) < len(result.rows) - 1  # cases were measured after the kill

    def pids(slot):
        log = (result.directory / "logs" / f"worker-{slot}.log").read_text()
        return [line.split(" pid=")[1].split()[0] for line in log.splitlines() if line.startswith("--- case")]

    assert len(pids(0)) >= 2 and len(set(pids(0))) == 1  # slot 0's worker went on, never restarted
    assert pids(1)  # slot 1 ran the killed case
