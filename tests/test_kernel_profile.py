"""run --profile and its report: kernel times captured by torch's profiler (operators on
the CPU), mapped to the model's parts by each backend, each part against its own bound;
the model's parts and the physical floor."""

from __future__ import annotations

import json

import pytest

from tflabench.backends import get_backend
from tflabench.backends.base import Shape
from tflabench.errors import UserError
from tflabench.run.kernel_profile import breakdown, breakdowns, parse_profile
from tflabench.model import counts_for_case
from tflabench.model.floor import compulsory_bytes, physical_floor
from tflabench.model.parts import row_part, split_parts

FIG4 = dict(B=8, NH=16, S=8192, d_qk=128, d_hv=256)  # Figure 4's heads at B*S = 65,536


CAPTURE = """
import json, torch
from tflabench.run.kernel_profile import capture

w = torch.randn(32, 32, requires_grad=True)
x = torch.randn(16, 32, requires_grad=True)

def clear():
    w.grad = x.grad = None

both = capture(lambda: (x @ w).sum(), lambda out: out.backward(), "cpu", steps=3, before_each=clear)
grad_ok = bool(torch.allclose(w.grad, x.detach().sum(0)[:, None].expand(32, 32)))
forward_only = capture(lambda: (x @ w).sum(), None, "cpu", steps=1)
try:
    capture(lambda: None, None, "cpu", steps=0)
    refused = False
except ValueError:
    refused = True
print(json.dumps({"both": both, "forward_only": forward_only, "grad_ok": grad_ok, "refused": refused}))
"""


def test_capture_on_the_cpu_records_each_operator_per_pass_and_per_call():
    # in its own process, as in a worker: running torch's profiler imports torch._dynamo and
    # with it triton, outside the interpreter mode the kernel tests of this process set later
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(root / "kernels"), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", CAPTURE], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    prof = got["both"]
    assert prof["source"] == "cpu operators" and prof["steps"] == 3
    calls = {(k["pass"], k["name"]): k["calls"] for k in prof["kernels"]}
    assert calls[("fwd", "aten::mm")] == 1.0        # one product per forward call
    assert calls[("bwd", "aten::mm")] == 2.0        # dx and dw per backward call
    assert all(k["ms"] >= 0 for k in prof["kernels"])
    assert {k["pass"] for k in prof["kernels"]} == {"fwd", "bwd"}
    assert got["grad_ok"]                           # the backward ran once per call, gradients cleared
    assert {k["pass"] for k in got["forward_only"]["kernels"]} == {"fwd"}
    assert got["refused"]


def test_corrupt_profile_is_one_user_error():
    assert parse_profile(None) is None and parse_profile(float("nan")) is None
    for bad in ("not json", json.dumps({"kernels": [{"pass": "up", "name": "k", "ms": 1, "calls": 1}]}),
                json.dumps({"source": "cpu operators"})):
        with pytest.raises(UserError, match="kernel_profile"):
            parse_profile(bad)


def test_model_parts_split_the_counts_and_flops_labels_them():
    c = counts_for_case("mlstm_sig", "fwdbw", L=128, **FIG4)
    parts = split_parts("mlstm_sig", c)
    assert list(parts) == [("fwd", "recurrent"), ("fwd", "parallel"), ("bwd", "recurrent"), ("bwd", "parallel")]
    assert sum(p.flops for p in parts.values()) == pytest.approx(c.flops)
    assert sum(p.bytes for p in parts.values()) == pytest.approx(c.bytes)
    assert set(parts[("fwd", "recurrent")].flop_rows) == {"fwd_gates", "fwd_numerator", "fwd_denominator"}
    assert set(parts[("bwd", "recurrent")].byte_rows) == {"bwd_state_recompute", "bwd_state_gradients"}
    assert row_part("mlstm_exp", "fwd_recurrent_store") == "recurrent"
    assert row_part("mlstm_exp", "bwd_qkv_gradients") == "parallel"
    att = split_parts("attention_causal", counts_for_case("attention_causal", "fwdbw", **FIG4))
    assert list(att) == [("fwd", "parallel"), ("bwd", "parallel")]
    ssd = split_parts("mamba2_ssd", counts_for_case("mamba2_ssd", "fwd", **FIG4))
    assert list(ssd) == [("fwd", "whole")]


def test_physical_floor_is_the_compulsory_traffic_and_lies_below_the_model():
    # Figure 4, bf16 activations, float32 gates: 1,544 bytes per token and head forward,
    # 4,120 forward+backward (q, k, v, gates read in both passes, h written, dh read,
    # dq, dk, dv, di, df written)
    tokens_heads = FIG4["B"] * FIG4["S"] * FIG4["NH"]
    fwd = compulsory_bytes("mlstm_sig", "fwd", **FIG4, bytes_qkv=2, bytes_gate=4)
    both = compulsory_bytes("mlstm_sig", "fwdbw", **FIG4, bytes_qkv=2, bytes_gate=4)
    assert sum(fwd.values()) == 1544 * tokens_heads and sum(both.values()) == 4120 * tokens_heads
    for mode in ("fwd", "fwdbw"):
        floor = physical_floor("mlstm_sig", mode, **FIG4, bytes_qkv=2, bytes_gate=4)
        for L in (16, 64, 128, 256):
            model = counts_for_case("mlstm_sig", mode, L=L, **FIG4)
            assert floor.flops <= model.flops and floor.bytes < model.bytes
    att = physical_floor("attention_causal", "fwd", **FIG4)
    assert att.flops == pytest.approx(counts_for_case("attention_causal", "fwd", **FIG4).flops)
    assert physical_floor("mamba2_ssd", "fwd", **FIG4) is None


