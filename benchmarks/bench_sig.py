"""mLSTMsig xl_chunk on one GPU: numerics at the paper's sizes and speed beside the peers.

One self-contained script (issue 5):

(a) numerics, bf16 at d_qk 128 / d_hv 256: our kernel and mlstm_kernels'
    ``chunkwise--triton_xl_chunk_siging`` (same inputs, normalize=False), each against a
    float64 reference (tfla.reference.mlstm_chunkwise on the same rounded inputs, gradients
    by autograd); relF = ||x - ref|| / ||ref|| and maxnorm = max|x - ref| / max|ref| for h,
    dq, dk, dv, di, df; checked against the error budget below;
(b) speed at the paper's Figure-4 setting (16 heads, d_qk 128, d_hv 256, bf16, 65,536
    tokens, S in {2048, 8192, 32768}): ours (chunk 128 and other chunks), mlstm_kernels
    (chunk 128), FLA chunk_simple_gla (forward); fwd and fwd+bwd; median of 30 calls after
    10 warm-ups, CUDA events around each call; peak memory above the inputs;
(c) the Figure-5 sweep (8 heads, d_qk 256, d_hv 512, S 8192, batch 8, chunk 64..1024).

(d) bwdcmp: our backward paths ("chunk", "walk", tile overrides) beside mlstm_kernels at the
    Figure-4 setting; profile: GPU time per kernel (torch.profiler) of our default fwd+bwd.

Usage (device): python3 benchmarks/bench_sig.py
[--sections bwdcmp,check,numerics,profile,fig4,tune,fig5]
[--out DIR] [--quick]. Needs kernels/ on PYTHONPATH; peers optional (missing ones are
reported, not fatal).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback

import torch

try:
    import tfla  # noqa: F401
except ImportError:  # run from the repository root without installing
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "kernels"))
from tfla import mlstm_sig  # noqa: E402
from tfla.reference import mlstm_chunkwise  # noqa: E402

# Error budget (bf16 inputs, vs float64 on the same rounded inputs), docs/tfla-kernels.md 5.2:
# h, dq, dk, dv, di relF <= 5e-3 and maxnorm <= 2e-2; df relF <= 1e-2 (target); and never
# worse than the peer by more than 10% (+1e-4) on any quantity.
BUDGET_RELF = {"h": 5e-3, "dq": 5e-3, "dk": 5e-3, "dv": 5e-3, "di": 5e-3, "df": 1e-2}
BUDGET_MAXNORM = {"h": 2e-2, "dq": 2e-2, "dk": 2e-2, "dv": 2e-2, "di": 2e-2, "df": 5e-2}

LOG = []
LOG_PATH = None


def log(msg=""):
    print(msg, flush=True)
    LOG.append(str(msg))
    if LOG_PATH:
        with open(LOG_PATH, "a") as fh:
            fh.write(str(msg) + "\n")


# ---------------------------------------------------------------- inputs and callers

def make_inputs(B, NH, S, d_qk, d_hv, *, i_mean=0.0, f_mean=3.0, seed=0, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, NH, S, d_qk, device="cuda", generator=g).to(dtype)
    k = torch.randn(B, NH, S, d_qk, device="cuda", generator=g).to(dtype)
    v = torch.randn(B, NH, S, d_hv, device="cuda", generator=g).to(dtype)
    i = (i_mean + torch.randn(B, NH, S, device="cuda", generator=g))
    f = (f_mean + torch.randn(B, NH, S, device="cuda", generator=g))
    return q, k, v, i, f


def ours(chunk, bwd=None, ov=None):
    """Our mlstm_sig at chunk size ``chunk``; ``bwd`` picks the backward path ("walk" or
    "chunk") and ``ov`` further tfla.triton.common.OVERRIDES, for the calls made through this
    function only."""
    from tfla.triton import common

    extra = dict(ov or {}, **({"bwd": bwd} if bwd else {}))

    def fn(q, k, v, i, f):
        if not extra:
            return mlstm_sig(q, k, v, i, f, chunk_size=chunk, normalize=False)
        before = dict(common.OVERRIDES)
        common.OVERRIDES.update(extra)
        try:
            return mlstm_sig(q, k, v, i, f, chunk_size=chunk, normalize=False)
        finally:
            common.OVERRIDES.clear()
            common.OVERRIDES.update(before)
    return fn


def peer_sig(chunk):
    from mlstm_kernels.torch import get_mlstm_kernel

    kern = get_mlstm_kernel("chunkwise--triton_xl_chunk_siging")

    def fn(q, k, v, i, f):
        return kern(q, k, v, i, f, chunk_size=chunk, normalize=False, return_last_states=False)
    return fn


def fla_simple_gla():
    from fla.ops.simple_gla import chunk_simple_gla

    def prep(q, k, v, i, f):
        t = lambda x: x.transpose(1, 2).contiguous()  # (B, T, H, D)
        return t(q), t(k), t(v), torch.nn.functional.logsigmoid(f).transpose(1, 2).contiguous()

    def fn(qt, kt, vt, gt):
        o, _ = chunk_simple_gla(qt, kt, vt, g=gt, scale=qt.shape[-1] ** -0.5)
        return o
    return prep, fn


# ---------------------------------------------------------------- measurement

def time_calls(call, n_warm=10, n_rep=30):
    """Median / min / max ms of n_rep calls after n_warm warm-ups (CUDA events per call)."""
    for _ in range(n_warm):
        call()
    torch.cuda.synchronize()
    ms = []
    for _ in range(n_rep):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        call()
        b.record()
        torch.cuda.synchronize()
        ms.append(a.elapsed_time(b))
    return statistics.median(ms), min(ms), max(ms)


def peak_above_inputs(call):
    """Peak bytes allocated during one call (outputs kept), above what was allocated before."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak


