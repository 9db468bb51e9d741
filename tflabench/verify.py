"""``tflabench verify``: every kernel of a suite against its float64 reference over a grid
of input regimes, sequence lengths, initial states and dtypes.

The grid (the suite's ``numerics.verify`` section, :class:`tflabench.numerics.VerifySettings`):
per kernel configuration of the suite, every dtype x regime x sequence length x
with/without initial state x mode. A regime (:data:`tflabench.numerics.REGIMES`) redraws
the gate pre-activations (or scales q and k) of the backend's own inputs; how it maps onto
a family's inputs is :data:`FAMILY_PROFILES` (one entry per family: the runner and the
backends never test a family by name). Default lengths per kernel with chunk L:
``L // 2 + 1`` (shorter than one chunk), ``2 L`` (whole chunks), ``2 L + L // 2 + 1``
(a partial last chunk).

Each case runs in the worker processes of ``tflabench run`` (a kernel that aborts is a
``crash`` row; :func:`verify_case` is what the worker calls for a case whose ``verify`` field
is set), at batch 1 and ``verify.heads`` heads: forward (from the initial state when the
case has one, returning the last state where the backend can), and for ``fwdbw`` the
backward of a fixed random output gradient; then :func:`tflabench.numerics.judge` compares
the output, the last state and every input gradient with the float64 reference, each
against its budget (the mLSTM family's df against the scale of its summands,
:func:`tflabench.numerics.reference_scales`). Rows: ``ok`` (every tensor within budget), ``wrong`` (reason: the
deciding tensor, its error, budget and relF; or the non-finite count), ``unavailable``
(the kernel cannot run this length, mode or state here), ``crash`` / ``timeout`` /
``error``. The result set (``results/<suite>-verify/<timestamp>/``) is read by ``report``
and ``compare`` like any other; :func:`write_heatmap` draws kernels x regimes.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import time
from pathlib import Path
from typing import Any, Callable

from tflabench import results as R
from tflabench.errors import UserError
from tflabench.numerics import REGIMES, RegimeSpec, VerifySettings
from tflabench.suite import Case, LoadedSuite, expand_cases, require_device, resolve_device

#: Suffix of a verify result set's suite name (``<suite>-verify``): ``compare`` refuses to
#: match a verify set against a timing set of the same suite.
SUITE_SUFFIX = "-verify"
#: Chunk length used for the default lengths of kernels without a chunk (attention).
DEFAULT_LENGTH_UNIT = 64
#: Statuses that fail ``verify`` (exit status 1).
FAILING = ("wrong", "crash", "timeout", "oom", "error")


# --------------------------------------------------------------------------- families


def _redraw(old, mean: float, std: float, gen, transform=None):
    """A new leaf tensor like ``old`` (shape, dtype, device, requires_grad) with values
    ``transform(N(mean, std))`` drawn in float32 from ``gen``."""
    import torch

    x = torch.randn(tuple(old.shape), generator=gen, device=old.device, dtype=torch.float32) * std + mean
    if transform is not None:
        x = transform(x)
    return x.to(old.dtype).requires_grad_(old.requires_grad)


def _scale(old, factor: float):
    return (old.detach() * factor).requires_grad_(old.requires_grad)


def _apply_mlstm(inputs: dict, spec: RegimeSpec, gen) -> dict:
    out = dict(inputs)
    if spec.f is not None:
        out["f"] = _redraw(inputs["f"], *spec.f, gen)
    if spec.i is not None:
        out["i"] = _redraw(inputs["i"], *spec.i, gen)
    if spec.qk_scale is not None:
        out["q"], out["k"] = _scale(inputs["q"], spec.qk_scale), _scale(inputs["k"], spec.qk_scale)
    return out


def _apply_gla(inputs: dict, spec: RegimeSpec, gen) -> dict:
    import torch.nn.functional as F

    out = dict(inputs)
    if spec.f is not None and "g" in inputs:
        out["g"] = _redraw(inputs["g"], *spec.f, gen, transform=F.logsigmoid)
    if spec.qk_scale is not None:
        out["q"], out["k"] = _scale(inputs["q"], spec.qk_scale), _scale(inputs["k"], spec.qk_scale)
    return out


def _apply_mamba2(inputs: dict, spec: RegimeSpec, gen) -> dict:
    out = dict(inputs)
    if spec.f is not None:  # a large f keeps the state: dt -> -inf, softplus -> 0, decay -> 1
        out["dt"] = _redraw(inputs["dt"], *spec.f, gen, transform=lambda x: -x)
    return out


def _apply_attention(inputs: dict, spec: RegimeSpec, gen) -> dict:
    out = dict(inputs)
    if spec.qk_scale is not None:
        out["q"], out["k"] = _scale(inputs["q"], spec.qk_scale), _scale(inputs["k"], spec.qk_scale)
    return out


@dataclasses.dataclass(frozen=True)
class FamilyProfile:
    """How regimes apply to a family's inputs.

    Attributes:
        fields: the regime fields the family has (``f``, ``i``, ``qk``): a regime that sets
            another field does not apply (no case).
        apply: (inputs, regime, torch.Generator) -> new inputs (leaf tensors, same
            ``requires_grad``).
    """

    fields: frozenset
    apply: Callable[[dict, RegimeSpec, Any], dict]


#: family (``Backend.numerics_family``) -> profile. Families not listed get only the
#: ``standard`` regime (the backend's own inputs).
FAMILY_PROFILES: dict[str, FamilyProfile] = {
    "mlstm": FamilyProfile(frozenset({"f", "i", "qk"}), _apply_mlstm),
    "gla": FamilyProfile(frozenset({"f", "qk"}), _apply_gla),
    "mamba2": FamilyProfile(frozenset({"f"}), _apply_mamba2),
    "attention": FamilyProfile(frozenset({"qk"}), _apply_attention),
}


def regimes_for(family: str, settings: VerifySettings) -> list[str]:
    """The regime names that apply to ``family``: the settings' list (or every known
    regime) whose fields the family has, in order."""
    profile = FAMILY_PROFILES.get(family)
    fields = profile.fields if profile else frozenset()
    names = settings.regimes if settings.regimes is not None else list(REGIMES) + [
        n for n in settings.custom_regimes if n not in REGIMES]
    return [n for n in names if settings.regime(n).fields_set() <= fields]


def default_seq_lens(chunk_size: int | None) -> list[int]:
    """``[L // 2 + 1, 2 L, 2 L + L // 2 + 1]`` for chunk L (:data:`DEFAULT_LENGTH_UNIT`
    without one): shorter than a chunk, whole chunks, a partial last chunk."""
    L = chunk_size or DEFAULT_LENGTH_UNIT
    return [L // 2 + 1, 2 * L, 2 * L + L // 2 + 1]


def takes_state(backend) -> bool:
    """True when the backend overrides ``forward_state`` (it takes an initial state and
    returns the last one)."""
    from tflabench.backends.base import Backend

    return type(backend).forward_state is not Backend.forward_state


# --------------------------------------------------------------------------- the grid


def verify_suite_name(name: str) -> str:
    """The suite name of a verify result set: ``<suite>-verify``."""
    return name + SUITE_SUFFIX


def verify_cases(
    loaded: LoadedSuite,
    *,
    device: str | None = None,
    only: list[str] | None = None,
    settings: VerifySettings | None = None,
) -> list[Case]:
    """The verify grid of a suite, in run order (kernels as in the suite, then dtype,
    regime, length, initial state, mode). A kernel whose ``fwdbw`` is refused here
    (``Backend.unsupported_mode``, e.g. FLA's gated backward on Hopper with triton 3.6)
    is checked in ``fwd`` instead when the settings ask for ``fwdbw`` only.

    Args:
        device: ``cpu`` / ``cuda`` (default: the suite's, ``auto`` resolved).
        only: glob patterns on kernel label or backend (``tflabench run --only``).
        settings: overrides the suite's ``numerics.verify``.

    Raises UserError for a pattern that matches no kernel, or an empty grid.
    """
    from tflabench.backends import get_backend
    from tflabench.runner import select_kernels

    suite = loaded.suite
    settings = settings or suite.numerics.verify
    device = device or resolve_device(suite.device)
    base = select_kernels(expand_cases(loaded, device=device), only)
    configs: dict[tuple, tuple[Case, set]] = {}
    for c in base:
        key = (c.kernel, c.backend, c.params, c.embedding_dim)
        configs.setdefault(key, (c, set()))[1].add(c.dtype)
    cases: list[Case] = []
    name = verify_suite_name(suite.name)
    for c, suite_dtypes in configs.values():
        backend = get_backend(c.backend)
        params = backend.parse_params(json.loads(c.params))
        family = backend.numerics_family(params)
        dtypes = settings.dtypes or sorted(suite_dtypes)
        states = [s for s in settings.initial_state if not s or takes_state(backend)] or [False]
        modes = [m for m in settings.modes if m in backend.modes]
        if "fwdbw" in modes and "fwd" not in modes and backend.unsupported_mode(params, "fwdbw") is not None:
            modes = ["fwd"]  # the backward is refused here: check the forward (output, last state)
        for dtype in dtypes:
            for regime in regimes_for(family, settings):
                spec = settings.regime(regime)
                for S in settings.seq_lens or default_seq_lens(c.chunk_size):
                    for init in states:
                        verify = json.dumps({"name": regime + ("+init" if init else ""), "regime": regime,
                                             "spec": spec.model_dump(mode="json"), "initial_state": init,
                                             "family": family}, sort_keys=True)
                        for mode in modes:
                            cases.append(dataclasses.replace(
                                c, suite=name, dtype=dtype, mode=mode, batch=1, seq_len=S,
                                heads=min(c.heads, settings.heads), verify=verify,
                                warmup=0, iterations=1, check_numerics=True))
    if not cases:
        raise UserError(f"{loaded.path}: the verify grid is empty (no kernel, regime, length or mode left)")
    return cases


# --------------------------------------------------------------------------- one case


def _float64_copy(value):
    import torch

    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to(torch.float64).requires_grad_(value.requires_grad)
    return value


def verify_case(case: Case) -> dict:
    """Run one verify case in this process (the worker calls it for a case with
    ``verify`` set); returns the outcome columns: ``status`` (``ok``, ``wrong``,
    ``unavailable``), ``reason``, the numerics columns of
    :meth:`tflabench.numerics.Verdict.columns`, ``numerics_ref``, ``tf32``.

    Inputs: the backend's own (``make_inputs`` at batch 1, the case's heads and S, seed
    ``case.seed``), then the regime (:data:`FAMILY_PROFILES`), then an initial state
    (``Backend.initial_state``) for ``+init`` cases. Kernel exceptions propagate (the
    worker records ``error`` / ``oom``); a ValueError from ``make_inputs`` (a length the
    kernel does not take) makes the row ``unavailable``.
    """
    import torch

    from tflabench.backends import get_backend
    from tflabench.backends.base import Shape
    from tflabench.measure import torch_dtype
    from tflabench.numerics import judge, reference_scales, tf32_text

    spec_all = json.loads(case.verify)
    spec = RegimeSpec.model_validate(spec_all["spec"])
    backend = get_backend(case.backend)
    params = backend.parse_params(json.loads(case.params))
    if case.device.startswith("cuda") and not torch.cuda.is_available():
        return {"status": "unavailable", "reason": "no CUDA device visible to torch"}
    reason = backend.available(params) or backend.unsupported_mode(params, case.mode)
    if reason is not None:
        return {"status": "unavailable", "reason": reason}
    dtype, device = torch_dtype(case.dtype), case.device
    grad = case.mode == "fwdbw"
    shape = Shape(case.batch, case.seq_len, case.heads, case.d_qk, case.d_hv, case.dtype)
    try:
        inputs = backend.make_inputs(params, shape, dtype, device, case.seed, requires_grad=grad)
    except ValueError as exc:
        return {"status": "unavailable", "reason": f"the kernel does not take this case: {exc}"}
    gen = torch.Generator(device=device).manual_seed(case.seed + 11)
    profile = FAMILY_PROFILES.get(spec_all["family"])
    if profile is not None:
        inputs = profile.apply(inputs, spec, gen)
    state = None
    if spec_all["initial_state"]:
        state = backend.initial_state(params, inputs, case.seed + 13, requires_grad=grad)
        if state is None:
            return {"status": "unavailable", "reason": f"{backend.name} takes no initial state"}
    with_state = takes_state(backend)
    tf32 = backend.uses_tf32(params, dtype, device)
    where = (f"{backend.numerics_family(params)} float64 reference, regime {spec_all['regime']}"
             f"{' with initial state' if state else ''}, B={case.batch} NH={case.heads} S={case.seq_len}")
    ref_inputs = {k: _float64_copy(v) for k, v in inputs.items()}
    ref_state = {k: _float64_copy(v) for k, v in state.items()} if state else None
    if with_state:
        out, last = backend.forward_state(params, inputs, state)
        try:
            ref, ref_last = backend.reference_state(params, ref_inputs, ref_state)
        except NotImplementedError as exc:
            return {"status": "unavailable", "reason": f"no float64 reference: {exc}"}
    else:
        out, last, ref_last = backend.forward(params, inputs), {}, {}
        try:
            ref = backend.reference(params, ref_inputs)
        except NotImplementedError as exc:
            return {"status": "unavailable", "reason": f"no float64 reference: {exc}"}
    base = {"numerics_ref": where, "tf32": tf32_text(case.dtype, tf32)}
    if tuple(out.shape) != tuple(ref.shape):
        return {**base, "status": "wrong",
                "reason": f"numerics: output shape {tuple(out.shape)} != reference {tuple(ref.shape)}"}
    pairs = {"out": (out, ref)}
    pairs.update({k: (last[k], ref_last[k]) for k in ref_last if k in last})
    if grad:
        g = torch.randn(tuple(ref.shape), generator=torch.Generator(device=device).manual_seed(case.seed + 2),
                        dtype=torch.float64, device=device)
        out.backward(g.to(out.dtype))
        ref.backward(g)
        leaves = [(k, v, ref_inputs[k]) for k, v in inputs.items()]
        leaves += [(k, v, ref_state[k]) for k, v in (state or {}).items()]
        for key, value, ref_value in leaves:
            if isinstance(value, torch.Tensor) and value.requires_grad:
                if value.grad is None:
                    return {**base, "status": "wrong", "reason": f"numerics: no gradient for input {key!r}"}
                pairs[f"d{key}"] = (value.grad, ref_value.grad)
    budgets = json.loads(case.numerics_budgets) if case.numerics_budgets else None
    scales = reference_scales(spec_all["family"], ref_inputs, pairs)
    if scales:
        base["numerics_ref"] += "; " + ", ".join(f"{t} vs {s.label}" for t, s in scales.items())
    verdict = judge(pairs, dtype=case.dtype, tf32=tf32, overrides=budgets, tolerance=case.tolerance,
                    scales=scales)
    return {**base, **verdict.columns(), "status": "ok" if verdict.passed else "wrong",
            "reason": verdict.reason()}


# --------------------------------------------------------------------------- the run


@dataclasses.dataclass
class VerifyResult:
    """What ``verify`` produced: the result-set directory, the rows (completion order),
    wall seconds, the heat-map path (None when not drawn)."""

    directory: Path
    rows: list[dict]
    wall_s: float
    heatmap: Path | None = None

    def exit_status(self) -> int:
        """1 when any case failed (``wrong``, ``crash``, ``timeout``, ``oom``, ``error``), else 0."""
        return int(any(r.get("status") in FAILING for r in self.rows))


def run_verify(
    loaded: LoadedSuite,
    cases: list[Case],
    *,
    out_root: str | Path = "results",
    gpus: list[str] | None = None,
    device: str | None = None,
    console=None,
    progress: bool = True,
    plots: bool = True,
    max_kernel_failures: int = 2,
) -> VerifyResult:
    """Run verify ``cases`` (:func:`verify_cases`) in worker processes with a progress
    bar; write the result set ``<out_root>/<suite>-verify/<timestamp>/`` (rows as they
    complete, table, metadata with the budgets) and the heat map. ``max_kernel_failures``:
    as :func:`tflabench.runner.run_cases` (a kernel that aborts twice in a row, e.g. while
    compiling, is not started again for each of its remaining cases).

    The result set is locked while verify writes it (:class:`tflabench.results.ResultSetLock`,
    as ``run``): a second writer of the same directory is refused.

    Raises UserError for a CUDA suite without a GPU, or a result set another run holds.
    """
    suite = loaded.suite
    dev = device or resolve_device(suite.device)
    require_device(suite.name, dev, "verify the CPU default (`tflabench verify`) or pass --device cpu")
    name = verify_suite_name(suite.name)
    directory = R.new_result_directory(out_root, name)
    lock = R.ResultSetLock(directory).acquire()   # as `run`: one writer per result set
    try:
        return _run_verify_locked(loaded, cases, directory, name, dev=dev, gpus=gpus, console=console,
                                  progress=progress, plots=plots, max_kernel_failures=max_kernel_failures,
                                  note=lock.note)
    finally:
        lock.release()


def _run_verify_locked(loaded: LoadedSuite, cases: list[Case], directory: Path, name: str, *, dev: str,
                       gpus: list[str] | None, console, progress: bool, plots: bool,
                       max_kernel_failures: int, note: str | None = None) -> VerifyResult:
    """:func:`run_verify` once its result set is locked: metadata, the cases, the heat map."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tflabench import environment
    from tflabench.numerics import BUDGET_REASONS, DEFAULT_BUDGETS
    from tflabench.runner import run_cases

    suite = loaded.suite
    metadata = {
        "suite": name, "suite_path": str(loaded.path), "suite_sha256": loaded.sha256,
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        **environment.collect(), "shard": None, "ceilings": None, "device": dev, "gpus": gpus,
        "kind": "verify",
        "budgets": {k: v.model_dump() for k, v in DEFAULT_BUDGETS.items()},
        "budget_overrides": {k: v.model_dump(exclude_none=True) for k, v in suite.numerics.budgets.items()},
        "budget_reasons": BUDGET_REASONS,
    }
    R.write_metadata(directory, metadata)
    console = console or Console(stderr=True)
    if note:
        console.print(f"[yellow]note:[/] {note}")
    console.print(f"writing to {directory} ({len(cases)} verify cases)")
    t0 = time.perf_counter()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=not progress, transient=False) as bar:
        task = bar.add_task(name, total=len(cases))
        try:
            rows = run_cases(cases, directory, gpus=gpus,
                             on_start=lambda slot, c: bar.update(
                                 task, description=f"[{slot}] {c.kernel} {c.numerics_case} S={c.seq_len} {c.mode}"),
                             on_done=lambda row: bar.advance(task), max_kernel_failures=max_kernel_failures)
        finally:
            if (directory / R.ROWS_FILE).exists():
                R.finalize(directory)
    wall = time.perf_counter() - t0
    heatmap = None
    if plots and rows:
        try:
            from tflabench.plots.numerics import write_heatmap

            heatmap = write_heatmap(R.load_results(directory).rows, directory / "plots" / "verify_heatmap.png",
                                    title=f"{name}: worst max-normalised error per kernel and regime")
        except Exception as exc:  # a plot problem must not lose the verdicts
            console.print(f"[yellow]warning:[/] heat map not written ({type(exc).__name__}: {exc})")
    return VerifyResult(directory=directory, rows=rows, wall_s=wall, heatmap=heatmap)


