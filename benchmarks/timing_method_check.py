"""Why do Triton peers time 4-11 % faster in tflabench than in the plain baseline script?

A device-only check (docs/harness.md, "Timing method"). For a few kernels of
suites/h100_7b.yaml at one S it times the same call three ways, in one process:

* ``harness``: tflabench.run.measure.time_callable, a CUDA event pair around each call and no
  synchronisation between calls (the CPU may run ahead; as triton.testing.do_bench does);
* ``sync each``: the same with ``sync_each=True`` (a synchronise before each timed call), so each
  call starts on an idle GPU and its Python launch overhead falls inside the events (what a
  script that synchronises per call measures);
* ``do_bench``: triton.testing.do_bench (median, its own L2 flush between calls);

and, for the mLSTM peers, with the gate pre-activations in float32 (tflabench's default)
and in bfloat16 (the baseline script's "bf16 everywhere").

    PYTHONPATH=$PWD:$PWD/kernels:/tmp/peers python3 benchmarks/timing_method_check.py --seq-len 8192
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import yaml

LABELS = (
    "mLSTMexp limit_chunk (mlstm_kernels)",
    "mLSTMsig TFLA xl_chunk (mlstm_kernels)",
    "Mamba 2 (SSD)",
    "Simple GLA (FLA chunk)",
    "cuDNN FlashAttention (SDPA cudnn)",
    "mLSTMexp TFLA xl_chunk (ours)",
)


def main() -> None:
    import torch
    import triton.testing

    from tflabench.backends import get_backend
    from tflabench.backends.base import Shape
    from tflabench.backends.mlstm_family import mlstm_inputs
    from tflabench.run.measure import time_callable

    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="suites/h100_7b.yaml")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--iterations", type=int, default=30)
    args = ap.parse_args()
    suite = yaml.safe_load(Path(args.suite).read_text())
    emb = suite["model"]["embedding_dim"]
    S = args.seq_len
    B = suite["sweep"]["tokens"] // S

    print(f"S={S} B={B}, ms (median of {args.iterations})")
    print(f"{'kernel':44s} {'gates':8s} {'harness':>8s} {'sync each':>10s} {'do_bench':>9s}")
    for spec in suite["kernels"]:
        if spec.get("label") not in LABELS:
            continue
        backend = get_backend(spec["backend"])
        params = backend.parse_params(dict(spec.get("params") or {}))
        reason = backend.available(params)
        if reason:
            print(f"{spec['label']:44s} unavailable: {reason}")
            continue
        heads, d_qk, d_hv = backend.layout(params, emb)
        shape = Shape(batch=B, seq_len=S, heads=heads, d_qk=d_qk, d_hv=d_hv)
        gate_variants = [None]
        if backend.name == "mlstm_kernels":
            gate_variants = [None, torch.bfloat16]
        for gd in gate_variants:
            if gd is None:
                inputs = backend.family.make_inputs(params, shape, torch.bfloat16, "cuda", 0)
            else:
                inputs = mlstm_inputs(shape, torch.bfloat16, "cuda", 0, gates_dtype=gd)

            def fn():
                backend.forward(params, inputs)

            with torch.no_grad():
                fn()
                torch.cuda.synchronize()
                h, s = (statistics.median(time_callable(fn, warmup=10, iterations=args.iterations,
                                                        device="cuda", sync_each=sync))
                        for sync in (False, True))
                d = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
            gname = "bf16" if gd is not None else ("fp32" if "i" in inputs else "-")
            print(f"{spec['label']:44s} {gname:8s} {h:8.3f} {s:10.3f} {d:9.3f}", flush=True)
            del inputs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
