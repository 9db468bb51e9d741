"""Numerics budgets, error measures and the verdict: the one definition of "correct".

Both the numerics gate of ``tflabench run`` (:func:`tflabench.run.measure.numerics_gate`) and
``tflabench verify`` (:mod:`tflabench.run.verify_run`) compare a kernel's tensors with its family's
float64 reference through :func:`judge`, with the budgets of :func:`budget`, so the two
never disagree on what "correct" means. ``docs/numerics.md`` gives every number its reason.

Error measures, per tensor x (kernel) against r (float64 reference), over the positions
where r is finite:

- **max-normalised** (the verdict's measure): ``max|x - r| / max|r|`` (``max|x|`` when r
  is all zero); for a tensor given a normaliser (``judge(..., scales=...)``), the
  denominator is ``max(max|r|, scale)`` instead: the mLSTM forget-gate gradient ``df`` is
  judged against the scale of the summands it is computed from (:func:`mlstm_df_scale`,
  :data:`FAMILY_SCALES`), since its true value cancels to ~1e-8 where forget gates are
  closed and every float kernel's df error there is rounding noise of O(1) summands;
- **relative Frobenius** (recorded beside it): ``||x - r||_F / ||r||_F``;
- **non-finite**: the count of NaN/inf in x where r is finite. Any is a failure (error inf).

Tensors fall in four classes (:func:`tensor_class`), each with its own budget per dtype:

- ``out``: the kernel's output (h, o, y);
- ``state``: the last state (``C_last``, ``n_last``, ...), when the kernel returns one;
- ``grad``: gradients of the activations and of the initial state (``dq``, ``dk``,
  ``dv``, ``dx``, ``dB``, ``dC``, ``dC0``);
- ``gate_grad``: gradients of gate pre-activations and decay parameters (``di``, ``df``,
  ``dg``, ``ddt``, ``dA``, ``dD``, ``ddt_bias``): each is a reduction over the whole
  sequence of products of the other tensors (df is a reverse cumulative sum over S of
  per-step terms), so its rounding error grows with S and is looser.

float32 has two budget rows: ``float32`` (full-precision dots: IEEE, or Triton's
``tf32x3``) and ``tf32`` (dots with TF32 operands, a 10-bit mantissa): the backend says
which its kernel uses (:meth:`tflabench.backends.base.Backend.uses_tf32`); unknown counts
as TF32 (the looser row) and the row says so.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tflabench import bounds as B

#: Tensor classes, in the order the docs list them.
TENSOR_CLASSES: tuple[str, ...] = ("out", "state", "grad", "gate_grad")

#: Gradient names that are gate / decay gradients (class ``gate_grad``), across families:
#: mLSTM ``di``, ``df``; GLA ``dg``; Mamba 2 ``ddt``, ``dA``, ``dD``, ``ddt_bias``;
#: Mamba ``ddelta``, ``ddelta_bias``; delta rule ``dbeta`` (and ``dg``); Mamba-3 ``dadt``,
#: ``dtrap``, ``dangles`` and the biases ``dq_bias``, ``dk_bias`` (per-step scalars, and
#: per-head vectors summed over the sequence as ``dD`` is).
GATE_GRADIENTS: frozenset[str] = frozenset(
    {"di", "df", "dg", "ddt", "dA", "dD", "ddt_bias", "ddelta", "ddelta_bias",
     "dbeta", "dadt", "dtrap", "dangles", "dq_bias", "dk_bias"})

#: Prefix of last-state tensor names (class ``state``), e.g. ``last_C``.
STATE_PREFIX = "last_"

#: Budget rows: the case dtype, with float32 split by whether the dots use TF32.
PRECISIONS: tuple[str, ...] = ("float64", "float32", "tf32", "float16", "bfloat16")


class Budget(BaseModel):
    """Largest accepted max-normalised error per tensor class, for one precision."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    out: float = Field(gt=0, description="the output")
    state: float = Field(gt=0, description="the last state")
    grad: float = Field(gt=0, description="gradients of q, k, v (x, B, C) and the initial state")
    gate_grad: float = Field(gt=0, description="gradients of the gate pre-activations / decays")

    def of(self, tensor_class_name: str) -> float:
        """The budget of a tensor class (one of :data:`TENSOR_CLASSES`)."""
        return float(getattr(self, tensor_class_name))


