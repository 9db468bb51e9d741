"""GPU benchmark: mLSTMexp xl_chunk and limit_chunk (ours) beside mlstm_kernels' limit_chunk.

Setting of the paper's Figure 4: embedding 4096, 16 heads, d_qk 128, d_hv 256,
bfloat16, 65,536 tokens (batch = 65,536 / S), S in {2048, 8192, 32768}; forward and
forward+backward (backward of a ones gradient, gradients set to None between calls);
median of 30 timed calls after 10 warm-ups, CUDA events around each call, no L2 flush
(timing, first call and peak memory through tflabench.run.measure);
peak memory = torch.cuda.max_memory_allocated during one call minus what was allocated
before it (inputs and the output gradient included in that base). Gates f ~ N(3, 1),
i ~ N(0, 1), the peers' benchmark setting.

Numerics (before timing): bf16 kernels against a float64 reference on the same rounded
inputs (tfla.reference.mlstm_chunkwise; gradients with normaliser and max states
detached, docs/tfla-kernels.md 3.1), and the float64 reference against mlstm_kernels'
torch references (chunkwise--native_autograd, parallel--native_stablef_autograd).

mlstm_kernels' own mLSTMexp xl_chunk aborts the process while compiling on triton 3.6;
``--peer-xl`` tries it in a subprocess only.

Run on a GPU node (docs/kernels.md, "Tuning rules", cites its results):
    python3 benchmarks/bench_exp.py --out DIR
Writes speed.csv, numerics.csv and env.json under --out and prints tables.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback

import torch

from tflabench.run.measure import first_call_seconds, peak_memory_bytes, time_callable

TOKENS = 65536
NH, D_QK, D_HV = 16, 128, 256
DEV = "cuda"
DTYPE = torch.bfloat16


def smoke_setup():
    """--smoke: tiny sizes on the CPU through TRITON_INTERPRET=1 (fp16; the interpreter's
    bf16 tl.dot is wrong), to check this script's own logic without a GPU."""
    global TOKENS, NH, D_QK, D_HV, DEV, DTYPE
    os.environ["TRITON_INTERPRET"] = "1"
    TOKENS, NH, D_QK, D_HV, DEV, DTYPE = 256, 2, 16, 32, "cpu", torch.float16
    torch.cuda.empty_cache = lambda: None


def env_info() -> dict:
    import triton
    info = {"torch": torch.__version__, "triton": triton.__version__,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "python": sys.version.split()[0]}
    try:
        from importlib.metadata import version
        info["mlstm_kernels"] = version("mlstm_kernels")
    except Exception as e:  # noqa: BLE001
        info["mlstm_kernels"] = f"unavailable: {e}"
    try:
        info["git_revision"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                              capture_output=True, text=True).stdout.strip()
    except Exception:  # noqa: BLE001
        info["git_revision"] = None
    return info


def make_inputs(B, S, *, dtype=None, gate_dtype=None, i_mean=0.0, seed=0,
                requires_grad=False, nh=None, d_qk=None, d_hv=None):
    dtype = dtype or DTYPE
    nh, d_qk, d_hv = nh or NH, d_qk or D_QK, d_hv or D_HV
    g = torch.Generator(device=DEV).manual_seed(seed)
    gate_dtype = gate_dtype or dtype

    def rn(*shape, dt=dtype, mean=0.0, std=1.0):
        x = torch.randn(*shape, generator=g, device=DEV, dtype=torch.float32) * std + mean
        return x.to(dt).requires_grad_(requires_grad)

    q = rn(B, nh, S, d_qk)
    k = rn(B, nh, S, d_qk)
    v = rn(B, nh, S, d_hv)
    i = rn(B, nh, S, dt=gate_dtype, mean=i_mean)
    f = rn(B, nh, S, dt=gate_dtype, mean=3.0)
    return q, k, v, i, f


# ---------------------------------------------------------------- implementations

class with_tuning:
    """fn run under a ``tfla.triton.tuning.Tuning`` (its fields as keyword arguments); the
    call's backward keeps it (the kernel configuration carries it)."""

    def __init__(self, fn, **fields):
        self.fn = fn
        self.fields = fields

    def __call__(self, *a):
        from tfla.triton.tuning import Tuning, use_tuning
        with use_tuning(Tuning(**self.fields)):
            return self.fn(*a)


