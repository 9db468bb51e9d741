"""Regression report between two result sets (``tflabench compare``).

Two result sets of one suite (see "Contract: result sets" in docs/ARCHITECTURE.md) are
matched case by case on the full configuration, each pair gets one outcome, and the
report is rendered as a rich table, GitHub-flavoured Markdown or JSON.

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

import json
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pandas as pd

from tflabench.errors import UserError
from tflabench.store.conditions import CPU_TIMERS, timing_differences, timing_method
from tflabench.store.results import LIMIT_FIELDS, case_label, recorded_timing
from tflabench.text_safety import LABEL_WIDTH, markdown_text, terminal_text

#: Statuses that mean the case ran and produced a timing.
OK = "ok"
#: Statuses that mean the case was attempted and failed (a *failure* when it was ``ok``).
FAILING = ("wrong", "crash", "timeout", "oom", "error")
#: The case could not be attempted here (backend not installed, mode unsupported).
UNAVAILABLE = "unavailable"
#: The run gave the case's kernel up before it (``--max-kernel-failures``): coverage lost.
NOT_RUN = "not_run"

#: Identity columns (docs/ARCHITECTURE.md); used to match when ``case_id`` is absent
#: and to describe a case.
IDENTITY_COLUMNS = (
    "kernel", "backend", "family", "params", "mode", "dtype", "device", "batch",
    "seq_len", "heads", "d_qk", "d_hv", "chunk_size", "embedding_dim", "numerics_case",
)

#: Metadata keys whose difference makes timings incomparable: warned about, never silent.
ENVIRONMENT_KEYS = ("gpu_name", "driver", "cuda", "torch", "triton")

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
FAIL_ON_CHOICES = ("regression", "failure", "undecided", "any", "none")
_FAILURE_OUTCOMES = ("new_failure", "lost")


def parse_fail_on(text: str) -> frozenset[str]:
    """The outcome groups a ``--fail-on`` value fails on: a comma list of
    :data:`FAIL_ON_CHOICES` (``any`` = ``regression,failure`` and the undecided share of
    :data:`UNDECIDED_SHARE`, group ``share``; ``none``: nothing).

    Raises:
        UserError: an empty list or an unknown choice.
    """
    items = [item.strip().lower() for item in str(text).split(",") if item.strip()]
    if not items:
        raise UserError(f"--fail-on: empty; give one or more of {', '.join(FAIL_ON_CHOICES)}")
    groups: set[str] = set()
    for item in items:
        if item not in FAIL_ON_CHOICES:
            raise UserError(f"--fail-on: {item!r} is not one of {', '.join(FAIL_ON_CHOICES)} "
                            "(a comma list, e.g. regression,undecided)")
        groups |= {"any": {"regression", "failure", "share"}, "none": set()}.get(item, {item})
    return frozenset(groups)


@dataclass(frozen=True)
class Thresholds:
    """Decision thresholds of :func:`compare_results` (docs/ci.md, "How compare decides").

    Attributes:
        time_threshold: smallest relative change of the median time that is reported
            (0.03 = 3 %); a slowdown must reach ``1 + t``, a speed-up ``1 / (1 + t)``.
        alpha: significance level of the two-sided Mann-Whitney U test on the
            per-iteration samples.
        min_samples: fewest samples per side for the test; below it the
            inter-quartile-range rule is used.
        mem_threshold: smallest relative change of ``peak_mem_bytes`` that is reported.
        mem_floor_bytes: smallest absolute change of ``peak_mem_bytes`` (bytes) that is
            reported (allocator rounding stays quiet).
    """

    time_threshold: float = 0.03
    alpha: float = 0.01
    min_samples: int = 5
    mem_threshold: float = 0.05
    mem_floor_bytes: int = 1 << 20

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


def _check_threshold(name: str, value: Any, where: str) -> float | int:
    """Validate one threshold value against :data:`tflabench.bounds.THRESHOLD_RANGES`
    (finite, in range, an integer where one is meant); UserError naming ``where``, the
    value and the allowed range."""
    from tflabench.bounds import THRESHOLD_RANGES, check_number

    lo, hi, lo_open, hi_open, integer = THRESHOLD_RANGES[name]
    reason = check_number(value, lo, hi, lo_open=lo_open, hi_open=hi_open, integer=integer)
    if reason:
        raise UserError(f"{where}: {name} {reason}")
    return int(value) if integer else float(value)


def _threshold_mapping(mapping: Any, where: str, check: bool = True) -> dict[str, Any]:
    if mapping is None:
        return {}
    if not isinstance(mapping, Mapping):
        raise UserError(f"{where}: expected a mapping of thresholds, got {type(mapping).__name__}")
    out = {}
    for name, value in mapping.items():
        if name not in Thresholds.names():
            allowed = ", ".join(Thresholds.names())
            raise UserError(f"{where}: unknown threshold {name!r}; allowed: {allowed}")
        if value is not None:
            out[name] = _check_threshold(name, value, where) if check else value
    return out


def load_thresholds_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML thresholds file: a mapping of :class:`Thresholds` field names to values.

    A top-level ``compare:`` key is accepted too, so a suite YAML's section can be reused.

    Raises:
        UserError: the file is missing, not YAML, or names an unknown/invalid threshold.
    """
    from tflabench.yaml_load import load_yaml

    path = Path(path)
    data = load_yaml(path, f"--thresholds {path}")
    if isinstance(data, Mapping) and "compare" in data:
        data = data["compare"]
    return _threshold_mapping(data, f"--thresholds {path}")