#: Default budgets (max-normalised error) per precision. Sources and margins: see
#: :data:`BUDGET_REASONS` and ``docs/numerics.md``. The bf16 numbers are set from the H200
#: reference runs (``results/reference/h200/*/rows.jsonl``, gate at B 1, NH 2, S 512) and the
#: kernel notes, and were checked per tensor in ``results/reference/h200/h100_7b_gate``.
DEFAULT_BUDGETS: dict[str, Budget] = {
    "float64": Budget(out=1e-6, state=1e-6, grad=1e-6, gate_grad=1e-6),
    "float32": Budget(out=1e-3, state=1e-3, grad=1e-3, gate_grad=5e-3),
    "tf32": Budget(out=5e-3, state=5e-3, grad=5e-3, gate_grad=2e-2),
    "float16": Budget(out=1e-2, state=1e-2, grad=1e-2, gate_grad=5e-2),
    "bfloat16": Budget(out=2.5e-2, state=2.5e-2, grad=2.5e-2, gate_grad=1e-1),
}

#: One line per precision: why its numbers (docs/numerics.md has the table of evidence).
BUDGET_REASONS: dict[str, str] = {
    "float64": "a float64 kernel against the float64 reference differs by summation order only "
               "(~1e-12 measured); 1e-6 leaves room for saturated-gate regimes",
    "float32": "full-precision fp32 dots (IEEE, tf32x3): our kernels reach <= 3.3e-6 on the H200 "
               "and ~1e-6 on the CPU at standard gates; the fp32 PyTorch reference itself is "
               "3e-4 off float64 in ill-conditioned regimes (i ~ N(30, 5)); 1e-3 = 3x that, and "
               "still 10x below a 1 % error",
    "tf32": "TF32 dots (10-bit mantissa, unit roundoff 4.9e-4) cost ~1e-3 (docs/tfla-tiling.md "
            "4.10); 5e-3 = 5x that, half of a 1 % error",
    "float16": "our fp16 kernels reach <= 1.1e-3 (GPU checks, S 129); 1e-2 = 9x that; gate "
               "gradients as the old fp16 gate tolerance (5e-2)",
    "bfloat16": "correct bf16 kernels reach 1.8e-3 (SDPA) to 1.04e-2 (mlstm_kernels "
                "limit_chunk) on the output at the gate's shape, ours 3.4e-3 / 3.7e-3; 2.5e-2 "
                "= 2.4x the largest, and half of a 5 % error. Gate gradients: df reaches "
                "6.4e-2 (peer, d_qk 256, L 1024, S 2048), ours 1.2e-2; 1e-1 = 1.6x the largest",
}


def tensor_class(name: str) -> str:
    """The class of a compared tensor by its name: ``out``; ``state`` for names starting
    with ``last_``; ``gate_grad`` for :data:`GATE_GRADIENTS`; ``grad`` for any other ``d*``
    name (``dq``, ``dk``, ``dv``, ``dx``, ``dB``, ``dC0``...). Raises ValueError for a name
    that fits none."""
    if name == "out":
        return "out"
    if name.startswith(STATE_PREFIX):
        return "state"
    if name in GATE_GRADIENTS:
        return "gate_grad"
    if name.startswith("d") and len(name) > 1:
        return "grad"
    raise ValueError(f"tensor {name!r}: not out, last_*, or a gradient d*")


def precision(dtype: str, tf32: bool | None = None) -> str:
    """The budget row of a case: its dtype name, except float32 with TF32 dots (or unknown
    dots, ``tf32=None``) -> ``tf32``. Raises ValueError for an unknown dtype name."""
    if dtype not in DEFAULT_BUDGETS:
        raise ValueError(f"dtype: {dtype!r}; allowed: {', '.join(d for d in PRECISIONS if d != 'tf32')}")
    if dtype == "float32" and tf32 is not False:
        return "tf32"
    return dtype


