"""Regressions over time: result sets of one suite, one per commit, and where each case's
time stepped (``tflabench history``; the method and its reasons: docs/ci.md, "History").

The sets are ordered by the date of the commit each measured (``metadata.json``'s
``git_commit_date``, else the commit's date in this checkout,
:func:`tflabench.environment.commit_date`); where any set's commit date is unknown, every
set is ordered by its run's ``date`` instead, and the report says so.

Per case (``case_id``), the series is the median time (``ms_median``, ms) of each commit
that ran it ``ok``. Change points are found on the log of the series by PELT (Killick,
Fearnhead and Eckley 2012, ``ruptures.Pelt``) with the ``l2`` cost (a piecewise-constant
mean; on log times a step is a ratio) and the penalty ``8 * sigma**2 * ln(n)`` (four
times BIC's for a mean shift of known variance; docs/ci.md, "History", says why), ``sigma`` the noise of one commit's log median estimated
robustly from successive differences (MAD / sqrt 2) and floored at a quarter of
``log(1 + threshold)``. Steps smaller than the threshold are dropped and the segments
joined. Each step has the first commit after it, its size (median of the segment after
over median of the segment before, minus 1) and a two-sided Mann-Whitney U p-value
(``scipy.stats.mannwhitneyu``) between the two segments' per-commit medians, or, where a
segment has fewer than :data:`MIN_COMMITS_FOR_TEST` commits, between the pooled
per-iteration samples of both segments. Where the rows carry ``kernel_profile``
(``run --profile``), the step names the kernel whose time per call moved most.

A case is a regression when its newest commit lies in a segment that began with a
slowdown beyond the threshold; ``history`` exits 1 when any case is.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pandas as pd

from tflabench.compare.caveats import ENVIRONMENT_KEYS, provenance_warnings, timing_warnings
from tflabench.compare.rows import OK, parse_samples, suite_name
from tflabench.compare.thresholds import resolve_thresholds
from tflabench.store import results as R
from tflabench.environment import commit_date
from tflabench.errors import UserError
from tflabench.store.schema import number
from tflabench.text_safety import case_label, markdown_text

#: Fewest commits a segment needs for the test between per-commit medians; fewer: the
#: pooled per-iteration samples of both segments (two-sided exact Mann-Whitney U of 2 against
#: 2 commits cannot go below p = 0.33).
MIN_COMMITS_FOR_TEST = 3
#: The penalty's factor: ``PENALTY_FACTOR * sigma^2 * ln n`` per change point (BIC's 2, made
#: four times stricter: docs/ci.md, "History", gives the false-alarm rates).
PENALTY_FACTOR = 8.0
#: The noise floor as a fraction of log(1 + threshold).
SIGMA_FLOOR = 0.25
METHOD = ("PELT (ruptures, l2 cost) on log medians, penalty 8 sigma^2 ln n, sigma from successive "
          "differences (MAD), steps below the threshold joined")


@dataclasses.dataclass(frozen=True)
class Commit:
    """One result set of the series: its ``revision`` (``git_revision``), ``date`` (ISO
    8601) and where that date came from (``date_source``: ``commit`` or ``run``)."""

    revision: str
    date: str
    date_source: str
    path: str

    @property
    def short(self) -> str:
        return (self.revision or "?")[:8]


@dataclasses.dataclass
class Step:
    """A change point of one case: ``index`` is the first commit after the step (0-based
    in :attr:`History.commits`), ``size`` the relative change of the median (0.3 = 30 %
    slower), ``p`` the Mann-Whitney U p-value and ``basis`` what it tested (``commits`` or
    ``samples``); ``kernel`` the profiled kernel that moved most (or None) and
    ``kernel_change_ms`` its change of time per call (ms)."""

    index: int
    revision: str
    before_ms: float
    after_ms: float
    size: float
    p: float | None
    basis: str
    kernel: str | None = None
    kernel_change_ms: float | None = None


@dataclasses.dataclass
class CaseHistory:
    """One case over the commits: ``medians_ms[i]`` is commit i's median (None where it
    did not run ``ok``), ``steps`` its change points, ``regression`` whether the newest
    commit sits in a segment that began with a slowdown beyond the threshold."""

    case_id: str
    label: str
    kernel: str
    backend: str | None
    params: str | None
    medians_ms: list[float | None]
    steps: list[Step]
    regression: bool

    @property
    def median_ms(self) -> float:
        values = [m for m in self.medians_ms if m is not None]
        return float(np.median(values)) if values else math.nan


@dataclasses.dataclass
class History:
    """The analysis of a series of result sets (:func:`analyse`)."""

    suite: str
    commits: list[Commit]
    cases: list[CaseHistory]
    threshold: float
    threshold_source: str
    notes: list[str]

    @property
    def regressions(self) -> list[CaseHistory]:
        return [c for c in self.cases if c.regression]

    def exit_status(self) -> int:
        """1 when any case's newest commit sits in a worsened segment, else 0."""
        return 1 if self.regressions else 0


