"""The statistics of ``tflabench compare``'s per-case decision: the time ratio's
confidence interval (Hodges-Lehmann and Mann-Whitney U, bounds found by bisection without
building the pairwise differences), the time, tail (Fisher's exact test) and memory
decisions of one case, the geometric-mean speed-up, and the allowance for drift between
runs (:data:`CPU_DRIFT`, or measured from A/A partners: :func:`history_drift`).

Source: docs/ci.md, "How compare decides"; docs/compare-gate.md ("Cost", "Tail", "Drift
between runs").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import pandas as pd

from tflabench.compare.rows import OK, cell_number, prepare, row_status
from tflabench.compare.thresholds import Thresholds

#: The run-to-run change of a case's median that its samples cannot see, assumed where
#: nothing measures it (docs/compare-gate.md, "Drift between runs"): 1.0 lets a median move up to
#: 2x between two runs of the same code before a change is decided. A/A pairs of the CPU
#: demo on a shared 2-core machine moved single cases by up to +92 %.
CPU_DRIFT = 1.0

#: Why a case is undecided: its samples cannot resolve the threshold (counts toward
#: :data:`tflabench.compare.thresholds.UNDECIDED_SHARE`); its change lies near the threshold's edge; its change lies
#: inside the run-to-run drift allowance; the two sets were timed by different timers
#: (counts); the candidate ran without the numerics gate and was faster.
UNDECIDED_KINDS = ("unresolved", "near", "drift", "timer", "unchecked")


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


def history_drift(base_rows: pd.DataFrame, history: Iterable[Any]) -> float | None:
    """The largest run-to-run change of a median between the base and its A/A partners
    (other runs of the reference's code on the same machine; docs/compare-gate.md, "Drift between
    runs"), over every case ``ok`` on both sides, as a fraction (0.08: a median moved by
    up to 8 %); None without partners or without a shared case.

    ``base_rows`` indexed by the matching key (as :func:`tflabench.compare.rows.prepare` leaves it); each
    partner an object with ``.rows`` and ``.path`` (a :class:`~tflabench.store.results.ResultSet`).
    """
    largest = None
    base_ok = {key: cell_number(r, "ms_median") for key, r in base_rows.to_dict("index").items() if row_status(r) == OK}
    for partner in history:
        rows = prepare(partner.rows, f"--aa {partner.path}", [])
        for key, record in rows.to_dict("index").items():
            m_base, m_partner = base_ok.get(key, float("nan")), cell_number(record, "ms_median")
            if row_status(record) == OK and m_base > 0 and m_partner > 0:
                change = abs(math.log(m_partner / m_base))
                largest = change if largest is None else max(largest, change)
    return None if largest is None else math.exp(largest) - 1.0
