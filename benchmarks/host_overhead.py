"""Host time against GPU time of one training step (fwd+bwd) and one forward, per shape, for
ours (``tfla.mlstm_sig``), cuDNN SDPA (attention at the same embedding: 32 heads of 128,
``SDPBackend.CUDNN_ATTENTION``, causal) and the authors' kernel (``mlstm_kernels``' mLSTMsig
xl_chunk, L 128, where it imports), side by side in one table.

A call is made of several kernels, launched from Python. While the CPU launches the next
call's kernels faster than the GPU runs this call's, back-to-back calls keep the GPU busy
and the timed median is the GPU's work. Where the host time per call comes near the GPU
time, the GPU waits on the CPU and the median swings with the CPU's speed (docs/kernels.md,
"Host time"; issue 45's bound: at most 0.6 ms of host per fwd+bwd, 0.25 ms per forward at
Figure 4's heads).

Per shape, kernel and mode, ``--rounds`` rounds of: the median of ``--iters`` calls back to
back (``tflabench.run.measure.time_callable``: CUDA events, after 5 warm-ups), then the host
time per call (wall time from the call's start until it returns, the GPU idle before it;
median of 10). A row gives the median over the rounds of both. ``--root`` measures another
checkout's kernels (package ``tfla`` under ROOT/kernels), ``--tag`` names it in the
table. Shapes: ``benchmarks/bench_sig_tfla.py``'s (``fig4``: Figure 4's heads, B 8, 16
heads, d_qk 128, d_hv 256, S 8192).

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/host_overhead.py [--shapes fig4,small,b7]
        [--kernels ours,cudnn,authors] [--root DIR] [--tag NAME] [--rounds 4] [--iters 30]
        [--graph] [--cprofile N]

``--graph``: our modes are also captured once as a CUDA graph (``tflabench.run.measure.graph_replay``,
as ``timing.cuda_graph`` does) and replayed (rows ``ours graph``); a line before the
table says whether the replayed h and gradients equal the eager call's.

``--cprofile N``: after the table, per shape, our fwd+bwd and forward under ``cProfile`` (20
calls each, the GPU idle before each call, as the host time is taken): the Python function
calls per call and the top N functions by own time and by cumulative time.

Prints one table: tag, shape, kernel, mode, GPU median (ms), host ms per call, host / GPU.
Exit status 2 without a CUDA GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

#: cuDNN SDPA's heads at embedding 4096 (paper App. E.3)
ATTENTION_HEADS, ATTENTION_DIM = 32, 128


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="fig4,small,b7")
    ap.add_argument("--kernels", default="ours,cudnn,authors")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--tag", default="")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--graph", action="store_true", help="also replay our modes as a CUDA graph")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="after the table, the top N host functions of our fwd+bwd and forward")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.root)
    sys.path[:0] = [os.path.join(root, "kernels"), os.path.dirname(os.path.abspath(__file__))]
    import torch

    if not torch.cuda.is_available():
        print("host_overhead.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    import tfla
    from bench_sig_tfla import SHAPES, make_inputs

    from tflabench.run.measure import time_callable

    if not os.path.abspath(tfla.__file__).startswith(root):
        print(f"host_overhead.py: imported tfla from {tfla.__file__}, not under {root}",
              file=sys.stderr)
        return 2
    rows, profiled = [], []
    for shape in args.shapes.split(","):
        shp = SHAPES[shape]
        for kernel in args.kernels.split(","):
            made = CALLS[kernel](shp, make_inputs, tfla, torch)
            if isinstance(made, str):
                rows.append((args.tag, shape, kernel, "-", None, None, made))
                continue
            for mode, fn in made:
                fn()
                torch.cuda.synchronize()
                runs = [(kernel, fn)]
                if args.graph and kernel == "ours":
                    replay = graph_of(fn, mode, shape, args.tag, torch)
                    if replay is not None:
                        runs.append(("ours graph", replay))
                for name, call in runs:
                    gpu, host = [], []
                    for _ in range(args.rounds):
                        ms = time_callable(call, device="cuda", warmup=5, iterations=args.iters)
                        gpu.append(statistics.median(ms))
                        per_call = []
                        for _ in range(10):
                            torch.cuda.synchronize()
                            t0 = time.perf_counter()
                            call()
                            per_call.append((time.perf_counter() - t0) * 1e3)
                        torch.cuda.synchronize()
                        host.append(statistics.median(per_call))
                    rows.append((args.tag, shape, name, mode, statistics.median(gpu),
                                 statistics.median(host), ""))
                if args.cprofile and kernel == "ours":
                    profiled.append((shape, mode, host_profile(fn, args.cprofile, torch)))
            del made
            torch.cuda.empty_cache()
    print_table(rows)
    for shape, mode, text in profiled:
        print(f"\n==== {args.tag} {shape} ours {mode}: cProfile of 20 calls\n{text}", flush=True)
    return 0


def host_profile(fn, top: int, torch, calls: int = 20) -> str:
    """``fn`` under cProfile for ``calls`` calls, the GPU idle before each (synchronised
    outside the profile): the Python function calls per call, then the ``top`` functions by
    own time and by cumulative time."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    for _ in range(calls):
        torch.cuda.synchronize()
        prof.enable()
        fn()
        prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    out.write(f"{stats.total_calls / calls:.0f} Python function calls per call\n")
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumtime").print_stats(top)
    return out.getvalue()


