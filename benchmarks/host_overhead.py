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
        [--root DIR] [--tag NAME] [--rounds 4] [--iters 30]

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

        def fwd():
            with torch.no_grad():
                tfla.mlstm_sig(*xs)

        fwdbw()
        fwd()
        torch.cuda.synchronize()
        for mode, fn in (("fwdbw", fwdbw), ("fwd", fwd)):
            for r in range(args.rounds):
                ms = time_callable(fn, device="cuda", warmup=5, iterations=args.iters)
                host = []
                for _ in range(10):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    fn()
                    host.append((time.perf_counter() - t0) * 1e3)
                torch.cuda.synchronize()
                print(f"{args.tag} {shape} {mode} round {r}: GPU median {statistics.median(ms):.3f}"
                      f" min {min(ms):.3f} ms | host {statistics.median(host):.3f} ms per call",
                      flush=True)
        del xs, dh
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
