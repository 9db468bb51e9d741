"""One mLSTMsig forward (bf16, no grad) at a bench_sig_tfla shape, for a profiler (ncu) to
capture: a warm-up call (compilation), then one profiled call.

    ncu --clock-control none -k regex:_parallel_fw_kernel -c 1 --section SpeedOfLight \\
        python3 benchmarks/profile_sig_fw.py --shape fig4 --chunk 128
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="fig4")
    ap.add_argument("--chunk", type=int, default=128)
    args = ap.parse_args(argv)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [os.path.join(here, "..", "kernels"), os.path.join(here, "..")]
    import torch
    import tfla
    from bench_sig_tfla import SHAPES, make_inputs

    xs, _ = make_inputs(SHAPES[args.shape], "mlstm", device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(2):
            tfla.mlstm_sig(*xs, chunk_size=args.chunk)
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