def print_table(rows) -> None:
    """One table: tag, shape, kernel, mode, GPU median ms, host ms per call, host / GPU (a
    note instead where the kernel could not run)."""
    head = ("tag", "shape", "kernel", "mode", "GPU ms", "host ms", "host/GPU")
    lines = [head]
    for tag, shape, kernel, mode, gpu, host, note in rows:
        if gpu is None:
            lines.append((tag, shape, kernel, mode, "-", "-", note))
        else:
            lines.append((tag, shape, kernel, mode, f"{gpu:.3f}", f"{host:.3f}",
                          f"{host / gpu:.2f}"))
    widths = [max(len(str(r[j])) for r in lines) for j in range(len(head))]
    for r in lines:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip(), flush=True)


def _steps(call, xs, dh, torch):
    """(mode, function) of a training step (forward, ``.backward(dh)``) and a forward."""

    def fwdbw():
        for x in xs:
            x.grad = None
        call(*xs).backward(dh)
        return [x.grad for x in xs]

    def fwd():
        with torch.no_grad():
            return [call(*xs)]

    return [("fwdbw", fwdbw), ("fwd", fwd)]


def ours(shp, make_inputs, tfla, torch):
    xs, hshape = make_inputs(shp, "mlstm", device="cuda", dtype=torch.bfloat16, grad=True)
    dh = torch.ones(hshape, device="cuda", dtype=torch.bfloat16)
    return _steps(tfla.mlstm_sig, xs, dh, torch)


def authors(shp, make_inputs, tfla, torch):
    """``mlstm_kernels``' mLSTMsig xl_chunk (L 128, no normaliser), or why not."""
    try:
        from mlstm_kernels.torch.chunkwise.triton_xl_chunk_siging import (
            mlstm_siging_chunkwise__xl_chunk as fn)
    except ImportError as exc:
        return f"mlstm_kernels not importable ({exc})"
    xs, hshape = make_inputs(shp, "mlstm", device="cuda", dtype=torch.bfloat16, grad=True)
    dh = torch.ones(hshape, device="cuda", dtype=torch.bfloat16)
    return _steps(lambda *a: fn(*a, chunk_size=128, normalize=False), xs, dh, torch)


def cudnn(shp, make_inputs, tfla, torch):
    """cuDNN SDPA, causal, 32 heads of 128 at the shape's B and S (Figure 4's attention)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    g = torch.Generator(device="cuda").manual_seed(0)
    size = (shp["B"], ATTENTION_HEADS, shp["S"], ATTENTION_DIM)
    xs = [torch.randn(size, generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_()
          for _ in range(3)]
    dh = torch.ones(size, device="cuda", dtype=torch.bfloat16)

    def call(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return sdpa(q, k, v, is_causal=True)

    try:
        call(*[x.detach() for x in xs])
    except RuntimeError as exc:
        return f"cuDNN SDPA cannot run here ({str(exc).splitlines()[0]})"
    return _steps(call, xs, dh, torch)


#: kernel name -> its (mode, function) list or the reason it cannot run
CALLS = {"ours": ours, "cudnn": cudnn, "authors": authors}


def graph_of(fn, mode: str, shape: str, tag: str, torch):
    """``fn`` (returning its output tensors) captured as a CUDA graph
    (``tflabench.run.measure.graph_replay``): the graph's replay, after printing how its outputs
    compare with an eager call's; None (and a line saying why) where capture fails."""
    from tflabench.run.measure import GraphCaptureError, graph_replay

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
