"""Measuring one case: first-call time, numerics gate, timings, peak memory.

:func:`time_callable` is the one timing function of the project (``calibrate`` uses it
too). Method (paper App. E.3; ``docs/harness.md``):

1. **First call** (compile / autotune) timed apart with ``time.perf_counter`` around the
   call and a device synchronise: ``first_call_s``. It never enters the timings.
2. **Numerics gate** (:func:`numerics_gate`): at a reduced shape (batch 1, <= 2 heads,
   S <= ``max_seq_len``), the output, and in ``fwdbw`` the gradient of every input with
   ``requires_grad`` (for a fixed random output gradient), are compared with the backend's
   float64 reference on float64 copies of the same inputs; the error is max-normalised,
   ``max|x - x_ref| / max|x_ref|``, worst over output and gradients. Above the tolerance
   the case is ``wrong`` and is not timed.
3. **Peak memory** (CUDA): one call after ``torch.cuda.reset_peak_memory_stats()``;
   ``max_memory_allocated()`` minus what was allocated before the call (inputs and the
   output gradient included in that base), i.e. the peak above the inputs.
4. **Timings**: ``warmup`` untimed calls (and, with ``warmup_s``, more until that many
   seconds have passed: a short kernel then meets the clock a long one runs at under the
   GPU's power cap), then ``iterations`` calls each between two CUDA
   events (CPU: ``time.perf_counter`` around each call); optionally a 256 MiB buffer is
   overwritten before each timed call to flush L2, and optionally (``sync_each``) the device
   is synchronised before each timed call (per-call latency, CPU launch overhead
   included; default: back-to-back calls, GPU time). ``fwdbw`` times forward plus
   ``backward`` of a fixed output gradient; gradients are set to None before each call,
   outside the timed region. Statistics: median, mean, min, max, quartiles (linear
   interpolation, numpy's default) and every sample.
5. **Kernel profile** (``run --profile``, after the timings, never inside them): a few
   calls under ``torch.profiler`` (:func:`tflabench.run.kernel_profile.capture`): the time of
   each kernel launched (CUDA) or operator run (CPU), per pass.

A CUDA row also records the GPU it ran on (:func:`gpu_columns`), and with ``run --gpu-trace``
its clock, power and slowdown reasons over the warm-up and timed calls
(:mod:`tflabench.run.gpu_trace`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import statistics
import time
from typing import Any, Callable

from tflabench.backends import get_backend
from tflabench.backends.base import Backend, BackendParams, Shape
from tflabench.store.conditions import CPU_TIMERS, cpu_timer  # noqa: F401  (CPU_TIMERS: the timers' names)
from tflabench.run.gpu_trace import GpuTrace
from tflabench.run.kernel_profile import plan_breakdown
from tflabench.numerics import budget as budget_of
from tflabench.numerics import judge, reference_scales, tensor_error, tf32_text

#: Bytes overwritten before each timed call when flushing L2 (larger than any current L2).
L2_FLUSH_BYTES = 256 * 1024 * 1024


def torch_dtype(name: str):
    """torch dtype from a suite dtype name (``bfloat16``, ``float16``, ``float32``, ``float64``)."""
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16,
            "float32": torch.float32, "float64": torch.float64}[name]


def synchronize(device: str) -> None:
    """Wait for the device's queued work (no-op on the CPU)."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def summarize(samples_ms: list[float]) -> dict:
    """The timing columns from per-iteration milliseconds: ``ms_median``, ``ms_mean``,
    ``ms_min``, ``ms_max``, ``ms_q25``, ``ms_q75`` (quartiles by linear interpolation between
    order statistics, as numpy.percentile), ``ms_samples`` (the list), ``n_iter``."""
    import numpy as np

    arr = np.asarray(samples_ms, dtype=float)
    q25, q50, q75 = np.percentile(arr, [25, 50, 75])
    return {
        "ms_median": float(q50),
        "ms_mean": float(arr.mean()),
        "ms_min": float(arr.min()),
        "ms_max": float(arr.max()),
        "ms_q25": float(q25),
        "ms_q75": float(q75),
        "ms_samples": [float(x) for x in arr],
        "n_iter": int(arr.size),
    }


