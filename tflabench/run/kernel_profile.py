"""Where a case's time goes: the time of every kernel it launched (``run --profile``), and
that time set against the analytic model's parts, each part against its own bound.

Two halves:

- :func:`capture` runs in the worker after the timings: ``steps`` forward calls under
  ``torch.profiler``, and for ``fwdbw`` ``steps`` backward calls, each profiled apart from
  its forward (the pass of each kernel is known by construction, whatever thread the
  backward runs on). On a GPU it records CUDA kernels (and copies / memsets: device
  time of each launch); on the CPU, operators (each operator's self CPU time). The
  result is the row's ``kernel_profile`` column (JSON text), form in :func:`parse_profile`.
- :func:`breakdown` (the parent, ``tflabench report``) maps each kernel to a model part
  through its backend's :attr:`~tflabench.backends.family.Family.KERNEL_PARTS` (its family's): per pass
  (``fwd``, ``bwd``) the ``recurrent`` and ``parallel`` kernels of a chunkwise kernel, or
  ``whole`` (a fused kernel, with the other part kernels of its pass, or a model without
  the split); kernels no pattern names
  are the pass's ``other``. Each part's time stands beside its model FLOPs, bytes and roofline bound
  ``max(FLOPs / alpha, bytes / beta)`` (:mod:`tflabench.model.parts`), and the case beside
  the model's bound and its physical floor (:mod:`tflabench.model.floor`).

Times are milliseconds per call (a call: one forward, or one forward and its backward).
The kernel times of a call add up to less than its measured median where the GPU idles
between launches (launch latency, host work); ``report`` shows both.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Callable

from tflabench.errors import UserError

#: Calls profiled per pass.
PROFILE_STEPS = 5
#: Kernels kept per pass (by time); the rest are summed into one entry ``(N more)``.
MAX_KERNELS_PER_PASS = 60
#: The part of a kernel that no pattern of its backend names.
OTHER = "other"
#: ``source`` of a profile: CUDA kernels (a GPU) or operators (the CPU).
SOURCES = ("cuda kernels", "cpu operators")


# --------------------------------------------------------------------------- capture (worker)


def capture(forward: Callable[[], Any], backward: Callable[[Any], Any] | None, device: str,
            steps: int = PROFILE_STEPS, before_each: Callable[[], Any] | None = None) -> dict:
    """Profile ``steps`` calls of one case with ``torch.profiler``: the ``kernel_profile``
    column (a dict, written as JSON text).

    Args:
        forward: one forward call; returns the output (kept for ``backward``).
        backward: ``backward(output)`` runs the backward of that output (``fwdbw``); None
            for a forward-only case.
        device: ``cuda...`` (CUDA kernels, device time) or ``cpu`` (operators, self CPU time).
        steps: calls per pass (>= 1).
        before_each: untimed callback before each call (e.g. set gradients to None).

    Returns:
        ``{"source", "steps", "kernels": [{"pass", "name", "ms", "calls"}, ...]}`` with ``ms``
        and ``calls`` per call, the kernels of each pass ordered by time (at most
        :data:`MAX_KERNELS_PER_PASS` each, the rest summed into one entry).
    Raises ValueError for steps < 1; the kernels' own exceptions propagate.
    """
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    if steps < 1:
        raise ValueError(f"steps: got {steps}; allowed: >= 1")
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    totals: dict[tuple[str, str], list[float]] = {}

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def collect(prof, pass_: str) -> None:
        for event in prof.events():
            if cuda:
                if event.device_type != DeviceType.CUDA:
                    continue
                us = event.time_range.elapsed_us()
            else:
                if event.device_type != DeviceType.CPU or event.is_async \
                        or getattr(event, "is_user_annotation", False):
                    continue
                us = event.self_cpu_time_total
            entry = totals.setdefault((pass_, event.name), [0.0, 0])
            entry[0] += float(us)
            entry[1] += 1

    sync()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            if before_each is not None:
                before_each()
            out = forward()
            del out
        sync()
    collect(prof, "fwd")
    if backward is not None:
        for _ in range(steps):
            if before_each is not None:
                before_each()
            out = forward()
            sync()
            with profile(activities=activities) as prof:
                backward(out)
                sync()
            collect(prof, "bwd")
            del out
    kernels = []
    for pass_ in ("fwd", "bwd"):
        mine = sorted(((name, us, n) for (p, name), (us, n) in totals.items() if p == pass_),
                      key=lambda item: (-item[1], item[0]))
        kept, rest = mine[:MAX_KERNELS_PER_PASS], mine[MAX_KERNELS_PER_PASS:]
        if rest:
            kept.append((f"({len(rest)} more)", sum(r[1] for r in rest), sum(r[2] for r in rest)))
        kernels.extend({"pass": pass_, "name": name, "ms": us / 1e3 / steps, "calls": n / steps}
                       for name, us, n in kept)
    return {"source": SOURCES[0] if cuda else SOURCES[1], "steps": steps, "kernels": kernels}


# --------------------------------------------------------------------------- reading


def parse_profile(value: Any) -> dict | None:
    """The ``kernel_profile`` column of a row as a dict, or None when the row has none.

    Form: ``{"source": "cuda kernels" | "cpu operators", "steps": int, "kernels": [{"pass":
    "fwd" | "bwd", "name": str, "ms": float (per call), "calls": float (per call)}]}``.
    Raises UserError naming what is wrong when the text is not of that form."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    try:
        data = json.loads(value) if isinstance(value, str) else value
        assert isinstance(data, dict) and isinstance(data.get("kernels"), list)
        for k in data["kernels"]:
            assert k["pass"] in ("fwd", "bwd") and isinstance(k["name"], str)
            float(k["ms"]), float(k["calls"])
    except (ValueError, TypeError, KeyError, AssertionError):
        raise UserError("corrupt kernel_profile column: not the JSON that `tflabench run --profile` "
                        "writes; profile the case again") from None
    return data