# --------------------------------------------------------------------------- summaries


def cell_summary(frame):
    """One row per (kernel, dtype, regime): the case that decides (failing first, then the
    largest error / budget), with ``cases``, ``failed`` counts and ``where`` (S, state,
    mode of that case). Input: a result-set DataFrame of verify rows."""
    import math

    import pandas as pd

    rows = []
    frame = frame[frame["numerics_case"].notna()].copy()
    frame["regime"] = frame["numerics_case"].str.replace("+init", "", regex=False)
    for (kernel, dtype, regime), group in frame.groupby(["kernel", "dtype", "regime"], sort=False):
        def rank(r):
            failing = r["status"] in FAILING
            err, bud = r.get("numerics_err"), r.get("numerics_budget")
            ratio = (err / bud) if isinstance(err, float) and isinstance(bud, float) and bud and not math.isnan(err) else -1.0
            nonfinite = (r.get("numerics_nonfinite") or 0) > 0
            return (failing, nonfinite, ratio)

        records = group.to_dict("records")
        ran = [r for r in records if r["status"] != "unavailable"]
        pick = max(ran or records, key=rank)
        rows.append({
            "kernel": kernel, "dtype": dtype, "regime": regime, "status": pick["status"],
            "cases": len(ran), "failed": sum(r["status"] in FAILING for r in ran),
            "numerics_err": pick.get("numerics_err"), "numerics_worst": pick.get("numerics_worst"),
            "numerics_budget": pick.get("numerics_budget"), "numerics_nonfinite": pick.get("numerics_nonfinite"),
            "where": f"S={int(pick['seq_len'])} {'init ' if '+init' in (pick['numerics_case'] or '') else ''}{pick['mode']}",
            "reason": pick.get("reason"),
        })
    return pd.DataFrame(rows)