def measure(fn, inputs, mode, dh=None, grad_idx=(0, 1, 2, 3, 4)):
    """{'ms': median, 'ms_min', 'ms_max', 'peak_gib', 'first_s'} of fn(*inputs) for mode."""
    if mode == "fwd":
        def call():
            with torch.no_grad():
                return fn(*inputs)
    else:
        leaves = [inputs[j] for j in grad_idx]

        def call():
            h = fn(*inputs)
            return torch.autograd.grad(h, leaves, dh)
    t0 = time.perf_counter()
    call()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    med, lo, hi = time_calls(call)
    peak = peak_above_inputs(call)
    return dict(ms=med, ms_min=lo, ms_max=hi, peak_gib=peak / 2**30, first_s=first)


def ceilings():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms, _, _ = time_calls(lambda: a @ b, 3, 10)
    tflops = 2 * 8192**3 / (ms * 1e-3) / 1e12
    x = torch.empty(2**31, device="cuda", dtype=torch.uint8).random_()   # 2 GiB
    y = torch.empty_like(x)
    ms2, _, _ = time_calls(lambda: y.copy_(x), 3, 10)
    tbs = 2 * x.numel() / (ms2 * 1e-3) / 1e12
    del a, b, x, y
    torch.cuda.empty_cache()
    return tflops, tbs


# ---------------------------------------------------------------- (0) GPU correctness

