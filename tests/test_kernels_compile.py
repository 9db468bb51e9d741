"""Every Triton kernel the dispatch can launch compiles for sm_90 (no GPU needed:
``triton.compile`` with a ``GPUTarget``): the chunk-gates kernel at every chunk size, gate
dtype and warps count, and every launch of the public functions over the matrix of
``benchmarks/kernel_matrix.py`` (variant, algorithm, chunk 16-1024, q/k/v and gate dtypes,
head dimensions, initial and last state, normaliser), compiled instead of launched.

Regression: ``tfla.mlstm_exp(..., chunk_size=256)`` with bfloat16 or float16 gate
pre-activations failed on Hopper with ``PassManager::run failed``
(TritonGPURemoveLayoutConversions: "operand #0 does not dominate this use") in the
chunk-gates kernel at 1 warp, and at chunk 1024 at 4 warps; float32 gates compiled. The
masked ī fed both a store and the max-scan of m^intra; the scan now takes ī - b from the
loaded gate, and the kernel compiles at every warps count.

The compilation runs in a child process with TRITON_INTERPRET off: ``@triton.jit`` picks
compiled or interpreted kernels when a module is imported, and the kernel tests of this
suite import the same modules for the interpreter.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels"
MATRIX = ROOT / "benchmarks" / "kernel_matrix.py"
CHUNKS = (16, 32, 64, 128, 256, 512, 1024)
GATE_DTYPES = ("fp32", "bf16", "fp16")

_CHILD = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tfla.triton import chunkwise_recurrent as cr

def compile_gates(gate_dtype, L, is_exp, num_warps):
    ptrs = ("I", "F", "B_vec", "A_vec", "I_vec", "MI_vec", "G_ch", "AMAX_ch")
    sig = {p: ("*" + gate_dtype if p in ("I", "F") else "*fp32") for p in ptrs}
    sig.update(S="i32", NC="i32", L="constexpr", IS_EXP="constexpr")
    # the launcher specialises 16-byte aligned pointers and S divisible by 16: compile so too
    attrs = {(k,): [["tt.divisibility", 16]] for k in range(10)}
    src = ASTSource(fn=cr._gates_kernel, signature=sig, constexprs={"L": L, "IS_EXP": is_exp},
                    attrs=attrs)
    try:
        triton.compile(src, target=GPUTarget("cuda", 90, 128), options={"num_warps": num_warps})
        return "ok"
    except Exception as e:
        return (str(e).strip().splitlines() or ["?"])[0][:200]

out = {}
for gate_dtype, L, is_exp, warps in json.loads(sys.argv[1]):
    w = cr.gates_num_warps(L) if warps is None else warps
    out[f"{gate_dtype} L{L} {'exp' if is_exp else 'sig'} w{w}"] = compile_gates(gate_dtype, L, is_exp, w)
print(json.dumps(out))
"""


