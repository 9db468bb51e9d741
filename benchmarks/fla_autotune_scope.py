"""Does FLA chunk_simple_gla's forward depend on the shape it was autotuned at?

fla-core 0.6.0 keys its autotuners on head dimensions and chunk size, not on the batch or
the sequence length, so in one process the config tuned at the first shape of a
fixed-token sweep (S 512, B 128) is reused at S 65536, B 1. This script times the forward
at ``--shape`` (1) tuned at that shape, in a fresh process, and (2) after a call at
``--first`` in the same process; Triton's disk cache is off for FLA (FLA_CACHE_RESULTS=0)
and TRITON_CACHE_DIR should be a fresh directory per process.

    FLA_CACHE_RESULTS=0 TRITON_CACHE_DIR=$(mktemp -d) python3 benchmarks/fla_autotune_scope.py \\
        --shape 1,65536 [--first 128,512]

Prints one line: shape, first shape (or -), median ms of 20 after 5 (CUDA events).
16 heads, d_qk 128, d_hv 256 (Figure 4), bf16, log forget gates logsigmoid(N(3, 1)).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", required=True, help="B,S timed")
    ap.add_argument("--first", default="", help="B,S called once before (same process)")
    args = ap.parse_args(argv)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, ".."))
    import torch
    from fla.ops.simple_gla import chunk_simple_gla
    from tflabench.run.measure import time_callable

    from bench_sig_tfla import make_inputs

    def inputs(B, S):
        shp = dict(B=B, NH=16, d_qk=128, d_hv=256, S=S)
        return make_inputs(shp, "fla", device="cuda", dtype=torch.bfloat16)[0]

    if args.first:
        B0, S0 = (int(x) for x in args.first.split(","))
        with torch.no_grad():
            chunk_simple_gla(*inputs(B0, S0))
        torch.cuda.synchronize()
    B, S = (int(x) for x in args.shape.split(","))
    xs = inputs(B, S)
    with torch.no_grad():
        chunk_simple_gla(*xs)
        torch.cuda.synchronize()
        ms = time_callable(lambda: chunk_simple_gla(*xs), device="cuda", warmup=5, iterations=20)
    print(f"shape B={B} S={S} first={args.first or '-'} ms={statistics.median(ms):.4f}", flush=True)


if __name__ == "__main__":
    main()
