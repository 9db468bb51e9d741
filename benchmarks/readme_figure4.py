"""Redraw the README's Figure-4 figures (docs/img/h100_7b_runtime_<gpu>.png and
docs/img/h100_7b_roofline_measured_<gpu>.png) from one reference set of suites/h100_7b.yaml,
``results/reference/<gpu>/h100_7b/`` (one whole run at one commit; results/reference/README.md),
with the ceilings `tflabench report` takes (measured where recorded).

    python3 benchmarks/readme_figure4.py [--gpu h100|h200] [--out docs/img] [--references DIR]
"""

from __future__ import annotations

import argparse
import os
import sys

#: the GPU's name in the figures' titles
GPU_NAMES = {"h200": "NVIDIA H200", "h100": "NVIDIA H100"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h100", choices=sorted(GPU_NAMES))
    ap.add_argument("--out", default="docs/img")
    ap.add_argument("--references", default=None, help="the directory of the reference sets "
                    "(default: results/reference of this checkout)")
    args = ap.parse_args(argv)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    sys.path.insert(0, root)
    import pandas as pd

    from tflabench.analysis import model_vs_measured as mm
    from tflabench.errors import UserError
    from tflabench.report.plots.benchmark import plot_runtime
    from tflabench.report.plots.model_measured import roofline_measured_figure
    from tflabench.store.references import reference_for
    from tflabench.store.results import load_results

    try:
        rs = load_results(reference_for(args.gpu, "h100_7b", args.references))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    frame = rs.rows
    commit = str(rs.metadata.get("git_revision") or "")[:7]
    print(f"{rs.path} ({commit}): {sorted(set(frame['kernel']))}")
    gpu = mm.ceilings_for(rs.metadata)
    title = f"h100_7b on {GPU_NAMES[args.gpu]} ({commit}, benchmarks/readme_figure4.py)"
    plot_runtime(frame, os.path.join(args.out, f"h100_7b_runtime_{args.gpu}.png"), title=title)
    placement = mm.roofline_placement(frame, peak_flops_per_s=gpu.flops_per_s, beta=gpu.bytes_per_s)
    roofline_measured_figure(placement, gpu, path=os.path.join(args.out, f"h100_7b_roofline_measured_{args.gpu}.png"),
                             title=f"{title}: every case against the roofline at its own shape "
                                   f"({gpu.ceilings} ceilings)")
    fraction = pd.DataFrame(placement).groupby(["kernel", "mode"])["fraction"].median()
    for (kernel, mode), part in frame[frame["status"] == "ok"].groupby(["kernel", "mode"]):
        print(f"  {kernel} {mode}: {part['ms_median'].min():.2f}-{part['ms_median'].max():.2f} ms, "
              f"median fraction of the roofline bound {fraction.get((kernel, mode), float('nan')):.2f}")


if __name__ == "__main__":
    main()