def _compile(configs: list) -> dict[str, str]:
    """Compile the chunk-gates kernel for sm_90 for each (gate dtype, L, is_exp, warps or
    None for the launch rule) in a child process; returns config -> "ok" or the error."""
    env = dict(os.environ, TRITON_INTERPRET="0",
               PYTHONPATH=os.pathsep.join([str(KERNELS), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(configs)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_chunk_gates_compiles_for_sm90_at_every_chunk_size_and_gate_dtype():
    configs = [[dt, L, e, None] for dt in GATE_DTYPES for e in (True, False) for L in CHUNKS]
    results = _compile(configs)
    assert len(results) == len(configs)
    failed = {k: v for k, v in results.items() if v != "ok"}
    assert not failed, failed
    for key in results:                      # the launch rule: at most 4 gate values a thread
        L, w = int(key.split()[1][1:]), int(key.split()[3][1:])
        assert 1 <= w <= 8 and L / (32 * w) <= 4, key


def test_regression_exp_chunk256_16bit_gates_compile_at_every_warps_count():
    """The reported case (mLSTMexp, chunk 256, bf16 or fp16 gates), and chunks 512 and
    1024, at 1, 2, 4 and 8 warps: the old kernel failed wherever a thread loaded 8 gate
    values (1 warp at L 256, 1-2 at L 512, 1-4 at L 1024), whatever warps the launch picks."""
    configs = [[dt, L, True, w] for dt in ("bf16", "fp16") for L in (256, 512, 1024)
               for w in (1, 2, 4, 8)]
    results = _compile(configs)
    assert len(results) == len(configs)
    assert results["bf16 L256 exp w1"] == "ok"
    failed = {k: v for k, v in results.items() if v != "ok"}
    assert not failed, failed


_CHILD_DKV = r"""
import json, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tfla.triton import chunkwise_parallel_bw as bw

def compile_fused(L, d_qk, d_hv, is_exp):
    cfg = bw.bw_config(L, d_qk, d_hv, torch.bfloat16)
    blq, blkv, fqk, fhv = cfg["DKV_B_LQ"], cfg["DKV_B_LKV"], triton.next_power_of_2(d_qk), triton.next_power_of_2(d_hv)
    td = lambda a, b: f"tensordesc<bf16[1,{a},{b}]>"
    sig = dict(Q="*bf16", K="*bf16", V="*bf16", DH="*bf16", QD=td(blq, fqk), KD=td(blkv, fqk),
               VD=td(blkv, fhv), DHD=td(blq, fhv), DCD=td(fqk, fhv), DKD=td(blkv, fqk),
               DVD=td(blkv, fhv), B_vec="*fp32", I_vec="*fp32", A_vec="*fp32", MI_vec="*fp32",
               M_st="*fp32", NOUT="*fp32", DC_st="*bf16", DK="*bf16", DV="*bf16", KDK="*fp32",
               S="i32", NC="i32", d_qk="i32", d_hv="i32", scale="fp32", eps="fp32")
    cst = dict(L=L, B_LQ=blq, B_LKV=blkv, B_DQK=fqk, B_DHV=fhv, IS_EXP=is_exp,
               NORMALIZE=is_exp, HAS_DC_LAST=is_exp, DOT_PREC="tf32", USE_TMA=True)
    sig.update({k: "constexpr" for k in cst})
    src = ASTSource(fn=bw._dkv_fused_kernel, signature=sig, constexprs=cst)
    try:
        triton.compile(src, target=GPUTarget("cuda", 90, 128),
                       options={"num_warps": cfg["DKV_num_warps"], "num_stages": cfg["DKV_num_stages"]})
        return "ok" if cfg["FUSED_DKV"] else "not the default"
    except Exception as e:
        return (str(e).strip().splitlines() or ["?"])[0][:200]

print(json.dumps({f"L{L} {q}/{v} {'exp' if e else 'sig'}": compile_fused(L, q, v, e)
                  for L, q, v, e in json.loads(sys.argv[1])}))
"""


def test_fused_dkv_kernel_compiles_for_sm90_where_it_is_the_default():
    """The one-launch dK/dV kernel with TMA tiles and pipelined query tiles compiles for sm_90
    at every shape where ``bw_config`` makes it the default. Regression: with the inter-chunk
    products K dC_k and V dC_kᵀ before the query loop, Triton 3.6 aborted in its TMA lowering
    pass at 2 stages ("cannot RAUW a value with itself"); the kernel adds them after the loop."""
    configs = [[L, q, v, e] for L, q, v in ((128, 128, 256), (256, 128, 256), (128, 64, 128), (64, 64, 128))
               for e in (False, True)]
    env = dict(os.environ, TRITON_INTERPRET="0",
               PYTHONPATH=os.pathsep.join([str(KERNELS), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _CHILD_DKV, json.dumps(configs)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == len(configs)
    failed = {k: v for k, v in results.items() if v != "ok"}
    assert not failed, failed


@pytest.fixture(scope="module")
def compile_matrix(tmp_path_factory):
    """``kernel_matrix.py --compile-only`` in two worker processes with an empty Triton cache
    (so every specialisation is compiled here): (exit status, output, rows, summary)."""
    tmp = tmp_path_factory.mktemp("compile_matrix")
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp / "triton"),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(KERNELS),
                                           os.environ.get("PYTHONPATH", "")]))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, str(MATRIX), "--compile-only", "--jobs", "2",
                           "--quiet", "--out", str(tmp / "out")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    assert (tmp / "out" / "summary.json").exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(tmp / "out" / "kernel_matrix.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    summary = json.loads((tmp / "out" / "summary.json").read_text())
    return proc.returncode, proc.stdout + proc.stderr, rows, summary


def test_every_configuration_of_the_dispatch_compiles_for_sm90(compile_matrix):
    rc, output, rows, summary = compile_matrix
    failed = [f"{r['config']} ({r['path']}): {r['error']}" for r in rows if r["status"] != "ok"]
    assert not failed, f"{len(failed)} configurations fail to compile for sm_90:\n" + "\n".join(failed)
    assert rc == 0, output[-3000:]
    assert summary["rows"] == summary["cases"] == len(rows)
    # every launch compiled (a specialisation seen twice compiles once)
    assert 0 < summary["distinct_compiles"] <= summary["launches"]
    # the matrix reaches every value of every axis
    for variant in ("sig", "exp"):
        mine = [r for r in rows if r["variant"] == variant]
        for dtype in ("float32", "bfloat16", "float16"):
            xl = {r["chunk"] for r in mine if r["dtype"] == dtype and r["algorithm"] == "xl_chunk"}
            assert xl >= {str(L) for L in CHUNKS} | {"auto"}, (variant, dtype, xl)
            limit = {r["chunk"] for r in mine if r["dtype"] == dtype
                     and r["algorithm"] == "limit_chunk"}
            assert limit == {"16", "32", "64", "128"}, (variant, dtype, limit)
            for L in CHUNKS:      # each chunk meets every gate dtype
                assert {r["gate_dtype"] for r in mine if r["chunk"] == str(L)} == \
                    {"float32", "bfloat16", "float16"}, (variant, L)
        assert {r["initial_state"] for r in mine} == {"", "float32", "float16", "bfloat16"}
        assert {r["last_state"] for r in mine} == {"True", "False"}
        heads = {(int(r["d_qk"]), int(r["d_hv"])) for r in mine}
        assert {(64, 128), (128, 256), (256, 512), (48, 96), (160, 192), (33, 65)} <= heads
        paths = {r["path"].split()[0] for r in mine}
        want = {"two_level", "limit_chunk"} | ({"walk", "walk_two_level", "walk_segments",
                                                "walk_segments_two_level"}
                                               if variant == "sig" else set())
        assert paths == want, paths
    assert {r["normalize"] for r in rows if r["variant"] == "sig"} == {"True", "False"}
    assert (1024, 1024) in {(int(r["d_qk"]), int(r["d_hv"])) for r in rows}


def test_regression_exp_chunk256_16bit_gates_compile_through_the_public_function(compile_matrix):
    """The reported call, ``tfla.mlstm_exp(..., chunk_size=256)`` with bfloat16 or float16
    gates, forward and backward, for every q/k/v dtype: every kernel it launches compiles."""
    rows = [r for r in compile_matrix[2] if r["variant"] == "exp" and r["chunk"] == "256"
            and r["algorithm"] == "xl_chunk" and r["gate_dtype"] in ("bfloat16", "float16")]
    assert {(r["dtype"], r["gate_dtype"]) for r in rows} >= {
        ("bfloat16", "bfloat16"), ("bfloat16", "float16"), ("float16", "bfloat16")}
    assert {r["path"] for r in rows} == {"two_level L256"}
    failed = [f"{r['config']}: {r['error']}" for r in rows if r["status"] != "ok"]
    assert not failed, failed


#: a child's set-up: compile-only for sm_90, every compiled kernel's name and shared memory
#: recorded in ``seen``
_CHILD_SPY = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import kernel_matrix as km
km._set_up("compile")
import torch
from triton.runtime.jit import JITFunction
from tfla.triton.chunkwise import kernels
from tfla.triton.tuning import Tuning
mods = kernels()
rec, pfw, pbw = mods.recurrent, mods.parallel_fw, mods.parallel_bw
run, seen = JITFunction.run, []
def spy(self, *a, **kw):
    kernel = run(self, *a, **kw)
    seen.append([self.fn.__name__, kernel.metadata.shared])
    return kernel
JITFunction.run = spy
out = {}
"""

_CHILD_GLUON = _CHILD_SPY + r"""
for name, dtype, S, normalize, tuning in (
        ("bf16", torch.bfloat16, 600, False, Tuning()), ("fp16", torch.float16, 700, False, Tuning()),
        ("bf16 normalised", torch.bfloat16, 600, True, Tuning()),
        ("bf16 GLUON off", torch.bfloat16, 600, False,
         Tuning(fw={"GLUON": False}, bw={"GLUON": False}))):
    NC = -(-S // 256)
    q, k = (torch.randn(2, S, 256, dtype=dtype) for _ in range(2))
    v = torch.randn(2, S, 512, dtype=dtype)
    b, i = torch.randn(2, NC * 256), torch.randn(2, NC * 256)
    C = torch.randn(2, NC + 1, 256, 512, dtype=dtype)
    n, m = torch.zeros(2, NC + 1, 256), torch.zeros(2, NC + 1)
    seen.clear()
    pfw.parallel_fw(q, k, v, b, i, i, C, n, m, L=256, is_exp=False, normalize=normalize,
                    eps=1e-6, limit=False, tuning=tuning)
    nout = torch.ones(2, NC * 256)
    for has_c0 in (True, False):
        pbw.parallel_bw_dq(q, k, v, (b, b, i, i), m, nout, C, v.clone(), L=256, is_exp=False,
                           normalize=normalize, eps=1e-6, has_c0=has_c0, tuning=tuning)
    out[name] = seen[:]
print(json.dumps(out))
"""


def test_gluon_kernels_compile_for_sm90_where_rules_h8_and_b12_run_them():
    """Rule H8's Gluon H kernel (``chunkwise_parallel_fw_gluon``) and rule B12's Gluon dQ
    kernel (``chunkwise_parallel_bw_gluon``, with and without an initial state) compile for
    sm_90 in bfloat16 and float16, within the SM's 227 KB of shared memory, and are the
    kernels ``parallel_fw`` and ``parallel_bw_dq`` launch there; with the normaliser or
    ``GLUON`` off the Triton kernels run. (Triton's interpreter cannot run Gluon: their
    numerics are checked against float64 on the GPU, ``benchmarks/kernel_matrix.py``.)"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(KERNELS),
                                                       os.environ.get("PYTHONPATH", "")]))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", _CHILD_GLUON, str(MATRIX.parent)], env=env,
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    gluon = ["_parallel_fw_gluon_kernel", "_dq_gluon_kernel", "_dq_gluon_kernel"]
    for name in ("bf16", "fp16"):
        assert [k for k, _ in got[name]] == gluon, got[name]
        assert all(0 < smem <= 232448 for _, smem in got[name]), got[name]
    for name in ("bf16 normalised", "bf16 GLUON off"):
        assert [k for k, _ in got[name]] == ["_parallel_fw_kernel", "_dq_once_kernel",
                                            "_dq_once_kernel"], got[name]


_CHILD_GLUON_DKV = _CHILD_SPY + r"""
for name, dtype, d_qk, d_hv, L, S, normalize, tuning in (
        ("bf16 128/256 L128", torch.bfloat16, 128, 256, 128, 600, False, Tuning()),
        ("fp16 128/256 L256", torch.float16, 128, 256, 256, 700, False, Tuning()),
        ("bf16 64/128 L128", torch.bfloat16, 64, 128, 128, 300, False, Tuning()),
        ("fp16 64/128 L64 S<L", torch.float16, 64, 128, 64, 40, False, Tuning()),
        ("bf16 128/256 S<L", torch.bfloat16, 128, 256, 128, 100, False, Tuning()),
        ("bf16 normalised", torch.bfloat16, 128, 256, 128, 600, True, Tuning()),
        ("bf16 GLUON off", torch.bfloat16, 128, 256, 128, 600, False, Tuning(bw={"GLUON": False})),
        ("bf16 256/512 L256", torch.bfloat16, 256, 512, 256, 600, False, Tuning()),
        ("fp16 256/512 L256 S<L", torch.float16, 256, 512, 256, 200, False, Tuning()),
        ("bf16 256/512 normalised", torch.bfloat16, 256, 512, 256, 600, True, Tuning()),
        ("bf16 256/512 GLUON off", torch.bfloat16, 256, 512, 256, 600, False,
         Tuning(bw={"GLUON": False}))):
    NC = -(-S // L)
    q, k = (torch.randn(2, S, d_qk, dtype=dtype) for _ in range(2))
    v, dh = (torch.randn(2, S, d_hv, dtype=dtype) for _ in range(2))
    b = torch.randn(2, NC * L)
    dC = torch.randn(2, NC + 1, d_qk, d_hv, dtype=dtype)
    m, nout = torch.zeros(2, NC + 1), torch.ones(2, NC * L)
    seen.clear()
    for has_dc_last in (True, False):
        pbw.parallel_bw_dkv(q, k, v, (b, b, b, b), m, nout, dC, dh, L=L, is_exp=False,
                            normalize=normalize, eps=1e-6, has_dc_last=has_dc_last,
                            tuning=tuning)
    out[name] = seen[:]
print(json.dumps(out))
"""


def test_gluon_dkv_kernels_compile_for_sm90_where_rules_b13_and_b14_run_them():
    """Rule B13's Gluon dK/dV kernel (``chunkwise_parallel_bw_gluon._dkv_gluon_kernel``)
    compiles for sm_90 at both of rule B4's head pairs, in bfloat16 and float16, at L 64, 128
    and 256, with and without dC_last, within the SM's 227 KB of shared memory, and is what
    ``parallel_bw_dkv`` launches there; with the normaliser or ``GLUON`` off the Triton
    one-launch kernel runs. Rule B14's (``chunkwise_parallel_bw_gluon_once``) likewise at
    Figure 5's heads (256 / 512, L 256), where the Triton kernel is ``_dkv_once_kernel``.
    Regression: a sequence of one chunk without dC_last (the number of chunks 1 as a constant
    folded the inter-chunk part away) failed to lower in Triton 3.6. (Numerics: bit for bit
    against the Triton kernels on the GPU, ``benchmarks/check_dkv_once_gluon.py``; against
    float64, ``benchmarks/kernel_matrix.py``.)"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(KERNELS),
                                                       os.environ.get("PYTHONPATH", "")]))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", _CHILD_GLUON_DKV, str(MATRIX.parent)],
                          env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("bf16 128/256 L128", "fp16 128/256 L256", "bf16 64/128 L128",
                 "fp16 64/128 L64 S<L", "bf16 128/256 S<L"):
        assert [k for k, _ in got[name]] == ["_dkv_gluon_kernel"] * 2, (name, got[name])
        assert all(0 < smem <= 232448 for _, smem in got[name]), got[name]
    for name in ("bf16 normalised", "bf16 GLUON off"):
        assert [k for k, _ in got[name]] == ["_dkv_fused_kernel"] * 2, (name, got[name])
    for name in ("bf16 256/512 L256", "fp16 256/512 L256 S<L"):
        assert [k for k, _ in got[name]] == ["_dkv_once_gluon_kernel"] * 2, (name, got[name])
        assert all(0 < smem <= 232448 for _, smem in got[name]), got[name]
    for name in ("bf16 256/512 normalised", "bf16 256/512 GLUON off"):
        assert [k for k, _ in got[name]] == ["_dkv_once_kernel"] * 2, (name, got[name])
