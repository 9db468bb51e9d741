"""Figure 4's heads: eager against CUDA-graph replay, and the kernel timeline of one call of each (start, duration, stream)."""
import json, os, statistics, sys, tempfile
sys.path[:0] = [os.path.join(os.getcwd(), "benchmarks")]
import torch, tfla
from bench_sig_tfla import SHAPES, make_inputs
from tflabench.measure import time_callable, graph_replay
from torch.profiler import ProfilerActivity, profile

def timeline(fn, label):
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(); torch.cuda.synchronize()
    path = tempfile.mktemp(suffix=".json"); prof.export_chrome_trace(path)
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("cat") == "kernel"]
    t0 = min(e["ts"] for e in ev)
    for e in sorted(ev, key=lambda e: e["ts"]):
        print(f"  {label} {e['name'][:34]:34s} stream {e['args'].get('stream')} start {(e['ts']-t0)/1e3:7.3f} dur {e['dur']/1e3:6.3f} end {(e['ts']-t0+e['dur'])/1e3:7.3f}")

import contextlib
import tfla.triton.chunkwise as cw
_orig_side = cw._side_stream
@contextlib.contextmanager
def _one_stream(x):
    yield lambda *outputs: None

for shape in sys.argv[1].split(","):
    xs, hshape = make_inputs(SHAPES[shape], "mlstm", device="cuda", dtype=torch.bfloat16, grad=True)
    dh = torch.ones(hshape, device="cuda", dtype=torch.bfloat16)
    def clear():
        for x in xs: x.grad = None
    def step():
        tfla.mlstm_sig(*xs).backward(dh)
    def call():
        clear(); step()
    call(); torch.cuda.synchronize()
    replay = graph_replay(step, clear)
    for r in range(2):
        e = time_callable(step, device="cuda", warmup=10, iterations=40, before_each=clear)
        g = time_callable(replay, device="cuda", warmup=10, iterations=40)
        print(f"{shape} round {r}: eager median {statistics.median(e):.3f} min {min(e):.3f} | graph median {statistics.median(g):.3f} min {min(g):.3f}", flush=True)
    cw._side_stream = _one_stream
    replay1 = graph_replay(step, clear)
    for r in range(2):
        e = time_callable(step, device="cuda", warmup=10, iterations=40, before_each=clear)
        g = time_callable(replay1, device="cuda", warmup=10, iterations=40)
        print(f"{shape} one stream round {r}: eager median {statistics.median(e):.3f} min {min(e):.3f} | graph median {statistics.median(g):.3f} min {min(g):.3f}", flush=True)
    cw._side_stream = _orig_side
    del replay1
    timeline(call, "eager"); timeline(replay, "graph")
    del xs, dh, replay; torch.cuda.empty_cache()