def time_callable(
    fn: Callable[[], Any],
    *,
    device: str,
    warmup: int,
    iterations: int,
    flush_l2: bool = False,
    before_each: Callable[[], Any] | None = None,
    sync_each: bool = False,
    warmup_s: float = 0.0,
    cuda_graph: bool = False,
) -> list[float]:
    """Per-iteration runtimes of ``fn`` in milliseconds: the one timing function.

    Args:
        fn: the work to time (its result is dropped each iteration).
        device: ``"cuda..."``: CUDA events around each call, one synchronise at the end;
            otherwise the CPU timer of :func:`cpu_timer` for torch's thread count around
            each call (``time.process_time`` with one thread, else ``time.perf_counter``).
        warmup: untimed calls first (then a synchronise).
        iterations: timed calls (>= 1).
        flush_l2: overwrite a :data:`L2_FLUSH_BYTES` buffer before each timed call (CUDA).
        before_each: untimed callback before each call (e.g. set gradients to None).
        sync_each: (CUDA) synchronise before each timed call, so that each call starts on an
            idle GPU and the CPU time to launch its kernels falls between the events
            (per-call latency). Default False: calls are queued back to back and the CPU
            may run ahead, so the events time the GPU's work (as triton.testing.do_bench).
        warmup_s: after the ``warmup`` calls, untimed calls (each synchronised) until this
            many seconds of wall time have passed; 0: none.
        cuda_graph: (CUDA) after the warm-ups, capture one call as a CUDA graph
            (:func:`graph_replay`) and time its replays: the GPU's work with no host time
            between its kernels (docs/harness.md, "Timing method"). ``before_each`` then
            runs only before the capture (a replay writes the captured outputs again).

    Returns:
        ``iterations`` floats, milliseconds.

    Raises:
        ValueError: iterations < 1, or ``cuda_graph`` on a device other than CUDA.
        GraphCaptureError: ``cuda_graph`` and the call cannot be captured.
    """
    if iterations < 1:
        raise ValueError(f"iterations: got {iterations}; allowed: >= 1")
    if cuda_graph and not device.startswith("cuda"):
        raise ValueError(f"cuda_graph: CUDA graphs need a CUDA device; got device {device!r}")
    collecting = gc.isenabled()
    gc.disable()  # as timeit: a garbage collection must not land inside a timed call
    try:
        return _time_calls(fn, device=device, warmup=warmup, iterations=iterations, flush_l2=flush_l2,
                           before_each=before_each, sync_each=sync_each, warmup_s=warmup_s,
                           cuda_graph=cuda_graph)
    finally:
        if collecting:
            gc.enable()


def _time_calls(fn, *, device, warmup, iterations, flush_l2, before_each, sync_each,
                warmup_s=0.0, cuda_graph=False) -> list[float]:
    """:func:`time_callable`'s loop (garbage collection already off)."""
    for _ in range(warmup):
        if before_each is not None:
            before_each()
        fn()
    synchronize(device)
    until = time.perf_counter() + warmup_s
    while warmup_s > 0 and time.perf_counter() < until:
        if before_each is not None:
            before_each()
        fn()
        synchronize(device)
    if device.startswith("cuda"):
        import torch

        if cuda_graph:
            fn = graph_replay(fn, before_each)
            before_each = None
        flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device) if flush_l2 else None
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
        for n in range(iterations):
            if before_each is not None:
                before_each()
            if flush is not None:
                flush.zero_()
            if sync_each:
                torch.cuda.synchronize()
            starts[n].record()
            fn()
            ends[n].record()
        torch.cuda.synchronize()
        return [float(s.elapsed_time(e)) for s, e in zip(starts, ends)]
    import torch

    clock = getattr(time, cpu_timer(torch.get_num_threads()))
    samples = []
    for _ in range(iterations):
        if before_each is not None:
            before_each()
        t0 = clock()
        fn()
        samples.append((clock() - t0) * 1e3)
    return samples


#: untimed calls on a side stream before a capture (:func:`graph_replay`)
GRAPH_WARMUP = 3


class GraphCaptureError(RuntimeError):
    """A call that cannot be captured as a CUDA graph (``timing.cuda_graph``)."""


