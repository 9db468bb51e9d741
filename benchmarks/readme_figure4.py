"""Redraw the README's Figure-4 figures (docs/img/h100_7b_runtime_<gpu>.png and
docs/img/h100_7b_roofline_measured_<gpu>.png) from one GPU's reference runs of
suites/h100_7b.yaml: each kernel's rows from the first set in SETS[gpu] that has it (and,
where SETS names kernels, only those from that set), ceilings as `tflabench report` takes
them (measured where recorded). The README shows both for the H200 and the runtime for the
H100.

    python3 benchmarks/readme_figure4.py [--gpu h200|h100] [--out docs/img]
"""

from __future__ import annotations

import argparse
import os
import sys

#: per GPU, (result set under results/reference/<gpu>/, the kernels to take from it or None
#: for all); their README says what each holds. H200: our mLSTMsig (chunk 128 and "auto"),
#: the authors' mLSTMsig, FlashAttention 4, cuDNN SDPA and Mamba 2 come from one run
#: (h100_7b_auto, f5e5255); our mLSTMexp xl_chunk from h100_7b_ours (4dad859); FLA simple_gla
#: from the run that tuned it per case (b5226ba); its rows in h100_7b_sig reused the S 512
#: tuning (docs/harness.md). H100: our mLSTMsig (chunk 128 and "auto"), the authors' mLSTMsig,
#: FlashAttention 4, cuDNN SDPA and Mamba 2 from one run with the GPU trace (h100_7b_trace,
#: feec059, kernels of 16917bb); our
#: mLSTMexp xl_chunk from h100_7b_auto (a2617c6); FLA simple_gla from h100_7b (2276887).
SETS = {
    "h200": [("h100_7b_auto", None), ("h100_7b_ours", None),
             ("h100_7b_sig_fla", ["Simple GLA (FLA chunk)"]), ("h100_7b_sig", None),
             ("h100_7b_fla_gla", None), ("h100_7b_tfla", None), ("h100_7b", None)],
    "h100": [("h100_7b_trace", None), ("h100_7b_auto", None), ("h100_7b", None)],
}
#: the GPU's name in the figures' titles
GPU_NAMES = {"h200": "NVIDIA H200", "h100": "NVIDIA H100"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h200", choices=sorted(SETS))
    ap.add_argument("--out", default="docs/img")
    args = ap.parse_args(argv)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    sys.path.insert(0, root)
    import pandas as pd

    from tflabench import model_vs_measured as mm
    from tflabench.plots.benchmark import plot_runtime
    from tflabench.plots.model_measured import roofline_measured_figure
    from tflabench.results import load_results

    taken, parts, newest = set(), [], None
    for name, kernels in SETS[args.gpu]:
        rs = load_results(os.path.join(root, "results", "reference", args.gpu, name))
        newest = newest or rs
        rows = rs.rows[~rs.rows["kernel"].isin(taken)]
        if kernels is not None:
            rows = rows[rows["kernel"].isin(kernels)]
        taken |= set(rows["kernel"])
        parts.append(rows)
        print(f"{name} ({rs.metadata.get('git_revision')}): {sorted(set(rows['kernel']))}")
    frame = pd.concat(parts, ignore_index=True)
    gpu = mm.ceilings_for(newest.metadata)
    title = f"h100_7b on {GPU_NAMES[args.gpu]} (joined runs, benchmarks/readme_figure4.py)"
    plot_runtime(frame, os.path.join(args.out, f"h100_7b_runtime_{args.gpu}.png"), title=title)
    placement = mm.roofline_placement(frame, alpha=gpu.flops_per_s, beta=gpu.bytes_per_s)
    roofline_measured_figure(placement, gpu, path=os.path.join(args.out, f"h100_7b_roofline_measured_{args.gpu}.png"),
                             title=f"{title}: every case against the roofline at its own shape "
                                   f"({gpu.ceilings} ceilings)")
    fraction = pd.DataFrame(placement).groupby(["kernel", "mode"])["fraction"].median()
    for (kernel, mode), part in frame[frame["status"] == "ok"].groupby(["kernel", "mode"]):
        print(f"  {kernel} {mode}: {part['ms_median'].min():.2f}-{part['ms_median'].max():.2f} ms, "
              f"median fraction of the roofline bound {fraction.get((kernel, mode), float('nan')):.2f}")


if __name__ == "__main__":
    main()