@dataclasses.dataclass
class PartTime:
    """One part of a case's time.

    Attributes:
        pass_: ``fwd`` or ``bwd``.
        part: ``recurrent``, ``parallel``, ``whole`` or :data:`OTHER` (kernels no pattern of
            the backend names: copies, fills, casts, a peer's utility kernels).
        ms: kernel time per call, ms.
        kernels: (name, ms, launches) per call of its kernels, largest first.
        flops, bytes: the model's counts of the part (None: no model part).
        bound_ms: ``max(flops / alpha, bytes / beta)`` in ms (None without counts or ceilings).
    """

    pass_: str
    part: str
    ms: float
    kernels: list[tuple[str, float, float]]
    flops: float | None = None
    bytes: float | None = None
    bound_ms: float | None = None

    @property
    def label(self) -> str:
        """``fwd recurrent``, ..., ``bwd other``."""
        return f"{self.pass_} {self.part}"

    @property
    def fraction(self) -> float | None:
        """bound / time (1: at its bound)."""
        return self.bound_ms / self.ms if self.bound_ms is not None and self.ms > 0 else None


@dataclasses.dataclass
class CaseBreakdown:
    """A case: its row, measured median, and where it has a profile its kernel time by part.

    Attributes:
        row: the result row (dict).
        source: the profile's ``source`` (None: the row has no profile).
        measured_ms: the row's ``ms_median``.
        kernel_ms: the profiled kernels' time per call (all parts; None without profile).
        parts: :class:`PartTime` per part, passes in order, each pass's :data:`OTHER` last
            (empty without profile).
        bound_ms: the model's roofline bound of the whole call (None without counts or ceilings).
        floor_ms: the physical floor (None where the model has no floor or no ceilings).
        floor_note: what the floor is made of (bytes, FLOPs, which binds).
    """

    row: dict
    source: str | None
    measured_ms: float | None
    kernel_ms: float | None
    parts: list[PartTime]
    bound_ms: float | None
    floor_ms: float | None
    floor_note: str | None

    def part(self, label: str) -> PartTime | None:
        """The part with this :attr:`PartTime.label`, or None."""
        return next((p for p in self.parts if p.label == label), None)


def _bound_ms(flops: float | None, nbytes: float | None, alpha: float | None, beta: float | None) -> float | None:
    if flops is None or nbytes is None or not alpha or not beta:
        return None
    return max(flops / alpha, nbytes / beta) * 1e3


