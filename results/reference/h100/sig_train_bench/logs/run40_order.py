"""fwd+bwd eager and CUDA-graph replay per shape, tfla from ROOT/kernels (argv[2]), tag argv[3]; grads' checksum."""
import os, statistics, sys
root = os.path.abspath(sys.argv[2]); tag = sys.argv[3]
sys.path[:0] = [os.path.join(root, "kernels"), os.path.join(os.getcwd(), "benchmarks")]
import torch, tfla
assert os.path.abspath(tfla.__file__).startswith(root), tfla.__file__
from bench_sig_tfla import SHAPES, make_inputs
from tflabench.measure import time_callable, graph_replay
for shape in sys.argv[1].split(","):
    xs, hshape = make_inputs(SHAPES[shape], "mlstm", device="cuda", dtype=torch.bfloat16, grad=True)
    dh = torch.ones(hshape, device="cuda", dtype=torch.bfloat16)
    def clear():
        for x in xs: x.grad = None
    def step():
        tfla.mlstm_sig(*xs).backward(dh)
    clear(); step(); torch.cuda.synchronize()
    chk = sum(float(x.grad.float().abs().sum()) for x in xs)
    replay = graph_replay(step, clear)
    e = time_callable(step, device="cuda", warmup=10, iterations=40, before_each=clear)
    g = time_callable(replay, device="cuda", warmup=10, iterations=40)
    print(f"{tag} {shape}: eager median {statistics.median(e):.3f} min {min(e):.3f} | graph median {statistics.median(g):.3f} min {min(g):.3f} | grad checksum {chk:.6e}", flush=True)
    del xs, dh, replay; torch.cuda.empty_cache()