def variants():
    """Tuning variants of our kernels, timed beside the defaults (docs/kernels.md, "Tuning rules")."""
    import tfla
    xl128 = lambda q, k, v, i, f: tfla.mlstm_exp(q, k, v, i, f, chunk_size=128)  # noqa: E731
    xl256 = lambda q, k, v, i, f: tfla.mlstm_exp(q, k, v, i, f, chunk_size=256)  # noqa: E731
    lim64 = lambda q, k, v, i, f: tfla.mlstm_exp(q, k, v, i, f, chunk_size=64,  # noqa: E731
                                                 algorithm="limit_chunk")
    return {
        "v xl L128 fw 128x64 dhv128 w8": with_tuning(
            xl128, fw={"B_LQ": 128, "B_LKV": 64, "B_DHV": 128, "num_warps": 8}),
        "v xl L128 fw 128x64 dhv64 w8": with_tuning(
            xl128, fw={"B_LQ": 128, "B_LKV": 64, "B_DHV": 64, "num_warps": 8}),
        "v xl L128 fw 128x128 dhv64 w8": with_tuning(
            xl128, fw={"B_LQ": 128, "B_LKV": 128, "B_DHV": 64, "num_warps": 8}),
        "v xl L128 rec 128x64 w8": with_tuning(xl128, state={"B_DQK": 128, "B_DHV": 64,
                                                                "num_warps": 8}),
        "v xl L128 rec 128x128 w8": with_tuning(xl128, state={"B_DQK": 128, "B_DHV": 128,
                                                                 "num_warps": 8}),
        "v xl L128 fw 128x64 dhv128 w8 + rec 128x64": with_tuning(
            xl128, fw={"B_LQ": 128, "B_LKV": 64, "B_DHV": 128, "num_warps": 8},
            state={"B_DQK": 128, "B_DHV": 64, "num_warps": 8}),
        "v xl L256 fw 128x64 dhv128 w8": with_tuning(
            xl256, fw={"B_LQ": 128, "B_LKV": 64, "B_DHV": 128, "num_warps": 8}),
        "v xl L128 recompute states": with_tuning(xl128, recompute_states=True),
        "v xl L128 fw stages3": with_tuning(xl128, fw={"num_stages": 3}),
        "v xl L128 fw B_dhv256 w8": with_tuning(xl128, fw={"B_DHV": 256, "num_warps": 8}),
        "v xl L128 bw stages1": with_tuning(xl128, bw={"num_stages": 1}),
        "v xl L128 bw B_dhv64": with_tuning(xl128, bw={"B_DHV": 64}),
        "v xl L128 rec stages2": with_tuning(xl128, state={"num_stages": 2}),
        "v xl L128 rec 128x32 w4": with_tuning(xl128, state={"B_DQK": 128, "B_DHV": 32,
                                                                "num_warps": 4}),
        "v xl L128 rec 128x32 w8": with_tuning(xl128, state={"B_DQK": 128, "B_DHV": 32,
                                                                "num_warps": 8}),
        "v xl L128 rec 64x128 w8": with_tuning(xl128, state={"B_DQK": 64, "B_DHV": 128,
                                                                "num_warps": 8}),
        "v xl L128 rec 128x64 w4": with_tuning(xl128, state={"B_DQK": 128, "B_DHV": 64,
                                                                "num_warps": 4}),
        "v xl L128 rec 128x64 w8 stages2": with_tuning(
            xl128, state={"B_DQK": 128, "B_DHV": 64, "num_warps": 8, "num_stages": 2}),
        "v xl L128 rec 64x64 (version 2)": with_tuning(
            xl128, state={"B_DQK": 64, "B_DHV": 64, "num_warps": 4}),
        "v lim L64 rec 64x64 (version 2)": with_tuning(
            lim64, state={"B_DQK": 64, "B_DHV": 64, "num_warps": 4}),
        "v xl L256 rec piece64": with_tuning(xl256, state={"PIECE": 64}),
        "v lim L64 bw w8": with_tuning(lim64, limit_bw={"num_warps": 8}),
        "v lim L64 bw 32x32": with_tuning(lim64, limit_bw={"B_DQK": 32, "B_DHV": 32}),
    }


