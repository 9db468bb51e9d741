"""B7 under CUDA graphs: the backward's dQ (side stream) launched before the state-gradient kernel (default) or after it
(`sg_first`: the state-gradient kernel launched first on the main stream, inside the fork), eager and graph replay."""
import inspect, os, statistics, sys, textwrap
sys.path[:0] = [os.path.join(os.getcwd(), "benchmarks")]
import torch, tfla
import tfla.triton.chunkwise as cw
from bench_sig_tfla import SHAPES, make_inputs
from tflabench.measure import time_callable, graph_replay

src = textwrap.dedent(inspect.getsource(cw.ChunkwiseFunction.backward))
I = " " * 8
old_block = (I + "with _side_stream(qf) as join:\n" + I + "    dq, qdq = pbw.parallel_bw_dq(")
new_block = (I + "_MAIN[0] = torch.cuda.current_stream(qf.device) if qf.is_cuda else None\n"
             + I + "with _side_stream(qf) as join:\n"
             + I + "    with (torch.cuda.stream(_MAIN[0]) if qf.is_cuda else contextlib.nullcontext()):\n"
             + I + "        dC_st, dC_0 = state_bw()\n"
             + I + "    dq, qdq = pbw.parallel_bw_dq(")
assert src.count(old_block) == 1
src2 = src.replace(old_block, new_block)
old_sg = "has_c0=has_C0, **kw)\n" + I + "dC_st, dC_0 = state_bw()\n"
assert src2.count(old_sg) == 1
src2 = src2.replace(old_sg, "has_c0=has_C0, **kw)\n")
src2 = src2.replace("@staticmethod\n", "")
ns = dict(vars(cw)); ns["_MAIN"] = [None]; ns["contextlib"] = __import__("contextlib")
exec(compile(src2, "sg_first", "exec"), ns)
default_bw = cw.ChunkwiseFunction.__dict__["backward"]

for shape in sys.argv[1].split(","):
    xs, hshape = make_inputs(SHAPES[shape], "mlstm", device="cuda", dtype=torch.bfloat16, grad=True)
    dh = torch.ones(hshape, device="cuda", dtype=torch.bfloat16)
    def clear():
        for x in xs: x.grad = None
    def step():
        tfla.mlstm_sig(*xs).backward(dh)
    ref = None
    for r in range(2):
        for name, bw in (("default", default_bw), ("sg_first", staticmethod(ns["backward"]))):
            cw.ChunkwiseFunction.backward = bw if name == "default" else bw
            clear(); step(); torch.cuda.synchronize()
            grads = [x.grad.clone() for x in xs]
            if ref is None: ref = grads
            same = all(torch.equal(a, b) for a, b in zip(grads, ref))
            replay = graph_replay(step, clear)
            e = time_callable(step, device="cuda", warmup=10, iterations=40, before_each=clear)
            g = time_callable(replay, device="cuda", warmup=10, iterations=40)
            print(f"{shape} {name:8s} round {r}: eager median {statistics.median(e):.3f} min {min(e):.3f} | graph median {statistics.median(g):.3f} min {min(g):.3f} | grads equal default: {same}", flush=True)
            del replay
    cw.ChunkwiseFunction.backward = default_bw
    del xs, dh, ref; torch.cuda.empty_cache()