# --------------------------------------------------------------------------- input


def result_set_paths(paths: Iterable[str | Path]) -> list[Path]:
    """The result sets named by ``paths``: each a result set (a directory or one of its
    files), or a folder holding result sets one or two levels down (``<suite>/<timestamp>/``,
    as ``run --out`` writes them), in the order given.

    Raises:
        UserError: a path that does not exist or holds no result set."""
    out: list[Path] = []
    for given in paths:
        path = Path(given)
        if not path.exists():
            raise UserError(f"history: {str(path)!r} does not exist; give result-set directories")
        if path.is_dir() and not (path / R.METADATA_FILE).exists() and not (path / R.ROWS_FILE).exists():
            found = sorted({p.parent for pattern in ("*/" + R.METADATA_FILE, "*/*/" + R.METADATA_FILE)
                            for p in path.glob(pattern)})
            if not found:
                raise UserError(f"history: {str(path)!r} holds no result set (no metadata.json in it or one "
                                "or two levels below); give the directories `tflabench run` wrote")
            out.extend(found)
        else:
            out.append(path)
    return out


def check_series(sets: list[Any]) -> list[str]:
    """Refuse a series that cannot be read as one suite's history; return warnings.

    Every set must name the same suite, and the measurement conditions that ``compare``
    warns about (:data:`tflabench.compare.caveats.ENVIRONMENT_KEYS`, the timing fields of
    :func:`tflabench.compare.caveats.timing_warnings`) must agree with the first set's: over a
    history a difference would show as a step of every case. A peer's version that differs
    is a warning, as in ``compare``.

    Raises:
        UserError: fewer than 2 sets, a set given twice, sets of different suites or
            differing conditions (the key and both sets named)."""
    if len(sets) < 2:
        raise UserError(f"history needs at least 2 result sets of one suite, got {len(sets)}; give one set per "
                        "commit (e.g. a folder holding them)")
    seen: dict[Path, Any] = {}
    for rs in sets:
        where = Path(rs.path).resolve()
        if where in seen:
            raise UserError(f"history: {str(rs.path)!r} given twice; give each result set once")
        seen[where] = rs
    first = sets[0]
    first_suite = suite_name(first.metadata, first.rows)
    warnings: list[str] = []
    for rs in sets[1:]:
        suite = suite_name(rs.metadata, rs.rows)
        if suite != first_suite:
            raise UserError(f"history: {str(rs.path)!r} ran suite {suite!r}, {str(first.path)!r} ran "
                            f"{first_suite!r}; give result sets of one suite")
        a, b = first.metadata, rs.metadata
        for key in ENVIRONMENT_KEYS:
            if a.get(key) != b.get(key):
                raise UserError(f"history: {key} differs ({str(first.path)!r}: {a.get(key)!r}, {str(rs.path)!r}: "
                                f"{b.get(key)!r}); a history holds runs of one machine and stack (split the sets "
                                "by stack, or start a new history after the upgrade)")
        pa, pb = a.get("peers") or {}, b.get("peers") or {}
        for name in sorted(set(pa) | set(pb)):   # as compare: a warning, not a condition
            if pa.get(name) != pb.get(name):
                warnings.append(f"{str(rs.path)!r}: peer {name} differs from {str(first.path)!r}'s "
                                f"({pa.get(name)!r} against {pb.get(name)!r}); its cases may move for that reason")
        timing = timing_warnings(a, b)
        if timing:
            raise UserError(f"history: {str(rs.path)!r} against {str(first.path)!r}: {timing[0]}")
        warnings.extend(f"{str(rs.path)!r}: {w}" for w in provenance_warnings(a, b))
        if a.get("suite_sha256") and b.get("suite_sha256") and a["suite_sha256"] != b["suite_sha256"]:
            warnings.append(f"{str(rs.path)!r}: the suite file differs from {str(first.path)!r}'s; cases added or "
                            "removed have a shorter series")
    for rs in sets:
        if rs.metadata.get("shard"):
            warnings.append(f"{str(rs.path)!r} is shard {rs.metadata['shard']} only; merge the shards first")
    return warnings