def budget(tensor: str, dtype: str, tf32: bool | None = None,
           overrides: Mapping[str, Budget | Mapping[str, float]] | None = None,
           tolerance: float | None = None) -> float:
    """The accepted max-normalised error of one tensor.

    Args:
        tensor: its name (``out``, ``last_C``, ``dq``, ``df``...; see :func:`tensor_class`).
        dtype: the case's dtype name (``bfloat16``, ``float16``, ``float32``, ``float64``).
        tf32: whether the kernel's float32 dots use TF32 (None: unknown -> the TF32 row).
        overrides: precision -> Budget (or a partial mapping of class -> budget), e.g. a
            suite's ``numerics.budgets``; classes it does not name keep the default.
        tolerance: one number for every tensor (the suite's ``numerics.tolerance``), the
            old single-tolerance setting; wins over everything else.

    Returns the budget (a positive float).
    """
    if tolerance is not None:
        return float(tolerance)
    row = precision(dtype, tf32)
    cls = tensor_class(tensor)
    over = (overrides or {}).get(row)
    if over is not None:
        value = over.of(cls) if isinstance(over, Budget) else over.get(cls)
        if value is not None:
            return float(value)
    return DEFAULT_BUDGETS[row].of(cls)


# --------------------------------------------------------------------------- measures


@dataclasses.dataclass
class TensorError:
    """One compared tensor.

    Attributes:
        name: ``out``, ``last_C``, ``dq``...
        max_norm: max-normalised error (inf when the kernel has NaN/inf where the
            reference is finite).
        rel_fro: relative Frobenius error (inf likewise).
        nonfinite: NaN/inf count in the kernel's tensor where the reference is finite.
        ref_nonfinite: NaN/inf count in the reference (those positions are not compared).
        budget: the accepted max-normalised error.
        scale: the normaliser given for this tensor (:class:`Normaliser`) when it was
            judged against ``max(max|r|, scale)`` rather than ``max|r|``; None otherwise.
        ref_max: ``max|r|`` over the compared positions (0 when none).
    """

    name: str
    max_norm: float
    rel_fro: float
    nonfinite: int
    ref_nonfinite: int
    budget: float
    scale: "Normaliser | None" = None
    ref_max: float = 0.0

    @property
    def normaliser_text(self) -> str | None:
        """``vs summand scale 31.6 (max|ref| 4.1e-08)`` when judged against a given
        normaliser, None when against ``max|r|``."""
        if self.scale is None:
            return None
        return f"vs {self.scale.label} {self.scale.value:.6g} (max|ref| {self.ref_max:.3g})"

    @property
    def passed(self) -> bool:
        """No non-finite value, and max_norm <= budget."""
        return self.nonfinite == 0 and self.max_norm <= self.budget

    @property
    def ratio(self) -> float:
        """max_norm / budget (inf with non-finite values): > 1 fails."""
        return math.inf if self.nonfinite else self.max_norm / self.budget


@dataclasses.dataclass(frozen=True)
class Normaliser:
    """A per-tensor normaliser of the max-normalised error (``judge(..., scales=...)``):
    the error is ``max|x - r| / max(max|r|, value)``.

    Attributes:
        value: the scale (positive and finite, else it is ignored and ``max|r|`` applies).
        label: what it is, for the row's detail and reason (``summand scale``).
    """

    value: float
    label: str = "given scale"


def tensor_error(name: str, x, ref, budget_value: float, scale: "Normaliser | float | None" = None) -> TensorError:
    """Compare one tensor with its reference (float64 arithmetic).

    Args:
        x: the kernel's tensor, any float dtype, any shape.
        ref: the reference, same number of elements (compared flattened).
        budget_value: the accepted max-normalised error.
        scale: a normaliser (:class:`Normaliser`, or a plain number labelled ``given
            scale``) for the max-normalised error: ``max|x - r| / max(max|r|, scale)``
            instead of ``/ max|r|``. None, or a value that is not positive and finite:
            ``max|r|``. The relative Frobenius error is unchanged.

    Returns a :class:`TensorError`. Raises ValueError when the element counts differ.
    """
    import torch

    if scale is not None and not isinstance(scale, Normaliser):
        scale = Normaliser(float(scale))
    if scale is not None and not (math.isfinite(scale.value) and scale.value > 0):
        scale = None

    x = x.detach().to(torch.float64).reshape(-1)
    ref = ref.detach().to(torch.float64).reshape(-1)
    if x.numel() != ref.numel():
        raise ValueError(f"{name}: {x.numel()} elements, the reference has {ref.numel()}")
    ref_ok = torch.isfinite(ref)
    ref_nonfinite = int((~ref_ok).sum())
    x, ref = x[ref_ok], ref[ref_ok]
    ref_max = ref.abs().max().item() if ref.numel() else 0.0
    bad = int((~torch.isfinite(x)).sum())
    if bad:
        return TensorError(name, math.inf, math.inf, bad, ref_nonfinite, float(budget_value), scale, ref_max)
    if x.numel() == 0:
        return TensorError(name, 0.0, 0.0, 0, ref_nonfinite, float(budget_value), scale, ref_max)
    diff = x - ref
    denom = max(ref_max, scale.value) if scale is not None else ref_max
    max_norm = diff.abs().max().item() / denom if denom > 0 else diff.abs().max().item()
    fro = torch.linalg.vector_norm(ref).item()
    dfro = torch.linalg.vector_norm(diff).item()
    rel_fro = dfro / fro if fro > 0 else dfro
    return TensorError(name, max_norm, rel_fro, 0, ref_nonfinite, float(budget_value), scale, ref_max)


