"""Commands: compare (regression report between two result sets), merge (join shards),
references (the index of the reference sets).

Thin: parse, call :func:`tflabench.compare.gate.compare_paths` (rendered by
:mod:`tflabench.compare.render`) / :mod:`tflabench.store.shard`, print. The decision rule and
its reasons are in docs/ci.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from tflabench.cli import app, echo_warnings, user_errors


def _override(flag: str, help: str):
    """An option overriding one threshold of :class:`tflabench.compare.thresholds.Thresholds`; not
    given (None), the threshold comes from --thresholds, the suite, or its default."""
    return typer.Option(None, flag, help=help)


@app.command()
def compare(
    base: Path = typer.Argument(..., help="Reference result set (directory or one of its files); "
                                "with --reference, the set to judge (NEW)."),
    new: Optional[Path] = typer.Argument(None, help="Result set to judge against BASE."),
    reference: Optional[str] = typer.Option(
        None, "--reference", help="GPU model (h100, h200): judge the one set given against "
        "results/reference/GPU/SUITE/, SUITE being the suite that set ran."),
    time_threshold: Optional[float] = _override(
        "--time-threshold", "Smallest relative change of the median time reported (default 0.03 = 3 %)."),
    alpha: Optional[float] = _override(
        "--alpha", "Significance level of the Mann-Whitney U test on per-iteration samples (default 0.01)."),
    min_samples: Optional[int] = _override(
        "--min-samples", "Fewest samples per side for the test; fewer: IQR rule (default 5)."),
    mem_threshold: Optional[float] = _override(
        "--mem-threshold", "Smallest relative change of peak_mem_bytes reported (default 0.05)."),
    mem_floor_bytes: Optional[int] = _override(
        "--mem-floor-bytes", "Smallest absolute change of peak_mem_bytes reported (default 1 MiB)."),
    thresholds_file: Optional[Path] = typer.Option(
        None, "--thresholds", help="YAML file of thresholds (same names, e.g. time_threshold: 0.05); "
        "overrides the base's suite, overridden by options (NEW's own thresholds are ignored)."
    ),
    fail_on: str = typer.Option(
        "any", "--fail-on", help="Exit 1 on, a comma list of: regression (time/memory), failure (new failure "
        "or lost case), undecided (samples too few or too noisy to decide), any (regression, failure, or more "
        "than 25 % of the cases undecided for want of resolution), none."
    ),
    output_format: str = typer.Option(
        "table", "--format", help="What to print on stdout: table, markdown or json."
    ),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="Also write the Markdown report to FILE."),
    json_file: Optional[Path] = typer.Option(None, "--json", help="Also write the JSON report to FILE."),
    step_summary: bool = typer.Option(
        False, "--step-summary", help="Append the Markdown report to $GITHUB_STEP_SUMMARY (GitHub Actions)."
    ),
    show_all: bool = typer.Option(False, "--all", help="List unchanged cases in the terminal table too."),
    wide: bool = typer.Option(
        False, "--wide", help="One line per case in the terminal table, every column side by side (wider than 80)."
    ),
    aa: Optional[List[Path]] = typer.Option(
        None, "--aa", help="An A/A partner of BASE: another run of the reference's code on the same machine "
        "(repeatable); its change from BASE is the drift allowance of every case (docs/ci.md)."
    ),
) -> None:
    """Compare two result sets of one suite: slower, faster, unchanged, undecided, broken, added, removed.

    Exit status: 1 when --fail-on finds something, 0 otherwise, 2 for an unusable input
    or output (checked before anything is written).
    """
    from tflabench.compare import render
    from tflabench.compare.gate import compare_paths

    with user_errors():
        render.check_outputs(fail_on, output_format, markdown, json_file, step_summary)
        comparison = compare_paths(
            base, new, reference=reference, partners=aa or (), thresholds_file=thresholds_file,
            overrides=dict(time_threshold=time_threshold, alpha=alpha, min_samples=min_samples,
                           mem_threshold=mem_threshold, mem_floor_bytes=mem_floor_bytes),
            on_loaded=echo_warnings)
    if output_format == "table":
        render.render_table(comparison, show_unchanged=show_all, fail_on=fail_on, wide=wide)
    else:
        typer.echo(render.report_text(comparison, output_format, fail_on))
    with user_errors():  # a write that fails now (a full disk) is still exit 2, never 1
        for line in render.write_reports(comparison, fail_on, markdown, json_file, step_summary):
            typer.echo(f"warning: {line}", err=True)
    raise typer.Exit(comparison.exit_status(fail_on))


@app.command()
def references(
    markdown: bool = typer.Option(False, "--markdown", help="Print the index as Markdown "
                                  "(as committed in results/reference/README.md)."),
) -> None:
    """List the reference sets: one per suite and GPU, with commit, date, software and cases ok."""
    from tflabench.console import literal, make_console
    from tflabench.store.references import index_markdown, reference_sets

    with user_errors():
        sets = reference_sets()
    if markdown:
        typer.echo(index_markdown(sets), nl=False)
        return
    from rich.table import Table

    table = Table("set", "commit", "date (UTC)", "GPU", "software", "cases")
    for s in sets:
        table.add_row(*(literal(v) for v in (f"{s.gpu}/{s.suite}/", s.commit, s.date,
                                              s.metadata.get("gpu_name"), s.software, s.cases)))
    make_console().print(table)


@app.command()
def merge(
    dirs: List[Path] = typer.Argument(..., help="Result-set directories of the shards (tflabench run --shard K/N)."),
    out: Path = typer.Option(..., "--out", help="Directory for the merged result set (must not hold one)."),
    allow_missing: bool = typer.Option(
        False, "--allow-missing", help="Merge even when some of the N shards are absent or incomplete "
        "(recorded in the metadata)."
    ),
) -> None:
    """Join the shard result sets of one run into one result set.

    Refuses (exit 2) shards of different suites or environments, repeated shards, and
    missing or incomplete shards (fewer rows than the cases they were to measure) unless
    --allow-missing.
    """
    from tflabench.store.results import load_results
    from tflabench.store.shard import merge_results

    with user_errors():
        warnings: list[str] = []
        path = merge_results(dirs, out, allow_missing=allow_missing, warnings=warnings)
        merged = load_results(path)
    for line in warnings:
        typer.echo(f"warning: {line}", err=True)
    missing = merged.metadata.get("shards_missing") or []
    n_shards = len(merged.metadata.get("merged_from") or [])
    typer.echo(f"merged {n_shards} shard(s), {len(merged.rows)} row(s) into {path}")
    if missing:
        typer.echo(f"warning: shard(s) {', '.join(map(str, missing))} missing; their cases are absent", err=True)
    for item in merged.metadata.get("shards_incomplete") or []:
        typer.echo(f"warning: {'shard ' + item['shard'] if item.get('shard') else 'the shards'} lack "
                   f"{item['cases_missing']} of {item['cases_expected']} case(s); they are absent", err=True)