def order_commits(sets: list[Any], lookup: Callable[[str | None], str | None] = commit_date
                  ) -> tuple[list[Any], list[Commit], list[str]]:
    """``sets`` sorted by commit date (``git_commit_date``, else ``lookup(git_revision)``),
    or by each run's ``date`` where any commit date is unknown; ties by run date, path.

    Returns (the sets in order, their :class:`Commit`, notes saying which date ordered)."""
    dates = []
    for rs in sets:
        meta = rs.metadata
        dates.append(meta.get("git_commit_date") or lookup(meta.get("git_revision")))
    notes: list[str] = []
    if all(dates):
        source = "commit"
    else:
        source = "run"
        unknown = sum(1 for d in dates if not d)
        notes.append(f"the commit date of {unknown} of {len(sets)} set(s) is unknown (not recorded and not in "
                     "this checkout: a shallow clone?); ordered by each run's date instead")
    def parse(text: Any) -> pd.Timestamp:
        try:
            stamp = pd.Timestamp(text)
        except (TypeError, ValueError):
            return pd.Timestamp.min.tz_localize("UTC")
        return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")

    keyed = []
    for rs, commit in zip(sets, dates):
        run_date = rs.metadata.get("date")
        primary = commit if source == "commit" else run_date
        keyed.append(((parse(primary), parse(run_date), str(rs.path)), rs, primary))
    keyed.sort(key=lambda item: item[0])
    commits = [Commit(str(rs.metadata.get("git_revision") or "?"), str(date or "?"), source, str(rs.path))
               for _, rs, date in keyed]
    return [rs for _, rs, _ in keyed], commits, notes


# --------------------------------------------------------------------------- change points


def noise_sigma(log_medians: np.ndarray, threshold: float) -> float:
    """The noise of one commit's log median: MAD of successive differences / sqrt 2
    (a step moves one difference only), floored at ``SIGMA_FLOOR * log(1 + threshold)``."""
    floor = SIGMA_FLOOR * math.log1p(threshold)
    if len(log_medians) < 3:
        return floor
    diffs = np.diff(log_medians)
    mad = 1.4826 * float(np.median(np.abs(diffs - np.median(diffs))))
    return max(mad / math.sqrt(2.0), floor)


def change_points(medians_ms: list[float], threshold: float) -> list[int]:
    """Indices (into ``medians_ms``) of the first value after each step: PELT on the log
    medians (module docstring), steps smaller than ``threshold`` joined away.

    Args:
        medians_ms: one median per commit, in commit order, all finite and positive (ms).
        threshold: the smallest relative step kept (0.05 = 5 %).
    """
    import ruptures

    y = np.log(np.asarray(medians_ms, dtype=float))
    n = len(y)
    if n < 2:
        return []
    sigma = noise_sigma(y, threshold)
    penalty = PENALTY_FACTOR * sigma ** 2 * math.log(n)
    breaks = ruptures.Pelt(model="l2", min_size=1, jump=1).fit(y.reshape(-1, 1)).predict(pen=penalty)
    points = [b for b in breaks if b < n]
    while points:  # join the smallest step below the threshold, then look again
        bounds = [0, *points, n]
        sizes = [abs(math.expm1(np.median(y[bounds[i + 1]:bounds[i + 2]]) - np.median(y[bounds[i]:bounds[i + 1]])))
                 for i in range(len(points))]
        smallest = int(np.argmin(sizes))
        if sizes[smallest] >= threshold:
            break
        points.pop(smallest)
    return points