@dataclasses.dataclass
class Verdict:
    """The verdict over every compared tensor of one case.

    Attributes:
        errors: one :class:`TensorError` per tensor, in comparison order.
        problem: a reason the comparison itself failed (missing gradient, shape mismatch).
    """

    errors: list[TensorError]
    problem: str | None = None

    @property
    def passed(self) -> bool:
        """True when there is no problem and every tensor is within its budget."""
        return self.problem is None and all(e.passed for e in self.errors)

    @property
    def worst(self) -> TensorError | None:
        """The tensor that decides: the largest ``max_norm / budget`` (non-finite first)."""
        if not self.errors:
            return None
        return max(self.errors, key=lambda e: (e.nonfinite > 0, e.ratio))

    @property
    def nonfinite(self) -> int:
        """NaN/inf values where the reference is finite, over all tensors."""
        return sum(e.nonfinite for e in self.errors)

    def reason(self, where: str = "") -> str | None:
        """One line for the ``reason`` column when failed (None when passed)."""
        at = f" ({where})" if where else ""
        if self.problem:
            return f"numerics: {self.problem}{at}"
        w = self.worst
        if w is None or self.passed:
            return None
        failing = [e for e in self.errors if not e.passed]
        others = f"; also {', '.join(e.name for e in failing if e is not w)}" if len(failing) > 1 else ""
        if w.nonfinite:
            return f"numerics: {w.nonfinite} non-finite values in {w.name} where the reference is finite{others}{at}"
        vs = f" ({w.name} {w.normaliser_text})" if w.scale is not None else ""
        return (f"numerics: max-normalised error {w.max_norm:.3g} on {w.name} exceeds its budget "
                f"{w.budget:.3g} ({w.max_norm / w.budget:.1f}x; relF {w.rel_fro:.3g}){vs}{others}{at}")

    def columns(self) -> dict[str, Any]:
        """The row's numerics columns: ``numerics_err`` (max-normalised error of the
        deciding tensor), ``numerics_worst``, ``numerics_budget``, ``numerics_relf``,
        ``numerics_nonfinite``, ``numerics_detail`` (JSON: tensor -> [max_norm, rel_fro,
        budget, nonfinite], with a fifth entry, the normaliser, for a tensor judged
        against a given scale: ``"vs summand scale 31.6 (max|ref| 4.1e-08)"``)."""
        w = self.worst
        detail = {}
        for e in self.errors:
            detail[e.name] = [_finite_or_none(e.max_norm), _finite_or_none(e.rel_fro), e.budget, e.nonfinite]
            if e.scale is not None:
                detail[e.name].append(e.normaliser_text)
        return {
            "numerics_err": None if w is None else w.max_norm,
            "numerics_worst": None if w is None else w.name,
            "numerics_budget": None if w is None else w.budget,
            "numerics_relf": None if w is None else w.rel_fro,
            "numerics_nonfinite": self.nonfinite,
            "numerics_detail": json.dumps(detail, sort_keys=True),
        }


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def judge(pairs: Mapping[str, tuple[Any, Any]], *, dtype: str, tf32: bool | None = None,
          overrides: Mapping[str, Budget | Mapping[str, float]] | None = None,
          tolerance: float | None = None,
          scales: Mapping[str, "Normaliser | float"] | None = None) -> Verdict:
    """Compare every (kernel, reference) tensor pair with its budget.

    Args:
        pairs: tensor name -> (kernel tensor, float64 reference tensor); names as
            :func:`tensor_class` reads them.
        dtype, tf32, overrides, tolerance: as :func:`budget`.
        scales: tensor name -> normaliser of its max-normalised error
            (:class:`Normaliser` or a number): that tensor's error is ``max|x - r| /
            max(max|r|, scale)``, and its detail and reason say so. Tensors not named keep
            ``max|r|``. The mLSTM family's df: :func:`reference_scales`.

    Returns a :class:`Verdict`; a pair whose element counts differ becomes its ``problem``.
    """
    errors = []
    scales = scales or {}
    for name, (x, ref) in pairs.items():
        b = budget(name, dtype, tf32, overrides, tolerance)
        try:
            errors.append(tensor_error(name, x, ref, b, scales.get(name)))
        except ValueError as exc:
            return Verdict(errors, problem=str(exc))
    return Verdict(errors)