def impls(include_sig_xl=True):
    """name -> callable(q, k, v, i, f) -> h."""
    import tfla
    from tfla.limit_chunk import mlstm_limit_chunk

    out = {
        "ours exp xl_chunk L128": lambda q, k, v, i, f: tfla.mlstm_exp(q, k, v, i, f, chunk_size=128),
        "ours exp xl_chunk L256": lambda q, k, v, i, f: tfla.mlstm_exp(q, k, v, i, f, chunk_size=256),
        "ours exp xl_chunk L512": lambda q, k, v, i, f: tfla.mlstm_exp(q, k, v, i, f, chunk_size=512),
        "ours exp limit_chunk L64": lambda q, k, v, i, f: tfla.mlstm_exp(
            q, k, v, i, f, chunk_size=64, algorithm="limit_chunk"),
        "ours exp limit_chunk L128": lambda q, k, v, i, f: tfla.mlstm_exp(
            q, k, v, i, f, chunk_size=128, algorithm="limit_chunk"),
        "ours sig limit_chunk L64": lambda q, k, v, i, f: mlstm_limit_chunk(
            q, k, v, i, f, variant="sig", chunk_size=64, normalize=False),
    }
    if include_sig_xl:
        out["ours sig xl_chunk L128 (issue 5)"] = lambda q, k, v, i, f: tfla.mlstm_sig(
            q, k, v, i, f, chunk_size=128, normalize=False)
    try:
        from mlstm_kernels.torch import get_mlstm_kernel
        peer = get_mlstm_kernel("chunkwise--triton_limit_chunk")
        out["peer exp limit_chunk L64"] = lambda q, k, v, i, f: peer(q, k, v, i, f, chunk_size=64)
    except Exception as e:  # noqa: BLE001
        print(f"peer limit_chunk unavailable: {e}")
    return out


def breakdown(rows, S=8192, n=10):
    """Per-kernel times (median of n) of our exp kernels at one S (Figure-4 sizes)."""
    from tfla.triton.chunkwise import kernels
    mods = kernels()
    rec, pfw, pbw, lbw = mods.recurrent, mods.parallel_fw, mods.parallel_bw, mods.limit_bw
    B = TOKENS // S
    q, k, v, i, f = make_inputs(B, S)
    flat = lambda x, *t: x.reshape(-1, *t).contiguous()  # noqa: E731
    qf, kf = flat(q, S, D_QK), flat(k, S, D_QK)
    vf, i_f, f_f = flat(v, S, D_HV), flat(i, S), flat(f, S)
    dh = torch.randn_like(vf)
    print(f"\nper-kernel breakdown, S={S} (ms, median of {n})")
    for name, L, limit in (("xl L128", 128, False), ("xl L256", 256, False), ("limit L64", 64, True)):
        gates = rec.chunk_gates(i_f, f_f, L=L, is_exp=True)
        states = rec.recurrent_fw(kf, vf, gates[1], gates[4], gates[5], None, None, None, L=L, is_exp=True)
        h, n_out = pfw.parallel_fw(qf, kf, vf, gates[0], gates[2], gates[3], states[0], states[1], states[2],
                                   L=L, is_exp=True, normalize=True, eps=1e-6, limit=limit)
        dC = rec.recurrent_bw(qf, gates[0], gates[3], states[2], n_out, dh, None, L=L, is_exp=True,
                              normalize=True, eps=1e-6, d_hv=D_HV)
        par = lbw.limit_parallel_bw if limit else pbw.parallel_bw
        parts = {
            "gates": lambda: rec.chunk_gates(i_f, f_f, L=L, is_exp=True),
            "recurrent_fw": lambda: rec.recurrent_fw(kf, vf, gates[1], gates[4], gates[5], None, None, None,
                                                     L=L, is_exp=True),
            "parallel_fw (H)": lambda: pfw.parallel_fw(qf, kf, vf, gates[0], gates[2], gates[3], states[0],
                                                       states[1], states[2], L=L, is_exp=True, normalize=True,
                                                       eps=1e-6, limit=limit),
            "recurrent_bw": lambda: rec.recurrent_bw(qf, gates[0], gates[3], states[2], n_out, dh, None, L=L,
                                                     is_exp=True, normalize=True, eps=1e-6, d_hv=D_HV),
            "parallel_bw (dQ dK dV)": lambda: par(qf, kf, vf, gates[:4], states[2], n_out, states[0], dC[0], dh,
                                                 L=L, is_exp=True, normalize=True, eps=1e-6),
        }
        for part, fn in parts.items():
            ms = time_call(fn, n_warmup=3, n_iter=n)
            rows.append(dict(kind="breakdown", impl=name, S=S, part=part, ms_median=statistics.median(ms)))
            print(f"{name:10s} {part:24s} {statistics.median(ms):7.3f}")
        del gates, states, h, n_out, dC
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- timing

