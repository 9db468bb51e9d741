"""Figure 4's long sequences under B7's new order: the state-gradient kernel's blocks, warps and stages (Tuning.state_bw), fwd+bwd eager."""
import os, statistics, sys
sys.path[:0] = [os.path.join(os.getcwd(), "benchmarks")]
import torch, tfla
from tfla.triton.tuning import Tuning, use_tuning
from bench_sig_tfla import SHAPES, make_inputs
from tflabench.measure import time_callable
VARIANTS = {
    "default": {},
    "64x64_w4_s2": dict(B_DQK=64, B_DHV=64, num_warps=4, num_stages=2),
    "64x64_w4_s4": dict(B_DQK=64, B_DHV=64, num_warps=4, num_stages=4),
    "64x64_w8": dict(B_DQK=64, B_DHV=64, num_warps=8),
    "64x32_w4": dict(B_DQK=64, B_DHV=32, num_warps=4),
    "32x64_w4": dict(B_DQK=32, B_DHV=64, num_warps=4),
    "32x64_w2": dict(B_DQK=32, B_DHV=64, num_warps=2),
    "64x128_w8": dict(B_DQK=64, B_DHV=128, num_warps=8),
    "128x64_w8": dict(B_DQK=128, B_DHV=64, num_warps=8),
}
for shape in sys.argv[1].split(","):
    xs, hshape = make_inputs(SHAPES[shape], "mlstm", device="cuda", dtype=torch.bfloat16, grad=True)
    dh = torch.ones(hshape, device="cuda", dtype=torch.bfloat16)
    def clear():
        for x in xs: x.grad = None
    ref = None
    for r in range(2):
        for name, over in VARIANTS.items():
            t = Tuning(state_bw=over)
            def step():
                with use_tuning(t):
                    h = tfla.mlstm_sig(*xs)
                h.backward(dh)
            clear(); step(); torch.cuda.synchronize()
            if ref is None: ref = [x.grad.clone() for x in xs]
            err = max(float((x.grad.float() - g.float()).abs().max() / g.float().abs().max()) for x, g in zip(xs, ref))
            ms = time_callable(step, device="cuda", warmup=10, iterations=40, before_each=clear)
            print(f"{shape} {name:12s} round {r}: fwd+bwd median {statistics.median(ms):.3f} min {min(ms):.3f} | max rel diff vs default {err:.1e}", flush=True)
    del xs, dh, ref; torch.cuda.empty_cache()
