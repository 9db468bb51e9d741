"""Command: verify (the numerics grid of :mod:`tflabench.run.verify_run`).

Thin: parse, build the grid (:func:`tflabench.run.verify_run.verify_cases`), run it
(:func:`tflabench.run.verify_run.run_verify`), render :func:`tflabench.report.tables.verify_table` and
the heat map (:func:`tflabench.report.plots.numerics.write_heatmap`).
Exit status as ``compare``: 1 when any case fails its budget (or crashes / errors), 0 when
all pass, 2 for bad input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tflabench.cli import app, comma_list, interruptible, plots_option, user_errors
from tflabench.errors import UserError


def _verify_interrupted_line(stop: KeyboardInterrupt) -> str:
    """What an interrupted ``verify`` leaves (the result set named on the exception, if any)."""
    directory = getattr(stop, "directory", None)
    return (f"interrupted: the verdicts so far are in {directory or 'the result set named above'}; "
            f"`tflabench report {directory or 'DIR'}` shows them")


#: The suite ``tflabench verify`` runs without arguments (CPU, CI time).
DEFAULT_VERIFY_SUITE = Path(__file__).resolve().parents[2] / "suites" / "verify_cpu.yaml"


def _kernel_suite(backend: str, params_text: str | None, dtype: str | None, device: str | None):
    """An in-memory suite of one kernel (``--kernel``): LoadedSuite named ``verify-<backend>``."""
    import json

    import yaml
    from pydantic import ValidationError

    from tflabench.store.suite import LoadedSuite, Suite, expand_cases, _format_validation

    try:
        params = json.loads(params_text) if params_text else {}
    except json.JSONDecodeError as exc:
        raise UserError(f"--params: not JSON ({exc.msg}); e.g. --params '{{\"variant\": \"sig\"}}'") from None
    if not isinstance(params, dict):
        raise UserError("--params: a JSON object, e.g. '{\"variant\": \"sig\", \"chunk_size\": 16}'")
    data = {"name": f"verify-{backend}", "device": device or "auto", "dtype": dtype or "float32",
            "sweep": {"batch": 1, "seq_len": 64}, "kernels": [{"backend": backend, "params": params}]}
    try:
        suite = Suite.model_validate(data)
    except ValidationError as exc:
        raise UserError(f"--kernel: {_format_validation(exc, Suite)}") from None
    text = yaml.safe_dump(data).encode()
    import hashlib

    loaded = LoadedSuite(suite=suite, path=Path(f"<--kernel {backend}>"), sha256=hashlib.sha256(text).hexdigest())
    try:
        expand_cases(loaded, device="cpu")  # validates backend and params
    except UserError as exc:
        raise UserError(f"--kernel {backend} --params: {str(exc).split(': ', 1)[-1]}") from None
    return loaded


def _parse_bool_list(values: list[str] | None) -> list[bool] | None:
    if not values:
        return None
    out = []
    for v in values:
        if v.lower() in ("yes", "true", "1", "with"):
            out.append(True)
        elif v.lower() in ("no", "false", "0", "without"):
            out.append(False)
        else:
            raise UserError(f"--initial-state={v!r}; allowed: yes, no")
    return out


@app.command()
def verify(
    suite: Optional[Path] = typer.Argument(
        None, help="Suite YAML (default: suites/verify_cpu.yaml: our Triton kernels in the interpreter, CPU)."),
    kernel: Optional[str] = typer.Option(None, "--kernel", help="Verify one backend without a suite (e.g. tfla)."),
    params: Optional[str] = typer.Option(None, "--params", help="With --kernel: its parameters as JSON."),
    only: Optional[list[str]] = typer.Option(
        None, "--only", help="Only kernels whose label or backend matches one of these globs, comma-separated."),
    regime: Optional[list[str]] = typer.Option(None, "--regime", help="Only these regimes, comma-separated."),
    seq_len: Optional[list[str]] = typer.Option(None, "--seq-len", "-T", help="These lengths instead, comma-separated."),
    dtype: Optional[list[str]] = typer.Option(None, "--dtype", help="These dtypes instead, comma-separated."),
    mode: Optional[list[str]] = typer.Option(None, "--mode", help="fwd, fwdbw or both, comma-separated."),
    initial_state: Optional[list[str]] = typer.Option(
        None, "--initial-state", help="yes, no or both, comma-separated (kernels without states: no)."),
    heads: Optional[int] = typer.Option(None, "--heads", help="Heads per case (default: the suite's verify.heads)."),
    out: Path = typer.Option(Path("results"), "--out", help="Root of the result set: OUT/<suite>-verify/<timestamp>/."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="One worker per GPU: 'all' or indices like 0,1."),
    max_kernel_failures: int = typer.Option(
        2, "--max-kernel-failures", min=0, help="After this many consecutive crash/timeout cases of one "
        "kernel, record its remaining cases as not run (0: run every case)."),
    device: Optional[str] = typer.Option(None, "--device", help="Override the suite's device: cpu or cuda."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show the progress bar."),
    plots: bool = plots_option("Draw the heat map."),
) -> None:
    """Check every kernel of a suite against its float64 reference over gate regimes,
    lengths, initial states and dtypes (budgets per tensor: docs/numerics.md).

    Exit status: 1 when any case fails its budget, 0 when all pass, 2 for bad input.
    """
    from tflabench.run import verify_run as V
    from tflabench.store.suite import load_suite
    from tflabench.run.pool import parse_gpus

    with user_errors():
        _check_verify_options(device=device, params=params, kernel=kernel, suite=suite)
        only = comma_list("--only", only)
        regime = comma_list("--regime", regime)
        dtype = comma_list("--dtype", dtype)
        mode = comma_list("--mode", mode, allowed=("fwd", "fwdbw"))
        initial_state = comma_list("--initial-state", initial_state)
        seq_len = _parse_seq_lens(seq_len)
        if kernel is not None:
            loaded = _kernel_suite(kernel, params, dtype[0] if dtype and len(dtype) == 1 else None, device)
        else:
            loaded = load_suite(suite if suite is not None else DEFAULT_VERIFY_SUITE)
        settings = _verify_settings(loaded.suite.numerics.verify, {
            "regimes": regime or None, "seq_lens": seq_len or None, "dtypes": dtype or None, "modes": mode or None,
            "initial_state": _parse_bool_list(initial_state), "heads": heads})
        gpu_list = parse_gpus(gpus)
        cases = V.verify_cases(loaded, device=device, only=only, settings=settings)
        with interruptible(_verify_interrupted_line):
            result = V.run_verify(loaded, cases, out_root=out, gpus=gpu_list, device=device,
                                  progress=progress, max_kernel_failures=max_kernel_failures)
    raise typer.Exit(_print_verify_result(V.verify_suite_name(loaded.suite.name), result, plots))


def _check_verify_options(*, device: str | None, params: str | None, kernel: str | None, suite: Path | None) -> None:
    """UserError for an unknown --device, --params without --kernel, or both a SUITE and --kernel."""
    if device not in (None, "cpu", "cuda"):
        raise UserError(f"--device={device!r}; allowed: cpu, cuda")
    if params is not None and kernel is None:
        raise UserError("--params needs --kernel")
    if kernel is not None and suite is not None:
        raise UserError("give a SUITE or --kernel, not both")


def _parse_seq_lens(values: list[str] | None) -> list[int] | None:
    """``--seq-len``: the lengths as whole numbers (None where not given); UserError otherwise."""
    if values is None:
        return None
    try:
        return [int(x) for x in comma_list("--seq-len", values)]
    except ValueError:
        raise UserError(f"--seq-len={values!r}: give whole numbers separated by commas, e.g. 64,161") from None


def _verify_settings(settings, update: dict):
    """The suite's verify settings with the options given (the ``update`` values that are not
    None), validated again; UserError naming the field that is not valid."""
    update = {k: v for k, v in update.items() if v is not None}
    if not update:
        return settings
    from pydantic import ValidationError

    from tflabench.numerics import VerifySettings

    try:
        return VerifySettings.model_validate({**settings.model_dump(), **update})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
        raise UserError(f"verify options: {where + ': ' if where else ''}"
                        f"{err['msg'].removeprefix('Value error, ')}") from None


def _print_verify_result(name: str, result, plots: bool) -> int:
    """Print a verify run's table, status counts, result set and heat map (drawn with
    ``plots``) and its verdict; returns its exit status (1: some case failed or did not run)."""
    from collections import Counter

    from tflabench.console import make_console
    from tflabench.store.results import load_results
    from tflabench.report.tables import verify_table

    frame = load_results(result.directory).rows
    heatmap = _write_heatmap(frame, result.directory) if plots and result.rows else None
    con = make_console()
    con.print(verify_table(frame, title=f"{name}: {len(frame)} cases"))
    counts = Counter(r["status"] for r in result.rows)
    con.print(f"{len(result.rows)} cases in {result.wall_s:.1f} s: "
              + ", ".join(f"{n} {s}" for s, n in counts.most_common()))
    con.print(f"results: {result.directory}")
    if heatmap is not None:
        con.print(f"plot: {heatmap}")
    status = result.exit_status()
    con.print("FAIL: some cases exceed their budgets or did not run (exit 1)" if status
              else "pass: every case within its budgets")
    return status


def _write_heatmap(frame, directory: Path) -> Path | None:
    """The verify heat map of a result set (``plots/verify_heatmap.png``); a problem drawing
    it is a warning on stderr (the verdicts are on disk already)."""
    from tflabench.console import make_console

    try:
        from tflabench.report.plots.numerics import heatmap_title, write_heatmap
        from tflabench.store.results import load_results

        return write_heatmap(frame, directory / "plots" / "verify_heatmap.png",
                             title=heatmap_title(load_results(directory).metadata))
    except Exception as exc:  # a plot problem must not lose the verdicts
        make_console(stderr=True).print(f"[yellow]warning:[/] heat map not written ({type(exc).__name__}: {exc})")
        return None