def time_call(fn, n_warmup=10, n_iter=30):
    """Per-call milliseconds of ``fn`` through the harness's timer, each call started on an
    idle device (``tflabench.run.measure.time_callable`` with ``sync_each``)."""
    return time_callable(fn, device=DEV, warmup=n_warmup, iterations=n_iter, sync_each=True)


def _gib(nbytes, width):
    """Bytes as GiB in ``width`` columns; ``n/a`` where peak memory was not measured (CPU)."""
    return f"{nbytes / 2**30:{width}.2f}" if nbytes is not None else f"{'n/a':>{width}}"


def bench_one(fn, S, mode):
    B = TOKENS // S
    inputs = make_inputs(B, S, requires_grad=(mode == "fwdbw"))
    if mode == "fwd":
        def call():
            with torch.no_grad():
                fn(*inputs)
    else:
        dh = torch.ones(B, NH, S, D_HV, device=DEV, dtype=DTYPE)

        def call():
            h = fn(*inputs)
            h.backward(dh)
            for x in inputs:
                x.grad = None
    first_s = first_call_seconds(call, DEV)
    ms = time_call(call)
    mem = peak_memory_bytes(call, DEV)
    return statistics.median(ms), min(ms), max(ms), mem, first_s


def run_speed(names, seqs, modes, rows, deadline):
    """Time the implementations (and variants) named, all of impls() if none, or all
    variants for names == ["variants"]."""
    fns = impls()
    if names == ["variants"]:
        fns = variants()
        names = []
    elif names:
        fns = {**fns, **variants()}
    for S in seqs:
        for mode in modes:
            for name in names or fns:
                if name not in fns:
                    continue
                if time.time() > deadline:
                    print(f"time budget spent: skipping S={S} {mode} {name}")
                    continue
                try:
                    med, lo, hi, mem, first = bench_one(fns[name], S, mode)
                    row = dict(S=S, B=TOKENS // S, mode=mode, impl=name, ms_median=med, ms_min=lo,
                               ms_max=hi, peak_mem_bytes=mem, first_call_s=first, status="ok")
                except Exception as e:  # noqa: BLE001
                    row = dict(S=S, B=TOKENS // S, mode=mode, impl=name, status=f"error: {e!r}"[:300])
                    traceback.print_exc()
                rows.append(row)
                if row["status"] == "ok":
                    print(f"S={S:6d} {mode:6s} {name:36s} {row['ms_median']:8.3f} ms "
                          f"[{row['ms_min']:.3f}, {row['ms_max']:.3f}]  "
                          f"{_gib(row['peak_mem_bytes'], 6)} GiB  first {row['first_call_s']:.1f}s",
                          flush=True)
                else:
                    print(f"S={S:6d} {mode:6s} {name:36s} {row['status']}", flush=True)
                torch.cuda.empty_cache()


# ---------------------------------------------------------------- numerics

def errs(x, ref):
    """(relF, maxnorm, 99th percentile of the per-row relative error) against ref."""
    x = x.double()
    ref = ref.double()
    d = x - ref
    rows = (d.norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-300)).flatten() if ref.dim() == 4 else None
    p99 = torch.quantile(rows[:2 ** 24], 0.99).item() if rows is not None else float("nan")
    return (d.norm() / ref.norm()).item(), (d.abs().max() / ref.abs().max()).item(), p99


