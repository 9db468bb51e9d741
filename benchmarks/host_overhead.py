"""Host time against GPU time of one ``tfla.mlstm_sig`` call (fwd and fwd+bwd), per shape.

A call is made of several kernels, launched from Python. While the CPU launches the next
call's kernels faster than the GPU runs this call's, back-to-back calls keep the GPU busy
and the timed median is the GPU's work. Where the host time per call comes near the GPU
time, the GPU waits on the CPU and the median swings with the CPU's speed (docs/kernels.md,
"Host time").

Per shape and mode, ``--rounds`` rounds of: the median and minimum of ``--iters`` calls
back to back (``tflabench.measure.time_callable``: CUDA events, after 5 warm-ups), then the
host time per call (wall time from the call's start until it returns, the GPU idle before
it; median of 10). ``--root`` measures another checkout's kernels (package ``tfla`` under
ROOT/kernels), ``--tag`` names it in the output. Shapes: ``benchmarks/bench_sig_tfla.py``'s.

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/host_overhead.py [--shapes small,fig4,b7]
        [--root DIR] [--tag NAME] [--rounds 4] [--iters 30] [--graph]

``--graph``: each mode is also captured once as a CUDA graph (``tflabench.measure.graph_replay``,
as ``timing.cuda_graph`` does) and replayed: a caller bound by the host can run the
step that way. One line per shape and mode first says whether the replayed h and gradients
equal the eager call's (the largest difference relative to each tensor's largest value;
the row sums that several programs add atomically may differ in their last bits), then each
round adds the replay's GPU median and host time.

Prints one line per round: tag, shape, mode, round, GPU median and minimum (ms), host ms per
call. Exit status 2 without a CUDA GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="small,fig4,b7")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--tag", default="")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--graph", action="store_true", help="also replay each mode as a CUDA graph")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.root)
    sys.path[:0] = [os.path.join(root, "kernels"), os.path.dirname(os.path.abspath(__file__))]
    import torch

    if not torch.cuda.is_available():
        print("host_overhead.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    import tfla
    from bench_sig_tfla import SHAPES, make_inputs

    from tflabench.measure import time_callable

    if not os.path.abspath(tfla.__file__).startswith(root):
        print(f"host_overhead.py: imported tfla from {tfla.__file__}, not under {root}",
              file=sys.stderr)
        return 2
    for shape in args.shapes.split(","):
        xs, hshape = make_inputs(SHAPES[shape], "mlstm", device="cuda", dtype=torch.bfloat16,
                                 grad=True)
        dh = torch.ones(hshape, device="cuda", dtype=torch.bfloat16)

        def fwdbw():
            for x in xs:
                x.grad = None
            tfla.mlstm_sig(*xs).backward(dh)
            return [x.grad for x in xs]

        def fwd():
            with torch.no_grad():
                return [tfla.mlstm_sig(*xs)]

        fwdbw()
        fwd()
        torch.cuda.synchronize()
        for mode, fn in (("fwdbw", fwdbw), ("fwd", fwd)):
            runs = [("", fn)]
            if args.graph:
                replay = graph_of(fn, mode, shape, args.tag, torch)
                if replay is not None:
                    runs.append((" graph", replay))
            for r in range(args.rounds):
                for how, call in runs:
                    ms = time_callable(call, device="cuda", warmup=5, iterations=args.iters)
                    host = []
                    for _ in range(10):
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        call()
                        host.append((time.perf_counter() - t0) * 1e3)
                    torch.cuda.synchronize()
                    print(f"{args.tag} {shape} {mode}{how} round {r}: GPU median "
                          f"{statistics.median(ms):.3f} min {min(ms):.3f} ms | host "
                          f"{statistics.median(host):.3f} ms per call", flush=True)
        del xs, dh
        torch.cuda.empty_cache()
    return 0


def graph_of(fn, mode: str, shape: str, tag: str, torch):
    """``fn`` (returning its output tensors) captured as a CUDA graph
    (``tflabench.measure.graph_replay``): the graph's replay, after printing how its outputs
    compare with an eager call's; None (and a line saying why) where capture fails."""
    from tflabench.measure import GraphCaptureError, graph_replay

    static = []

    def call():            # the last call, the captured one, leaves the graph's outputs
        static[:] = fn()

    try:
        replay = graph_replay(call)
    except GraphCaptureError as err:
        print(f"{tag} {shape} {mode} graph: {err}")
        return None
    eager = [t.clone() for t in fn()]
    replay()
    torch.cuda.synchronize()
    diffs = []
    for a, b in zip(static, eager):
        scale = b.float().abs().max().clamp_min(1e-30)
        diffs.append(f"{(a.float() - b.float()).abs().max().div(scale).item():.1e}"
                     + (" (equal)" if torch.equal(a, b) else ""))
    print(f"{tag} {shape} {mode} graph: replay against eager, largest difference per output "
          f"relative to its largest value: {', '.join(diffs)}", flush=True)
    return replay


if __name__ == "__main__":
    sys.exit(main())
