"""Checking one ``tflabench verify`` case: a kernel against its float64 reference in one
input regime.

A regime (:data:`tflabench.numerics.REGIMES`) redraws the gate pre-activations (or scales
q and k) of the backend's own inputs; how it maps onto a family's inputs is
:data:`FAMILY_PROFILES` (one entry per family: the worker pool and the backends never
test a family by name). :func:`verify_case` is what a worker calls for a case whose
``verify`` field is set: forward (from the initial state when the case has one, returning
the last state where the backend can), and for ``fwdbw`` the backward of a fixed random
output gradient; then :func:`tflabench.numerics.judge` compares the output, the last state
and every input gradient with the float64 reference, each against its budget (the mLSTM
family's df against the scale of its summands, :func:`tflabench.numerics.reference_scales`).
The grid of cases and its run are :mod:`tflabench.run.verify_run`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

from tflabench.backends import get_backend
from tflabench.backends.base import Backend, Shape
from tflabench.run.measure import torch_dtype
from tflabench.numerics import REGIMES, RegimeSpec, VerifySettings, judge, reference_scales, tf32_text
from tflabench.store.suite import Case

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


#: family (``Family.numerics_family``) -> profile. Families not listed get only the
#: ``standard`` regime (the backend's own inputs).
FAMILY_PROFILES: dict[str, FamilyProfile] = {
    "mlstm": FamilyProfile(frozenset({"f", "i", "qk"}), _apply_mlstm),
    "gla": FamilyProfile(frozenset({"f", "qk"}), _apply_gla),
    "mamba2": FamilyProfile(frozenset({"f"}), _apply_mamba2),
    "attention": FamilyProfile(frozenset({"qk"}), _apply_attention),
    # gated DeltaNet: its log decay g as GLA's; q and k are L2-normalised in the kernel, so
    # no qk regime (backends.delta: the ungated delta rule has no regime field)
    "delta_rule_gated": FamilyProfile(frozenset({"f"}), _apply_gla),
}


def regimes_for(family: str, settings: VerifySettings) -> list[str]:
    """The regime names that apply to ``family``: the settings' list (or every known
    regime) whose fields the family has, in order."""
    profile = FAMILY_PROFILES.get(family)
    fields = profile.fields if profile else frozenset()
    names = settings.regimes if settings.regimes is not None else list(REGIMES) + [
        n for n in settings.custom_regimes if n not in REGIMES]
    return [n for n in names if settings.regime(n).fields_set() <= fields]



def takes_state(backend) -> bool:
    """True when the backend overrides ``forward_state`` (it takes an initial state and
    returns the last one)."""
    return type(backend).forward_state is not Backend.forward_state



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
    (``Family.initial_state``) for ``+init`` cases. Kernel exceptions propagate (the
    worker records ``error`` / ``oom``); a ValueError from ``make_inputs`` (a length the
    kernel does not take) makes the row ``unavailable``.
    """
    import torch

    spec_all = json.loads(case.verify)
    spec = RegimeSpec.model_validate(spec_all["spec"])
    backend = get_backend(case.backend)
    params = case.params
    if case.device.startswith("cuda") and not torch.cuda.is_available():
        return {"status": "unavailable", "reason": "no CUDA device visible to torch"}
    reason = backend.available(params) or backend.unsupported_mode(params, case.mode)
    if reason is not None:
        return {"status": "unavailable", "reason": reason}
    dtype, device = torch_dtype(case.dtype), case.device
    grad = case.mode == "fwdbw"
    shape = Shape(case.batch, case.seq_len, case.heads, case.d_qk, case.d_hv, case.dtype)
    try:
        inputs = backend.family.make_inputs(params, shape, dtype, device, case.seed, requires_grad=grad)
    except ValueError as exc:
        return {"status": "unavailable", "reason": f"the kernel does not take this case: {exc}"}
    gen = torch.Generator(device=device).manual_seed(case.seed + 11)
    profile = FAMILY_PROFILES.get(spec_all["family"])
    if profile is not None:
        inputs = profile.apply(inputs, spec, gen)
    state = None
    if spec_all["initial_state"]:
        state = backend.family.initial_state(params, inputs, case.seed + 13, requires_grad=grad)
        if state is None:
            return {"status": "unavailable", "reason": f"{backend.name} takes no initial state"}
    with_state = takes_state(backend)
    tf32 = backend.uses_tf32(params, dtype, device)
    where = (f"{backend.family.numerics_family(params)} float64 reference, regime {spec_all['regime']}"
             f"{' with initial state' if state else ''}, B={case.batch} NH={case.heads} S={case.seq_len}")
    ref_inputs = {k: _float64_copy(v) for k, v in inputs.items()}
    ref_state = {k: _float64_copy(v) for k, v in state.items()} if state else None
    if with_state:
        out, last = backend.forward_state(params, inputs, state)
        try:
            ref, ref_last = backend.family.reference_state(params, ref_inputs, ref_state)
        except NotImplementedError as exc:
            return {"status": "unavailable", "reason": f"no float64 reference: {exc}"}
    else:
        out, last, ref_last = backend.forward(params, inputs), {}, {}
        try:
            ref = backend.family.reference(params, ref_inputs)
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


__all__ = ["FAMILY_PROFILES", "FamilyProfile", "regimes_for", "takes_state", "verify_case"]
