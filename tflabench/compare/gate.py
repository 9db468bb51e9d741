"""The regression gate between two result sets (``tflabench compare``): each case's outcome
and the verdict over them.

Two result sets of one suite (see "Contract: result sets" in docs/ARCHITECTURE.md) are
matched case by case on the full configuration (:mod:`tflabench.compare.rows`), each pair
gets one outcome (:func:`compare_results`), and :class:`Comparison` says whether the
``--fail-on`` policy fails. The thresholds are :mod:`tflabench.compare.thresholds`', the
tests :mod:`tflabench.compare.statistics`', the warnings :mod:`tflabench.compare.caveats`';
:mod:`tflabench.compare.render` renders the report as a rich table, Markdown or JSON.

The decision rule (docs/ci.md, "How compare decides", gives the reasons):

* **time**: with ``r = new ms_median / base ms_median``, a case is *slower* when
  ``r >= 1 + time_threshold`` **and** the per-iteration samples (``ms_samples``) of the
  two runs differ by a two-sided Mann-Whitney U test at level ``alpha``
  (:func:`scipy.stats.mannwhitneyu`); *faster* when ``r <= 1 / (1 + time_threshold)`` and
  the test agrees. It is *the same* only when the samples show it: the ``1 - 2 alpha``
  confidence interval of the ratio (Hodges-Lehmann, the shifts of the log samples that
  one-sided Mann-Whitney tests at ``alpha`` do not reject) lies inside
  ``(1 / (1 + time_threshold), 1 + time_threshold)``. Anything else is *undecided*: the
  samples are too few or too noisy to tell a change of the threshold's size from none.
  Half that interval's width is the case's *resolution*, the smallest change its samples
  could detect. When either side has fewer than ``min_samples`` samples, the
  inter-quartile ranges ``(ms_q25, ms_q75)`` stand in for the samples (separated: slower
  or faster; every quartile ratio inside the band: the same).
* **memory**: ``peak_mem_bytes`` is deterministic for a given configuration and
  allocator, so no test: *larger* when it grew by more than ``mem_threshold``
  (relative) **and** by more than ``mem_floor_bytes`` (absolute); *smaller* likewise.
* **status**: ``ok`` in the base and ``wrong``/``crash``/``timeout``/``oom``/``error``
  in the new run is a *new failure*; so is a case only in the new run that does not
  run ``ok``. A case that ran ``ok`` in the base and is missing (or ``unavailable``) in
  the new run is *lost*: the run lost coverage.

* **tail**: where the median holds, a case whose upper tail grew (the 90th percentile or the
  mean of its samples past ``1 + time_threshold``) and whose samples above the base's 90th
  percentile are more than the base's by a one-sided Fisher exact test at ``alpha`` is a
  *tail* finding (:func:`decide_tail`), its own outcome, failing like a regression.
* **drift**: samples of one run cannot see a change between runs. Where such drift can
  exceed what the samples see (CPU timers, a spread warning on either side) a change is
  decided only beyond an allowance for it (:data:`CPU_DRIFT`, or the spread between the
  base and its A/A partners where those are given); inside it the case is *undecided* by
  drift, which does not count toward the undecided share of the gate.

The gate belongs to the base and the command line (:func:`resolve_thresholds`): the
defaults of :class:`Thresholds`, the base set's ``compare:`` section, a YAML thresholds
file, then the options. A candidate's own section is ignored with a warning
(:func:`candidate_warnings`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pandas as pd

from tflabench.compare.caveats import (
    environment_warnings, gpu_model_warnings, noise_warnings, noisy_cases, provenance_warnings,
)
from tflabench.compare.rows import (
    NOT_RUN, OK, UNAVAILABLE, cell_number, parse_samples, plain, prepare, row_status, suite_name,
)
from tflabench.compare.statistics import (
    CPU_DRIFT, TAIL_PERCENTILE, TimeDecision, decide_memory, decide_tail, decide_time, geometric_mean_speedup,
    history_drift,
)
from tflabench.compare.thresholds import (
    UNDECIDED_SHARE, Thresholds, candidate_warnings, load_thresholds_file, numerics_loosened, parse_fail_on,
    resolve_thresholds,
)
from tflabench.errors import UserError
from tflabench.store.conditions import CPU_TIMERS, timing_differences, timing_method
from tflabench.store.references import reference_for, suite_of
from tflabench.store.results import load_results
from tflabench.text_safety import case_label

#: Outcomes, worst first (the order of the report).
OUTCOMES = (
    "new_failure",  # ok -> wrong/crash/timeout/oom/error, or an added case that fails
    "regression",   # slower, or more peak memory
    "tail",         # the median holds, the upper tail (p90 or mean) grew past the threshold
    "lost",         # ok in base, missing or unavailable in new
    "still_failing",
    "undecided",    # both ok, but the samples cannot tell a change of the threshold's size from none
    "added",
    "removed",      # only in base, and not ok there (an ok one is "lost")
    "fixed",        # failing in base, ok in new
    "improvement",  # faster or less memory (and not slower)
    "unchanged",
)
_FAILURE_OUTCOMES = ("new_failure", "lost")
_SHARE_KINDS = ("unresolved", "timer")

#: Each outcome in words (reports and the verdict line).
OUTCOME_LABEL = {
    "new_failure": "new failure",
    "regression": "regression",
    "tail": "tail",
    "lost": "lost",
    "still_failing": "still failing",
    "undecided": "undecided",
    "added": "added",
    "removed": "removed",
    "fixed": "fixed",
    "improvement": "improvement",
    "unchanged": "unchanged",
}


# ----------------------------------------------------------------------------- comparison


@dataclass
class Comparison:
    """Result of :func:`compare_results`.

    Attributes:
        suite: the suite both result sets ran.
        cases: one row per case (either side): ``key``, ``case_id``, ``case`` (label),
            ``backend``, ``mode``, ``outcome`` (one of :data:`OUTCOMES`), ``detail``,
            ``base_status``, ``new_status``, ``base_ms``, ``new_ms`` (medians, ms),
            ``time_ratio`` (new / base), ``time_verdict``, ``undecided_kind`` (one of
            :data:`~tflabench.compare.statistics.UNDECIDED_KINDS`), ``p_value``, ``test``, ``ratio_low``,
            ``ratio_high`` (the ratio's confidence interval), ``resolution`` (smallest
            detectable relative change), ``drift`` (the allowance applied),
            ``tail_verdict``, ``p90_ratio``, ``mean_ratio``, ``tail_p_value``
            (:func:`decide_tail`), ``base_peak_mem_bytes``, ``new_peak_mem_bytes``,
            ``mem_ratio``, ``mem_verdict``, ``unchecked`` (the candidate's numerics gate
            was off or laxer), ``kernel``, ``new_reason``; sorted worst first.
        backends: per backend: ``cases`` compared (both ok), ``geomean_speedup``
            (base / new, > 1 faster), ``slower``, ``faster``, ``undecided``, ``failures``.
        warnings: environment differences and other things a reader must know.
        thresholds, threshold_source: what decided, and where each value came from.
        base_path, new_path: the two result sets.
    """

    suite: str
    cases: pd.DataFrame
    backends: pd.DataFrame
    warnings: list[str]
    thresholds: Thresholds
    threshold_source: dict[str, str]
    base_path: str = ""
    new_path: str = ""
    counts: dict[str, int] = field(default_factory=dict)

    def exit_status(self, fail_on: str = "any") -> int:
        """1 when the comparison fails the ``fail_on`` policy, else 0.

        ``fail_on`` is a comma list (:func:`parse_fail_on`): ``regression``: a slower case,
        a grown tail or more peak memory; ``failure``: a new failure or a lost case;
        ``undecided``: any case whose samples could not decide; ``any``: regression,
        failure, or more than :data:`UNDECIDED_SHARE` of the compared cases undecided
        because their samples cannot resolve the threshold or the sets used different
        timers (:meth:`undecided_share`); ``none``: never.

        Raises:
            UserError: an unknown ``fail_on``.
        """
        return int(bool(self.failures(fail_on)))

    def undecided_share(self) -> tuple[int, int]:
        """``(undecided, compared)``: the cases undecided for want of resolution or for
        different timers (not for drift, nor near the threshold's edge), and the cases ok on
        both sides."""
        compared = int((self.cases["base_status"].eq(OK) & self.cases["new_status"].eq(OK)).sum())
        counted = int((self.cases["outcome"].eq("undecided")
                       & self.cases["undecided_kind"].isin(_SHARE_KINDS)).sum())
        return counted, compared

    def failures(self, fail_on: str = "any") -> list[str]:
        """Why the comparison fails the ``fail_on`` policy, one phrase per reason; empty
        when it passes (:meth:`exit_status`).

        Raises:
            UserError: an unknown ``fail_on``.
        """
        groups = parse_fail_on(fail_on)
        c = self.counts
        reasons = []
        if "regression" in groups and c.get("regression", 0) + c.get("tail", 0):
            reasons.append(" and ".join(f"{c[o]} {OUTCOME_LABEL[o]}(s)" for o in ("regression", "tail")
                                        if c.get(o, 0)))
        if "failure" in groups and any(c.get(o, 0) for o in _FAILURE_OUTCOMES):
            reasons.append(f"{sum(c.get(o, 0) for o in _FAILURE_OUTCOMES)} new failure(s) or lost case(s)")
        if "undecided" in groups and c.get("undecided", 0):
            reasons.append(f"{c['undecided']} undecided")
        elif "share" in groups:
            counted, compared = self.undecided_share()
            if compared and counted / compared > UNDECIDED_SHARE:
                reasons.append(f"{counted} of {compared} compared case(s) undecided for want of resolution "
                               f"({counted / compared:.0%} > {UNDECIDED_SHARE:.0%})")
        return reasons

    def resolution_summary(self) -> dict[str, Any]:
        """The smallest change the samples could detect, over the cases ok on both sides:
        ``cases`` (count), ``median`` and ``worst`` resolution (fractions; inf where the
        samples bound nothing), ``worst_case`` (its label). Empty dict without such cases."""
        both = self.cases[self.cases["base_status"].eq(OK) & self.cases["new_status"].eq(OK)]
        values = both["resolution"].astype(float).fillna(float("inf"))
        if values.empty:
            return {}
        worst = int(np.argmax(values.to_numpy()))
        return {"cases": int(len(values)), "median": float(np.median(values)),
                "worst": float(values.iloc[worst]), "worst_case": str(both["case"].iloc[worst])}


def _timer_differs(base_meta: Mapping[str, Any], new_meta: Mapping[str, Any]) -> tuple[str, str] | None:
    timers = [value for field_name, *value in timing_differences(base_meta, new_meta) if field_name == "timer"]
    return tuple(timers[0]) if timers else None  # type: ignore[return-value]


def compare_results(base: Any, new: Any, thresholds: Thresholds | None = None,
                    threshold_source: Mapping[str, str] | None = None, history: Iterable[Any] = ()) -> Comparison:
    """Compare two result sets (objects with ``.rows``, ``.metadata``, ``.path``, e.g.
    :class:`tflabench.store.results.ResultSet`).

    Matching is by ``case_id`` and ``mode`` (the stable hash of the full configuration);
    where ``case_id`` is missing, by the identity columns. Decision rule: module docstring.
    ``history``: A/A partners of the base (result sets of the reference's code on the same
    machine); their largest change from the base (:func:`history_drift`) is every case's
    drift allowance. Without them, cases timed on the CPU or spread past
    :data:`~tflabench.compare.caveats.NOISY_RELATIVE_IQR` on either side get :data:`CPU_DRIFT`, the others none.

    Raises:
        UserError: the two sets ran different suites, or a table is corrupt (no ``status``
            column, no way to match, unparsable samples or numbers).
    """
    if thresholds is None:
        thresholds, threshold_source = resolve_thresholds(base.metadata)
    base_meta, new_meta = dict(base.metadata or {}), dict(new.metadata or {})
    base_suite, new_suite = suite_name(base_meta, base.rows), suite_name(new_meta, new.rows)
    if base_suite and new_suite and base_suite != new_suite:
        raise UserError(
            f"the result sets ran different suites: base {base_suite!r}, new {new_suite!r}; compare runs of one suite"
        )
    warnings = environment_warnings(base_meta, new_meta) + provenance_warnings(base_meta, new_meta)
    warnings += candidate_warnings(new_meta, thresholds, base_meta)
    base_rows = prepare(base.rows, f"base {base.path}", warnings)
    new_rows = prepare(new.rows, f"new {new.path}", warnings)
    warnings.extend(gpu_model_warnings(base_rows, new_rows, base_meta, new_meta))
    noisy: set[str] = set()
    for label, frame in (("base", base_rows), ("new", new_rows)):
        if frame.empty:
            warnings.append(f"{label} holds no case rows (an interrupted or empty run?)")
        else:
            warnings.extend(noise_warnings(frame, label))
            noisy |= {case for case, _ in noisy_cases(frame)}
    history = list(history)
    measured = history_drift(base_rows, history)
    if history:
        warnings.append(
            f"drift between runs from {len(history)} A/A partner(s) of the base: up to "
            f"{measured:+.1%}; changes inside it are undecided" if measured is not None else
            "the A/A partner(s) share no case with the base ran ok; the drift allowance stays the default")
    timer = _timer_differs(base_meta, new_meta)
    cpu_timed = timing_method(base_meta)["timer"] in CPU_TIMERS or timing_method(new_meta)["timer"] in CPU_TIMERS
    unchecked = bool(numerics_loosened(base_meta, new_meta))

    def drift_of(record: Mapping[str, Any]) -> float:
        if measured is not None:
            return measured
        exposed = cpu_timed or plain(record.get("device")) == "cpu" or case_label(record) in noisy
        return CPU_DRIFT if exposed else 0.0

    records = []
    keys = list(base_rows.index) + [k for k in new_rows.index if k not in base_rows.index]
    base_dict = base_rows.to_dict("index")
    new_dict = new_rows.to_dict("index")
    for key in keys:
        either = new_dict.get(key) or base_dict.get(key)
        records.append(_compare_one(key, base_dict.get(key), new_dict.get(key), thresholds,
                                    drift=drift_of(either), timer=timer, unchecked=unchecked))

    cases = pd.DataFrame.from_records(records, columns=_CASE_COLUMNS)
    for column in _TEXT_COLUMNS:  # None stays None (not NaN) in the text columns
        cases[column] = cases[column].astype(object).where(cases[column].notna(), None)
    order = {o: i for i, o in enumerate(OUTCOMES)}
    cases["_rank"] = cases["outcome"].map(order)
    # worst first: by outcome, then the largest slowdown, then the label for stability
    cases["_ratio"] = cases["time_ratio"].fillna(0.0)
    cases = (
        cases.sort_values(["_rank", "_ratio", "case"], ascending=[True, False, True], kind="mergesort")
        .drop(columns=["_rank", "_ratio"])
        .reset_index(drop=True)
    )
    counts = {o: int((cases["outcome"] == o).sum()) for o in OUTCOMES}
    return Comparison(
        suite=base_suite or new_suite or "?",
        cases=cases,
        backends=_per_backend(cases),
        warnings=warnings,
        thresholds=thresholds,
        threshold_source=dict(threshold_source or {}),
        base_path=str(base.path),
        new_path=str(new.path),
        counts=counts,
    )


_CASE_COLUMNS = (
    "key", "case_id", "case", "kernel", "backend", "mode", "outcome", "detail", "base_status", "new_status",
    "base_ms", "new_ms", "time_ratio", "time_verdict", "undecided_kind", "p_value", "test", "ratio_low",
    "ratio_high", "resolution", "drift", "tail_verdict", "p90_ratio", "mean_ratio", "tail_p_value",
    "base_peak_mem_bytes", "new_peak_mem_bytes", "mem_ratio", "mem_verdict", "unchecked", "new_reason",
)

_TEXT_COLUMNS = (
    "key", "case_id", "case", "kernel", "backend", "mode", "outcome", "detail", "base_status", "new_status",
    "time_verdict", "undecided_kind", "test", "tail_verdict", "mem_verdict", "new_reason",
)


def _compare_one(key: str, b: Mapping[str, Any] | None, n: Mapping[str, Any] | None,
                 thresholds: Thresholds, drift: float = 0.0, timer: tuple[str, str] | None = None,
                 unchecked: bool = False) -> dict[str, Any]:
    either = n if n is not None else b
    out: dict[str, Any] = {c: None for c in _CASE_COLUMNS}
    out.update(
        key=key,
        case_id=plain(either.get("case_id")),
        case=case_label(either),
        kernel=plain(either.get("kernel")),
        backend=plain(either.get("backend")),
        mode=plain(either.get("mode")),
        base_status=row_status(b),
        new_status=row_status(n),
        new_reason=plain(n.get("reason")) if n is not None else None,
        unchecked=bool(unchecked and n is not None),
    )
    bs, ns = out["base_status"], out["new_status"]
    if b is not None and n is not None and bs == OK and ns == OK:
        base_samples, new_samples = parse_samples(b.get("ms_samples")), parse_samples(n.get("ms_samples"))
        td = decide_time(
            cell_number(b, "ms_median"), cell_number(n, "ms_median"), base_samples, new_samples, thresholds,
            (cell_number(b, "ms_q25"), cell_number(b, "ms_q75")), (cell_number(n, "ms_q25"), cell_number(n, "ms_q75")),
            drift=drift,
        )
        if timer is not None and td.verdict != "n/a":  # numbers of two kinds: nothing to decide
            td = TimeDecision("undecided", td.ratio, td.p_value, td.test, td.low, td.high, td.resolution,
                              td.drift, "timer")
        tail_verdict, p90_ratio, mean_ratio, tail_p = decide_tail(base_samples, new_samples, thresholds, drift)
        if timer is not None:
            tail_verdict = "n/a"
        mem_verdict, mem_ratio = decide_memory(
            cell_number(b, "peak_mem_bytes"), cell_number(n, "peak_mem_bytes"), thresholds
        )
        out.update(
            base_ms=cell_number(b, "ms_median"), new_ms=cell_number(n, "ms_median"), time_ratio=td.ratio,
            time_verdict=td.verdict, undecided_kind=td.kind, p_value=td.p_value, test=td.test,
            ratio_low=td.low, ratio_high=td.high, resolution=td.resolution, drift=td.drift,
            tail_verdict=tail_verdict, p90_ratio=p90_ratio, mean_ratio=mean_ratio, tail_p_value=tail_p,
            base_peak_mem_bytes=cell_number(b, "peak_mem_bytes"), new_peak_mem_bytes=cell_number(n, "peak_mem_bytes"),
            mem_ratio=mem_ratio, mem_verdict=mem_verdict,
        )
        details = []
        if td.verdict in ("slower", "faster"):
            details.append(f"time {td.ratio - 1:+.1%}")
        if mem_verdict in ("larger", "smaller"):
            details.append(f"memory {mem_ratio - 1:+.1%}")
        tail = tail_verdict == "slower" and td.verdict != "slower"
        if tail:
            details.append(f"tail: p{TAIL_PERCENTILE} {p90_ratio - 1:+.1%}, mean {mean_ratio - 1:+.1%} "
                           f"(median {td.ratio - 1:+.1%}; Fisher p {tail_p:.1e})")
        if td.verdict == "slower" or mem_verdict == "larger":
            outcome = "regression"
        elif tail:
            outcome = "tail"
        elif td.verdict in ("undecided", "n/a"):
            outcome = "undecided"
            details.append(_undecided_reason(td, thresholds))
        elif unchecked and (td.verdict == "faster" or mem_verdict == "smaller"):
            outcome = "undecided"
            out["undecided_kind"] = "unchecked"
            details.append("faster or smaller, but measured without the numerics gate (numerics.check off): "
                           "not counted as an improvement")
        elif td.verdict == "faster" or mem_verdict == "smaller":
            outcome = "improvement"
        else:
            outcome = "unchanged"
        out.update(outcome=outcome, detail="; ".join(details))
        return out

    if b is None:
        outcome = "added" if ns in (OK, UNAVAILABLE) else "new_failure"
        detail = "only in new" + ("" if ns == OK else f" ({ns})")
    elif n is None:
        outcome = "lost" if bs == OK else "removed"
        detail = "missing in new" + ("" if bs == OK else f" (was {bs})")
    elif bs == OK:
        outcome = "lost" if ns in (UNAVAILABLE, NOT_RUN) else "new_failure"
        detail = f"ok -> {ns}"
    elif ns == OK:
        outcome, detail = "fixed", f"{bs} -> ok"
    elif bs == UNAVAILABLE and ns != UNAVAILABLE:
        outcome, detail = "new_failure", f"{bs} -> {ns}"
    else:
        outcome = "still_failing" if ns != UNAVAILABLE or bs != UNAVAILABLE else "unchanged"
        detail = f"{bs} -> {ns}" if bs != ns else str(ns)
    if n is not None and ns == OK:
        out.update(new_ms=cell_number(n, "ms_median"), new_peak_mem_bytes=cell_number(n, "peak_mem_bytes"))
    if b is not None and bs == OK:
        out.update(base_ms=cell_number(b, "ms_median"), base_peak_mem_bytes=cell_number(b, "peak_mem_bytes"))
    out.update(outcome=outcome, detail=detail)
    return out


def _undecided_reason(td: TimeDecision, thresholds: Thresholds) -> str:
    """Why a time decision is undecided, and what would decide it (one phrase)."""
    if td.verdict == "n/a":
        return "no timing to compare"
    if td.kind == "timer":
        return f"time {td.ratio - 1:+.1%}, not decided: the two sets were timed by different timers"
    if td.test is None:
        return "no samples or quartiles to decide on"
    change = f"time {td.ratio - 1:+.1%}"
    if td.kind == "drift":
        return (f"{change}, inside the allowance for drift between runs, which samples of one run "
                f"cannot see (up to {td.drift:+.0%}; docs/compare-gate.md)")
    if not math.isfinite(td.resolution):
        return (f"{change}, could not decide: too few samples to bound the change "
                f"(at least {thresholds.min_samples} per side)")
    return (f"{change}, could not decide: the samples resolve ±{td.resolution:.1%}, the threshold is "
            f"{thresholds.time_threshold:.0%}; more iterations or a quieter machine")


def _per_backend(cases: pd.DataFrame) -> pd.DataFrame:
    rows = []
    both = cases[cases["base_status"].eq(OK) & cases["new_status"].eq(OK)]
    for backend in sorted({str(b) for b in cases["backend"].dropna()}):
        sub = both[both["backend"].astype(str) == backend]
        rows.append(
            dict(
                backend=backend,
                cases=int(len(sub)),
                geomean_speedup=geometric_mean_speedup(sub["base_ms"], sub["new_ms"]),
                slower=int((sub["time_verdict"] == "slower").sum()),
                faster=int((sub["time_verdict"] == "faster").sum()),
                undecided=int((cases[cases["backend"].astype(str) == backend]["outcome"] == "undecided").sum()),
                failures=int(cases[(cases["backend"].astype(str) == backend)
                                   & cases["outcome"].isin(_FAILURE_OUTCOMES)].shape[0]),
            )
        )
    frame = pd.DataFrame(rows, columns=["backend", "cases", "geomean_speedup", "slower", "faster", "undecided",
                                        "failures"])
    # worst backend first (lowest speed-up)
    return frame.sort_values("geomean_speedup", na_position="last", kind="mergesort").reset_index(drop=True)


def compare_paths(base: Path, new: Path | None, *, reference: str | None = None, partners: Iterable[Path] = (),
                  thresholds_file: Path | None = None, overrides: Mapping[str, Any] | None = None,
                  on_loaded: Callable[..., None] | None = None) -> Comparison:
    """``tflabench compare`` from paths: load BASE and NEW (with ``reference``, a GPU model:
    NEW is ``base`` and BASE the reference set of its suite, :mod:`tflabench.store.references`)
    and the A/A ``partners``, call ``on_loaded(base_set, new_set, *partner_sets)`` (the CLI
    prints what loading skipped), resolve the thresholds (:func:`resolve_thresholds`: the
    base's suite, ``thresholds_file``, then ``overrides``, the options) and compare
    (:func:`compare_results`).

    Raises:
        UserError: two sets with ``reference`` or one without it, no reference set, a set
            that is missing or corrupt, a bad thresholds file or value, sets of different suites.
    """
    if reference is not None or new is None:
        base, new = _reference_pair(reference, base, new)
    base_set, new_set = load_results(base), load_results(new)
    partner_sets = [load_results(path) for path in partners]
    if on_loaded is not None:
        on_loaded(base_set, new_set, *partner_sets)
    file_values = load_thresholds_file(thresholds_file) if thresholds_file else None
    thresholds, source = resolve_thresholds(base_set.metadata, file_values, overrides)
    return compare_results(base_set, new_set, thresholds, source, history=partner_sets)


def _reference_pair(gpu: str | None, first: Path, second: Path | None) -> tuple[Path, Path]:
    """(BASE, NEW) for ``compare --reference GPU NEW`` (tflabench.store.references); raises
    UserError for two sets with --reference or one set without it."""
    if gpu is None:
        raise UserError("compare: give BASE and NEW, or --reference GPU and NEW")
    if second is not None:
        raise UserError("compare --reference: give one result set (NEW), not two; "
                        "without --reference give BASE and NEW")
    try:
        return reference_for(gpu, suite_of(first)), first
    except UserError as exc:
        raise UserError(f"--reference {gpu}: {exc}; or compare against a directory: "
                        f"tflabench compare BASE {first}") from None