def _samples(row: Mapping[str, Any]) -> list[float]:
    try:
        return [float(x) for x in parse_samples(row.get("ms_samples"))]
    except UserError:
        return []


def step_p_value(before: list[float], after: list[float], samples_before: list[float],
                 samples_after: list[float]) -> tuple[float | None, str]:
    """Two-sided Mann-Whitney U p-value between the segments' per-commit medians, or the
    pooled per-iteration samples where a segment has fewer than :data:`MIN_COMMITS_FOR_TEST`
    commits and both have samples. Returns (p or None, ``commits`` | ``samples``)."""
    from scipy.stats import mannwhitneyu

    if min(len(before), len(after)) >= MIN_COMMITS_FOR_TEST or not (samples_before and samples_after):
        if not before or not after:
            return None, "commits"
        return float(mannwhitneyu(before, after, alternative="two-sided").pvalue), "commits"
    return float(mannwhitneyu(samples_before, samples_after, alternative="two-sided").pvalue), "samples"


def _kernel_times(profile: Mapping[str, Any] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for k in (profile or {}).get("kernels", []):
        key = f"{k['name']} ({k['pass']})"
        out[key] = out.get(key, 0.0) + float(k["ms"])
    return out


def kernel_moved(before: list[dict[str, float]], after: list[dict[str, float]]) -> tuple[str | None, float | None]:
    """The kernel (``name (pass)``) whose median time per call (ms) over the commits of a
    segment changed most between the two segments, and that change (ms); (None, None)
    without profiles on both sides."""
    if not before or not after:
        return None, None
    names = set().union(*before, *after)
    best, change = None, 0.0
    for name in sorted(names):
        delta = (float(np.median([t.get(name, 0.0) for t in after]))
                 - float(np.median([t.get(name, 0.0) for t in before])))
        if best is None or abs(delta) > abs(change):
            best, change = name, delta
    return best, change


# --------------------------------------------------------------------------- analysis


def analyse(sets: list[Any], *, threshold: float | None = None,
            parse_profile: Callable[[Any], dict | None] | None = None,
            lookup: Callable[[str | None], str | None] = commit_date) -> History:
    """The history of a series of result sets of one suite.

    Args:
        sets: result sets (:class:`tflabench.store.results.ResultSet`), any order.
        threshold: the smallest relative step reported and judged (0.05 = 5 %); None: the
            suite's ``compare: time_threshold`` of the oldest set (else compare's default): as in
            ``compare``, the sets under judgement do not set their own gate.
        parse_profile: reads a row's ``kernel_profile`` (``tflabench.run.kernel_profile.parse_profile``);
            None: profiles are not read.
        lookup: a revision's commit date where the metadata records none.

    Raises:
        UserError: see :func:`check_series`; a threshold out of its range.
    """
    notes = check_series(sets)
    sets, commits, order_notes = order_commits(sets, lookup)
    notes = order_notes + notes
    thresholds, source = resolve_thresholds(sets[0].metadata, None, {"time_threshold": threshold})
    threshold, threshold_source = thresholds.time_threshold, source["time_threshold"]

    per_set: list[dict[str, dict]] = []
    info: dict[str, dict] = {}
    for rs in sets:
        rows = rs.rows
        ok = rows[rows["status"] == OK] if "status" in rows.columns else rows.iloc[0:0]
        records = {}
        for row in ok.to_dict("records"):
            key = str(row.get("case_id"))
            median = number(row.get("ms_median"))
            if median is None or median <= 0:
                continue
            records[key] = row
            info[key] = row  # the newest set's identity wins
        per_set.append(records)

    cases = []
    for key, row in info.items():
        medians = [number(s[key]["ms_median"]) if key in s else None for s in per_set]
        present = [i for i, m in enumerate(medians) if m is not None]
        steps: list[Step] = []
        if len(present) >= 2:
            values = [medians[i] for i in present]
            points = change_points(values, threshold)
            bounds = [0, *points, len(present)]
            for j, point in enumerate(points):
                seg_a = present[bounds[j]:bounds[j + 1]]
                seg_b = present[bounds[j + 1]:bounds[j + 2]]
                before = [medians[i] for i in seg_a]
                after = [medians[i] for i in seg_b]
                samples_a = [x for i in seg_a for x in _samples(per_set[i][key])]
                samples_b = [x for i in seg_b for x in _samples(per_set[i][key])]
                p, basis = step_p_value(before, after, samples_a, samples_b)
                kernel, change = None, None
                if parse_profile is not None:
                    prof_a = [_kernel_times(parse_profile(per_set[i][key].get("kernel_profile"))) for i in seg_a]
                    prof_b = [_kernel_times(parse_profile(per_set[i][key].get("kernel_profile"))) for i in seg_b]
                    kernel, change = kernel_moved([t for t in prof_a if t], [t for t in prof_b if t])
                level_a, level_b = float(np.median(before)), float(np.median(after))
                index = present[point]
                steps.append(Step(index, commits[index].revision, level_a, level_b, level_b / level_a - 1.0, p,
                                  basis, kernel, change))
        newest = len(sets) - 1
        regression = bool(steps) and medians[newest] is not None and steps[-1].size > threshold
        cases.append(CaseHistory(key, case_label(row), str(row.get("kernel") or "?"),
                                 row.get("backend"), row.get("params"), medians, steps, regression))
    cases.sort(key=lambda c: (not c.regression, -max((abs(s.size) for s in c.steps), default=0.0), c.label))
    suite = suite_name(sets[-1].metadata, sets[-1].rows) or "?"
    return History(suite, commits, cases, float(threshold), threshold_source, notes)



# --------------------------------------------------------------------------- reports


def _pct(size: float) -> str:
    return f"{size * 100:+.1f} %"


def _p(value: float | None) -> str:
    return "-" if value is None else (f"{value:.2g}" if value >= 0.001 else "<0.001")


def _kernel_text(step: Step) -> str:
    if step.kernel is None or step.kernel_change_ms is None:
        return "-"
    return f"{step.kernel} {step.kernel_change_ms:+.3g} ms"


def verdict_line(history: History) -> str:
    """One line: how many cases sit in a worsened segment at the newest commit."""
    n = len(history.regressions)
    newest = history.commits[-1].short
    if n:
        return (f"REGRESSION: {n} case(s) slower since a step beyond {history.threshold * 100:g} % "
                f"at the newest commit {newest}")
    return f"no case is in a worsened segment at the newest commit {newest} (threshold {history.threshold * 100:g} %)"


def span_line(history: History) -> str:
    """The series in words: commits, first and newest, what ordered them."""
    first, last = history.commits[0], history.commits[-1]
    by = "commit date" if first.date_source == "commit" else "run date"
    return (f"{history.suite}: {len(history.commits)} result sets, {first.short} ({first.date[:10]}) to "
            f"{last.short} ({last.date[:10]}), ordered by {by}")


def step_rows(history: History, show_all: bool = False) -> list[tuple[str, ...]]:
    """The rows of the step table: case, median ms over the commits, the first commit after
    the step (#index revision), size, p, the kernel that moved, and ``REGRESSION`` on the
    last step of a case in a worsened segment; with ``show_all`` cases without a step too."""
    rows = []
    for case in history.cases:
        median = f"{case.median_ms:.4g}"
        if not case.steps:
            if show_all:
                rows.append((case.label, median, "-", "-", "-", "-", ""))
            continue
        for j, step in enumerate(case.steps):
            last = j == len(case.steps) - 1
            rows.append((case.label if j == 0 else "", median if j == 0 else "",
                         f"#{step.index + 1} {step.revision[:8]}", _pct(step.size), _p(step.p), _kernel_text(step),
                         "REGRESSION" if last and case.regression else ""))
    return rows


_HEADER = ("case", "median ms", "first after step", "size", "p", "kernel moved most", "")


def render_table(history: History, console: Any = None, show_all: bool = False) -> None:
    """Print the step table (readable at 80 columns: the case column folds), the notes
    and the verdict on ``console`` (default: the project's console)."""
    from rich.table import Table

    from tflabench.console import make_console

    con = console or make_console()
    con.print(span_line(history), markup=False)
    for note in history.notes:
        con.print(f"note: {note}", markup=False)
    rows = step_rows(history, show_all)
    if rows:
        table = Table(title=f"steps of {history.suite} (! : the newest commit is in this slower segment)")
        for i, name in enumerate(("case", "median ms", "step at", "size", "p", "kernel moved")):
            table.add_column(name, overflow="fold", justify="right" if i in (1, 3, 4) else "left",
                             ratio={0: 5, 5: 3}.get(i), min_width=None if i in (0, 5) else 6)
        for *cells, mark in rows:
            if mark:
                cells[3] = "! " + cells[3]
            table.add_row(*cells, style="bold red" if mark else None)
        con.print(table)
    stepped = sum(1 for c in history.cases if c.steps)
    con.print(f"{stepped} of {len(history.cases)} case(s) with a step of {history.threshold * 100:g} % or more "
              f"(threshold from {history.threshold_source})", markup=False)
    con.print(verdict_line(history), style="bold red" if history.regressions else "green", markup=False)


def to_markdown(history: History, max_rows: int = 200) -> str:
    """The report as GitHub Markdown (a CI job summary): the span, the verdict, the notes,
    the step table (at most ``max_rows`` rows, the rest counted). Every string from a set
    (suite, revisions, dates, labels, kernels, notes naming them) passes
    :func:`tflabench.text_safety.markdown_text`, so no tag, comment, mention or pipe from a
    set acts in the rendered summary (docs/harness.md, "What reaches the terminal")."""
    lines = [f"### tflabench history: {markdown_text(history.suite)}", "", markdown_text(span_line(history), None),
             "", f"**{markdown_text(verdict_line(history), None)}**", ""]
    lines += [f"- note: {markdown_text(note, 4000)}" for note in history.notes]
    rows = step_rows(history)
    if rows:
        lines += ["", "| " + " | ".join(_HEADER) + " |", "|" + "---|" * len(_HEADER)]
        from_set = (0, 2, 5)  # case label, revision, kernel; the other cells are the project's numbers
        for row in rows[:max_rows]:
            lines.append("| " + " | ".join(markdown_text(cell) if i in from_set else cell.replace("|", "\\|")
                                           for i, cell in enumerate(row)) + " |")
        if len(rows) > max_rows:
            lines.append(f"\n{len(rows) - max_rows} more row(s) in the JSON report")
    else:
        lines.append("No case stepped by the threshold or more.")
    lines += ["", f"Method: {METHOD}; threshold {history.threshold * 100:g} % ({history.threshold_source}); "
              "p: two-sided Mann-Whitney U between the segments (docs/ci.md, \"History\")."]
    return "\n".join(lines)


def to_json(history: History) -> dict:
    """The report as a JSON-able dict: suite, threshold, method, commits, cases (their
    per-commit medians and steps), regressions, exit_status."""
    def clean(value: Any) -> Any:
        return None if isinstance(value, float) and not math.isfinite(value) else value

    return {
        "suite": history.suite,
        "threshold": history.threshold,
        "threshold_source": history.threshold_source,
        "method": METHOD,
        "notes": history.notes,
        "commits": [dataclasses.asdict(c) for c in history.commits],
        "cases": [{"case_id": c.case_id, "case": c.label, "kernel": c.kernel, "backend": c.backend,
                   "median_ms": clean(c.median_ms), "medians_ms": c.medians_ms, "regression": c.regression,
                   "steps": [{k: clean(v) for k, v in dataclasses.asdict(s).items()} for s in c.steps]}
                  for c in history.cases],
        "regressions": [c.case_id for c in history.regressions],
        "exit_status": history.exit_status(),
    }