def tf32_text(dtype: str, tf32: bool | None) -> str | None:
    """The ``tf32`` column: ``yes`` / ``no`` / ``unknown`` for float32 cases, None otherwise."""
    if dtype != "float32":
        return None
    return {True: "yes", False: "no", None: "unknown"}[tf32]


# --------------------------------------------------------------------------- normalisers


def mlstm_df_scale(q, k, f, dq_ref, dk_ref, dC=None, C_last=None, df_ref=None) -> float:
    """The scale the mLSTM forget-gate gradient df is judged against
    (docs/tfla-verification.md 5.1).

    Every kernel (ours and mlstm_kernels) computes df by the difference identity
    (docs/tfla-kernels.md 3.4) ``df_t = σ(-f_t) [Σ_{u>=t} (q_u·dq_u - k_u·dk_u) + ⟨dC_S, C_S⟩]``.
    Where forget gates are closed (f ~ N(-20, 2)) the true df is ~1e-8 while the summands
    are O(1), so a float kernel's df error is rounding noise of the summands; its size
    is measured against::

        max( max|df_ref|, max_t σ(-f_t) [Σ_{u>=t} (|q_u| |dq_u| + |k_u| |dk_u|) + |⟨dC_S, C_S⟩|] )

    with |·| the L2 norm over the head dimension, per (batch, head), the max over all.

    Args:
        q, k: (B, NH, S, d_qk) inputs (the float64 reference's); f: (B, NH, S) forget-gate
            pre-activations. The mLSTM layout of ``tfla`` and ``mlstm_kernels`` alike.
        dq_ref, dk_ref: (B, NH, S, d_qk) the reference's gradients of q and k.
        dC, C_last: (B, NH, d_qk, d_hv) the gradient reaching the last state and the last
            state, only where a last-state gradient is used (otherwise the term is 0).
        df_ref: the reference df (B, NH, S); None: its max is left to the caller
            (:func:`tensor_error` takes ``max(max|r|, scale)`` anyway).

    Returns the scale (float). Raises ValueError for shapes that do not fit together.
    """
    import torch

    q, k, f, dq, dk = (t.detach().to(torch.float64) for t in (q, k, f, dq_ref, dk_ref))
    if q.dim() != 4 or k.shape != q.shape or dq.shape != q.shape or dk.shape != q.shape:
        raise ValueError(f"mlstm_df_scale: q, k, dq, dk must be (B, NH, S, d) alike; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(dq.shape)}, {tuple(dk.shape)}")
    if tuple(f.shape) != tuple(q.shape[:-1]):
        raise ValueError(f"mlstm_df_scale: f must be (B, NH, S) = {tuple(q.shape[:-1])}; got {tuple(f.shape)}")
    per_t = q.norm(dim=-1) * dq.norm(dim=-1) + k.norm(dim=-1) * dk.norm(dim=-1)   # (B, NH, S)
    rev = per_t.flip(-1).cumsum(-1).flip(-1)                                      # Σ_{u>=t}
    if dC is not None and C_last is not None:
        T = (dC.detach().to(torch.float64) * C_last.detach().to(torch.float64)).sum((-2, -1)).abs()
        rev = rev + T.reshape(*rev.shape[:-1], 1)
    scale = (torch.sigmoid(-f) * rev).max().item() if rev.numel() else 0.0
    if df_ref is not None and df_ref.numel():
        scale = max(scale, df_ref.detach().to(torch.float64).abs().max().item())
    return float(scale)


#: What a summand-scale normaliser is called in rows (``numerics_detail``, reason).
SUMMAND_SCALE = "summand scale"