def verify_table(frame, title: str | None = None):
    """A rich Table of :func:`cell_summary`: kernel, dtype, regime, status, failed / cases,
    the deciding tensor, its error and budget, where, reason."""
    import math

    from rich.table import Table

    summary = cell_summary(frame)
    table = Table(title=title)
    for col, kw in (("kernel", {}), ("dtype", {}), ("regime", {}), ("status", {}),
                    ("failed", {"justify": "right"}), ("tensor", {}), ("err", {"justify": "right"}),
                    ("budget", {"justify": "right"}), ("where", {}),
                    ("reason", {"overflow": "fold", "max_width": 70})):
        table.add_column(col, **kw)
    colour = {"ok": "green", "wrong": "red", "crash": "red", "error": "red", "timeout": "yellow",
              "oom": "yellow", "unavailable": "dim"}

    def fmt(x):
        if x is None or (isinstance(x, float) and math.isnan(x)):
            return ""
        return f"{x:.1e}"

    for r in summary.to_dict("records"):
        nonfinite = r.get("numerics_nonfinite")
        err = "NaN/inf" if nonfinite and not (isinstance(nonfinite, float) and math.isnan(nonfinite)) else fmt(r["numerics_err"])
        table.add_row(r["kernel"], r["dtype"], r["regime"], f"[{colour.get(r['status'], 'white')}]{r['status']}[/]",
                      f"{r['failed']}/{r['cases']}", r["numerics_worst"] if isinstance(r.get("numerics_worst"), str) else "", err,
                      fmt(r["numerics_budget"]), r["where"],
                      "" if r["status"] == "ok" else str(r.get("reason") or "")[:200])
    return table


__all__ = ["FAMILY_PROFILES", "FamilyProfile", "regimes_for", "default_seq_lens", "verify_cases",
           "verify_case", "run_verify", "VerifyResult", "cell_summary", "verify_table", "takes_state"]
