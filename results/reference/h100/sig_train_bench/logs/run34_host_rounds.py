"""Small heads fwd+bwd over rounds: per round median/min GPU ms (events), host enqueue ms per call, per-kernel profile."""
import statistics, subprocess, sys, time, os
sys.path[:0] = [os.path.join(os.getcwd(), "benchmarks")]
import torch
from bench_sig_tfla import SHAPES, make_inputs
import tfla
from tflabench.measure import time_callable
from torch.profiler import ProfilerActivity, profile
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw.instant,temperature.gpu,clocks_event_reasons.active", "--format=csv,noheader", "-lms", "100"], stdout=open(os.environ["OUT"] + f"/smi_{sys.argv[1]}.csv", "w"))
shp = SHAPES[sys.argv[1] if len(sys.argv) > 1 else "small"]
xs, hshape = make_inputs(shp, "mlstm", device="cuda", dtype=torch.bfloat16, grad=True)
dh = torch.ones(hshape, device="cuda", dtype=torch.bfloat16)
def call():
    for x in xs: x.grad = None
    tfla.mlstm_sig(*xs).backward(dh)
call(); torch.cuda.synchronize()
for r in range(14):
    ms = time_callable(call, device="cuda", warmup=5, iterations=30)
    host = []
    for _ in range(10):
        torch.cuda.synchronize(); t0 = time.perf_counter(); call(); host.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    # back to back, host time for 10 calls vs GPU
    t0 = time.perf_counter(); [call() for _ in range(10)]; t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3): call()
        torch.cuda.synchronize()
    ks = sorted(((e.self_device_time_total / 3e3, e.key[:28]) for e in prof.key_averages() if e.self_device_time_total > 0), reverse=True)
    tot = sum(k for k, _ in ks)
    print(f"{time.strftime('%H:%M:%S')} r{r:2d} med {statistics.median(ms):.3f} min {min(ms):.3f} max {max(ms):.3f} | host/call {statistics.median(host):.3f} ms, 10 b2b enqueue {(t1-t0)*1e3:.1f} wall {(t2-t0)*1e3:.1f} | kernels {tot:.3f}: " + " ".join(f"{n}={k:.3f}" for k, n in ks[:6]), flush=True)
    time.sleep(1.0 if r % 4 == 3 else 0)
smi.terminate()