def fwdbw(fn, inputs, dh):
    xs = [x.detach().clone().requires_grad_(True) for x in inputs]
    h = fn(*xs)
    h.backward(dh.to(h.dtype))
    return [h.detach()] + [x.grad.detach() for x in xs]


def run_numerics(all_rows, S=2048, B=1, nh=4):
    from tfla.reference import mlstm_chunkwise
    import tfla
    from tfla.limit_chunk import mlstm_limit_chunk
    names = ["h", "dq", "dk", "dv", "di", "df"]
    rows = []
    if DEV == "cpu":
        S, nh = 128, 2
    for regime, i_mean in (("paper i~N(0,1)", 0.0), ("i~N(-10,1)", -10.0), ("i~N(10,1)", 10.0)):
        inp = make_inputs(B, S, gate_dtype=torch.float32, i_mean=i_mean, seed=1, nh=nh)
        g = torch.Generator(device=DEV).manual_seed(2)
        dh = torch.randn(B, nh, S, D_HV, generator=g, device=DEV).to(DTYPE)
        inp64 = [x.double() for x in inp]
        for variant, normalize in (("exp", True), ("sig", False)):
            ref = fwdbw(lambda *a: mlstm_chunkwise(*a, variant=variant, chunk_size=64,
                                                   normalize=normalize), inp64, dh.double())
            cands = {"float32 reference (conditioning baseline)": lambda *a: mlstm_chunkwise(
                *[x.float() for x in a], variant=variant, chunk_size=64, normalize=normalize)}
            if variant == "exp":
                cands["ours exp xl_chunk L128"] = lambda *a: tfla.mlstm_exp(*a, chunk_size=128)
                cands["ours exp xl_chunk L256"] = lambda *a: tfla.mlstm_exp(*a, chunk_size=256)
                cands["ours exp limit_chunk L64"] = lambda *a: tfla.mlstm_exp(
                    *a, chunk_size=64, algorithm="limit_chunk")
                try:
                    from mlstm_kernels.torch import get_mlstm_kernel
                    peer = get_mlstm_kernel("chunkwise--triton_limit_chunk")
                    cands["peer exp limit_chunk L64"] = lambda *a: peer(*a, chunk_size=64)
                    nat = get_mlstm_kernel("chunkwise--native_autograd")
                    par = get_mlstm_kernel("parallel--native_stablef_autograd")
                    # conventions: float64 peer torch references vs our float64 reference (h only;
                    # the peer's autograd differentiates through the normaliser,
                    # docs/tfla-kernels.md 1.5)
                    h_nat = nat(*inp64, chunk_size=64)
                    rows.append(dict(regime=regime, variant=variant,
                                     impl="peer chunkwise--native_autograd fp64 vs our fp64 ref",
                                     h=errs(h_nat, ref[0])))
                    if S <= 4096:
                        h_par = par(*inp64)
                        rows.append(dict(regime=regime, variant=variant,
                                         impl="peer parallel--native_stablef fp64 vs our fp64 ref",
                                         h=errs(h_par, ref[0])))
                except Exception as e:  # noqa: BLE001
                    print(f"peer numerics unavailable: {e!r}")
            else:
                cands["ours sig limit_chunk L64"] = lambda *a: mlstm_limit_chunk(
                    *a, variant="sig", chunk_size=64, normalize=False)
            for name, fn in cands.items():
                try:
                    out = fwdbw(fn, inp, dh)
                    bad = [n for n, x in zip(names, out) if not torch.isfinite(x).all()]
                    row = dict(regime=regime, variant=variant, impl=name, nonfinite=bad)
                    for n, x, r in zip(names, out, ref):
                        row[n] = errs(x, r)
                except Exception as e:  # noqa: BLE001
                    row = dict(regime=regime, variant=variant, impl=name, error=repr(e)[:300])
                    traceback.print_exc()
                rows.append(row)
    print("\nnumerics (bf16 vs float64 reference, relF / maxnorm / p99 row), B=%d NH=%d S=%d" % (B, nh, S))
    for r in rows:
        cells = " ".join(f"{n}={r[n][0]:.1e}/{r[n][1]:.1e}/{r[n][2]:.1e}" for n in names if n in r)
        extra = f" NONFINITE {r['nonfinite']}" if r.get("nonfinite") else ""
        extra += f" ERROR {r['error']}" if r.get("error") else ""
        all_rows.append(r)
        print(f"{r.get('regime', r.get('check', '')):15s} {r.get('variant', '')} {r['impl']:52s} {cells}{extra}")