def _row(backend: str, params: dict, mode: str, kernels: list[tuple[str, str, float]], **shape) -> dict:
    b = get_backend(backend)
    p = b.parse_params(params)
    sh = {**dict(batch=8, seq_len=8192, heads=16, d_qk=128, d_hv=256, dtype="bfloat16"), **shape}
    return {"backend": backend, "params": json.dumps(p.model_dump()), "mode": mode, "status": "ok",
            "ms_median": 5.0, **sh,
            "kernel_profile": json.dumps({"source": "cuda kernels", "steps": 5, "kernels": [
                {"pass": pa, "name": n, "ms": ms, "calls": 1.0} for pa, n, ms in kernels]})}


def test_breakdown_sets_each_part_of_our_kernels_against_its_own_bound():
    alpha, beta = 800e12, 4.27e12
    row = _row("tfla", {"variant": "sig"}, "fwdbw", [
        ("fwd", "_gates_kernel", 0.05), ("fwd", "_recurrent_fw_kernel", 0.4), ("fwd", "_parallel_fw_kernel", 0.6),
        ("bwd", "_recurrent_fw_kernel", 0.4), ("bwd", "_recurrent_bw_kernel", 0.5),
        ("bwd", "_dq_kernel", 1.0), ("bwd", "_dkv_kernel", 1.5),
        ("fwd", "void at::native::vectorized_elementwise_kernel<4>", 0.02)])
    b = breakdown(row, alpha, beta)
    assert [p.label for p in b.parts] == ["fwd recurrent", "fwd parallel", "fwd other", "bwd recurrent", "bwd parallel"]
    assert b.part("fwd recurrent").ms == pytest.approx(0.45) and b.part("bwd parallel").ms == pytest.approx(2.5)
    assert b.kernel_ms == pytest.approx(4.47) and b.measured_ms == 5.0
    model = split_parts("mlstm_sig", counts_for_case("mlstm_sig", "fwdbw", L=128, **FIG4))
    for (pass_, part), counts in model.items():
        got = b.part(f"{pass_} {part}")
        assert (got.flops, got.bytes) == (pytest.approx(counts.flops), pytest.approx(counts.bytes))
        assert got.bound_ms == pytest.approx(max(counts.flops / alpha, counts.bytes / beta) * 1e3)
        assert got.fraction == pytest.approx(got.bound_ms / got.ms)
    assert b.part("fwd other").bound_ms is None and b.part("fwd other").ms == pytest.approx(0.02)
    total = counts_for_case("mlstm_sig", "fwdbw", L=128, **FIG4)
    assert b.bound_ms == pytest.approx(max(total.flops / alpha, total.bytes / beta) * 1e3)
    assert b.floor_ms == pytest.approx(4120 * 8 * 8192 * 16 / beta * 1e3)  # bytes bind at Figure 4
    assert b.floor_ms < b.bound_ms and "bytes bind" in b.floor_note


def test_fused_walk_and_peers_map_to_their_parts_and_unknown_kernels_to_other():
    walk = breakdown(_row("tfla", {"variant": "sig", "chunk_size": 64}, "fwd", [("fwd", "_sig_walk_fw_kernel", 0.8)]),
                     800e12, 4.27e12)
    fwd = counts_for_case("mlstm_sig", "fwd", L=64, **FIG4)
    (part,) = walk.parts
    assert part.label == "fwd whole" and part.flops == pytest.approx(fwd.flops) and part.bytes == pytest.approx(fwd.bytes)
    # training under auto: the walk and the gate kernels are the forward's whole, the backward
    # keeps its parts
    train = breakdown(_row("tfla", {"variant": "sig", "chunk_size": 128}, "fwdbw", [
        ("fwd", "_sig_walk_fw_kernel", 0.96), ("fwd", "_gates_kernel", 0.02),
        ("bwd", "_recurrent_bw_kernel", 0.5), ("bwd", "_dkv_fused_kernel", 1.55),
        ("bwd", "_dq_kernel", 0.91)]), 800e12, 4.27e12)
    assert [(p.label, round(p.ms, 2)) for p in train.parts] == [
        ("fwd whole", 0.98), ("bwd recurrent", 0.5), ("bwd parallel", 2.46)]
    assert sorted(k[0] for k in train.part("fwd whole").kernels) == ["_gates_kernel",
                                                                      "_sig_walk_fw_kernel"]
    peer = breakdown(_row("mlstm_kernels", {"variant": "sig"}, "fwd", [
        ("fwd", "mlstm_siging_chunkwise__recurrent_fw_C_kernel", 0.5),
        ("fwd", "mlstm_siging_chunkwise__parallel_fw_Hintra_kernel", 1.0),
        ("fwd", "triton_poi_fused_cumsum_0", 0.1)]))
    assert [(p.label, p.ms) for p in peer.parts] == [("fwd recurrent", 0.5), ("fwd parallel", 1.0), ("fwd other", 0.1)]
    assert all(p.bound_ms is None for p in peer.parts) and peer.floor_ms is None  # no ceilings given
    att = breakdown(_row("sdpa", {"impl": "cudnn"}, "fwdbw", [
        ("fwd", "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x128", 3.0),
        ("bwd", "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_7_64x128x128", 7.0),
        ("bwd", "Memset (Device)", 0.01)], heads=32, d_qk=128, d_hv=128), 800e12, 4.27e12)
    assert [p.label for p in att.parts] == ["fwd parallel", "bwd parallel", "bwd other"]
    assert att.part("fwd parallel").bound_ms > 0 and att.floor_ms is not None
    unknown = breakdown({**_row("tfla", {}, "fwd", [("fwd", "_parallel_fw_kernel", 1.0)]), "backend": "gone"})
    assert [p.label for p in unknown.parts] == ["fwd other"]