def _mlstm_scales(inputs: Mapping[str, Any], pairs: Mapping[str, tuple[Any, Any]],
                  last_grads: Mapping[str, Any] | None = None) -> dict[str, Normaliser]:
    if "df" not in pairs or "dq" not in pairs or "dk" not in pairs:
        return {}
    if not all(n in inputs for n in ("q", "k", "f")):
        return {}
    dC = C = None
    if last_grads and "last_C" in last_grads:
        dC, C = last_grads["last_C"]
    value = mlstm_df_scale(inputs["q"], inputs["k"], inputs["f"], pairs["dq"][1], pairs["dk"][1],
                           dC=dC, C_last=C, df_ref=pairs["df"][1])
    return {"df": Normaliser(value, SUMMAND_SCALE)}


#: family (``Family.numerics_family``) -> (reference inputs, pairs, last-state gradients)
#: -> tensor name -> :class:`Normaliser`: the tensors a family judges against something
#: other than their own max. mLSTM (``tfla``, ``mlstm_kernels``, ``custom`` with the mLSTM
#: layout): df against its summand scale (:func:`mlstm_df_scale`).
FAMILY_SCALES: dict[str, Any] = {"mlstm": _mlstm_scales}


def reference_scales(family: str, inputs: Mapping[str, Any], pairs: Mapping[str, tuple[Any, Any]],
                     last_grads: Mapping[str, tuple[Any, Any]] | None = None) -> dict[str, Normaliser]:
    """The ``scales`` argument of :func:`judge` for a case of ``family``.

    Args:
        family: ``Family.numerics_family`` (``mlstm``...); families not in
            :data:`FAMILY_SCALES` get none.
        inputs: the float64 reference's inputs (name -> tensor: ``q``, ``k``, ``f``...).
        pairs: as :func:`judge` (the reference gradients are the pairs' second items);
            without ``df``, ``dq``, ``dk`` (a ``fwd`` case) there is nothing to scale.
        last_grads: last-state name -> (gradient reaching it, the reference's last state),
            where the backward starts from a last-state gradient too (``last_C``); the
            gate and ``verify`` backpropagate the output only (None).

    Returns tensor name -> :class:`Normaliser` (empty when none applies).
    """
    fn = FAMILY_SCALES.get(family)
    return fn(inputs, pairs, last_grads) if fn is not None else {}


__all__ = [
    "Budget", "DEFAULT_BUDGETS", "BUDGET_REASONS", "TENSOR_CLASSES", "GATE_GRADIENTS", "PRECISIONS",
    "tensor_class", "precision", "budget", "TensorError", "tensor_error", "Verdict", "judge", "tf32_text",
    "Normaliser", "mlstm_df_scale", "FAMILY_SCALES", "reference_scales", "SUMMAND_SCALE",
]


# --------------------------------------------------------------------------- suite schema


class BudgetOverride(BaseModel):
    """A suite's partial budget row (``numerics.budgets.<precision>``): classes left out
    keep the default. Numbers may be written ``1e-2`` (YAML 1.1 reads that as text)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    out: B.Float(0.0, B.MAX_BUDGET, lo_open=True) | None = None
    state: B.Float(0.0, B.MAX_BUDGET, lo_open=True) | None = None
    grad: B.Float(0.0, B.MAX_BUDGET, lo_open=True) | None = None
    gate_grad: B.Float(0.0, B.MAX_BUDGET, lo_open=True) | None = None

    def get(self, cls: str) -> float | None:
        """The override of a tensor class, or None."""
        return getattr(self, cls)


class RegimeSpec(BaseModel):
    """One input regime of ``tflabench verify``: normal distributions (mean, std) of the
    forget-gate and input-gate pre-activations, and a factor on q and k. Unset fields keep
    the backend's own inputs (f ~ N(3, 1), i ~ N(0, 1), q, k ~ N(0, 1) for the mLSTM).

    Per family (``tflabench.run.verify_case.FAMILY_PROFILES``): mLSTM ``i``, ``f`` are the gate
    pre-activations; GLA's log forget gate is ``logsigmoid(f)``; Mamba 2's ``dt`` (before
    its bias and softplus) is ``-f``, so that a large f keeps the state (decay exp(Δ A) -> 1)
    as for the mLSTM; ``qk_scale`` multiplies q and k (attention: the logits by its square).
    A regime that sets a field a family lacks does not apply to it (no case).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    f: tuple[B.Float(-1e6, 1e6), B.Float(0.0, 1e6)] | None = None
    i: tuple[B.Float(-1e6, 1e6), B.Float(0.0, 1e6)] | None = None
    qk_scale: B.Float(0.0, 1e6, lo_open=True) | None = None
    description: str = ""

    def fields_set(self) -> set[str]:
        """The input fields this regime changes (``f``, ``i``, ``qk``)."""
        out = set()
        if self.f is not None:
            out.add("f")
        if self.i is not None:
            out.add("i")
        if self.qk_scale is not None:
            out.add("qk")
        return out