def run_check(args, results):
    """Compiled kernels vs float64 reference at small odd shapes (ragged S, non-power-of-two
    heads, several chunk sizes, normalize, initial/last state, forced segments/blocks)."""
    from tfla.reference import mlstm_recurrent  # noqa: F401
    from tfla.triton import common

    log("\n== (0) GPU correctness vs float64 (maxnorm errors: h, C_S, dq, dk, dv, di, df, dC0) ==")
    cases = [
        dict(dtype=torch.float32, B=2, NH=3, S=1000, d_qk=64, d_hv=96, L=64, normalize=False,
             init=True, ov={"chunks_per_seg": 3, "BDHV": 32, "BDHV_B": 32}),
        dict(dtype=torch.float32, B=1, NH=2, S=300, d_qk=128, d_hv=256, L=128, normalize=True,
             init=False, ov={}),
        dict(dtype=torch.bfloat16, B=1, NH=2, S=777, d_qk=256, d_hv=512, L=256, normalize=False,
             init=True, ov={"chunks_per_seg": 1}),
        dict(dtype=torch.float16, B=2, NH=2, S=129, d_qk=32, d_hv=48, L=16, normalize=True,
             init=True, ov={"chunks_per_seg": 2}),
    ]
    if args.check_cases:
        cases = [cases[int(j)] for j in args.check_cases.split(",")]
    if args.check_bwd:
        cases = [dict(c, ov=dict(c["ov"], bwd=path)) for path in args.check_bwd.split(",")
                 for c in cases]
    for cs in cases:
        common.OVERRIDES.clear()
        common.OVERRIDES.update(cs["ov"])
        B, NH, S, dq_, dv_ = cs["B"], cs["NH"], cs["S"], cs["d_qk"], cs["d_hv"]
        q, k, v, i, f = make_inputs(B, NH, S, dq_, dv_, seed=S, dtype=cs["dtype"])
        i = i * 4
        init = None
        if cs["init"]:
            init = (torch.randn(B, NH, dq_, dv_, device="cuda"),
                    torch.randn(B, NH, dq_, device="cuda").abs())
        xs = [x.clone().requires_grad_() for x in (q, k, v, i, f)]
        leaves = xs + ([init[0].requires_grad_()] if init else [])
        try:
            t0 = time.time()
            h, (C, n) = mlstm_sig(*xs, chunk_size=cs["L"], normalize=cs["normalize"],
                                  initial_state=init, return_last_state=True)
            dh = torch.randn_like(h)
            dC = torch.randn_like(C)
            gr = torch.autograd.grad([h, C], leaves, [dh, dC])
            xr = [x.detach().double().requires_grad_() for x in leaves]
            ir = (xr[5], init[1].double()) if init else None
            hr, (Cr, nr) = mlstm_chunkwise(*xr[:5], variant="sig", chunk_size=64,
                                           normalize=cs["normalize"], eps=1e-6,
                                           initial_state=ir, return_last_state=True)
            grr = torch.autograd.grad([hr, Cr], xr, [dh.double(), dC.double()])
            e = [errs(h, hr)[1], errs(C, Cr)[1]] + [errs(a, b)[1] for a, b in zip(gr, grr)]
            tol = 2e-2 if cs["dtype"] != torch.float32 else 1e-4
            ok = all(x < tol for x in e) and all(math.isfinite(x) for x in e)
            log(f"check {str(cs['dtype']):15s} S={S} d={dq_}/{dv_} L={cs['L']} norm={cs['normalize']} "
                f"init={cs['init']} ov={cs['ov']}: " + " ".join(f"{x:.1e}" for x in e)
                + f" -> {'OK' if ok else 'FAIL'} ({time.time() - t0:.0f}s)")
            results.setdefault("check", []).append(dict(case=str(cs), errors=e, ok=ok))
        except Exception as ex:  # noqa: BLE001
            log(f"check {cs}: ERROR {ex!r}"[:600])
            traceback.print_exc()
    common.OVERRIDES.clear()


# ---------------------------------------------------------------- (a) numerics