def run_gpu_checks(rows, d_qk=192, d_hv=96):
    """Small GPU shapes with the awkward cases: ragged S, d_qk != d_hv, d_qk > 128 (several
    d_qk blocks, atomic row sums; d_qk <= 128: one block), initial state, a
    gradient on the last state."""
    from tfla.reference import mlstm_chunkwise
    import tfla
    from tfla.limit_chunk import mlstm_limit_chunk
    B, nh, S = (2, 3, 1000) if DEV == "cuda" else (1, 1, 100)
    if DEV != "cuda":
        d_qk, d_hv = 40, 24
    g = torch.Generator(device=DEV).manual_seed(5)

    def rn(*shape, mean=0.0, std=1.0):
        return torch.randn(*shape, generator=g, device=DEV) * std + mean

    base = [rn(B, nh, S, d_qk).to(DTYPE), rn(B, nh, S, d_qk).to(DTYPE), rn(B, nh, S, d_hv).to(DTYPE),
            rn(B, nh, S, std=3.0), rn(B, nh, S, mean=3.0)]
    init = [rn(B, nh, d_qk, d_hv), rn(B, nh, d_qk).abs(), rn(B, nh)]
    dh = rn(B, nh, S, d_hv)
    dC = rn(B, nh, d_qk, d_hv)

    def run(fn, xs, st, dtype):
        xs = [x.detach().to(dtype if x.dim() == 4 else x.dtype).clone().requires_grad_(True) for x in xs]
        st = [x.detach().to(torch.float64 if dtype == torch.float64 else x.dtype).clone().requires_grad_(True)
              for x in st]
        h, last = fn(*xs, initial_state=tuple(st), return_last_state=True)
        ((h.double() * dh.double()).sum() + (last[0].double() * dC.double()).sum()).backward()
        return [h, last[0]] + [x.grad for x in xs] + [st[0].grad]

    names = ["h", "C_last", "dq", "dk", "dv", "di", "df", "dC0"]
    cases = [("exp", True, "ours exp xl_chunk L128", lambda *a, **kw: tfla.mlstm_exp(*a, chunk_size=128, **kw)),
             ("exp", True, "ours exp xl_chunk L256", lambda *a, **kw: tfla.mlstm_exp(*a, chunk_size=256, **kw)),
             ("exp", True, "ours exp limit_chunk L64", lambda *a, **kw: tfla.mlstm_exp(
                 *a, chunk_size=64, algorithm="limit_chunk", **kw)),
             ("sig", False, "ours sig limit_chunk L64", lambda *a, **kw: mlstm_limit_chunk(
                 *a, variant="sig", chunk_size=64, normalize=False, **kw)),
             ("sig", True, "ours sig limit_chunk L128 norm", lambda *a, **kw: mlstm_limit_chunk(
                 *a, variant="sig", chunk_size=128, normalize=True, **kw))]
    refs = {}
    print(f"\nGPU checks (bf16, B={B} NH={nh} S={S} d_qk={d_qk} d_hv={d_hv}, initial state, dC_last), relF/maxnorm")
    for variant, norm, name, fn in cases:
        key = (variant, norm)
        if key not in refs:
            refs[key] = run(lambda *a, **kw: mlstm_chunkwise(*a, variant=variant, normalize=norm, chunk_size=64, **kw),
                            [x.double() for x in base], [x.double() for x in init], torch.float64)
        try:
            out = run(fn, base, init, DTYPE)
            row = dict(check="gpu", impl=name, nonfinite=[n for n, x in zip(names, out) if not torch.isfinite(x).all()])
            for n, x, r in zip(names, out, refs[key]):
                row[n] = errs(x, r)
        except Exception as e:  # noqa: BLE001
            row = dict(check="gpu", impl=name, error=repr(e)[:300])
            traceback.print_exc()
        rows.append(row)
        cells = " ".join(f"{n}={row[n][0]:.1e}/{row[n][1]:.1e}" for n in names if n in row)
        print(f"{name:34s} {cells} {row.get('nonfinite') or ''} {row.get('error', '')}")