def resolve_thresholds(
    base_metadata: Mapping[str, Any] | None = None,
    file_values: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> tuple[Thresholds, dict[str, str]]:
    """Combine the threshold sources, later ones winning.

    Order: :class:`Thresholds` defaults < base metadata ``compare`` (the reference's suite)
    < ``file_values`` (``--thresholds FILE``) < ``overrides`` (CLI options; ``None``
    values are ignored). The candidate's metadata is no source: a set under judgement
    does not set its own gate (:func:`candidate_warnings` names what it asked for).

    Returns:
        (thresholds, source) where ``source`` maps each field to where its value came from.

    Raises:
        UserError: an unknown threshold name or an out-of-range value.
    """
    values: dict[str, Any] = {}
    source = {name: "default" for name in Thresholds.names()}
    layers = (
        ("base suite", _threshold_mapping((base_metadata or {}).get("compare"), "base metadata 'compare'")),
        ("thresholds file", _threshold_mapping(file_values, "thresholds file")),
        ("option", {k: _check_threshold(k, v, f"--{k.replace('_', '-')}")
                    for k, v in _threshold_mapping(overrides, "option", check=False).items()}),
    )
    for name, layer in layers:
        for key, value in layer.items():
            values[key] = value
            source[key] = name
    return Thresholds(**values), source


def numerics_checked(metadata: Mapping[str, Any]) -> bool | None:
    """Whether a result set was measured behind the numerics gate
    (``measurement.numerics.check`` of its metadata); None where the set does not say."""
    measurement = metadata.get("measurement") if isinstance(metadata, Mapping) else None
    numerics = measurement.get("numerics") if isinstance(measurement, Mapping) else None
    check = numerics.get("check") if isinstance(numerics, Mapping) else None
    return check if isinstance(check, bool) else None


#: The fields of a suite's ``numerics`` that decide whether a row is ``ok``: a candidate
#: whose differ from the base's is judged as one measured without the gate.
NUMERICS_GATE_FIELDS = ("check", "tolerance", "budgets")


def numerics_loosened(base_metadata: Mapping[str, Any], new_metadata: Mapping[str, Any]) -> list[str]:
    """The :data:`NUMERICS_GATE_FIELDS` of ``measurement.numerics`` on which the candidate
    may be laxer than the base: ``check`` off, or a ``tolerance`` or ``budgets`` that
    differs from the base's (where both record the field); empty when none."""
    def numerics(metadata: Mapping[str, Any]) -> Mapping[str, Any]:
        measurement = metadata.get("measurement") if isinstance(metadata, Mapping) else None
        value = measurement.get("numerics") if isinstance(measurement, Mapping) else None
        return value if isinstance(value, Mapping) else {}

    base, new = numerics(base_metadata), numerics(new_metadata)
    out = ["check"] if numerics_checked(new_metadata) is False else []
    return out + [key for key in NUMERICS_GATE_FIELDS[1:] if key in base and key in new and base[key] != new[key]]


def candidate_warnings(new_metadata: Mapping[str, Any], thresholds: Thresholds,
                       base_metadata: Mapping[str, Any] | None = None) -> list[str]:
    """What the candidate set asked for that does not loosen the gate: one warning naming
    its own ``compare:`` thresholds (ignored: the gate is the base's and the command
    line's) and one when it was measured without the numerics gate or with other
    numerics settings than the base (:func:`numerics_loosened`: its faster cases do not
    count as improvements)."""
    out = []
    asked = new_metadata.get("compare") if isinstance(new_metadata, Mapping) else None
    if isinstance(asked, Mapping):
        differing = [f"{name} {repr(asked[name])[:40]}" for name in sorted(map(str, asked))
                     if name in Thresholds.names() and asked[name] is not None
                     and asked[name] != getattr(thresholds, name)]
        unknown = sorted(str(name)[:40] for name in asked if name not in Thresholds.names())
        if differing or unknown:
            text = ", ".join(differing + [f"{name!r} (unknown)" for name in unknown])
            out.append(f"new asks for {text} in its compare section; ignored: the gate's thresholds come from "
                       "the base set, --thresholds and the options")
    elif asked is not None:
        out.append("new holds a compare section that is not a mapping; ignored")
    loosened = numerics_loosened(base_metadata or {}, new_metadata)
    if "check" in loosened:
        out.append("new was measured without the numerics gate (numerics.check off): its cases are marked "
                   "'unchecked' and a faster one does not count as an improvement")
    elif loosened:
        out.append(f"new was measured with other numerics.{' and numerics.'.join(loosened)} than the base: its "
                   "cases are marked 'unchecked' and a faster one does not count as an improvement")
    return out


# ----------------------------------------------------------------------------- statistics


def parse_samples(value: Any) -> np.ndarray:
    """Per-iteration times (ms) of one row as a float array; empty when absent.

    Accepts the stored JSON list (``ms_samples`` column), a list/array, or None/NaN.
    Non-finite entries are dropped.
    """
    if value is None:
        return np.empty(0)
    if isinstance(value, float) and math.isnan(value):
        return np.empty(0)
    if isinstance(value, (bytes, str)):
        text = value.decode() if isinstance(value, bytes) else value
        if not text.strip():
            return np.empty(0)
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            raise UserError(f"corrupt table: ms_samples is not a JSON list: {text[:40]!r}") from None
    try:
        array = np.asarray(value, dtype=float).ravel()
    except (TypeError, ValueError):
        raise UserError(f"corrupt table: ms_samples is not a list of numbers: {str(value)[:40]!r}") from None
    return array[np.isfinite(array)]


#: The run-to-run change of a case's median that its samples cannot see, assumed where
#: nothing measures it (docs/compare-gate.md, "Drift between runs"): 1.0 lets a median move up to
#: 2x between two runs of the same code before a change is decided. A/A pairs of the CPU
#: demo on a shared 2-core machine moved single cases by up to +92 %.
CPU_DRIFT = 1.0

#: The share of the cases compared (ok on both sides) that may be undecided because their
#: samples cannot resolve the threshold before the default gate fails (docs/compare-gate.md, "Who sets the gate").
UNDECIDED_SHARE = 0.25

#: Why a case is undecided: its samples cannot resolve the threshold (counts toward
#: :data:`UNDECIDED_SHARE`); its change lies near the threshold's edge; its change lies
#: inside the run-to-run drift allowance; the two sets were timed by different timers
#: (counts); the candidate ran without the numerics gate and was faster.
UNDECIDED_KINDS = ("unresolved", "near", "drift", "timer", "unchecked")
_SHARE_KINDS = ("unresolved", "timer")


@dataclass(frozen=True)
class TimeDecision:
    """Outcome of :func:`decide_time`.

    Attributes:
        verdict: ``slower``, ``faster``, ``same`` (the samples show any change is inside
            the threshold), ``undecided`` (too few or too noisy samples to tell, or a
            change inside the drift allowance) or ``n/a`` (no positive medians).
        ratio: new median / base median.
        p_value: two-sided Mann-Whitney U p of the samples (None without samples).
        test: the evidence used: ``mannwhitneyu``, ``iqr``, ``identical`` (the same
            samples on both sides, however few) or None.
        low, high: bounds of the ratio's confidence interval (``1 - 2 alpha``; from the
            quartiles under the ``iqr`` rule); NaN when none could be formed.
        resolution: the smallest relative change these samples could detect: half the
            interval's width on the log scale, as a fraction (0.05 = 5 %); inf when the
            samples bound nothing.
        drift: the run-to-run allowance applied (a fraction: 1.0 = up to 2x; 0 none).
        kind: for ``undecided``, one of :data:`UNDECIDED_KINDS`; else None.
    """

    verdict: str
    ratio: float
    p_value: float | None
    test: str | None
    low: float = float("nan")
    high: float = float("nan")
    resolution: float = float("inf")
    drift: float = 0.0
    kind: str | None = None


def _count_at_most(x_sorted: np.ndarray, y_sorted: np.ndarray, shift: float) -> int:
    """How many pairwise differences ``y_j - x_i`` are ``<= shift``: one binary search per
    ``y_j`` in the sorted ``x`` (O(n log m), no pairs built)."""
    return int(np.sum(len(x_sorted) - np.searchsorted(x_sorted, y_sorted - shift, side="left")))


def pairwise_difference_quantile(x: np.ndarray, y: np.ndarray, q: float = 0.5) -> float:
    """The ``q`` quantile of the ``len(x) * len(y)`` pairwise differences ``y_j - x_i``
    (``q`` 0.5: the Hodges-Lehmann shift of ``y`` against ``x``), in O((n + m) log(n + m))
    time per step of a bisection over the difference's value and O(n + m) memory: the
    pairs are counted by binary search, never built (docs/compare-gate.md, "Cost").

    For an even count the median is the mean of the two middle differences, as
    ``np.median`` takes it. NaN when either side is empty.
    """
    x_sorted, y_sorted = np.sort(np.asarray(x, dtype=float)), np.sort(np.asarray(y, dtype=float))
    total = len(x_sorted) * len(y_sorted)
    if total == 0:
        return float("nan")

    n = len(x_sorted)
    window_limit = max(4 * (n + len(y_sorted)), 4096)

    def below(shift: float) -> np.ndarray:  # per y_j: the first x_i with y_j - x_i <= shift
        return np.searchsorted(x_sorted, y_sorted - shift, side="left")

    def kth(k: int) -> float:  # the k-th smallest difference, k from 1
        lo = float(y_sorted[0] - x_sorted[-1]) - 1.0  # no difference at or below lo
        hi = float(y_sorted[-1] - x_sorted[0]) + 1.0  # every difference at or below hi
        start, stop = below(hi), below(lo)
        for _ in range(200):  # invariant: count(<= lo) < k <= count(<= hi)
            if int(np.sum(stop - start)) <= window_limit:
                break
            mid = lo + (hi - lo) / 2
            if mid <= lo or mid >= hi:
                break
            index = below(mid)
            if n * len(y_sorted) - int(index.sum()) >= k:
                hi, start = mid, index
            else:
                lo, stop = mid, index
        # the differences in (lo, hi], built from the same searches that counted them
        sizes = stop - start
        inside = int(sizes.sum())
        if inside == 0 or inside > window_limit:  # a mass of tied differences: any one of them
            return hi
        rows = np.repeat(np.arange(len(y_sorted)), sizes)
        offsets = np.arange(inside) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        window = np.sort(y_sorted[rows] - x_sorted[np.repeat(start, sizes) + offsets])
        rank = k - (n * len(y_sorted) - int(stop.sum())) - 1
        return float(window[min(max(rank, 0), inside - 1)])

    position = q * (total - 1)  # np.quantile's linear rule; the median of an even count averages two
    k_low = int(math.floor(position)) + 1
    low = kth(k_low)
    if position == math.floor(position):
        return low
    high = kth(k_low + 1)
    return low + (high - low) * (position - math.floor(position))


def ratio_interval(base_samples: np.ndarray, new_samples: np.ndarray, alpha: float) -> tuple[float, float, float]:
    """Confidence interval of the time ratio new / base from per-iteration samples (ms).

    The ratio is a shift of the log samples; its estimate is the Hodges-Lehmann shift
    (median of the pairwise differences ``log new_j - log base_i``,
    :func:`pairwise_difference_quantile`) and its interval the shifts that neither
    one-sided Mann-Whitney U test at ``alpha`` (:func:`scipy.stats.mannwhitneyu`)
    rejects, a ``1 - 2 alpha`` interval (Hollander and Wolfe, *Nonparametric Statistical
    Methods*, sec. 4.3). Each bound is found by bisection over the shift between the
    smallest and the largest difference, each step one test of O((n + m) log(n + m)):
    no pairwise differences are built, so 40,000 samples a side (the most
    ``timing.iterations`` allows) cost seconds and a few MB.

    Returns:
        ``(low, estimate, high)`` as ratios; ``low`` is 0 and ``high`` inf where the
        samples are too few to reject any shift (for example 4 against 4 at alpha 0.01).
    """
    from scipy.stats import mannwhitneyu

    base_log = np.sort(np.log(base_samples[base_samples > 0]))
    new_log = np.sort(np.log(new_samples[new_samples > 0]))
    if len(base_log) == 0 or len(new_log) == 0:
        return 0.0, float("nan"), float("inf")
    estimate = pairwise_difference_quantile(base_log, new_log, 0.5)
    smallest, largest = float(new_log[0] - base_log[-1]), float(new_log[-1] - base_log[0])
    margin = 1.0 + (largest - smallest)

    def p_value(shift: float, alternative: str) -> float:
        return float(mannwhitneyu(new_log - shift, base_log, alternative=alternative).pvalue)

    def bound(alternative: str) -> float:
        # "greater": p rises with the shift; the low bound is where it reaches alpha.
        # "less": p falls with the shift; the high bound is where it drops below alpha.
        lo, hi = smallest - margin, largest + margin
        rising = alternative == "greater"
        if rising and p_value(lo, alternative) >= alpha:
            return -math.inf
        if not rising and p_value(hi, alternative) >= alpha:
            return math.inf
        for _ in range(64):  # invariant: rejected at lo ("greater") / accepted at lo ("less")
            mid = lo + (hi - lo) / 2
            if mid <= lo or mid >= hi or hi - lo <= 1e-12 * max(1.0, abs(mid)):
                break
            accepted = p_value(mid, alternative) >= alpha
            if accepted == rising:
                hi = mid
            else:
                lo = mid
        return hi if rising else lo

    low, high = bound("greater"), bound("less")
    return math.exp(low), math.exp(estimate), math.exp(high)


def _resolution(low: float, centre: float, high: float) -> float:
    """Half the width of ``[low, high]`` around ``centre`` on the log scale, as a
    relative change (the larger side); inf when unbounded."""
    if not (low > 0 and math.isfinite(high) and centre > 0):
        return float("inf")
    return float(max(high / centre, centre / low) - 1.0)


def decide_time(
    base_median: float,
    new_median: float,
    base_samples: np.ndarray,
    new_samples: np.ndarray,
    thresholds: Thresholds,
    base_iqr: tuple[float, float] | None = None,
    new_iqr: tuple[float, float] | None = None,
    drift: float = 0.0,
) -> TimeDecision:
    """Decide whether one case got slower, faster, stayed the same, or cannot be decided
    (times in ms).

    Rule (module docstring; docs/ci.md): slower / faster when the ratio of medians passes
    ``time_threshold`` and a two-sided Mann-Whitney U test on the per-iteration samples
    rejects equal distributions at ``alpha``; the same when the ratio's confidence
    interval (:func:`ratio_interval`) lies inside the threshold band; else undecided.
    With fewer than ``min_samples`` samples on a side, the inter-quartile ranges
    ``(ms_q25, ms_q75)`` stand in: separated decides a change, every ratio of quartiles
    inside the band decides the same.

    ``drift`` (a fraction, 1.0 = 2x) is the run-to-run change the samples cannot see
    (docs/compare-gate.md, "Drift between runs"): the ratio and its interval are then judged against
    the band widened by ``1 + drift`` (a slowdown must pass ``(1 + time_threshold)
    (1 + drift)`` with its interval above ``1 + drift``; a speed-up likewise); a change the
    samples alone would have decided but the widened band does not is undecided of kind
    ``drift``. "The same" needs no widening: drift makes two runs differ, never agree.
    """
    from scipy.stats import mannwhitneyu

    if not (np.isfinite(base_median) and np.isfinite(new_median)) or base_median <= 0 or new_median <= 0:
        return TimeDecision("n/a", float("nan"), None, None, kind="unresolved")
    ratio = float(new_median / base_median)
    bound = 1.0 + thresholds.time_threshold
    allowance = 1.0 + max(0.0, float(drift))
    if base_median == new_median and len(base_samples) and np.array_equal(np.sort(base_samples),
                                                                          np.sort(new_samples)):
        return TimeDecision("same", 1.0, 1.0, "identical", 1.0, 1.0, 0.0, allowance - 1.0)  # the same record

    def judge(low: float, high: float, significant: bool, widen: float) -> str:
        if significant and ratio >= bound * widen and low > widen:
            return "slower"
        if significant and ratio <= 1.0 / (bound * widen) and high < 1.0 / widen:
            return "faster"
        if 1.0 / bound < low and high < bound:  # drift cannot make two runs agree: no widening
            return "same"
        return "undecided"

    def decision(low: float, high: float, significant: bool, p_value: float | None, test: str,
                 resolution: float) -> TimeDecision:
        plain = judge(low, high, significant, 1.0)
        verdict = judge(low, high, significant, allowance) if allowance > 1.0 else plain
        kind = None
        if verdict == "undecided":
            kind = ("drift" if plain != "undecided"
                    else "unresolved" if not resolution <= thresholds.time_threshold else "near")
        return TimeDecision(verdict, ratio, p_value, test, low, high, resolution,
                            allowance - 1.0, kind)

    if len(base_samples) >= thresholds.min_samples and len(new_samples) >= thresholds.min_samples:
        if np.ptp(np.concatenate([base_samples, new_samples])) == 0:
            p_value = 1.0  # every sample equal: nothing to tell apart
        else:
            p_value = float(mannwhitneyu(new_samples, base_samples, alternative="two-sided").pvalue)
        low, centre, high = ratio_interval(base_samples, new_samples, thresholds.alpha)
        return decision(low, high, p_value < thresholds.alpha, p_value, "mannwhitneyu",
                        _resolution(low, centre, high))

    if base_iqr is not None and new_iqr is not None and all(np.isfinite(base_iqr)) and all(np.isfinite(new_iqr)) \
            and min(base_iqr) > 0 and min(new_iqr) > 0:
        low, high = new_iqr[0] / base_iqr[1], new_iqr[1] / base_iqr[0]
        separated = new_iqr[0] > base_iqr[1] or new_iqr[1] < base_iqr[0]
        return decision(low, high, separated, None, "iqr", _resolution(low, ratio, high))

    # Neither samples nor quartiles: the ratio alone cannot tell noise from change.
    return TimeDecision("undecided", ratio, None, None, drift=allowance - 1.0, kind="unresolved")


#: The upper percentile :func:`decide_tail` watches.
TAIL_PERCENTILE = 90

#: :func:`decide_tail`'s test runs at ``alpha`` times this: a tail is a rarer finding than
#: a median, and on the synthetic noise model of ``tests/test_compare.py`` (5 % outliers
#: 1.3-3x slower in both runs) ``alpha`` itself flagged 0.3 % of A/A cases, a tenth of it 0.03 %.
TAIL_LEVEL = 0.1


def decide_tail(base_samples: np.ndarray, new_samples: np.ndarray, thresholds: Thresholds,
                drift: float = 0.0) -> tuple[str, float, float, float | None]:
    """Whether the upper tail of a case's times grew while its median may hold (docs/compare-gate.md,
    "Tail"): ``(verdict, p90 ratio, mean ratio, p)``, verdict ``slower`` or ``same``
    (``n/a`` with fewer than ``min_samples`` samples a side).

    With ``bound = (1 + time_threshold) (1 + drift)``: slower when the new 90th
    percentile or mean (ms) is at least ``bound`` times the base's **and** the new samples
    above ``bound`` times the base's 90th percentile outnumber the base's own by a one-sided
    Fisher exact test at ``alpha * TAIL_LEVEL`` (:func:`scipy.stats.fisher_exact`): one
    stall in a hundred calls is no finding, ten are. O(n log n): quantiles and counts.
    """
    from scipy.stats import fisher_exact

    nan = float("nan")
    if len(base_samples) < thresholds.min_samples or len(new_samples) < thresholds.min_samples:
        return "n/a", nan, nan, None
    base_p90, new_p90 = np.percentile(base_samples, TAIL_PERCENTILE), np.percentile(new_samples, TAIL_PERCENTILE)
    base_mean, new_mean = float(np.mean(base_samples)), float(np.mean(new_samples))
    if not (base_p90 > 0 and base_mean > 0):
        return "n/a", nan, nan, None
    p90_ratio, mean_ratio = float(new_p90 / base_p90), float(new_mean / base_mean)
    bound = (1.0 + thresholds.time_threshold) * (1.0 + max(0.0, float(drift)))
    if max(p90_ratio, mean_ratio) < bound:
        return "same", p90_ratio, mean_ratio, None
    cut = base_p90 * bound
    new_above = int(np.count_nonzero(new_samples > cut))
    base_above = int(np.count_nonzero(base_samples > cut))
    table = [[new_above, len(new_samples) - new_above], [base_above, len(base_samples) - base_above]]
    p_value = float(fisher_exact(table, alternative="greater").pvalue)
    return ("slower" if p_value < thresholds.alpha * TAIL_LEVEL else "same"), p90_ratio, mean_ratio, p_value


def decide_memory(base_bytes: float, new_bytes: float, thresholds: Thresholds) -> tuple[str, float]:
    """``(verdict, ratio)`` for peak memory: ``larger``/``smaller``/``same``/``n/a``.

    Larger when ``new - base > mem_floor_bytes`` and ``new > base * (1 + mem_threshold)``;
    smaller symmetrically (``new < base / (1 + mem_threshold)``).
    """
    if not (np.isfinite(base_bytes) and np.isfinite(new_bytes)):
        return "n/a", float("nan")
    ratio = float(new_bytes / base_bytes) if base_bytes > 0 else (1.0 if new_bytes == 0 else float("inf"))
    delta = new_bytes - base_bytes
    bound = 1.0 + thresholds.mem_threshold
    if delta > thresholds.mem_floor_bytes and ratio > bound:
        return "larger", ratio
    if -delta > thresholds.mem_floor_bytes and ratio < 1.0 / bound:
        return "smaller", ratio
    return "same", ratio


def geometric_mean_speedup(base_ms: Iterable[float], new_ms: Iterable[float]) -> float:
    """Geometric mean of ``base / new`` (> 1: the new run is faster); NaN when empty."""
    b = np.asarray(list(base_ms), dtype=float)
    n = np.asarray(list(new_ms), dtype=float)
    keep = np.isfinite(b) & np.isfinite(n) & (b > 0) & (n > 0)
    if not keep.any():
        return float("nan")
    return float(np.exp(np.mean(np.log(b[keep] / n[keep]))))


# ----------------------------------------------------------------------------- matching


def _key_series(rows: pd.DataFrame, label: str) -> pd.Series:
    """One matching key per row: ``case_id`` and ``mode`` where present, else the
    identity columns as canonical JSON."""
    if "case_id" in rows.columns and rows["case_id"].notna().all():
        mode = rows["mode"].astype(str) if "mode" in rows.columns else ""
        return rows["case_id"].astype(str) + "|" + mode
    present = [c for c in IDENTITY_COLUMNS if c in rows.columns]
    if "backend" not in present:
        raise UserError(f"corrupt table: {label} has neither a case_id nor a backend column")

    def encode(record: Mapping[str, Any]) -> str:
        return json.dumps({k: _plain(record[k]) for k in present}, sort_keys=True, default=str)

    return pd.Series([encode(r) for r in rows[present].to_dict("records")], index=rows.index)


def _plain(value: Any) -> Any:
    """A JSON-friendly scalar (NaN/None -> None, numpy -> python)."""
    if value is None:
        return None
    if isinstance(value, (float, np.floating)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    try:
        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    return value


def _prepare(rows: pd.DataFrame, label: str, warnings: list[str]) -> pd.DataFrame:
    if not isinstance(rows, pd.DataFrame):
        raise UserError(f"corrupt table: {label} rows are not a table")
    if "status" not in rows.columns:
        raise UserError(f"corrupt table: {label} has no 'status' column")
    rows = rows.copy()
    rows["_key"] = _key_series(rows, label)
    duplicated = rows["_key"].duplicated(keep="last")
    if duplicated.any():
        warnings.append(
            f"{label} holds {int(duplicated.sum())} repeated case row(s); the last of each is used "
            "(was the run resumed into the same directory?)"
        )
        rows = rows[~duplicated]
    return rows.set_index("_key", drop=False)


def _number(record: Mapping[str, Any], column: str) -> float:
    value = _plain(record.get(column))
    try:
        return float(value) if value is not None else float("nan")
    except (TypeError, ValueError):
        raise UserError(f"corrupt table: column {column!r} holds {value!r}, not a number") from None


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
            :data:`UNDECIDED_KINDS`), ``p_value``, ``test``, ``ratio_low``,
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
            reasons.append(" and ".join(f"{c[o]} {_OUTCOME_LABEL[o]}(s)" for o in ("regression", "tail")
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


def _suite_name(metadata: Mapping[str, Any], rows: pd.DataFrame) -> str | None:
    name = metadata.get("suite")
    if name:
        return str(name)
    if "suite" in rows.columns:
        names = rows["suite"].dropna().astype(str).unique()
        if len(names) == 1:
            return str(names[0])
    return None


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
    with its value then (:func:`~tflabench.store.results.recorded_timing`)."""
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
    it). Both tables indexed by the matching key (as :func:`_prepare` leaves them).
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
        if _status(record) != OK:
            continue
        median, q25, q75 = _number(record, "ms_median"), _number(record, "ms_q25"), _number(record, "ms_q75")
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
              if _status(r) == OK and case_label(r) in labels and isinstance(r.get("gpu_slowdowns"), str)]
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


def history_drift(base_rows: pd.DataFrame, history: Iterable[Any]) -> float | None:
    """The largest run-to-run change of a median between the base and its A/A partners
    (other runs of the reference's code on the same machine; docs/compare-gate.md, "Drift between
    runs"), over every case ``ok`` on both sides, as a fraction (0.08: a median moved by
    up to 8 %); None without partners or without a shared case.

    ``base_rows`` indexed by the matching key (as :func:`_prepare` leaves it); each
    partner an object with ``.rows`` and ``.path`` (a :class:`~tflabench.store.results.ResultSet`).
    """
    largest = None
    base_ok = {key: _number(r, "ms_median") for key, r in base_rows.to_dict("index").items() if _status(r) == OK}
    for partner in history:
        rows = _prepare(partner.rows, f"--aa {partner.path}", [])
        for key, record in rows.to_dict("index").items():
            m_base, m_partner = base_ok.get(key, float("nan")), _number(record, "ms_median")
            if _status(record) == OK and m_base > 0 and m_partner > 0:
                change = abs(math.log(m_partner / m_base))
                largest = change if largest is None else max(largest, change)
    return None if largest is None else math.exp(largest) - 1.0


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
    :data:`NOISY_RELATIVE_IQR` on either side get :data:`CPU_DRIFT`, the others none.

    Raises:
        UserError: the two sets ran different suites, or a table is corrupt (no ``status``
            column, no way to match, unparsable samples or numbers).
    """
    if thresholds is None:
        thresholds, threshold_source = resolve_thresholds(base.metadata)
    base_meta, new_meta = dict(base.metadata or {}), dict(new.metadata or {})
    base_suite, new_suite = _suite_name(base_meta, base.rows), _suite_name(new_meta, new.rows)
    if base_suite and new_suite and base_suite != new_suite:
        raise UserError(
            f"the result sets ran different suites: base {base_suite!r}, new {new_suite!r}; compare runs of one suite"
        )
    warnings = environment_warnings(base_meta, new_meta) + provenance_warnings(base_meta, new_meta)
    warnings += candidate_warnings(new_meta, thresholds, base_meta)
    base_rows = _prepare(base.rows, f"base {base.path}", warnings)
    new_rows = _prepare(new.rows, f"new {new.path}", warnings)
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
        exposed = cpu_timed or _plain(record.get("device")) == "cpu" or case_label(record) in noisy
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


def _status(record: Mapping[str, Any] | None) -> str | None:
    if record is None:
        return None
    value = _plain(record.get("status"))
    return None if value is None else str(value)


def _compare_one(key: str, b: Mapping[str, Any] | None, n: Mapping[str, Any] | None,
                 thresholds: Thresholds, drift: float = 0.0, timer: tuple[str, str] | None = None,
                 unchecked: bool = False) -> dict[str, Any]:
    either = n if n is not None else b
    out: dict[str, Any] = {c: None for c in _CASE_COLUMNS}
    out.update(
        key=key,
        case_id=_plain(either.get("case_id")),
        case=case_label(either),
        kernel=_plain(either.get("kernel")),
        backend=_plain(either.get("backend")),
        mode=_plain(either.get("mode")),
        base_status=_status(b),
        new_status=_status(n),
        new_reason=_plain(n.get("reason")) if n is not None else None,
        unchecked=bool(unchecked and n is not None),
    )
    bs, ns = out["base_status"], out["new_status"]
    if b is not None and n is not None and bs == OK and ns == OK:
        base_samples, new_samples = parse_samples(b.get("ms_samples")), parse_samples(n.get("ms_samples"))
        td = decide_time(
            _number(b, "ms_median"), _number(n, "ms_median"), base_samples, new_samples, thresholds,
            (_number(b, "ms_q25"), _number(b, "ms_q75")), (_number(n, "ms_q25"), _number(n, "ms_q75")),
            drift=drift,
        )
        if timer is not None and td.verdict != "n/a":  # numbers of two kinds: nothing to decide
            td = TimeDecision("undecided", td.ratio, td.p_value, td.test, td.low, td.high, td.resolution,
                              td.drift, "timer")
        tail_verdict, p90_ratio, mean_ratio, tail_p = decide_tail(base_samples, new_samples, thresholds, drift)
        if timer is not None:
            tail_verdict = "n/a"
        mem_verdict, mem_ratio = decide_memory(
            _number(b, "peak_mem_bytes"), _number(n, "peak_mem_bytes"), thresholds
        )
        out.update(
            base_ms=_number(b, "ms_median"), new_ms=_number(n, "ms_median"), time_ratio=td.ratio,
            time_verdict=td.verdict, undecided_kind=td.kind, p_value=td.p_value, test=td.test,
            ratio_low=td.low, ratio_high=td.high, resolution=td.resolution, drift=td.drift,
            tail_verdict=tail_verdict, p90_ratio=p90_ratio, mean_ratio=mean_ratio, tail_p_value=tail_p,
            base_peak_mem_bytes=_number(b, "peak_mem_bytes"), new_peak_mem_bytes=_number(n, "peak_mem_bytes"),
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
        out.update(new_ms=_number(n, "ms_median"), new_peak_mem_bytes=_number(n, "peak_mem_bytes"))
    if b is not None and bs == OK:
        out.update(base_ms=_number(b, "ms_median"), base_peak_mem_bytes=_number(b, "peak_mem_bytes"))
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


# ----------------------------------------------------------------------------- rendering

_OUTCOME_LABEL = {
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
_OUTCOME_MARK = {
    "new_failure": "\N{LARGE RED CIRCLE}",
    "regression": "\N{LARGE RED CIRCLE}",
    "tail": "\N{LARGE RED CIRCLE}",
    "lost": "\N{LARGE ORANGE CIRCLE}",
    "still_failing": "\N{LARGE ORANGE CIRCLE}",
    "undecided": "\N{LARGE YELLOW CIRCLE}",
    "added": "\N{LARGE BLUE CIRCLE}",
    "removed": "\N{MEDIUM WHITE CIRCLE}",
    "fixed": "\N{LARGE GREEN CIRCLE}",
    "improvement": "\N{LARGE GREEN CIRCLE}",
    "unchanged": "\N{MEDIUM WHITE CIRCLE}",
}
_OUTCOME_STYLE = {
    "new_failure": "bold red",
    "regression": "bold red",
    "tail": "red",
    "lost": "yellow",
    "still_failing": "yellow",
    "undecided": "magenta",
    "added": "cyan",
    "removed": "dim",
    "fixed": "green",
    "improvement": "green",
    "unchanged": "dim",
}


def _fmt(value: Any, render: Callable[[float], str], *, finite: bool = False) -> str:
    """``render`` of the plain scalar of ``value``; "-" for a missing one (and, with
    ``finite``, for an infinite one)."""
    value = _plain(value)
    if value is None or (finite and not math.isfinite(value)):
        return "-"
    return render(value)


def _fmt_ms(value: Any) -> str:
    return _fmt(value, lambda v: f"{v:.4g}")


def _fmt_change(ratio: Any) -> str:
    return _fmt(ratio, lambda r: f"{r - 1:+.1%}", finite=True)


def _fmt_p(value: Any) -> str:
    return _fmt(value, lambda v: f"{v:.1e}" if v < 1e-3 else f"{v:.3f}")


def _fmt_speedup(value: Any) -> str:
    return _fmt(value, lambda v: f"{v:.3f}x", finite=True)


def _fmt_resolution(value: Any) -> str:
    return _fmt(value, lambda v: "unbounded" if not math.isfinite(v) else f"±{v:.1%}")


def resolution_line(comparison: Comparison) -> str:
    """One line: the smallest change the samples of this comparison could detect (median
    and worst case), beside the time threshold."""
    summary = comparison.resolution_summary()
    threshold = comparison.thresholds.time_threshold
    if not summary:
        return f"resolution: no case ran ok on both sides (time threshold {threshold:.0%})"
    text = (f"resolution: the samples could detect a change of {_fmt_resolution(summary['median'])} "
            f"(median of {summary['cases']} case(s); worst {_fmt_resolution(summary['worst'])}, "
            f"{terminal_text(summary['worst_case'])}); time threshold {threshold:.0%}")
    if summary["median"] > threshold:
        text += "; most cases cannot resolve the threshold: raise timing.iterations or measure on a quieter machine"
    return text


def _status_text(record: Mapping[str, Any]) -> str:
    bs, ns = _plain(record.get("base_status")), _plain(record.get("new_status"))
    text = f"{bs or 'absent'} -> {ns or 'absent'}" if bs != ns else str(ns)
    reason = _plain(record.get("new_reason"))
    if ns not in (None, OK) and reason:
        text += f" ({str(reason).splitlines()[0][:80]})"
    return text


def verdict_line(comparison: Comparison, fail_on: str = "any") -> str:
    """One line: the counts that matter, whether the policy fails, and why."""
    c = comparison.counts
    parts = [f"{c.get(o, 0)} {_OUTCOME_LABEL[o]}" for o in OUTCOMES if c.get(o, 0)]
    drift = int((comparison.cases["undecided_kind"] == "drift").sum())
    if drift:
        parts.append(f"{drift} of the undecided within the drift between runs")
    reasons = comparison.failures(fail_on)
    status = "FAIL" if reasons else "pass"
    text = f"{status} (--fail-on {fail_on}): " + (", ".join(parts) if parts else "no cases")
    return text + (f"; fails on {'; '.join(reasons)}" if reasons else "")


#: Console width (characters) from which the terminal table puts every column side by side;
#: narrower (an 80-column terminal), each case folds its p, resolution, memory, tail and
#: status into a second line under its label (``compare --wide`` forces one line).
WIDE_TABLE = 140

#: Longest kernel label the narrow table prints whole; longer ones are shortened and
#: named in a legend above the table (:func:`short_kernel_names`).
SHORT_KERNEL = 14


def short_kernel_names(kernels: Iterable[Any], limit: int = SHORT_KERNEL) -> dict[str, str]:
    """A short, readable name for each kernel label longer than ``limit`` characters: its
    first word (cut to ``limit``), ``#2``, ``#3`` added where two would read alike. Labels
    that fit are left out (they print whole)."""
    labels = sorted({str(k) for k in kernels if k is not None})
    out: dict[str, str] = {}
    taken = {label for label in labels if len(label) <= limit}
    for label in labels:
        if len(label) <= limit:
            continue
        first = (label.split() or [label])[0][:limit - 2]
        name, index = first, 1
        while name in taken:
            index += 1
            name = f"{first}#{index}"
        taken.add(name)
        out[label] = name
    return out


def _short_case(record: Mapping[str, Any], names: Mapping[str, str]) -> str:
    case, kernel = str(record.get("case") or ""), record.get("kernel")
    if kernel is not None and str(kernel) in names and case.startswith(str(kernel)):
        return names[str(kernel)] + case[len(str(kernel)):]
    return case


def _fmt_tail(record: Mapping[str, Any]) -> str:
    ratios = [r for r in (_plain(record.get("p90_ratio")), _plain(record.get("mean_ratio"))) if r is not None]
    if not ratios or not all(math.isfinite(r) for r in ratios):
        return "-"
    return f"{max(ratios) - 1:+.1%}"


def _case_notes(record: Mapping[str, Any]) -> str:
    """The second line of a case in the narrow table: p, resolution, memory, tail, status."""
    notes = [f"p={_fmt_p(record.get('p_value'))}", f"res={_fmt_resolution(record.get('resolution'))}",
             f"mem={_fmt_change(record.get('mem_ratio'))}", f"tail={_fmt_tail(record)}"]
    if record.get("unchecked"):
        notes.append("unchecked")
    status = _status_text(record)
    if status != OK:
        notes.append(status)
    return "  ".join(notes)


def render_table(comparison: Comparison, console: Any = None, show_unchanged: bool = False,
                 fail_on: str = "any", wide: bool = False) -> None:
    """Print the comparison as rich tables (warnings, per-backend speed-up, cases worst first).

    Unchanged cases are counted but only listed with ``show_unchanged``. On a console
    narrower than :data:`WIDE_TABLE` (and without ``wide``) each case takes two lines:
    outcome, label, base and new median (ms) and change, then p, resolution, memory, tail
    and status under the label; kernel labels longer than :data:`SHORT_KERNEL` are
    shortened, with a legend. Numbers are never cut: only the label column folds.
    """
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from tflabench.console import literal, make_console

    console = console or make_console()
    if wide and console.width < WIDE_TABLE * 2:
        console = Console(file=console.file, width=WIDE_TABLE * 2, highlight=False, no_color=console.no_color)
    narrow = not wide and console.width < WIDE_TABLE
    for warning in comparison.warnings:  # labels, reasons and paths print as written
        console.print(Text.assemble(("warning:", "yellow"), " ", literal(warning)), highlight=False)

    per_backend = Table(title=literal(f"{comparison.suite}: geometric-mean speed-up per backend (base / new)"))
    for column in ("backend", "cases", "speed-up", "slower", "faster", "undecided", "failures"):
        per_backend.add_column(column, justify="left" if column == "backend" else "right",
                               no_wrap=column != "backend", overflow="fold")
    for r in comparison.backends.to_dict("records"):
        per_backend.add_row(literal(r["backend"]), str(r["cases"]), _fmt_speedup(r["geomean_speedup"]),
                            str(r["slower"]), str(r["faster"]), str(r["undecided"]), str(r["failures"]))
    console.print(per_backend)

    records = [r for r in comparison.cases.to_dict("records") if show_unchanged or r["outcome"] != "unchanged"]
    hidden = len(comparison.cases) - len(records)
    names = short_kernel_names(r.get("kernel") for r in records) if narrow else {}
    table = Table(title="cases, worst first")
    if narrow:
        if names:
            legend = ", ".join(f"{short} = {label}" for label, short in sorted(names.items(), key=lambda i: i[1]))
            console.print(literal(f"kernels: {legend}"), highlight=False)
        for column, justify in (("outcome", "left"), ("case (p, resolution, memory, tail)", "left"),
                                ("base ms", "right"), ("new ms", "right"), ("time", "right")):
            table.add_column(column, justify=justify, no_wrap=column != "case (p, resolution, memory, tail)",
                             overflow="fold", ratio=1 if column.startswith("case") else None)
        for r in records:
            style = _OUTCOME_STYLE[r["outcome"]]
            case = Text.assemble(literal(_short_case(r, names)), "\n", (_case_notes(r), "dim"))
            table.add_row(Text(_OUTCOME_LABEL[r["outcome"]], style=style), case,
                          _fmt_ms(r["base_ms"]), _fmt_ms(r["new_ms"]), _fmt_change(r["time_ratio"]))
    else:
        for column, justify in (("outcome", "left"), ("case", "left"), ("status", "left"), ("base ms", "right"),
                                ("new ms", "right"), ("time", "right"), ("p", "right"), ("resolution", "right"),
                                ("memory", "right"), ("tail", "right")):
            table.add_column(column, justify=justify, no_wrap=column not in ("case", "status"), overflow="fold",
                             min_width=24 if column == "case" else None,
                             max_width=28 if column == "status" else None)
        for r in records:
            style = _OUTCOME_STYLE[r["outcome"]]
            status = _status_text(r) + (" (unchecked)" if r.get("unchecked") else "")
            table.add_row(
                Text(_OUTCOME_LABEL[r["outcome"]], style=style), literal(r["case"]), literal(status),
                _fmt_ms(r["base_ms"]), _fmt_ms(r["new_ms"]), _fmt_change(r["time_ratio"]), _fmt_p(r["p_value"]),
                _fmt_resolution(r["resolution"]), _fmt_change(r["mem_ratio"]), _fmt_tail(r),
            )
    if table.row_count:
        console.print(table)
    if hidden:
        console.print(f"{hidden} unchanged case(s) not listed (--all lists them)")
    console.print(resolution_line(comparison), highlight=False, markup=False)  # it names a case
    console.print(verdict_line(comparison, fail_on), highlight=False, markup=False)


def _md_line(value: Any) -> str:
    """A line of the report that holds text from a set (a label, a reason, a warning, a
    path): every character Markdown or HTML acts on escaped (docs/harness.md, "What reaches
    the terminal"); the length is bounded where the text is made (labels cut in the line)."""
    return markdown_text(value, None)


_MD_HEADER = ("", "case", "backend", "base ms", "new ms", "time", "p", "resolution", "peak memory", "tail",
              "status")


def _md_table(records: list[Mapping[str, Any]]) -> list[str]:
    lines = ["| " + " | ".join(_MD_HEADER) + " |", "|" + "|".join(
        [":-:", "---", "---", "--:", "--:", "--:", "--:", "--:", "--:", "--:", "---"]) + "|"]
    for r in records:
        cells = (  # text from the set through markdown_text, the project's own numbers as made
            f"{_OUTCOME_MARK[r['outcome']]} {_OUTCOME_LABEL[r['outcome']]}",
            markdown_text(r["case"]), markdown_text(r["backend"] or "-"), _fmt_ms(r["base_ms"]),
            _fmt_ms(r["new_ms"]), _fmt_change(r["time_ratio"]), _fmt_p(r["p_value"]),
            _fmt_resolution(r["resolution"]), _fmt_change(r["mem_ratio"]), _fmt_tail(r),
            markdown_text(_status_text(r)) + (" (unchecked)" if r.get("unchecked") else ""),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def to_markdown(comparison: Comparison, fail_on: str = "any", max_rows: int = 200) -> str:
    """GitHub-flavoured Markdown report (PR comment or ``$GITHUB_STEP_SUMMARY``).

    Sections: verdict, warnings, geometric-mean speed-up per backend (worst first), a
    table of every case that is not unchanged (worst first), and the unchanged cases in
    a collapsed ``<details>`` table. At most ``max_rows`` case rows in all; the rest are
    counted in a note (GitHub caps a comment at 65536 characters). Every string from a set
    (suite, paths, labels, backends, reasons, warnings, the worst case's label) passes
    :func:`tflabench.text_safety.markdown_text`: no tag, comment, mention or pipe from a
    set acts in the rendered comment (docs/compare-gate.md).
    """
    t = comparison.thresholds
    lines = [f"## tflabench compare: {markdown_text(comparison.suite)}", ""]
    lines.append(f"**{_md_line(verdict_line(comparison, fail_on))}**")
    lines.append("")
    lines.append(
        f"Base {markdown_text(comparison.base_path)} vs new {markdown_text(comparison.new_path)}. Rule: time change "
        f"beyond ±{t.time_threshold:.0%} of the median and Mann-Whitney U p < {t.alpha:g} on the "
        f"per-iteration samples (non-overlapping IQRs when fewer than {t.min_samples} samples); "
        f"unchanged only when the {1 - 2 * t.alpha:.0%} confidence interval of the time ratio lies "
        f"within ±{t.time_threshold:.0%}, else undecided; "
        f"peak memory beyond ±{t.mem_threshold:.0%} and {t.mem_floor_bytes / 2**20:g} MiB; "
        f"a tail when p{TAIL_PERCENTILE} or the mean passes the threshold while the median holds; where drift "
        f"between runs can exceed what the samples see, changes inside it are undecided; the default gate "
        f"fails when more than {UNDECIDED_SHARE:.0%} of the cases are undecided for want of resolution."
    )
    lines.append("")
    lines.append(_md_line(resolution_line(comparison)) + ".")
    lines.append("")
    for warning in comparison.warnings:
        lines.append(f"> [!WARNING]\n> {markdown_text(warning, 4000)}\n")
    lines += ["### Geometric-mean speed-up per backend (base / new; > 1 is faster)", ""]
    lines += ["| backend | cases | speed-up | slower | faster | undecided | failures |",
              "|---|--:|--:|--:|--:|--:|--:|"]
    for r in comparison.backends.to_dict("records"):
        lines.append(
            f"| {markdown_text(r['backend'])} | {r['cases']} | {_fmt_speedup(r['geomean_speedup'])} | "
            f"{r['slower']} | {r['faster']} | {r['undecided']} | {r['failures']} |"
        )
    lines.append("")
    records = comparison.cases.to_dict("records")
    changed = [r for r in records if r["outcome"] != "unchanged"]
    unchanged = [r for r in records if r["outcome"] == "unchanged"]
    shown_changed = changed[:max_rows]
    shown_unchanged = unchanged[: max(0, max_rows - len(shown_changed))]
    lines += ["### Changed cases, worst first", ""]
    if shown_changed:
        lines += _md_table(shown_changed)
    else:
        lines.append("No case changed.")
    lines.append("")
    if shown_unchanged:
        lines += [f"<details><summary>{len(unchanged)} unchanged case(s)</summary>", ""]
        lines += _md_table(shown_unchanged)
        lines += ["", "</details>", ""]
    left_out = len(records) - len(shown_changed) - len(shown_unchanged)
    if left_out:
        lines += [f"{left_out} more case(s) not shown (see the JSON report).", ""]
    return "\n".join(lines)


def to_json(comparison: Comparison, fail_on: str = "any") -> dict[str, Any]:
    """The comparison as plain JSON-ready data (every case, all fields)."""

    def clean(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for r in records:
            item = {}
            for k, v in r.items():
                v = _plain(v)
                if isinstance(v, float) and not math.isfinite(v):
                    v = None
                item[k] = v
            out.append(item)
        return out

    return {
        "suite": comparison.suite,
        "base": comparison.base_path,
        "new": comparison.new_path,
        "fail_on": fail_on,
        "exit_status": comparison.exit_status(fail_on),
        "fails_on": comparison.failures(fail_on),
        "undecided_share": dict(zip(("undecided", "compared"), comparison.undecided_share()),
                                limit=UNDECIDED_SHARE),
        "counts": comparison.counts,
        "warnings": list(comparison.warnings),
        "thresholds": {f.name: getattr(comparison.thresholds, f.name) for f in fields(Thresholds)},
        "threshold_source": comparison.threshold_source,
        "resolution": clean([comparison.resolution_summary()])[0],
        "backends": clean(comparison.backends.to_dict("records")),
        "cases": clean(comparison.cases.to_dict("records")),
    }


def append_step_summary(markdown: str) -> Path | None:
    """Append ``markdown`` to the file named by ``$GITHUB_STEP_SUMMARY``; None when unset.
    Raises UserError when the file cannot be written."""
    from tflabench.outputs import write_text

    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    return write_text(target, markdown.rstrip("\n") + "\n\n", "$GITHUB_STEP_SUMMARY", append=True)
