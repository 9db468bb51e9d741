"""Several GPUs: which GPUs a run may use (CUDA_VISIBLE_DEVICES), each row's GPU, the set's
GPUs (also across merged shards), and compare's warning across GPU models."""

from __future__ import annotations

import pytest

from tflabench import environment
from tflabench.compare import compare_results
from tflabench.environment import GpuDevice, GpuInfo, gpus_used, visible_gpus
from tflabench.results import load_results, new_row, write_results
from tflabench.shard import merge_results

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
    row = new_row(suite="s", kernel="k", backend="sdpa", family="attention", params={}, mode="fwd")
    row.update(status="ok", gpu_index=value)
    rs = load_results(write_results(tmp_path / "set", [row], {"suite": "s"}))
    assert rs.rows["gpu_index"].tolist() == ["1"]
