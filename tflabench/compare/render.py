"""The three renderings of a comparison (:class:`tflabench.compare.gate.Comparison`): rich
tables for the terminal (:func:`render_table`, folded to two lines a case below
:data:`WIDE_TABLE` columns), GitHub-flavoured Markdown for a pull request or
``$GITHUB_STEP_SUMMARY`` (:func:`to_markdown`, :func:`append_step_summary`) and JSON
(:func:`to_json`); the one-line verdict and resolution (:func:`verdict_line`,
:func:`resolution_line`). Every string from a set passes
:mod:`tflabench.text_safety` (docs/harness.md, "What reaches the terminal").
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from tflabench.compare.gate import OUTCOME_LABEL, OUTCOMES, Comparison
from tflabench.compare.rows import OK, plain
from tflabench.compare.statistics import TAIL_PERCENTILE
from tflabench.compare.thresholds import UNDECIDED_SHARE, Thresholds, parse_fail_on
from tflabench.errors import UserError
from tflabench.text_safety import markdown_text, terminal_text

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
    value = plain(value)
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
    bs, ns = plain(record.get("base_status")), plain(record.get("new_status"))
    text = f"{bs or 'absent'} -> {ns or 'absent'}" if bs != ns else str(ns)
    reason = plain(record.get("new_reason"))
    if ns not in (None, OK) and reason:
        text += f" ({str(reason).splitlines()[0][:80]})"
    return text


def verdict_line(comparison: Comparison, fail_on: str = "any") -> str:
    """One line: the counts that matter, whether the policy fails, and why."""
    c = comparison.counts
    parts = [f"{c.get(o, 0)} {OUTCOME_LABEL[o]}" for o in OUTCOMES if c.get(o, 0)]
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
    ratios = [r for r in (plain(record.get("p90_ratio")), plain(record.get("mean_ratio"))) if r is not None]
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
            table.add_row(Text(OUTCOME_LABEL[r["outcome"]], style=style), case,
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
                Text(OUTCOME_LABEL[r["outcome"]], style=style), literal(r["case"]), literal(status),
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
            f"{_OUTCOME_MARK[r['outcome']]} {OUTCOME_LABEL[r['outcome']]}",
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
                v = plain(v)
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


#: What ``compare --format`` may print on stdout.
FORMATS = ("table", "markdown", "json")


def check_outputs(fail_on: str, output_format: str, markdown: Path | None = None, json_file: Path | None = None,
                  step_summary: bool = False) -> None:
    """Refuse, before anything is loaded, printed or written, an unknown ``--fail-on``
    (:func:`tflabench.compare.thresholds.parse_fail_on`) or ``--format`` (:data:`FORMATS`)
    and a report file that cannot be written (``--markdown``, ``--json``,
    ``$GITHUB_STEP_SUMMARY`` with ``step_summary``): an unusable output is exit 2, never a
    verdict. Raises UserError."""
    from tflabench.outputs import check_writable

    parse_fail_on(fail_on)
    if output_format not in FORMATS:
        raise UserError(f"--format: {output_format!r} is not one of {', '.join(FORMATS)}")
    summary = os.environ.get("GITHUB_STEP_SUMMARY") if step_summary else None
    for path, what in ((markdown, "--markdown"), (json_file, "--json"), (summary, "$GITHUB_STEP_SUMMARY")):
        if path:
            check_writable(path, what)


def report_text(comparison: Comparison, output_format: str, fail_on: str = "any") -> str:
    """The report for stdout in ``output_format`` ``markdown`` (:func:`to_markdown`) or
    ``json`` (:func:`to_json`, indented); the table is printed by :func:`render_table`.
    Raises ValueError for another format."""
    if output_format == "markdown":
        return to_markdown(comparison, fail_on)
    if output_format == "json":
        return json.dumps(to_json(comparison, fail_on), indent=2)
    raise ValueError(f"output_format={output_format!r}; allowed: markdown, json")


def write_reports(comparison: Comparison, fail_on: str = "any", markdown: Path | None = None,
                  json_file: Path | None = None, step_summary: bool = False) -> list[str]:
    """Write the Markdown report to ``markdown``, the JSON report to ``json_file`` and, with
    ``step_summary``, append the Markdown to ``$GITHUB_STEP_SUMMARY`` (:func:`append_step_summary`).
    Returns the warnings (one line each): ``step_summary`` without the variable set.
    Raises UserError when a file cannot be written."""
    from tflabench.outputs import write_text

    if markdown:
        write_text(markdown, to_markdown(comparison, fail_on) + "\n", "--markdown")
    if json_file:
        write_text(json_file, json.dumps(to_json(comparison, fail_on), indent=2) + "\n", "--json")
    if step_summary and append_step_summary(to_markdown(comparison, fail_on)) is None:
        return ["--step-summary given but $GITHUB_STEP_SUMMARY is not set; nothing appended"]
    return []