def graph_replay(fn: Callable[[], Any], before_each: Callable[[], Any] | None = None) -> Callable[[], None]:
    """``fn`` captured once as a CUDA graph; returns the graph's ``replay``.

    As PyTorch's CUDA-graph notes ask, :data:`GRAPH_WARMUP` calls run first on a side
    stream (so that lazy initialisation, autotuning and cuBLAS workspaces happen outside the
    capture); then ``before_each`` and one call under ``torch.cuda.graph``. A replay runs the
    captured kernels on the same buffers: the outputs and gradients the capture allocated are
    written again, the host launches one graph instead of each kernel.

    Raises:
        GraphCaptureError: the call could not be captured (it synchronises with the host,
            reads a GPU value on the host, or uses an operation a graph cannot hold); the
            message names the error and says to time the kernel without ``cuda_graph``.
    """
    import torch

    def call():
        if before_each is not None:
            before_each()
        fn()

    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(GRAPH_WARMUP):
                call()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if before_each is not None:
            before_each()
        with torch.cuda.graph(graph):
            fn()
    except Exception as exc:  # noqa: BLE001 - every capture failure becomes this one error
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise GraphCaptureError(f"the call cannot be captured as a CUDA graph ({type(exc).__name__}: "
                                f"{first}); time this kernel without timing.cuda_graph") from exc
    return graph.replay


#: calls whose host time :func:`host_ms_per_call` takes the median of
HOST_CALLS = 7
#: a case is host-bound where its host time per call is at least this share of its GPU time
#: (``report`` marks it; docs/harness.md "Host time")
HOST_BOUND_SHARE = 0.8


def host_ms_per_call(fn: Callable[[], Any], before_each: Callable[[], Any] | None = None,
                     calls: int = HOST_CALLS) -> float:
    """The host's time to issue one call of ``fn`` on a CUDA device, in milliseconds: the
    median over ``calls`` calls of the wall time from the call's start until it returns,
    each started on an idle GPU (a synchronise before it, so that a full launch queue never
    blocks the host). This is the CPU time a training step pays for the call's launches and
    Python around them; where it reaches the GPU time, the host sets the speed of a step
    that has no other work to overlap it (docs/harness.md "Host time").

    Raises:
        ValueError: ``calls`` < 1.
    """
    import torch

    if calls < 1:
        raise ValueError(f"calls: got {calls}; allowed: >= 1")
    samples = []
    for _ in range(calls):
        if before_each is not None:
            before_each()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return float(statistics.median(samples))


def host_bound_cases(rows) -> list[tuple[str, float]]:
    """The ``ok`` rows whose host time per call (``host_ms``) is at least
    :data:`HOST_BOUND_SHARE` of their GPU median (``ms_median``), as (case label, host / GPU),
    largest share first; [] for rows without ``host_ms`` (CPU rows, older sets). ``rows``: a
    DataFrame of result rows (docs/harness.md "Host time")."""
    from tflabench.text_safety import case_label

    if "host_ms" not in getattr(rows, "columns", ()):
        return []
    found = []
    for r in rows.to_dict("records"):
        host, gpu = r.get("host_ms"), r.get("ms_median")
        if r.get("status") != "ok" or not isinstance(host, (int, float)) or not isinstance(gpu, (int, float)):
            continue
        if gpu > 0 and host == host and host >= HOST_BOUND_SHARE * gpu:
            found.append((case_label(r), host / gpu))
    return sorted(found, key=lambda x: -x[1])


#: what helps a host-bound case (``report``, ``run``)
HOST_BOUND_ADVICE = ("a training step then runs at the host's pace: capture it as a CUDA graph "
                     "(timing.cuda_graph: true times the replays) or give each call more work (a larger batch)")


def first_call_seconds(fn: Callable[[], Any], device: str) -> float:
    """Wall seconds of one call of ``fn`` including a device synchronise (the first call:
    compilation and autotuning)."""
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0


def peak_memory_bytes(fn: Callable[[], Any], device: str) -> int | None:
    """Peak device memory of one call of ``fn`` above what was allocated before it
    (``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, paper App. E.3).
    None on the CPU."""
    if not device.startswith("cuda"):
        return None
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del result
    return int(peak)


# --------------------------------------------------------------------------- numerics


