"""Figure 4's heads at S 32768 / 65536 (and 8192): auto (walk L64 + two-level bwd L128) against the same with the backward at L 256
(tfla.plan.auto_chunk patched to 256: walk storing every 4th state), and explicit L 128 / 256; per-kernel profile of both autos."""
import os, statistics, sys
sys.path[:0] = [os.path.join(os.getcwd(), "benchmarks")]
import torch, tfla, importlib
P = importlib.import_module("tfla.plan")
from bench_sig_tfla import SHAPES, make_inputs
from tflabench.measure import time_callable
from torch.profiler import ProfilerActivity, profile
orig = P.auto_chunk
def patched(variant, *, d_qk, d_hv, grad, dtype=None):
    return 256 if os.environ.get("BW256") == "1" else orig(variant, d_qk=d_qk, d_hv=d_hv, grad=grad, dtype=dtype)
P.auto_chunk = patched
for shape in sys.argv[1].split(","):
    xs, hshape = make_inputs(SHAPES[shape], "mlstm", device="cuda", dtype=torch.bfloat16, grad=True)
    dh = torch.ones(hshape, device="cuda", dtype=torch.bfloat16)
    for name, env, L in (("auto", "0", "auto"), ("auto_bw256", "1", "auto"), ("L128", "0", 128), ("L256", "0", 256), ("auto", "0", "auto"), ("auto_bw256", "1", "auto")):
        os.environ["BW256"] = env
        pl = P.plan("sig", xs[0], xs[2], chunk_size=L, grad=True)
        def call():
            for x in xs: x.grad = None
            tfla.mlstm_sig(*xs, chunk_size=L).backward(dh)
        call(); torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated(); call(); torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**30
        ms = time_callable(call, device="cuda", warmup=10, iterations=40)
        line = f"{shape} {name:10s} plan L={pl.chunk_size} alg={pl.algorithm} seg={pl.segments} | fwd+bwd median {statistics.median(ms):.3f} min {min(ms):.3f} ms peak {peak:.3f} GiB"
        if name.startswith("auto") and "prof" not in os.environ.get("DONE_" + name + shape, ""):
            os.environ["DONE_" + name + shape] = "prof"
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(3): call()
                torch.cuda.synchronize()
            ks = sorted(((e.self_device_time_total / 3e3, e.key[:24]) for e in prof.key_averages() if e.self_device_time_total > 0), reverse=True)
            line += " | " + " ".join(f"{n}={k:.3f}" for k, n in ks[:8])
        print(line, flush=True)
    del xs, dh; torch.cuda.empty_cache()
