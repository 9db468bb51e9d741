"""The verdict of a ``tflabench verify`` result set per kernel, dtype and regime.

:func:`cell_summary` reduces the rows over lengths, initial states and modes to the case
that decides each cell; the table (:func:`tflabench.report.tables.verify_table`) and the heat map
(:func:`tflabench.report.plots.numerics.write_heatmap`) both draw it.
"""

from __future__ import annotations

import math

import pandas as pd

#: Statuses that fail ``verify`` (exit status 1).
FAILING = ("wrong", "crash", "timeout", "oom", "error")


def cell_summary(frame):
    """One row per (kernel, dtype, regime): the case that decides (failing first, then the
    largest error / budget), with ``cases``, ``failed`` counts and ``where`` (S, state,
    mode of that case). Input: a result-set DataFrame of verify rows."""
    rows = []
    frame = frame[frame["numerics_case"].notna()].copy()
    frame["regime"] = frame["numerics_case"].str.replace("+init", "", regex=False)
    for (kernel, dtype, regime), group in frame.groupby(["kernel", "dtype", "regime"], sort=False):
        def rank(r):
            failing = r["status"] in FAILING
            err, bud = r.get("numerics_err"), r.get("numerics_budget")
            ratio = (err / bud) if isinstance(err, float) and isinstance(bud, float) and bud and not math.isnan(err) else -1.0
            nonfinite = (r.get("numerics_nonfinite") or 0) > 0
            return (failing, nonfinite, ratio)

        records = group.to_dict("records")
        ran = [r for r in records if r["status"] not in ("unavailable", "not_run")]  # attempted
        pick = max(ran or records, key=rank)
        rows.append({
            "kernel": kernel, "dtype": dtype, "regime": regime, "status": pick["status"],
            "cases": len(ran), "failed": sum(r["status"] in FAILING for r in ran),
            "numerics_err": pick.get("numerics_err"), "numerics_worst": pick.get("numerics_worst"),
            "numerics_budget": pick.get("numerics_budget"), "numerics_nonfinite": pick.get("numerics_nonfinite"),
            "where": f"S={int(pick['seq_len'])} {'init ' if '+init' in (pick['numerics_case'] or '') else ''}{pick['mode']}",
            "reason": pick.get("reason"),
        })
    return pd.DataFrame(rows)


__all__ = ["FAILING", "cell_summary"]
