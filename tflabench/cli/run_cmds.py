"""Commands: run, report, backends, doctor, calibrate (the main job and its helpers).

Thin: parse, call :mod:`tflabench.run.suite_run` / :mod:`tflabench.store.results` /
:mod:`tflabench.environment`, render with :mod:`tflabench.report.tables` and :mod:`tflabench.report.plots`.
torch, pandas and matplotlib are imported inside the command functions (the analytic
commands start without them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from tflabench.cli import app, ceilings_option, comma_list, echo_warnings, interruptible, plots_option, user_errors
from tflabench.console import make_console
from tflabench.errors import UserError
from tflabench.text_safety import terminal_text


def _status_line(rows) -> str:
    """``"3 ok, 1 crash"``: the rows' statuses counted (row dicts or a DataFrame)."""
    from collections import Counter

    counts = Counter(rows["status"].tolist()) if hasattr(rows, "columns") else Counter(r["status"] for r in rows)
    order = ["ok", "wrong", "crash", "timeout", "oom", "error", "unavailable", "not_run"]
    return ", ".join(f"{counts[s]} {s}" for s in order if counts.get(s))


@app.command()
def run(
    suite: Optional[Path] = typer.Argument(
        None, help="Suite YAML (default: suites/cpu_demo.yaml, a small suite that runs on the CPU)."),
    resume: Optional[Path] = typer.Option(
        None, "--resume", help="Finish an interrupted run: append to this result set, skipping measured cases."),
    out: Path = typer.Option(Path("results"), "--out", help="Root of new result sets: OUT/<suite>/<timestamp>/."),
    shard: Optional[str] = typer.Option(None, "--shard", help="Run shard K of N (e.g. 2/4), balanced by model cost."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="One worker per GPU: 'all' or indices like 0,1."),
    only: Optional[list[str]] = typer.Option(
        None, "--only", help="Run only kernels whose label or backend matches one of these globs, "
        "comma-separated, e.g. --only '*mLSTMsig*,mamba2'."),
    max_kernel_failures: int = typer.Option(
        2, "--max-kernel-failures", min=0, help="After this many consecutive crash/timeout rows of one "
        "kernel, record its remaining cases as not run (0: run every case)."),
    ceilings: str = ceilings_option(),
    device: Optional[str] = typer.Option(None, "--device", help="Override the suite's device: cpu or cuda."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show the progress bar."),
    plots: bool = plots_option("Write the figures after the run."),
    triton_cache: Optional[Path] = typer.Option(
        None, "--triton-cache", help="Keep Triton's compiled kernels and every autotuner's results in DIR "
        "(TRITON_CACHE_DIR, TRITON_CACHE_AUTOTUNING=1), also across cases: a later run with the same DIR "
        "skips the autotuning (e.g. FLA chunk_gla's minutes per shape), but a case then runs with the "
        "config tuned for an earlier case of the same tuning key (fla's keys leave out B and S). "
        "Without it every case tunes at its own shape. first_call_s shows what a run paid."),
    profile: bool = typer.Option(
        False, "--profile", help="After each case's timings, record the time of every kernel it launched "
        "(torch.profiler: CUDA kernels on a GPU, operators on the CPU), forward and backward apart; "
        "`tflabench report` splits it over the model's parts, each against its own bound."),
    gpu_trace: bool = typer.Option(
        False, "--gpu-trace", help="Sample each case's GPU with nvidia-smi while it is timed: the lowest SM "
        "clock, the highest power draw and the slowdown reasons the driver reported (power cap, thermal), "
        "kept in the rows; the warning about spread cases then says which of them slowed down."),
    count: bool = typer.Option(
        False, "--count", help="Print the number of cases the run would measure (after --only, --shard and "
        "--device) and exit, measuring nothing: the size of a SLURM job array (docs/ci.md)."),
) -> None:
    """Run a benchmark suite: every case in an isolated worker, results + plots on disk."""
    from tflabench.store.suite import default_suite_path

    path = suite if suite is not None else default_suite_path()
    if count:
        _print_case_count(path, shard=shard, only=only, device=device)
        return
    # from the start: the message is true at every moment
    with interruptible(lambda stop: _interrupted_line(stop, path)):
        _run_and_report(path, resume=resume, out=out, shard=shard, gpus=gpus, only=only,
                        max_kernel_failures=max_kernel_failures, ceilings=ceilings, device=device,
                        progress=progress, plots=plots, triton_cache=triton_cache, profile=profile,
                        gpu_trace=gpu_trace)


def _print_case_count(path: Path, *, shard, only, device) -> None:
    """``run --count``: the number of cases of suite ``path`` after ``--only``, ``--shard``
    and ``--device``, on stdout alone (a script reads it). Raises UserError (exit 2) where
    ``run`` would refuse the suite or an option."""
    from tflabench.store.shard import parse_shard, select_shard
    from tflabench.store.suite import expand_cases, load_suite, resolve_device
    from tflabench.run.suite_run import case_cost, select_kernels

    with user_errors():
        if device not in (None, "cpu", "cuda"):
            raise UserError(f"--device={device!r}; allowed: cpu, cuda")
        loaded = load_suite(path)
        cases = select_kernels(expand_cases(loaded, device=resolve_device(device or loaded.suite.device)),
                               comma_list("--only", only))
        if shard is not None:
            cases = select_shard(cases, *parse_shard(shard), case_cost)
    typer.echo(str(len(cases)))


class _AfterRun(KeyboardInterrupt):
    """Ctrl-C / SIGTERM while the table or the figures of a finished run were drawn."""

    def __init__(self, directory: Path):
        super().__init__()
        self.directory = directory


def _interrupted_line(stop: KeyboardInterrupt, suite_path: Path) -> str:
    """What an interrupted ``run`` leaves, said truly at whatever moment it stopped."""
    from tflabench.run.pool import RunInterrupted

    if isinstance(stop, _AfterRun):
        return f"interrupted after the run finished: every row is in {stop.directory}"
    if not isinstance(stop, RunInterrupted) or stop.directory is None:
        return "interrupted before a result set was created: nothing was written"
    finish = f"`tflabench run {suite_path} --resume {stop.directory}`"
    if not stop.written:
        return f"interrupted before anything was written: {stop.directory} is as it was"
    if not stop.rows:
        return f"interrupted before a case finished: {stop.directory} holds no row yet; finish with {finish}"
    return (f"interrupted: {stop.rows} case(s) measured so far are kept in {stop.directory}; "
            f"finish with {finish}")


def _run_and_report(path: Path, *, resume, out, shard, gpus, only, max_kernel_failures, ceilings, device,
                    progress, plots, triton_cache, profile=False, gpu_trace=False) -> Path:
    """``run``'s body: check the options, run the suite, print the table, draw the figures."""
    from tflabench.store.suite import load_suite
    from tflabench.run.suite_run import run_suite
    from tflabench.run.pool import parse_gpus

    with user_errors():
        if device not in (None, "cpu", "cuda"):
            raise UserError(f"--device={device!r}; allowed: cpu, cuda")
        if ceilings not in ("auto", "datasheet", "measured"):
            raise UserError(f"--ceilings={ceilings!r} is not valid; allowed: auto|datasheet|measured")
        loaded = load_suite(path)
        gpu_list = parse_gpus(gpus)
        if shard is not None:
            from tflabench.store.shard import parse_shard

            parse_shard(shard)
        result = run_suite(loaded, out_root=out, resume=resume, gpus=gpu_list, shard=shard,
                           only=comma_list("--only", only), max_kernel_failures=max_kernel_failures,
                           ceilings=ceilings, device=device, progress=progress, triton_cache=triton_cache,
                           profile=profile, gpu_trace=gpu_trace)
    try:
        _report_run(loaded, result, plots)
    except KeyboardInterrupt:
        raise _AfterRun(result.directory) from None
    return result.directory


def _report_run(loaded, result, plots: bool) -> None:
    from tflabench.store.results import load_results
    from tflabench.report.tables import summary_table

    written_plots = _write_run_plots(result.directory) if plots else []
    con = make_console()
    with user_errors():
        loaded_set = load_results(result.directory)
    echo_warnings(loaded_set)
    frame = loaded_set.rows
    con.print(summary_table(frame, title=f"{loaded.suite.name}: {len(frame)} rows"))
    skipped = f", {result.skipped} already measured (skipped)" if result.skipped else ""
    first_call_s = sum(r["first_call_s"] or 0.0 for r in result.rows)
    con.print(f"{len(result.rows)} cases run in {result.wall_s:.1f} s ({_status_line(result.rows) or 'none'}){skipped}; "
              f"first calls (compilation, autotuning) took {first_call_s:.1f} s of it")
    con.print(f"results: {result.directory}", markup=False)
    for p in written_plots:
        con.print(f"plot: {p}", markup=False)
    threads = loaded_set.metadata.get("cpu_threads") or {}
    if threads:
        con.print(f"CPU threads per worker: {threads.get('per_worker')} of {threads.get('cores')} cores "
                  f"({threads.get('set_by')})")
    _warn_noisy(loaded_set.rows)
    _warn_host_bound(loaded_set.rows, loaded_set.metadata)


#: Most noisy cases a run's closing warning names (the rest are counted).
NOISY_NAMED = 6


def _named_cases(cases: list[tuple[str, float]], share: str) -> str:
    """The first :data:`NOISY_NAMED` (label, share) pairs of a warning as ``label (share);
    ...``, ``share`` a format string for the number, and how many more there are."""
    named = "; ".join(f"{terminal_text(label, 120)} ({share.format(x)})" for label, x in cases[:NOISY_NAMED])
    return named + (f"; and {len(cases) - NOISY_NAMED} more" if len(cases) > NOISY_NAMED else "")


def _warn_noisy(rows) -> list[tuple[str, float]]:
    """End a run (or a report) with a warning naming the cases whose timings spread more
    than compare's noise level, and what to do (on stderr); returns those cases
    (:func:`tflabench.compare.caveats.noisy_cases`)."""
    from tflabench.compare.caveats import NOISE_ADVICE, NOISY_RELATIVE_IQR, noisy_cases, slowdown_text

    noisy = noisy_cases(rows)
    if not noisy:
        return noisy
    traced = rows  # only traced rows can say why (fast on 100,000 rows)
    if "gpu_slowdowns" in rows.columns:
        traced = rows[rows["gpu_slowdowns"].map(lambda x: isinstance(x, str))]
    named = _named_cases(noisy, "{:.0%}")
    trace = slowdown_text(traced, noisy)
    on_gpu = "device" in rows.columns and rows["device"].astype(str).str.startswith("cuda").any()
    if trace:
        trace = f" {trace[:1].upper()}{trace[1:]}."
    elif on_gpu:
        trace = " (`run --gpu-trace` records whether the GPU slowed down.)"
    typer.echo(f"warning: {len(noisy)} case(s) spread more than {NOISY_RELATIVE_IQR:.0%} of their median "
               f"(IQR / median): {named}.{trace} Their medians are not to be trusted and `tflabench "
               f"compare` cannot decide on them: {NOISE_ADVICE}.", err=True)
    return noisy


def _host_bound_lines(rows, graphs: bool = False) -> list[str]:
    """The host-bound warning (docs/harness.md "Host time"): one line naming the cases whose
    host time per call reaches :data:`tflabench.run.measure.HOST_BOUND_SHARE` of their GPU time
    and what helps; [] where none does. ``graphs``: the set timed CUDA-graph replays, so its
    times are the GPU's and only an eager call would wait for the host."""
    from tflabench.run.measure import HOST_BOUND_ADVICE, HOST_BOUND_SHARE, host_bound_cases

    bound = host_bound_cases(rows)
    if not bound:
        return []
    named = _named_cases(bound, "host {:.0%} of GPU")
    if graphs:
        return [f"{len(bound)} case(s) host-bound when called eagerly (host time per call at least "
                f"{HOST_BOUND_SHARE:.0%} of the GPU time): {named}. Their times here are CUDA-graph replays "
                "(the GPU's alone); an eager training step would run at the host's pace."]
    return [f"{len(bound)} case(s) host-bound (host time per call at least {HOST_BOUND_SHARE:.0%} of the GPU "
            f"time): {named}. {HOST_BOUND_ADVICE[:1].upper()}{HOST_BOUND_ADVICE[1:]}."]


def _warn_host_bound(rows, metadata=None) -> list[str]:
    """Print :func:`_host_bound_lines` as a warning on stderr; returns the lines. ``metadata``:
    the set's, which says whether it timed CUDA-graph replays."""
    from tflabench.store.schema import recorded_timing

    lines = _host_bound_lines(rows, graphs=bool(recorded_timing(metadata or {}).get("cuda_graph")))
    for line in lines:
        typer.echo(f"warning: {line}", err=True)
    return lines


def _write_run_plots(directory: Path) -> list[Path]:
    """The figures of a run's result set (:func:`tflabench.report.plots.benchmark.write_plots`); a
    problem drawing them is a warning on stderr (the measurements are on disk already)."""
    from tflabench.store.results import ROWS_FILE

    if not (directory / ROWS_FILE).exists():
        return []
    try:
        from tflabench.report.plots.benchmark import write_plots
        from tflabench.report.set_report import install_drawn

        return install_drawn(lambda scratch: write_plots(directory, scratch), directory / "plots")
    except Exception as exc:  # a plot problem must not lose the measurements
        typer.echo(f"warning: plots not written ({type(exc).__name__}: {exc})", err=True)
        return []


@app.command()
def report(
    results_dir: Path = typer.Argument(..., help="A result set (directory or one of its files).", metavar="RESULTS"),
    plots: bool = plots_option("Redraw the figures."),
    out: Optional[Path] = typer.Option(None, "--out", help="Directory the figures are written into (default: "
                                       "results/plots/<suite>-<set>/ in the current directory; never the set itself "
                                       "unless named here)."),
    all_rows: bool = typer.Option(False, "--all", help="Print every row (default: the first 100 and a count "
                                  "of the rest; in --html the first 2000)."),
    wide: bool = typer.Option(False, "--wide", help="Print each table on one line per row, however wide (default: "
                              "columns that do not fit the terminal move to a second table)."),
    html: Optional[Path] = typer.Option(
        None, "--html", help="Also write a self-contained HTML report (tables + figures in one file, "
        "nothing loaded from the network) to FILE.html."),
    ceilings: str = ceilings_option(),
    gpu: Optional[str] = typer.Option(
        None, "--gpu", help="GPU key or name whose roofline to use, one (default: the set's GPU)."),
    causal_factor: float = typer.Option(
        0.66, "--causal-factor", help="F_causal of the chunk-sweep model curve (0.66: the paper's figures)."),
    kernels: int = typer.Option(
        0, "--kernels", min=0, help="For a set measured with `run --profile`: also list each case's N "
        "largest kernels per model part (0: none)."),
) -> None:
    """Print a result set's table, its distance to the roofline bound, each case's time by
    model part (sets measured with `run --profile`) beside the model's bound and the
    physical floor, and (for chunk-size sweeps) predicted vs measured optimal chunk size;
    redraw its figures; optionally write one self-contained HTML file. With --no-plots no
    figure file is written (an HTML report still embeds its figures, drawn in a temporary
    directory)."""
    with user_errors():
        from tflabench.outputs import check_writable
        from tflabench.report import set_report as sr
        from tflabench.report.html import check_html_path, write_html_report
        from tflabench.report.tables import verify_table
        from tflabench.store.results import load_results

        _check_report_options(causal_factor, ceilings, gpu)
        rs = load_results(results_dir)
        _normalise_set_labels(rs, results_dir)
        if html is not None:  # every output checked before anything is printed or drawn
            check_html_path(html)
        plot_dir = out if out is not None else default_report_dir(rs.path)
        if plots:
            check_writable(plot_dir / "runtime.png", "--out" if out else f"{plot_dir}/ (--out DIR: another; "
                           "--no-plots: none)")
            check_untracked(plot_dir, rs.path)
        echo_warnings(rs)
        con = make_console(wide=wide)
        con.print(sr.set_heading(rs.metadata), markup=False)
        verify_set = sr.is_verify_set(rs.rows)
        if verify_set:
            con.print(verify_table(rs.rows, title=f"verify, {len(rs.rows)} cases: worst case per kernel and regime"))
            con.print(_status_line(rs.rows))
            comparison, warnings = sr.ModelComparison(), []
        else:
            comparison, warnings = _print_timing_set(con, rs, ceilings=ceilings, gpu=gpu, causal_factor=causal_factor,
                                                     all_rows=all_rows, kernels=kernels)
        written = []
        if plots:
            written = sr.install_drawn(lambda scratch: sr.draw_figures(
                rs, scratch, verify_set=verify_set, model_gpu=comparison.gpu, F_causal=causal_factor), plot_dir)
            for p in written:
                con.print(f"plot: {p}", markup=False)
        if html:
            text = sr.html_page(rs, figures=written if plots else None, comparison=comparison, warnings=warnings,
                                all_rows=all_rows, verify_set=verify_set, F_causal=causal_factor)
            con.print(f"html: {write_html_report(html, text)}", markup=False)


def _check_report_options(causal_factor: float, ceilings: str, gpu: str | None) -> None:
    """UserError for a --causal-factor outside [0.5, 1], an unknown --ceilings, or more than one --gpu."""
    if not 0.5 <= causal_factor <= 1.0:
        raise UserError(f"--causal-factor={causal_factor!r} is not valid; F_causal must lie in [0.5, 1]")
    if ceilings not in ("auto", "measured", "datasheet"):
        raise UserError(f"--ceilings={ceilings!r} is not valid; allowed: auto|measured|datasheet")
    if gpu is not None and len(comma_list("--gpu", gpu)) > 1:
        raise UserError(f"--gpu={gpu!r}: report places the rows on one GPU's roofline; give one")


def _print_timing_set(con, rs, *, ceilings: str, gpu: str | None, causal_factor: float, all_rows: bool,
                      kernels: int):
    """Print a timing set's report: how it was timed, its table, its statuses, the spread and
    host-bound warnings (stderr), the model comparison, the chunk-size "auto" gaps and the
    time by model part. Returns the :class:`~tflabench.report.set_report.ModelComparison`
    and the warnings' lines (for the HTML page)."""
    from tflabench.analysis.chunk_rule import auto_gaps
    from tflabench.report import set_report as sr
    from tflabench.report.tables import (SHOWN_ROWS, auto_gap_table, distance_table, summary_table, sweep_table,
                                         timing_text)

    rows, meta = rs.rows, rs.metadata
    con.print(terminal_text(f"timed: {timing_text(meta)}", 2000), markup=False)
    con.print(summary_table(rows, title=f"{len(rows)} rows", limit=None if all_rows else SHOWN_ROWS))
    con.print(_status_line(rows))
    noisy = _warn_noisy(rows)
    warnings = _noisy_lines(noisy) + _warn_host_bound(rows, meta)
    comparison = sr.model_comparison(rows, meta, ceilings=ceilings, gpu=gpu, F_causal=causal_factor)
    if comparison.note:
        con.print(comparison.note, style="dim", markup=False)
    if comparison.gpu is not None:
        con.print(terminal_text(f"model: {comparison.ceilings_text()}", 2000), markup=False)
        if comparison.distance:
            con.print(distance_table(comparison.distance))
        if comparison.sweeps:
            con.print(sweep_table(comparison.sweeps))
    gaps = auto_gaps(rows.to_dict("records"))
    if gaps:
        con.print(auto_gap_table(gaps))
    _print_profile(con, rows, comparison.gpu, all_rows=all_rows, kernels=kernels)
    return comparison, warnings


def _print_profile(con, rows, model_gpu, *, all_rows: bool, kernels: int) -> None:
    """Print each case's time by model part beside its bound and floor
    (:func:`tflabench.run.kernel_profile.breakdowns`), and with ``kernels`` its largest
    kernels per part; nothing where no case has a profile or a model bound."""
    from tflabench.report import set_report as sr
    from tflabench.report.tables import kernels_table, profile_table
    from tflabench.run.kernel_profile import breakdowns

    capped = sr.profile_rows(rows, model_gpu, all_rows)
    if capped is None:
        return
    peak_flops_per_s, beta = (model_gpu.flops_per_s, model_gpu.bytes_per_s) if model_gpu is not None else (None, None)
    cases = breakdowns(capped, peak_flops_per_s, beta)
    if any(c.source is not None for c in cases) or (cases and model_gpu is not None):
        con.print(profile_table(cases))
        if len(capped) < len(rows):
            con.print(f"(of the first {len(capped)} rows; `--all`: every row)", markup=False)
        for case in cases if kernels else []:
            if case.source is not None:
                con.print(kernels_table(case, top=kernels))


def default_report_dir(set_path: Path) -> Path:
    """Where ``report`` writes its figures without ``--out``: ``results/plots/<suite>-<set>/``
    under the current directory, as the analytic commands' ``results/plots/`` (``<suite>``,
    ``<set>``: the set directory's parent's name and its own, e.g.
    ``results/plots/cpu_demo-20260101-120000/``), outside the set (docs/harness.md,
    "Reports: the terminal, Markdown, one HTML file")."""
    import re

    resolved = set_path.resolve()
    name = f"{resolved.parent.name}-{resolved.name}" if resolved.parent.name else resolved.name
    return Path("results", "plots", re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "set")


def check_untracked(plot_dir: Path, set_path: Path) -> None:
    """Refuse to draw figures over a file of the set that git tracks (a committed reference
    set): UserError naming the file. Only figure names report writes are checked; a
    directory outside a git work tree passes."""
    import subprocess

    names = ("runtime.png", "memory_vs_runtime.png", "roofline_measured.png", "optimal_chunk.png",
             "verify_heatmap.png")
    target = plot_dir.resolve()
    if not target.is_dir():
        return
    try:
        tracked = subprocess.run(["git", "-C", str(target), "ls-files", "--", *names], capture_output=True,
                                 text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):  # no git: nothing is tracked
        return
    if tracked:
        raise UserError(f"--out {plot_dir}: {terminal_text(tracked[0])} there is tracked by git; report does not "
                        "overwrite a committed figure: give another --out DIR, or --no-plots")


def _normalise_set_labels(rs, where) -> None:
    """The set's kernel labels in their normalised form (NFC, no zero-width characters),
    in place; UserError naming both where two collide (:func:`distinct_labels`)."""
    from tflabench.text_safety import distinct_labels

    column = rs.rows["kernel"]
    mapping = distinct_labels((x for x in column.unique() if isinstance(x, str)), f"{where}")
    if any(k != v for k, v in mapping.items()):
        rs.rows["kernel"] = column.map(lambda x: mapping.get(x, x))


def _noisy_lines(noisy: list[tuple[str, float]]) -> list[str]:
    """The spread warning of :func:`_warn_noisy` (its ``(label, spread)`` pairs) as lines for
    the HTML report (none where no case spread more than compare's noise level)."""
    from tflabench.compare.caveats import NOISY_RELATIVE_IQR

    if not noisy:
        return []
    named = _named_cases(noisy, "{:.0%}")
    return [f"{len(noisy)} case(s) spread more than {NOISY_RELATIVE_IQR:.0%} of their median (IQR / median): "
            f"{named}. Their medians are not to be trusted and `tflabench compare` cannot decide on them."]


def backend_table():
    """A rich Table of every backend: name, family, available or why not, parameters."""
    from rich.table import Table

    from tflabench.backends import all_backends

    table = Table(title="backends")
    for col in ("name", "family", "status", "parameters"):
        table.add_column(col, overflow="fold")
    for b in all_backends():
        try:
            params = b.parse_params({})
        except Exception:  # required parameters (e.g. custom's function)
            status = "[cyan]needs parameters[/] (" + ", ".join(
                n for n, f in b.Params.model_fields.items() if f.is_required()) + ")"
        else:
            try:
                reason = b.available(params)
            except Exception as exc:  # availability checks must not end the listing
                reason = f"{type(exc).__name__}: {exc}"
            if reason is None:
                try:
                    found = b.note(params, "cuda")
                except Exception:  # a note must not end the listing either
                    found = None
                status = "[green]available[/]" + (f" ({escape(found)})" if found else "")
            else:
                status = f"[yellow]unavailable[/]: {escape(reason)}"
        table.add_row(b.name, b.family.name, status, ", ".join(b.Params.model_fields))
    return table


@app.command()
def backends() -> None:
    """List every backend, whether it can run here, and why not."""
    with user_errors():
        make_console().print(backend_table())


@app.command()
def doctor() -> None:
    """Check the environment: GPU, driver, CUDA, torch, triton, peers, known-bad combinations."""
    import importlib.util

    from tflabench import environment

    with user_errors():
        con = make_console()
        env = environment.collect()
        con.print(f"python      {env['python']} ({environment.python_executable()})", markup=False)
        con.print(f"tflabench   {env['tflabench']} (git {env['git_revision']})", markup=False)
        con.print(f"torch       {env['torch']} (CUDA build {env['cuda']})", markup=False)
        con.print(f"triton      {env['triton']}", markup=False)
        con.print(f"GPU         {env['gpu_name'] or 'none'} x {env['gpu_count']} (driver {env['driver']})", markup=False)
        try:
            import torch

            if torch.cuda.is_available():
                cap = torch.cuda.get_device_capability()
                con.print(f"torch sees  {torch.cuda.device_count()} GPU(s), compute capability {cap[0]}.{cap[1]}")
            else:
                con.print("torch sees  no GPU")
        except Exception as exc:  # pragma: no cover
            con.print(f"torch CUDA query failed: {exc}", style="red", markup=False)
        con.print("peers:")
        for dist, module in environment.PEERS.items():
            version = env["peers"].get(dist)
            spec = importlib.util.find_spec(module) if "." not in module else None
            where = spec.origin if spec is not None and spec.origin else ("-" if spec is None else "namespace")
            if version or spec is not None:
                con.print(f"  {dist:24s} {version or '(no dist metadata)':12s} import {module}: {where}", markup=False)
            else:
                con.print(f"  {dist:24s} [dim]not installed[/]")
        problems = environment.known_problems(env)
        if problems:
            con.print("[yellow]known problems:[/]")
            for p in problems:
                con.print(f"  - {p}", markup=False)
        else:
            con.print("[green]no known problem[/]")
        from tflabench.run import triton_cache
        from tflabench.backends.status import peer_modes

        con.print(f"triton cache {triton_cache.status()}", markup=False)
        con.print(peer_mode_table(peer_modes(env)))
        con.print(backend_table())


def peer_mode_table(modes):
    """A rich Table of :func:`tflabench.backends.status.peer_modes`: each peer mode, the backend
    that measures it, whether it runs here, why not and what would fix it."""
    from rich.table import Table

    t = Table(title="the peers (the paper's and beyond), mode by mode")
    for col, kw in (("peer", {}), ("backend", {}), ("mode", {}), ("runs", {}),
                    ("why (not)", {"overflow": "fold", "ratio": 3}), ("fix", {"overflow": "fold", "ratio": 3})):
        t.add_column(col, **kw)
    for m in modes:
        runs = "[green]yes[/]" if m.runs else "[red]no[/]" if m.runs is False else "[yellow]?[/]"
        t.add_row(escape(m.peer), m.backend or "-", m.mode, runs, escape(m.why), escape(m.fix))
    return t


@app.command()
def calibrate(
    matmul_n: int = typer.Option(8192, "--matmul-n", help="n of the bf16 n x n x n matmul."),
    copy_gib: float = typer.Option(4.0, "--copy-gib", help="GiB copied device to device."),
    iterations: int = typer.Option(20, "--iterations", help="Timed repetitions (median taken)."),
    save: bool = typer.Option(True, "--save/--no-save", help="Store as this GPU's measured ceilings."),
    hardware: Optional[Path] = typer.Option(None, "--hardware", help="Hardware YAML to write (default: user file)."),
) -> None:
    """Measure this GPU's ceilings (bf16 matmul FLOP/s, device-to-device copy bytes/s) and
    store them for `--ceilings measured`."""
    with user_errors():
        import torch

        from tflabench import hardware as hw
        from tflabench.run.measure import time_callable

        if matmul_n < 256:
            raise UserError(f"--matmul-n={matmul_n}; allowed: >= 256")
        if copy_gib <= 0:
            raise UserError(f"--copy-gib={copy_gib}; allowed: > 0")
        if iterations < 1:
            raise UserError(f"--iterations={iterations}; allowed: >= 1")
        if not torch.cuda.is_available():
            raise UserError("calibrate needs a CUDA GPU (torch sees none)")
        name = torch.cuda.get_device_name()
        key = hw.detect_gpu(name)
        if key is None and save:
            raise UserError(f"GPU {name!r} is not in the catalogue; add it to a hardware YAML "
                            "(--hardware) first, or use --no-save")
        con = make_console()
        n = matmul_n
        gen = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=gen)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=gen)
        ms = time_callable(lambda: torch.mm(a, b), device="cuda", warmup=5, iterations=iterations)
        ms_mm = sorted(ms)[len(ms) // 2]
        flops_per_s = 2 * n**3 / (ms_mm * 1e-3)
        del a, b
        numel = int(copy_gib * 2**30) // 4
        src = torch.empty(numel, device="cuda", dtype=torch.float32).normal_(generator=gen)
        dst = torch.empty_like(src)
        ms = time_callable(lambda: dst.copy_(src), device="cuda", warmup=3, iterations=iterations)
        ms_cp = sorted(ms)[len(ms) // 2]
        bytes_per_s = 2 * src.numel() * src.element_size() / (ms_cp * 1e-3)  # read + write
        con.print(f"{name}: bf16 {n}^3 matmul {ms_mm:.3f} ms -> {flops_per_s / 1e12:.1f} TFLOP/s; "
                  f"{copy_gib:g} GiB copy {ms_cp:.3f} ms -> {bytes_per_s / 1e12:.2f} TB/s (read + write)")
        if save:
            note = (f"tflabench calibrate: bf16 {n}^3 matmul, {copy_gib:g} GiB device copy (read+write), "
                    f"median of {iterations}; torch {torch.__version__}")
            path = hw.save_measured(key, flops_per_s, bytes_per_s, note, path=hardware)
            con.print(f"saved as measured ceilings of {key!r} in {path}")