def errs(x, ref):
    x = x.double()
    ref = ref.double()
    relf = ((x - ref).norm() / ref.norm().clamp_min(1e-300)).item()
    maxn = ((x - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item()
    return relf, maxn


def run_numerics(args, results):
    log("\n== (a) numerics: bf16, B=1, NH=4, d_qk=128, d_hv=256, vs float64 reference ==")
    shapes = [(2048, 0.0), (8192, 0.0), (2048, -10.0)] if not args.quick else [(2048, 0.0)]
    impls = [("ours L=128", ours(128)), ("ours L=64", ours(64))]
    if args.numerics_bwd:
        impls = [(f"ours L=128 {p}", ours(128, p)) for p in args.numerics_bwd.split(",")]
    try:
        impls.append(("mlstm_kernels L=128", peer_sig(128)))
    except Exception as e:  # noqa: BLE001
        log(f"mlstm_kernels unavailable: {e!r}")
    names = ["h", "dq", "dk", "dv", "di", "df"]
    for S, i_mean in shapes:
        q, k, v, i, f = make_inputs(1, 4, S, 128, 256, i_mean=i_mean, seed=S + 7)
        g = torch.Generator(device="cuda").manual_seed(99)
        dh = torch.randn(1, 4, S, 256, device="cuda", generator=g).to(torch.bfloat16)
        xr = [x.double().requires_grad_() for x in (q, k, v, i, f)]
        href = mlstm_chunkwise(*xr, variant="sig", chunk_size=64, normalize=False)
        gref = torch.autograd.grad(href, xr, dh.double())
        refs = [href.detach()] + list(gref)
        del xr
        per_impl = {}
        for name, fn in impls:
            try:
                xs = [x.clone().requires_grad_() for x in (q, k, v, i, f)]
                h = fn(*xs)
                gr = torch.autograd.grad(h, xs, dh)
                vals = [h.detach()] + list(gr)
                per_impl[name] = {n: errs(a, r) for n, a, r in zip(names, vals, refs)}
                bad = [n for n, a in zip(names, vals) if not torch.isfinite(a).all()]
                if bad:
                    per_impl[name]["nonfinite"] = bad
            except Exception as e:  # noqa: BLE001
                per_impl[name] = {"error": repr(e)[:300]}
        log(f"-- S={S}, i~N({i_mean},1), f~N(3,1): relF / maxnorm")
        log(f"{'impl':22s}" + "".join(f"{n:>20s}" for n in names))
        for name, e in per_impl.items():
            if "error" in e:
                log(f"{name:22s} ERROR {e['error']}")
                continue
            log(f"{name:22s}" + "".join(f"{e[n][0]:9.2e} /{e[n][1]:9.2e}" for n in names))
        verdicts = []
        peer = per_impl.get("mlstm_kernels L=128")
        for name, e in per_impl.items():
            if not name.startswith("ours") or "error" in e:
                continue
            ok = "nonfinite" not in e
            for n in names:
                if e[n][0] > BUDGET_RELF[n] or e[n][1] > BUDGET_MAXNORM[n]:
                    ok = False
                    verdicts.append(f"{name} {n} over budget")
                if peer and "error" not in peer and e[n][0] > 1.1 * peer[n][0] + 1e-4:
                    ok = False
                    verdicts.append(f"{name} {n} worse than peer ({e[n][0]:.2e} > {peer[n][0]:.2e})")
            verdicts.append(f"{name}: {'PASS' if ok else 'FAIL'}")
        log("budget: " + "; ".join(verdicts))
        results.setdefault("numerics", []).append(dict(S=S, i_mean=i_mean, errors=per_impl))
        del q, k, v, i, f, dh, refs
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- (b), (c) speed

def speed_rows(setting, B, NH, S, d_qk, d_hv, our_chunks, peer_chunks, with_fla, results,
               modes=("fwd", "fwdbw")):
    q, k, v, i, f = make_inputs(B, NH, S, d_qk, d_hv, seed=S)
    leaves = [x.requires_grad_() for x in (q, k, v, i, f)]
    dh = torch.randn(B, NH, S, d_hv, device="cuda").to(torch.bfloat16)
    rows = []
    cands = [(f"ours L={c}", ours(c), c) for c in our_chunks]
    for c in peer_chunks:
        try:
            cands.append((f"mlstm_kernels L={c}", peer_sig(c), c))
        except Exception as e:  # noqa: BLE001
            log(f"mlstm_kernels unavailable: {e!r}")
    for name, fn, c in cands:
        for mode in modes:
            try:
                m = measure(fn, leaves, mode, dh=dh)
                rows.append(dict(setting=setting, impl=name, chunk=c, S=S, B=B, mode=mode, **m))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(setting=setting, impl=name, chunk=c, S=S, B=B, mode=mode,
                                 error=repr(e)[:300]))
                log(f"{name} {mode} S={S}: ERROR {e!r}"[:400])
                if os.environ.get("BENCH_TRACEBACK"):
                    traceback.print_exc()
            torch.cuda.empty_cache()
    if with_fla:
        try:
            prep, fn = fla_simple_gla()
            with torch.no_grad():
                xs = prep(*[x.detach() for x in leaves])
            m = measure(fn, xs, "fwd")
            rows.append(dict(setting=setting, impl="fla chunk_simple_gla", chunk=64, S=S, B=B,
                             mode="fwd", **m))
            del xs
        except Exception as e:  # noqa: BLE001
            rows.append(dict(setting=setting, impl="fla chunk_simple_gla", chunk=64, S=S, B=B,
                             mode="fwd", error=repr(e)[:300]))
            log(f"fla fwd S={S}: ERROR {e!r}"[:400])
    for r in rows:
        if "error" not in r:
            log(f"{r['setting']:5s} S={S:6d} B={B:3d} {r['impl']:22s} {r['mode']:6s} "
                f"{r['ms']:8.3f} ms (min {r['ms_min']:.3f}, max {r['ms_max']:.3f}) "
                f"peak {r['peak_gib']:6.2f} GiB first {r['first_s']:.1f}s")
    results.setdefault("speed", []).extend(rows)
    del q, k, v, i, f, leaves, dh
    torch.cuda.empty_cache()
    return rows


def run_bwdcmp(args, results):
    """Fig. 4 setting: our backward paths side by side with mlstm_kernels (same run)."""
    log("\n== backward paths vs mlstm_kernels: Fig. 4 setting (16 heads, d_qk 128, d_hv 256) ==")
    cands = json.loads(args.bwdcmp)
    for S in [int(x) for x in args.bwdcmp_S.split(",")]:
        B = 65536 // S
        q, k, v, i, f = make_inputs(B, 16, S, 128, 256, seed=S)
        leaves = [x.requires_grad_() for x in (q, k, v, i, f)]
        dh = torch.randn(B, 16, S, 256, device="cuda").to(torch.bfloat16)
        for cand in cands:
            if "S" in cand and S not in cand["S"]:
                continue
            chunk, path, modes = cand["chunk"], cand.get("bwd"), cand.get("modes", ["fwdbw"])
            if path == "peer":
                try:
                    fn, name = peer_sig(chunk), f"mlstm_kernels L={chunk}"
                except Exception as e:  # noqa: BLE001
                    log(f"mlstm_kernels unavailable: {e!r}")
                    continue
            else:
                fn = ours(chunk, path, cand.get("ov"))
                name = f"ours L={chunk}" + (f" {path}" if path else "") + (
                    " " + json.dumps(cand["ov"]) if cand.get("ov") else "")
            for mode in modes:
                try:
                    m = measure(fn, leaves, mode, dh=dh)
                    log(f"bwdcmp S={S:6d} B={B:3d} {name:24s} {mode:6s} {m['ms']:8.3f} ms "
                        f"(min {m['ms_min']:.3f}, max {m['ms_max']:.3f}) peak {m['peak_gib']:5.2f} GiB "
                        f"first {m['first_s']:.1f}s")
                    results.setdefault("speed", []).append(
                        dict(setting="bwdcmp", impl=name, chunk=chunk, S=S, B=B, mode=mode, **m))
                except Exception as e:  # noqa: BLE001
                    log(f"bwdcmp S={S} {name} {mode}: ERROR {e!r}"[:600])
                    if os.environ.get("BENCH_TRACEBACK"):
                        traceback.print_exc()
                torch.cuda.empty_cache()
        del q, k, v, i, f, leaves, dh
        torch.cuda.empty_cache()


def run_profile(args, results):
    """GPU time per kernel of our fwd+bwd (default path, chunk 128) at Fig. 4, S 8192 and 32768
    (torch.profiler, 3 calls after a warm-up)."""
    from torch.profiler import ProfilerActivity, profile

    for S in (8192, 32768):
        B = 65536 // S
        q, k, v, i, f = make_inputs(B, 16, S, 128, 256, seed=S)
        leaves = [x.requires_grad_() for x in (q, k, v, i, f)]
        dh = torch.randn(B, 16, S, 256, device="cuda").to(torch.bfloat16)
        fn = ours(128)

        def call():
            return torch.autograd.grad(fn(*leaves), leaves, dh)
        call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                call()
            torch.cuda.synchronize()
        log(f"\n== profile: ours L=128 fwd+bwd, S={S}, 3 calls (times are totals over 3) ==")
        log(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=44))
        del q, k, v, i, f, leaves, dh
        torch.cuda.empty_cache()