@dataclasses.dataclass
class GateResult:
    """Outcome of the numerics gate.

    Attributes:
        err: max-normalised error of the deciding tensor (the largest error / budget;
            None: no reference).
        worst: which tensor it is (``out`` or ``d<input name>``).
        errors: every compared tensor's max-normalised error.
        tolerance: the deciding tensor's budget (:func:`tflabench.numerics.budget`).
        ref: label of the reference and the gate's shape (the ``numerics_ref`` column).
        passed: True when err is None or every tensor is within its budget.
        problem: a reason when the comparison itself failed (shape mismatch, no gradient).
        verdict: the per-tensor :class:`tflabench.numerics.Verdict` (None without reference).
        tf32: whether the kernel's float32 dots use TF32 (the backend's ``uses_tf32``).
    """

    err: float | None
    worst: str | None
    errors: dict
    tolerance: float
    ref: str
    passed: bool
    problem: str | None = None
    verdict: Any = None
    tf32: bool | None = False

    def reason(self) -> str:
        """One line for the ``reason`` column of a ``wrong`` row."""
        if self.verdict is not None and not self.passed:
            return self.verdict.reason(self.ref)
        if self.problem:
            return f"numerics: {self.problem} ({self.ref})"
        return (f"numerics: max-normalised error {self.err:.3g} on {self.worst} exceeds its "
                f"budget {self.tolerance:.3g} ({self.ref})")

    def columns(self, dtype: str) -> dict:
        """The row's numerics columns (``numerics_err``, ``numerics_ref``, ``numerics_worst``,
        ``numerics_budget``, ``numerics_relf``, ``numerics_nonfinite``, ``numerics_detail``,
        ``tf32``)."""
        out = {"numerics_err": self.err, "numerics_ref": self.ref, "tf32": tf32_text(dtype, self.tf32)}
        if self.verdict is not None:
            out.update(self.verdict.columns())
        return out


def max_normalised_error(x, ref) -> float:
    """``max|x - ref| / max|ref|`` in float64 (``max|x|`` when ref is all zero); inf when
    x holds NaN or inf where ref does not (:func:`tflabench.numerics.tensor_error`)."""
    return tensor_error("x", x, ref, 1.0).max_norm


def _to_float64(value):
    import torch

    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to(torch.float64).requires_grad_(value.requires_grad)
    return value


def dtype_name(dtype) -> str:
    """``bfloat16`` for ``torch.bfloat16`` etc. (the suite's dtype names)."""
    return str(dtype).replace("torch.", "")