#: Built-in regimes (name -> spec), from saturated-open to saturated-closed gates, the
#: benchmark's standard gates, a wide spread, and large / small attention logits.
REGIMES: dict[str, RegimeSpec] = {
    "standard": RegimeSpec(description="the backend's own inputs, as the benchmark and the gate "
                                       "(mLSTM: f ~ N(3, 1), i ~ N(0, 1))"),
    "f_open": RegimeSpec(f=(20.0, 1.0), description="forget gates saturated open: f ~ N(20, 1)"),
    "f_closed": RegimeSpec(f=(-20.0, 2.0), description="forget gates saturated closed: f ~ N(-20, 2)"),
    "i_open": RegimeSpec(i=(30.0, 5.0), description="input gates saturated open: i ~ N(30, 5)"),
    "i_closed": RegimeSpec(i=(-30.0, 5.0), description="input gates saturated closed: i ~ N(-30, 5)"),
    "wide": RegimeSpec(f=(0.0, 25.0), i=(0.0, 25.0), description="wide gates: f, i ~ N(0, 25)"),
    "qk_large": RegimeSpec(qk_scale=4.0, description="q, k x 4 (attention logits x 16: saturated softmax)"),
    "qk_small": RegimeSpec(qk_scale=0.01, description="q, k x 0.01 (near-uniform attention)"),
}


class VerifySettings(BaseModel):
    """The suite's ``numerics.verify`` section: the grid of ``tflabench verify``.

    Attributes:
        regimes: names from :data:`REGIMES` or ``custom_regimes``; None: every regime that
            applies to the kernel's family.
        custom_regimes: further regimes, name -> :class:`RegimeSpec`.
        seq_lens: sequence lengths; None: per kernel with chunk L (64 when it has none)
            ``[L // 2 + 1, 2 L, 2 L + L // 2 + 1]``: shorter than one chunk, whole chunks,
            and a partial last chunk.
        initial_state: run without and/or with an initial state (kernels that take one).
        modes: ``fwd`` (output, last state) and/or ``fwdbw`` (also every input gradient;
            the default, a superset of ``fwd``; kernels whose backward is refused here run
            ``fwd`` instead).
        dtypes: None: the suite's dtypes.
        heads: heads per case (at most the kernel's); batch is 1.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    regimes: list[str] | None = None
    custom_regimes: dict[str, RegimeSpec] = Field(default_factory=dict)
    seq_lens: list[B.Int(1, B.MAX_SEQ_LEN)] | None = None
    initial_state: list[bool] = Field(default_factory=lambda: [False, True], min_length=1)
    modes: list[str] = Field(default_factory=lambda: ["fwdbw"], min_length=1)
    dtypes: list[str] | None = None
    heads: B.Int(1, B.MAX_KERNEL_PARAM) = 2

    @model_validator(mode="after")
    def _check(self):
        for name in ("regimes", "seq_lens", "initial_state", "modes", "dtypes"):
            values = getattr(self, name)
            problem = B.axis_problem(list(values)) if values is not None else None
            if problem:
                raise ValueError(f"{name}: {problem}")
        known = set(REGIMES) | set(self.custom_regimes)
        for n, name in enumerate(self.regimes or []):
            if name not in known:
                raise ValueError(f"regimes[{n}]: unknown regime {name!r}; known: {', '.join(sorted(known))}")
        for n, s in enumerate(self.seq_lens or []):
            if s < 1:
                raise ValueError(f"seq_lens[{n}]: {s} must be >= 1")
        for n, m in enumerate(self.modes):
            if m not in ("fwd", "fwdbw"):
                raise ValueError(f"modes[{n}]: {m!r}; allowed: fwd, fwdbw")
        for n, d in enumerate(self.dtypes or []):
            if d not in ("bfloat16", "float16", "float32", "float64"):
                raise ValueError(f"dtypes[{n}]: {d!r}; allowed: bfloat16, float16, float32, float64")
        return self

    def regime(self, name: str) -> RegimeSpec:
        """The spec of a regime name (custom first). Raises KeyError when unknown."""
        return self.custom_regimes.get(name) or REGIMES[name]
