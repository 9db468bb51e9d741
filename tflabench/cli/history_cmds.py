"""Command: history (where each case's time stepped over a series of result sets, one per
commit). Thin: parse, call :mod:`tflabench.compare.history`, render. The method: docs/ci.md, "History".
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from tflabench.cli import app, echo_warnings, user_errors


@app.command()
def history(
    dirs: List[Path] = typer.Argument(..., help="Result sets of one suite, one per commit, any order (or folders "
                                      "holding them, e.g. results/tfla_ci)."),
    time_threshold: Optional[float] = typer.Option(
        None, "--time-threshold", help="Smallest step reported and judged (0.05 = 5 %; default: the suite's "
        "compare: time_threshold, else compare's default)."),
    output_format: str = typer.Option("table", "--format", help="What to print on stdout: table, markdown or json."),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="Also write the Markdown report to FILE."),
    json_file: Optional[Path] = typer.Option(None, "--json", help="Also write the JSON report to FILE."),
    step_summary: bool = typer.Option(
        False, "--step-summary", help="Append the Markdown report to $GITHUB_STEP_SUMMARY (GitHub Actions)."),
    out: Optional[Path] = typer.Option(
        None, "--out", help="Directory for the trend figures, one PNG per kernel family (none when not given)."),
    show_all: bool = typer.Option(False, "--all", help="List the cases without a step too."),
) -> None:
    """Find where each case's time stepped over a suite's result sets, one per commit.

    Exit status: 1 when a case's newest commit sits in a segment that began with a slowdown
    beyond the threshold, 0 otherwise, 2 for unusable input (fewer than 2 sets, sets of
    different suites or measurement conditions) or output.
    """
    import json
    import os

    from tflabench.compare import history as H
    from tflabench.compare.render import append_step_summary
    from tflabench.errors import UserError
    from tflabench.run.kernel_profile import parse_profile
    from tflabench.outputs import check_writable, write_text
    from tflabench.store.results import load_results

    with user_errors():
        if output_format not in ("table", "markdown", "json"):
            raise UserError(f"--format: {output_format!r} is not one of table, markdown, json")
        summary = os.environ.get("GITHUB_STEP_SUMMARY") if step_summary else None
        for path, what in ((markdown, "--markdown"), (json_file, "--json"), (summary, "$GITHUB_STEP_SUMMARY")):
            if path:
                check_writable(path, what)
        sets = [load_results(p) for p in H.result_set_paths(dirs)]
        echo_warnings(*sets)
        result = H.analyse(sets, threshold=time_threshold, parse_profile=parse_profile)
        text_md = H.to_markdown(result)
        figures = []
        if out is not None:
            from tflabench.report.plots.history import plot_trends

            figures = plot_trends(result, out)

    if output_format == "table":
        H.render_table(result, show_all=show_all)
    elif output_format == "markdown":
        typer.echo(text_md)
    else:
        typer.echo(json.dumps(H.to_json(result), indent=2))
    for figure in figures:
        typer.echo(f"plot: {figure}", err=output_format != "table")
    with user_errors():
        if markdown:
            write_text(markdown, text_md + "\n", "--markdown")
        if json_file:
            write_text(json_file, json.dumps(H.to_json(result), indent=2) + "\n", "--json")
        if step_summary and append_step_summary(text_md) is None:
            typer.echo("warning: --step-summary given but $GITHUB_STEP_SUMMARY is not set; nothing appended",
                       err=True)
    raise typer.Exit(result.exit_status())
