"""What a reader of a comparison must know before trusting it: the two sets' environments,
hosts, timing methods or GPU models differ, or the cases of one set spread so widely that
decisions on them are shaky. Warnings, never verdicts: the cases are compared all the same
(the candidate's own settings: :func:`tflabench.compare.thresholds.candidate_warnings`).

``run`` uses the noise check too (:func:`noisy_cases`, :func:`slowdown_text`).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from tflabench.compare.rows import OK, cell_number, parse_samples, row_status
from tflabench.store.conditions import timing_differences
from tflabench.store.schema import LIMIT_FIELDS, recorded_timing
from tflabench.text_safety import case_label

#: Metadata keys whose difference makes timings incomparable: warned about, never silent.
ENVIRONMENT_KEYS = ("gpu_name", "driver", "cuda", "torch", "triton")


def environment_warnings(base_metadata: Mapping[str, Any], new_metadata: Mapping[str, Any]) -> list[str]:
    """One warning per environment key (GPU, driver, CUDA, torch, triton; then peers and
    the suite file) whose value differs between the two runs."""
    out = []
    for key in ENVIRONMENT_KEYS:
        base, new = base_metadata.get(key), new_metadata.get(key)
        if base != new:
            out.append(
                f"{key} differs: base {base!r}, new {new!r}; timings may move for that reason alone "
                "(compare runs from the same machine and stack, or refresh the reference)"
            )
    base_peers, new_peers = base_metadata.get("peers") or {}, new_metadata.get("peers") or {}
    for name in sorted(set(base_peers) | set(new_peers)):
        if base_peers.get(name) != new_peers.get(name):
            out.append(f"peer {name} differs: base {base_peers.get(name)!r}, new {new_peers.get(name)!r}")
    out += timing_warnings(base_metadata, new_metadata)
    base_sha, new_sha = base_metadata.get("suite_sha256"), new_metadata.get("suite_sha256")
    if base_sha and new_sha and base_sha != new_sha:
        out.append("the suite file changed between the runs (suite_sha256 differs); added/removed cases may follow")
    for label, metadata in (("base", base_metadata), ("new", new_metadata)):
        if metadata.get("shard"):
            out.append(f"{label} is shard {metadata['shard']} only; merge the shards first (tflabench merge)")
        if metadata.get("shards_missing"):
            missing = ", ".join(str(s) for s in metadata["shards_missing"])
            out.append(f"{label} was merged without shard(s) {missing}; their cases count as missing")
    return out


def timing_warnings(base_metadata: Mapping[str, Any], new_metadata: Mapping[str, Any]) -> list[str]:
    """One warning per field of the suite's ``timing`` (``metadata.json``, ``measurement``)
    that both runs record with different values, but the limits (:data:`LIMIT_FIELDS`:
    ``timeout_s``): ``warmup_s`` 0 against 5, ``sync_each``, ``flush_l2``, ``cuda_graph``,
    the counts. A field a set does not record (written before the field existed) counts
    with its value then (:func:`~tflabench.store.schema.recorded_timing`)."""
    base, new = recorded_timing(base_metadata), recorded_timing(new_metadata)
    return [f"timing.{key} differs: base {base[key]!r}, new {new[key]!r}; the cases were timed by different "
            "methods, so timings may move for that reason alone"
            for key in sorted(set(base) & set(new)) if key not in LIMIT_FIELDS and base[key] != new[key]]


#: Metadata keys of the machine and interpreter: a difference is warned about (two CPU
#: result sets of two machines time different hardware even under one GPU name, None).
HOST_KEYS = ("hostname", "cpu", "python")


def provenance_warnings(base_metadata: Mapping[str, Any], new_metadata: Mapping[str, Any]) -> list[str]:
    """One warning per :data:`HOST_KEYS` key that differs between the two runs (only where
    both record it), one per differing timer or thread count
    (:func:`tflabench.store.conditions.timing_differences`), and one per side merged from shards
    that hold fewer cases than they were to measure (``shards_incomplete``, written by
    ``merge --allow-missing``)."""
    out = []
    for key in HOST_KEYS:
        base, new = base_metadata.get(key), new_metadata.get(key)
        if base is not None and new is not None and base != new:
            out.append(f"{key} differs: base {base!r}, new {new!r}; the runs measured on different machines or "
                       "interpreters, so timings may move for that reason alone")
    for key, base, new in timing_differences(base_metadata, new_metadata):
        if key == "timer":
            out.append(f"timer differs: base {base!r}, new {new!r}; the sets were timed by different timers "
                       "(process CPU time with one thread per worker, wall time with more), so no time is "
                       "compared: every case is undecided; give both runs the same threads per worker")
        elif key == "threads":
            out.append(f"threads per worker differ: base {base!r}, new {new!r}; timings may move for that reason "
                       "alone (cpu_threads in metadata.json)")
    for label, metadata in (("base", base_metadata), ("new", new_metadata)):
        lacking = sum(int(item.get("cases_missing") or 0) for item in metadata.get("shards_incomplete") or []
                      if isinstance(item, Mapping))
        if lacking:
            out.append(f"{label} was merged from incomplete shards ({lacking} case(s) not measured); "
                       "they count as missing")
    return out


def gpu_model_warnings(base_rows: pd.DataFrame, new_rows: pd.DataFrame, base_metadata: Mapping[str, Any],
                       new_metadata: Mapping[str, Any]) -> list[str]:
    """One warning when matched cases ran on different GPU models: each row's
    ``gpu_name`` (the run's ``gpu_name`` for rows of sets written before rows recorded
    it). Both tables indexed by the matching key (as :func:`tflabench.compare.rows.prepare` leaves them).
    A warning, not a verdict: the cases are still compared."""

    def models(rows: pd.DataFrame, metadata: Mapping[str, Any]) -> pd.Series:
        fallback = metadata.get("gpu_name")
        column = rows["gpu_name"] if "gpu_name" in rows.columns else pd.Series(None, index=rows.index)
        return column.astype(object).where(column.notna(), fallback)

    base, new = models(base_rows, base_metadata), models(new_rows, new_metadata)
    shared = base.index.intersection(new.index)
    pairs = pd.DataFrame({"base": base.loc[shared], "new": new.loc[shared]}).dropna()
    across = pairs[pairs["base"] != pairs["new"]]
    if across.empty:
        return []
    kinds = ", ".join(f"{b} -> {n}" for b, n in sorted(set(zip(across["base"], across["new"]))))
    return [f"{len(across)} of {len(pairs)} case(s) compare rows measured on different GPU models "
            f"({kinds}); their timings differ for that reason alone: compare runs on one GPU model"]


#: Relative inter-quartile range ``(ms_q75 - ms_q25) / ms_median`` above which a case's
#: timings are called noisy (a warning, not a decision).
NOISY_RELATIVE_IQR = 0.10


def noisy_cases(rows: pd.DataFrame, threshold: float = NOISY_RELATIVE_IQR) -> list[tuple[str, float]]:
    """The ``ok`` cases whose timings spread more than ``threshold`` (IQR / median), as
    ``(label, spread)`` pairs, widest first.

    Uses ``ms_q25``/``ms_q75`` (or the quartiles of ``ms_samples``) and ``ms_median``.
    """
    found = []
    for record in rows.to_dict("records"):
        if row_status(record) != OK:
            continue
        median, q25, q75 = cell_number(record, "ms_median"), cell_number(record, "ms_q25"), cell_number(record, "ms_q75")
        if not (np.isfinite(q25) and np.isfinite(q75)):
            samples = parse_samples(record.get("ms_samples"))
            if len(samples) < 2:
                continue
            q25, q75 = np.quantile(samples, [0.25, 0.75])
        if not (np.isfinite(median) and median > 0):
            continue
        spread = float((q75 - q25) / median)
        if spread > threshold:
            found.append((case_label(record), spread))
    return sorted(found, key=lambda item: -item[1])


#: What to do about noisy cases (the end of ``run``'s warning and of compare's).
NOISE_ADVICE = ("measure on a quiet machine (close other programs), raise timing.iterations and "
                "timing.warmup in the suite, or give each worker fewer threads (OMP_NUM_THREADS)")


def slowdown_text(rows: pd.DataFrame, noisy: list[tuple[str, float]]) -> str:
    """What ``run --gpu-trace`` saw during the ``noisy`` cases (:func:`noisy_cases`' pairs):
    ``""`` where none of them was traced; else which slowdown reasons the driver reported in
    how many of them (:mod:`tflabench.run.gpu_trace`), e.g. ``"the GPU reported sw_power_cap
    during 3 of the 4 traced ones"``."""
    if "gpu_slowdowns" not in rows.columns:
        return ""
    labels = {label for label, _ in noisy}
    traced = [r.get("gpu_slowdowns") for r in rows.to_dict("records")
              if row_status(r) == OK and case_label(r) in labels and isinstance(r.get("gpu_slowdowns"), str)]
    if not traced:
        return ""
    slowed = [t for t in traced if t]
    if not slowed:
        return f"the GPU reported no slowdown reason during the {len(traced)} traced one(s)"
    seen = sorted({reason for t in slowed for reason in t.split(",")})
    return f"the GPU reported {', '.join(seen)} during {len(slowed)} of the {len(traced)} traced one(s)"


def noise_warnings(rows: pd.DataFrame, label: str) -> list[str]:
    """A warning when cases of one run spread more than :data:`NOISY_RELATIVE_IQR`
    (IQR / median): a busy machine, a GPU slowed by its power or thermal limit, or too-short
    cases make every decision on them shaky (:func:`noisy_cases`, :func:`slowdown_text`)."""
    noisy = noisy_cases(rows)
    if not noisy:
        return []
    worst_case, worst = noisy[0]
    trace = slowdown_text(rows, noisy)
    return [
        f"{label}: {len(noisy)} case(s) spread more than {NOISY_RELATIVE_IQR:.0%} (IQR / median; worst "
        f"{worst:.0%}, {worst_case}){'; ' + trace if trace else ''}; decisions on them are shaky: {NOISE_ADVICE}"
    ]