def test_rows_without_profile_keep_the_bound_and_the_floor_only():
    row = _row("tfla", {}, "fwd", [])
    row["kernel_profile"] = None
    b = breakdown(row, 800e12, 4.27e12)
    assert b.source is None and b.parts == [] and b.kernel_ms is None
    assert b.floor_ms == pytest.approx(1544 * 8 * 8192 * 16 / 4.27e12 * 1e3) and b.bound_ms > b.floor_ms
    assert breakdowns([{**row, "status": "ok"}, {**row, "status": "crash"}], 800e12, 4.27e12)[0].row["status"] == "ok"
    assert breakdowns([{**row, "backend": "gone"}]) == []  # nothing to show


def test_run_profile_on_the_cpu_records_operators_and_report_splits_them_by_part(tmp_path):
    """`tflabench run --profile` of a CPU suite (torch SDPA math, forward and
    forward+backward): each row holds its operators by pass; `report` prints the time by
    part (the attention's matrix products and softmax are its parallel part)."""
    import yaml
    from typer.testing import CliRunner

    from tflabench.cli import app
    from tflabench.store.results import load_results

    data = {"name": "profile_cpu", "device": "cpu", "dtype": "float32", "modes": ["fwd", "fwdbw"],
            "timing": {"warmup": 1, "iterations": 3, "timeout_s": 120}, "numerics": {"max_seq_len": 64},
            "model": {"embedding_dim": 64}, "sweep": {"batch": 1, "seq_len": [64]},
            "kernels": [{"backend": "sdpa", "label": "sdpa math", "params": {"impl": "math", "heads": 2, "d_hv": 32}}]}
    (tmp_path / "profile_cpu.yaml").write_text(yaml.safe_dump(data))
    runner = CliRunner()
    result = runner.invoke(app, ["run", str(tmp_path / "profile_cpu.yaml"), "--profile", "--no-progress",
                                 "--no-plots", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    (directory,) = [p.parent for p in (tmp_path / "out").glob("*/*/metadata.json")]
    rs = load_results(directory)
    assert rs.metadata["profile"] is True and set(rs.rows["status"]) == {"ok"}
    for row in rs.rows.to_dict("records"):
        prof = parse_profile(row["kernel_profile"])
        assert prof["source"] == "cpu operators"
        passes = {k["pass"] for k in prof["kernels"]}
        assert passes == ({"fwd"} if row["mode"] == "fwd" else {"fwd", "bwd"})
        assert any(k["name"] == "aten::bmm" for k in prof["kernels"])
    report = runner.invoke(app, ["report", str(directory), "--no-plots", "--kernels", "2"])
    assert report.exit_code == 0, report.output
    assert "fwd parallel" in report.output and "bwd parallel" in report.output
    assert "aten::bmm" in report.output  # --kernels lists the largest operators


def test_every_triton_kernel_of_ours_has_a_model_part():
    # A kernel added to kernels/tfla/triton without a KERNEL_PARTS pattern would land in
    # "other" in every profile breakdown. Read from the sources (importing the kernels here
    # would load triton outside the interpreter mode the kernel tests set).
    import ast
    from pathlib import Path

    from tflabench.backends.tfla import TflaParams

    backend = get_backend("tfla")
    params = TflaParams(variant="sig", chunk_size=64)
    root = Path(__file__).resolve().parents[1] / "kernels" / "tfla" / "triton"
    kernels = []
    for path in sorted(root.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel") and any(
                    ast.unparse(d).startswith("triton.jit") for d in node.decorator_list):
                kernels.append(node.name)
    assert len(kernels) >= 8, kernels
    unnamed = [name for name in kernels if backend.family.kernel_part(params, name) is None]
    assert unnamed == [], f"kernels without a model part in TflaBackend.KERNEL_PARTS: {unnamed}"