def peer_xl_probe(S=2048):
    """Try mlstm_kernels' mLSTMexp xl_chunk in a subprocess (it aborts on triton 3.6)."""
    code = ("import torch; from mlstm_kernels.torch import get_mlstm_kernel;"
            "fn=get_mlstm_kernel('chunkwise--triton_xl_chunk');"
            f"q=torch.randn(1,4,{S},128,device='cuda',dtype=torch.bfloat16);"
            f"v=torch.randn(1,4,{S},256,device='cuda',dtype=torch.bfloat16);"
            f"i=torch.randn(1,4,{S},device='cuda');f=i+3;"
            "h=fn(q,q,v,i,f,chunk_size=128);torch.cuda.synchronize();print('ran',h.float().abs().mean().item())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    return p.returncode, (p.stdout + p.stderr)[-600:]


def print_table(rows):
    seqs = sorted({r["S"] for r in rows})
    impl_names = list(dict.fromkeys(r["impl"] for r in rows))
    for mode in ("fwd", "fwdbw"):
        print(f"\n{mode}: ms_median (peak GiB above inputs)")
        print(f"{'impl':40s}" + "".join(f"{'S=' + str(s):>22s}" for s in seqs))
        for name in impl_names:
            cells = []
            for s in seqs:
                r = next((r for r in rows if r["impl"] == name and r["S"] == s and r["mode"] == mode), None)
                if r is None:
                    cells.append(f"{'-':>22s}")
                elif r["status"] != "ok":
                    cells.append(f"{'error':>22s}")
                else:
                    cells.append(f"{r['ms_median']:>12.3f} ({_gib(r['peak_mem_bytes'], 5)})")
            print(f"{name:40s}" + "".join(cells))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--seqs", default="2048,8192,32768")
    ap.add_argument("--modes", default="fwd,fwdbw")
    ap.add_argument("--impls", default="", help="comma-separated subset of implementation names")
    ap.add_argument("--no-numerics", action="store_true")
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument("--peer-xl", action="store_true")
    ap.add_argument("--variants", action="store_true", help="also time the tuning variants")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU dry run (interpreter)")
    ap.add_argument("--breakdown", action="store_true", help="per-kernel times at one S")
    ap.add_argument("--breakdown-s", type=int, default=8192, help="the S of --breakdown")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting timings after this")
    args = ap.parse_args()
    if args.smoke:
        smoke_setup()
    os.makedirs(args.out, exist_ok=True)
    info = env_info()
    print(json.dumps(info))
    with open(os.path.join(args.out, "env.json"), "w") as fh:
        json.dump(info, fh, indent=1)
    if args.peer_xl:
        rc, tail = peer_xl_probe()
        print(f"peer mLSTMexp xl_chunk probe: returncode {rc}\n{tail}")
    t_start = time.time()
    deadline = t_start + args.budget_s
    if not args.no_numerics:
        nrows = []
        run_gpu_checks(nrows)
        run_gpu_checks(nrows, d_qk=64, d_hv=96)
        run_numerics(nrows)
        with open(os.path.join(args.out, "numerics.json"), "w") as fh:
            json.dump(nrows, fh, indent=1)
    if args.breakdown:
        brows = []
        breakdown(brows, S=min(args.breakdown_s, TOKENS))
        with open(os.path.join(args.out, "breakdown.json"), "w") as fh:
            json.dump(brows, fh, indent=1)
    if not args.no_speed:
        rows = []
        names = [n.strip() for n in args.impls.split(",") if n.strip()]
        seqs = [int(s) for s in args.seqs.split(",")]
        run_speed(names, seqs, args.modes.split(","), rows, deadline)
        if args.variants:
            run_speed(["variants"], seqs, args.modes.split(","), rows, deadline)
        import csv
        keys = sorted({k for r in rows for k in r})
        with open(os.path.join(args.out, "speed.csv"), "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
        print_table(rows)


if __name__ == "__main__":
    main()