def _number(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def plan_breakdown(backend, params, shape, mode: str, ran: dict):
    """The model's :class:`tflabench.model.Counts` of one call counted for what ran: the
    backend's model kind (``Family.model_kind`` of its family) at the plan's chunk size (``ran["chunk_size"]``,
    tokens) with the plan's algorithm (``ran["algorithm"]``;
    :func:`tflabench.model.plan_counts_kwargs`: an mLSTMsig walk keeps its states on chip); an
    empty ``ran`` counts at the parameters. None where the backend has no model count."""
    from tflabench.backends.base import model_breakdown
    from tflabench.model import plan_counts_kwargs

    found = backend.family.model_kind(params, shape, mode)
    if found is None:
        return None
    kind, kwargs = found
    kwargs = dict(kwargs)
    if ran.get("chunk_size") and "L" in kwargs:
        kwargs["L"] = int(ran["chunk_size"])
    kwargs.update(plan_counts_kwargs(kind, ran.get("algorithm")))
    return model_breakdown(kind, mode, shape, **kwargs)


def _model(row: dict):
    """(backend, params, kind, counts, shape) for a row, or Nones where unknown; the counts
    are those of the chunk size and algorithm the row ran (:func:`plan_breakdown`)."""
    from tflabench.backends import get_backend, params_of_row
    from tflabench.backends.base import Shape
    from tflabench.store.schema import chunk_size_ran

    try:
        backend = get_backend(str(row.get("backend")))
        params = params_of_row(row)
    except Exception:  # a backend this checkout does not know: every kernel is `other`
        return None, None, None, None, None
    try:
        shape = Shape(int(row["batch"]), int(row["seq_len"]), int(row["heads"]), int(row["d_qk"]),
                      int(row["d_hv"]), str(row.get("dtype") or "bfloat16"))
        found = backend.family.model_kind(params, shape, str(row.get("mode")))
        counts = plan_breakdown(backend, params, shape, str(row.get("mode")),
                                {"chunk_size": chunk_size_ran(row), "algorithm": row.get("algorithm")})
    except Exception:  # no shape or no model for it: times without bounds
        return backend, params, None, None, None
    return backend, params, (found[0] if found else None), counts, shape


def breakdown(row: dict, alpha: float | None = None, beta: float | None = None) -> CaseBreakdown:
    """A row's profile split by model part (module docstring), beside the model's bound and
    the physical floor; a row without a profile has no parts. ``alpha`` (FLOP/s) and
    ``beta`` (byte/s): the ceilings of the bounds and the floor (None: times only).
    Raises UserError for a corrupt profile."""
    from tflabench.model.floor import physical_floor
    from tflabench.model.parts import PARTS, PASSES, split_parts

    profile = parse_profile(row.get("kernel_profile"))
    backend, params, kind, counts, shape = _model(row)
    model_parts = split_parts(kind, counts) if counts is not None and kind is not None else {}
    times: dict[tuple[str | None, str], list[tuple[str, float, float]]] = {}
    for k in (profile or {}).get("kernels", []):
        pass_, name, ms = k["pass"], k["name"], float(k["ms"])
        part = backend.family.kernel_part(params, name) if backend is not None else None
        if part is None:
            key: tuple[str | None, str] = (pass_, OTHER)
        elif not model_parts or (pass_, part) in model_parts:
            key = (pass_, part)
        else:  # the model does not split this pass (or the kernel fuses both parts)
            key = (pass_, "whole")
        times.setdefault(key, []).append((name, ms, float(k["calls"])))
    # a pass with a fused kernel (mLSTMsig's walk beside its gate kernel): its model parts
    # are that kernel's together, so every part kernel of the pass counts as the whole
    for pass_ in {p for p, q in times if q == "whole"}:
        for part in ("recurrent", "parallel"):
            times[(pass_, "whole")] += times.pop((pass_, part), [])

    order = [(p, q) for p in PASSES for q in (*PARTS, OTHER)]
    parts = []
    for key in order:
        if key not in times:
            continue
        kernels = sorted(times[key], key=lambda item: -item[1])
        pt = PartTime(key[0], key[1], sum(k[1] for k in kernels), kernels)
        if key[1] != OTHER and model_parts:
            if key in model_parts:
                c = model_parts[key]
                pt.flops, pt.bytes = c.flops, c.bytes
            elif key[1] == "whole":  # a fused kernel: the pass's parts together
                mine = [c for (p, _), c in model_parts.items() if p == key[0]]
                pt.flops, pt.bytes = sum(c.flops for c in mine), sum(c.bytes for c in mine)
            pt.bound_ms = _bound_ms(pt.flops, pt.bytes, alpha, beta)
        parts.append(pt)

    bound = _bound_ms(counts.flops, counts.bytes, alpha, beta) if counts is not None else None
    floor_ms = floor_note = None
    if kind is not None and shape is not None:
        floor = physical_floor(kind, str(row.get("mode")), B=shape.batch, NH=shape.heads, S=shape.seq_len,
                               d_qk=shape.d_qk, d_hv=shape.d_hv, bytes_qkv=shape.bytes_qkv,
                               bytes_gate=shape.bytes_gate)
        if floor is not None:
            floor_ms = _bound_ms(floor.flops, floor.bytes, alpha, beta)
            floor_note = f"{floor.bytes / 1e9:.3g} GB, {floor.flops / 1e12:.3g} TFLOP"
            if floor_ms is not None:
                binds = "bytes" if floor.bytes / beta >= floor.flops / alpha else "FLOPs"
                floor_note += f" ({binds} bind)"
    return CaseBreakdown(row=row, source=None if profile is None else str(profile.get("source")),
                         measured_ms=_number(row.get("ms_median")),
                         kernel_ms=None if profile is None else sum(p.ms for p in parts), parts=parts,
                         bound_ms=bound, floor_ms=floor_ms, floor_note=floor_note)


def breakdowns(rows, alpha: float | None = None, beta: float | None = None) -> list[CaseBreakdown]:
    """:func:`breakdown` of every ``ok`` row (a DataFrame or row dicts) that has a profile,
    a model bound or a floor, in row order."""
    records = rows.to_dict("records") if hasattr(rows, "to_dict") else [dict(r) for r in rows]
    out = []
    for row in records:
        if row.get("status") != "ok":
            continue
        found = breakdown(row, alpha, beta)
        if found.source is not None or found.bound_ms is not None or found.floor_ms is not None:
            out.append(found)
    return out


__all__ = ["PROFILE_STEPS", "OTHER", "capture", "parse_profile", "breakdown", "breakdowns",
           "PartTime", "CaseBreakdown"]