def run_fig4(args, results):
    log("\n== (b) Figure-4 setting: 16 heads, d_qk 128, d_hv 256, bf16, 65,536 tokens ==")
    Ss = [2048, 8192, 32768] if not args.quick else [8192]
    for S in Ss:
        speed_rows("fig4", 65536 // S, 16, S, 128, 256, args.our_chunks, [128], True, results)


def run_fig5(args, results):
    log("\n== (c) Figure-5 sweep: 8 heads, d_qk 256, d_hv 512, S 8192, batch 8 ==")
    chunks = [64, 128, 256, 512, 1024] if not args.quick else [128]
    speed_rows("fig5", 8, 8, 8192, 256, 512, chunks, chunks, False, results)


def run_tune(args, results):
    """Time variants of the tile heuristic (tfla.triton.common.OVERRIDES) at Fig. 4, S=8192."""
    from tfla.triton import common

    log("\n== tune: variants of the heuristic, Fig. 4 S=8192 ==")
    variants = json.loads(args.tune) if args.tune else [{}]
    cur_S = None
    for ov in variants:
        ov = dict(ov)
        chunk = ov.pop("chunk", 128)
        S = ov.pop("S", 8192)
        modes = ov.pop("modes", ["fwd", "fwdbw"])
        if S != cur_S:
            q, k, v, i, f = make_inputs(65536 // S, 16, S, 128, 256, seed=1)
            leaves = [x.requires_grad_() for x in (q, k, v, i, f)]
            dh = torch.randn(*v.shape, device="cuda").to(torch.bfloat16)
            cur_S = S
        common.OVERRIDES.clear()
        common.OVERRIDES.update(ov)
        for mode in modes:
            try:
                m = measure(ours(chunk), leaves, mode, dh=dh)
                log(f"tune S={S} L={chunk} {json.dumps(ov):60s} {mode:6s} {m['ms']:8.3f} ms "
                    f"peak {m['peak_gib']:.2f} GiB first {m['first_s']:.0f}s")
                results.setdefault("tune", []).append(dict(S=S, chunk=chunk, overrides=ov,
                                                           mode=mode, **m))
            except Exception as e:  # noqa: BLE001
                log(f"tune S={S} L={chunk} {json.dumps(ov)} {mode} ERROR {e!r}"[:400])
    common.OVERRIDES.clear()


def summary(results, info):
    log("\n== summary ==")
    log(json.dumps(info))
    rows = [r for r in results.get("speed", []) if "error" not in r]
    if not rows:
        return
    log(f"{'set':5s} {'S':>6s} {'impl':22s} {'fwd ms':>8s} {'fwdbw ms':>9s} {'fwd GiB':>8s} "
        f"{'fwdbw GiB':>9s} {'fwd/peer':>8s} {'fwdbw/peer':>10s}")
    keys = []
    for r in rows:
        key = (r["setting"], r["S"], r["impl"])
        if key not in keys:
            keys.append(key)
    get = {(r["setting"], r["S"], r["impl"], r["mode"]): r for r in rows}
    for st, S, impl in keys:
        fw = get.get((st, S, impl, "fwd"))
        fb = get.get((st, S, impl, "fwdbw"))
        chunk = impl.split("L=")[-1] if "L=" in impl else "128"
        peer_fw = get.get((st, S, f"mlstm_kernels L={chunk}", "fwd")) or get.get(
            (st, S, "mlstm_kernels L=128", "fwd"))
        peer_fb = get.get((st, S, f"mlstm_kernels L={chunk}", "fwdbw")) or get.get(
            (st, S, "mlstm_kernels L=128", "fwdbw"))
        f = lambda r, key: f"{r[key]:.3f}" if r else "-"
        ratio = lambda a, b: f"{a['ms'] / b['ms']:.2f}" if a and b else "-"
        log(f"{st:5s} {S:6d} {impl:22s} {f(fw, 'ms'):>8s} {f(fb, 'ms'):>9s} "
            f"{f(fw, 'peak_gib'):>8s} {f(fb, 'peak_gib'):>9s} {ratio(fw, peer_fw):>8s} "
            f"{ratio(fb, peer_fb):>10s}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="check,numerics,fig4,fig5")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--our-chunks", default="64,128,256")
    ap.add_argument("--tune", default="", help="JSON list of OVERRIDES dicts (key 'chunk' too)")
    ap.add_argument("--bwdcmp", default=json.dumps([
        {"chunk": 128, "bwd": "walk", "modes": ["fwd", "fwdbw"]}, {"chunk": 128, "bwd": "chunk"},
        {"chunk": 256, "bwd": "chunk"}, {"chunk": 128, "bwd": "peer", "modes": ["fwd", "fwdbw"]}]),
        help="JSON list of {chunk, bwd: walk|chunk|peer, modes} for section bwdcmp")
    ap.add_argument("--bwdcmp-S", default="2048,8192,32768")
    ap.add_argument("--check-cases", default="", help="indices of the check cases to run")
    ap.add_argument("--check-bwd", default="", help="backward paths for the check cases")
    ap.add_argument("--numerics-bwd", default="", help="backward paths for the numerics section")
    args = ap.parse_args()
    args.our_chunks = [int(c) for c in args.our_chunks.split(",")]
    import triton

    global LOG_PATH
    os.makedirs(args.out, exist_ok=True)
    LOG_PATH = os.path.join(args.out, "bench_sig.log")
    open(LOG_PATH, "w").close()

    info = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__)
    for mod in ("mlstm_kernels", "fla"):
        try:
            m = __import__(mod)
            info[mod] = getattr(m, "__version__", "?")
        except Exception as e:  # noqa: BLE001
            info[mod] = f"unavailable: {e!r}"[:120]
    tflops, tbs = ceilings()
    info["ceil_bf16_tflops"] = round(tflops, 1)
    info["ceil_copy_tbs"] = round(tbs, 3)
    log(json.dumps(info))
    results = {"info": info}
    sections = args.sections.split(",")
    for name, fn in (("bwdcmp", run_bwdcmp), ("check", run_check), ("numerics", run_numerics),
                     ("profile", run_profile),
                     ("fig4", run_fig4),
                     ("tune", run_tune), ("fig5", run_fig5)):
        if name in sections:
            t0 = time.time()
            fn(args, results)
            log(f"[{name} took {time.time() - t0:.0f} s]")
    summary(results, info)
    with open(os.path.join(args.out, "bench_sig.json"), "w") as fh:
        json.dump(results, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