def numerics_gate(
    backend: Backend,
    params: BackendParams,
    shape: Shape,
    *,
    mode: str,
    dtype,
    device: str,
    seed: int,
    max_seq_len: int,
    tolerance: float | None = None,
    budgets: dict | None = None,
) -> GateResult:
    """Check the kernel against its family's float64 reference at a reduced shape
    (``backend.family.gate_shape``): output, and for ``fwdbw`` every input gradient, each against
    its own budget (:func:`tflabench.numerics.judge`: per tensor class and dtype, TF32 or
    full-precision float32 as ``backend.uses_tf32`` says; docs/numerics.md). The mLSTM
    family's df is judged against the scale of its summands
    (:func:`tflabench.numerics.reference_scales`; ``numerics_ref`` then ends in
    ``; df vs summand scale``).

    Args:
        shape: the case's full shape (reduced here).
        dtype: torch dtype of the case.
        tolerance: one max-normalised error for every tensor (the suite's
            ``numerics.tolerance``); default: the per-tensor budgets.
        budgets: the suite's ``numerics.budgets`` overrides (precision -> class -> number).

    Returns a :class:`GateResult`. Exceptions of the kernel propagate (the caller records
    them as ``error`` / ``oom``); a backend without reference passes with ``err=None``.
    """
    import torch

    family = backend.family
    gshape = family.gate_shape(params, shape, max_seq_len, backend.chunk_size(params))
    tf32 = backend.uses_tf32(params, dtype, device)
    name = dtype_name(dtype)
    tol = budget_of("out", name, tf32, budgets, tolerance)
    where = f"B={gshape.batch} NH={gshape.heads} S={gshape.seq_len}"
    grad = mode == "fwdbw"
    inputs = family.make_inputs(params, gshape, dtype, device, seed + 1, requires_grad=grad)
    out = backend.forward(params, inputs)
    ref_inputs = {k: _to_float64(v) for k, v in inputs.items()}
    try:
        ref = family.reference(params, ref_inputs)
    except NotImplementedError as exc:
        note = str(exc) or "the backend has no reference"
        return GateResult(None, None, {}, tol, f"none: {note}", True, tf32=tf32)
    label = f"{family.name} float64 reference at {where}"
    if tuple(out.shape) != tuple(ref.shape):
        return GateResult(None, "out", {}, tol, label, False, tf32=tf32,
                          problem=f"output shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    pairs = {"out": (out, ref)}
    if grad:
        gen = torch.Generator(device=device).manual_seed(seed + 2)
        g = torch.randn(tuple(ref.shape), generator=gen, dtype=torch.float64, device=device)
        out.backward(g.to(out.dtype))
        ref.backward(g)
        for key, value in inputs.items():
            if isinstance(value, torch.Tensor) and value.requires_grad:
                if value.grad is None:
                    errors = {}
                    return GateResult(None, f"d{key}", errors, tol, label, False, tf32=tf32,
                                      problem=f"no gradient for input {key!r}")
                pairs[f"d{key}"] = (value.grad, ref_inputs[key].grad)
    scales = reference_scales(family.numerics_family(params), ref_inputs, pairs)
    if scales:
        label += "; " + ", ".join(f"{t} vs {s.label}" for t, s in scales.items())
    verdict = judge(pairs, dtype=name, tf32=tf32, overrides=budgets, tolerance=tolerance, scales=scales)
    errors = {e.name: e.max_norm for e in verdict.errors}
    worst = verdict.worst
    if worst is None:
        return GateResult(None, None, errors, tol, label, verdict.passed, verdict.problem, verdict, tf32)
    return GateResult(worst.max_norm, worst.name, errors, worst.budget, label, verdict.passed,
                      verdict.problem, verdict, tf32)


# --------------------------------------------------------------------------- a case


def is_oom(exc: BaseException) -> bool:
    """True for a device out-of-memory error (torch's OutOfMemoryError or its message)."""
    try:
        import torch

        if isinstance(exc, torch.cuda.OutOfMemoryError):
            return True
    except ImportError:  # pragma: no cover
        pass
    text = str(exc).lower()
    return "out of memory" in text and ("cuda" in text or "hip" in text or "device" in text)


def gpu_columns() -> dict:
    """The row's ``gpu_index`` (the current CUDA device as ``CUDA_VISIBLE_DEVICES`` names it
    on the host, its position where the variable is unset) and ``gpu_name`` (the driver's
    name of the model). Call only where CUDA is available."""
    import os

    import torch

    position = torch.cuda.current_device()
    entries = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
    index = entries[position] if position < len(entries) else str(position)
    return {"gpu_index": index, "gpu_name": torch.cuda.get_device_name(position)}


def nvidia_smi_id() -> str:
    """The current CUDA device as ``nvidia-smi -i`` names it: ``GPU-<uuid>`` from torch's
    device properties (the same GPU whatever order CUDA numbers the devices in), else its
    ``gpu_index`` (:func:`gpu_columns`). Call only where CUDA is available."""
    import torch

    uuid = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
    return f"GPU-{uuid}" if uuid else gpu_columns()["gpu_index"]


def counts_for_plan(backend: Backend, params: BackendParams, shape: Shape, mode: str,
                    ran: dict) -> tuple[float, float] | None:
    """(FLOPs, bytes) of one call counted for the algorithm that ran: the backend's model kind
    at the plan's chunk size (``ran["chunk_size"]``) with the plan's algorithm
    (:func:`tflabench.model.plan_counts_kwargs`: an mLSTMsig walk keeps its states on chip);
    None where the backend has no model count or recorded no plan (the counts made before
    the run stand)."""
    counts = plan_breakdown(backend, params, shape, mode, ran) if ran else None
    return None if counts is None else (float(counts.flops), float(counts.bytes))


def plan_columns(backend: Backend, params: BackendParams, ran: dict) -> dict:
    """The row's columns of what a case ran: ``chunk_size_run`` (tokens; the plan's chunk
    size, else the size the parameters fix, ``Backend.chunk_size``; None for a kernel
    without chunks) and, where the plan names it, ``algorithm``. ``ran``: the backend's
    ``run_plan``. The identity column ``chunk_size`` stays what the suite asked (None for
    ``auto``), so that the case's id does not depend on the run."""
    chunk = ran.get("chunk_size") or backend.chunk_size(params)
    out = {"chunk_size_run": None if chunk is None else int(chunk)}
    if ran.get("algorithm") is not None:
        out["algorithm"] = ran["algorithm"]
    return out


def measure_case(case) -> dict:
    """Run one timing :class:`tflabench.store.suite.Case` in this process (a case with ``verify``
    set is :func:`tflabench.run.verify_case.verify_case`'s); returns the outcome columns
    (``status``, ``reason``, timings, ``first_call_s``, ``peak_mem_bytes``,
    ``numerics_err``, ``numerics_ref``, ``flops``, ``bytes``, ``chunk_size_run`` and
    ``algorithm``: :func:`plan_columns`). Its typed ``case.params`` are used as they are.

    Status here is ``ok``, ``wrong`` or ``unavailable``; a kernel's exception propagates
    (the worker turns it into ``error`` / ``oom``), as does a crash (the process dies).
    """
    import torch

    backend = get_backend(case.backend)
    params = case.params
    shape = Shape(case.batch, case.seq_len, case.heads, case.d_qk, case.d_hv, case.dtype)
    out: dict[str, Any] = _model_columns(backend, params, shape, case.mode)
    if case.device.startswith("cuda") and not torch.cuda.is_available():
        return {**out, "status": "unavailable", "reason": "no CUDA device visible to torch"}
    if case.device.startswith("cuda"):
        out.update(gpu_columns())
    reason = backend.available(params)
    if reason is None:
        reason = backend.unsupported_mode(params, case.mode)
    if reason is not None:
        return {**out, "status": "unavailable", "reason": reason}

    device, dtype = case.device, torch_dtype(case.dtype)
    grad = case.mode == "fwdbw"
    torch.manual_seed(case.seed)
    inputs = backend.family.make_inputs(params, shape, dtype, device, case.seed, requires_grad=grad)
    clear_grads = _gradient_clearer(inputs)
    out["first_call_s"], step, grad_out = _first_call_and_step(backend, params, inputs, grad=grad, device=device,
                                                               seed=case.seed, clear_grads=clear_grads)
    if case.check_numerics:
        gate = _gate_case(case, backend, params, shape, dtype)
        out.update(gate.columns(case.dtype))
        if not gate.passed:
            return {**out, "status": "wrong", "reason": gate.reason()}
        if device.startswith("cuda"):
            torch.cuda.empty_cache()

    clear_grads()
    failed = _measure_timed_calls(case, step, clear_grads, out)
    if failed is not None:
        return {**out, **failed}
    note = backend.note(params, device)
    ran = backend.run_plan(params, shape, case.mode, dtype, device)
    out.update(plan_columns(backend, params, ran))
    counts = counts_for_plan(backend, params, shape, case.mode, ran)
    if counts is not None:
        out["flops"], out["bytes"] = counts
    if case.profile:
        profile, problem = _profile_kernels(backend, params, inputs, device, grad_out=grad_out,
                                            clear_grads=clear_grads)
        if profile is not None:
            out["kernel_profile"] = profile
        if problem is not None:
            note = "; ".join(x for x in (note, problem) if x)
    return {**out, "status": "ok", "reason": note}


def _model_columns(backend: Backend, params: BackendParams, shape: Shape, mode: str) -> dict:
    """``flops`` and ``bytes`` of one call as the family's model counts them before the run;
    {} where it has no count (the model is optional for a row)."""
    try:
        counts = backend.family.model_counts(params, shape, mode)
    except Exception:
        counts = None
    return {} if counts is None else {"flops": float(counts[0]), "bytes": float(counts[1])}


def _gradient_clearer(inputs: dict) -> Callable[[], None]:
    """A function that sets the gradient of each input that requires one to None."""
    import torch

    grad_tensors = [v for v in inputs.values() if isinstance(v, torch.Tensor) and v.requires_grad]

    def clear_grads():
        for t in grad_tensors:
            t.grad = None

    return clear_grads


def _first_call_and_step(backend: Backend, params: BackendParams, inputs: dict, *, grad: bool, device: str,
                         seed: int, clear_grads: Callable[[], None]):
    """Time the first call (compile, autotune: :func:`first_call_seconds`) and make the step
    the timings call: forward, and with ``grad`` backward of a fixed random output gradient
    (seeded ``seed + 3``, of the first output's shape and dtype). Returns ``(first_call_s,
    step, output gradient or None)``."""
    import torch

    if not grad:
        first_call_s = first_call_seconds(lambda: backend.forward(params, inputs), device)

        def step():
            return backend.forward(params, inputs)

        return first_call_s, step, None
    probe = {}

    def first():
        o = backend.forward(params, inputs)
        probe["shape"], probe["dtype"] = tuple(o.shape), o.dtype
        o.backward(torch.ones_like(o))

    first_call_s = first_call_seconds(first, device)
    clear_grads()
    gen = torch.Generator(device=device).manual_seed(seed + 3)
    grad_out = torch.randn(probe["shape"], generator=gen, dtype=torch.float32, device=device).to(probe["dtype"])

    def step():
        backend.forward(params, inputs).backward(grad_out)

    return first_call_s, step, grad_out


def _gate_case(case, backend: Backend, params: BackendParams, shape: Shape, dtype) -> GateResult:
    """The case's :func:`numerics_gate` with its tolerance and budgets."""
    return numerics_gate(backend, params, shape, mode=case.mode, dtype=dtype, device=case.device,
                         seed=case.seed, max_seq_len=case.numerics_max_seq_len, tolerance=case.tolerance,
                         budgets=json.loads(case.numerics_budgets) if case.numerics_budgets else None)


def _measure_timed_calls(case, step: Callable[[], Any], clear_grads: Callable[[], None], out: dict) -> dict | None:
    """Peak memory, the timings (:func:`time_callable`; with ``gpu_trace`` the GPU's clock and
    power over them) and on CUDA the host time per call, into ``out``. Returns the ``error``
    outcome of a CUDA graph that cannot be captured (what was measured stays), else None."""
    device = case.device
    before_each = clear_grads if case.mode == "fwdbw" else None
    trace = GpuTrace(nvidia_smi_id()) if case.gpu_trace and device.startswith("cuda") else None
    with trace or contextlib.nullcontext():
        if trace is not None:
            trace.wait_first()
        out["peak_mem_bytes"] = peak_memory_bytes(step, device)
        clear_grads()
        start = time.monotonic()
        try:
            samples = time_callable(step, device=device, warmup=case.warmup, iterations=case.iterations,
                                    flush_l2=case.flush_l2, before_each=before_each,
                                    sync_each=case.sync_each, warmup_s=case.warmup_s,
                                    cuda_graph=case.cuda_graph)
        except GraphCaptureError as exc:
            return {"status": "error", "reason": str(exc)}
        if trace is not None:
            out.update(trace.columns(start, time.monotonic()))
    if device.startswith("cuda"):
        out["host_ms"] = host_ms_per_call(step, before_each)
        clear_grads()
    out.update(summarize(samples))
    out["ms_samples"] = json.dumps(out["ms_samples"])
    return None


def _profile_kernels(backend: Backend, params: BackendParams, inputs: dict, device: str, *, grad_out,
                     clear_grads: Callable[[], None]) -> tuple[str | None, str | None]:
    """``run --profile``: each kernel's time over a few calls
    (:func:`tflabench.run.kernel_profile.capture`; with ``grad_out`` the backward too), as
    the row's JSON. Returns ``(json, None)``, or ``(None, why)`` where the profiler failed
    (it must not lose the measurement)."""
    from tflabench.run.kernel_profile import capture

    try:
        if grad_out is not None:
            profile = capture(lambda: backend.forward(params, inputs), lambda o: o.backward(grad_out),
                              device, before_each=clear_grads)
        else:
            profile = capture(lambda: backend.forward(params, inputs), None, device)
        return json.dumps(profile, sort_keys=True), None
    except Exception as exc:
        return None, f"no kernel profile ({type(exc).__name__}: {exc})"


__all__ = [
    "time_callable", "graph_replay", "GraphCaptureError", "GRAPH_WARMUP", "summarize", "first_call_seconds",
    "host_ms_per_call", "HOST_CALLS", "HOST_BOUND_SHARE", "host_bound_cases", "HOST_BOUND_ADVICE",
    "peak_memory_bytes", "numerics_gate", "max_normalised_error", "measure_case", "GateResult", "is_oom",
    "torch_dtype", "dtype_name",
]
