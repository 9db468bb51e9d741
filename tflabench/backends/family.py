"""The knowledge of a kernel family, one home per family (issue 44).

A :class:`Family` knows what every kernel of the family computes, independent of which
package runs it: the inputs (:meth:`Family.make_inputs`), the float64 ground truth
(:meth:`Family.reference`, :meth:`Family.reference_state`), the initial state
(:meth:`Family.initial_state`), the numerics budgets (:meth:`Family.tolerance`,
:meth:`Family.numerics_family`, :meth:`Family.gate_shape`), the analytic model's counts
(:meth:`Family.model_kind`, :meth:`Family.model_breakdown`, :meth:`Family.model_counts`)
and the model part of each kernel launched (:meth:`Family.kernel_part`). A
:class:`~tflabench.backends.base.Backend` holds one instance (its ``family`` attribute)
and keeps only what is its own: parameters, availability, the forward call and its plan.

Homes: the mLSTM family (``tfla``, ``mlstm_kernels``, ``custom`` with ``layout: mlstm``)
in :mod:`tflabench.backends.mlstm_family`, attention (``sdpa``, ``fa2``/``fa3``/``fa4``)
in :mod:`tflabench.backends.attention_family`; a family measured by one backend module
(fla's GLA forms, Lightning Attention 2, the delta rules, Mamba 1/2/3, the layer) keeps
its class in that module. Where backends of one family differ only in a layout, a check
or a table, that is a constructor argument of the family's class.

Every method runs in the worker and imports torch inside itself (the module is imported
in the parent too).
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from tflabench.backends.base import BackendParams, Shape, model_breakdown
from tflabench.numerics import budget

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: A check of a case's inputs before they are made: ``check(params, shape, dtype)`` raises
#: ValueError naming the field when the kernel cannot take them (the case becomes
#: ``unavailable`` in ``verify``, ``error`` in ``run``).
InputCheck = Callable[[BackendParams, Shape, Any], None]


class Family:
    """What every kernel of one family shares (module docstring). Subclass per family; set
    :attr:`name`; implement :meth:`make_inputs` and :meth:`reference` (and
    :meth:`model_kind` where the analytic model counts the family).

    Args:
        name: the row's ``family`` column (default: the class's :attr:`name`).
        kernel_parts: ``run --profile``'s (regular expression, part) table for the
            backend holding this instance (default: the class's :attr:`KERNEL_PARTS`);
            backends of one family that launch differently named kernels pass their own.
        check_inputs: a backend's constraint on the inputs it takes (:data:`InputCheck`),
            called first by :meth:`make_inputs` where the family's make_inputs does.
    """

    #: The row's ``family`` column (``mlstm``, ``attention``, ``gla``, ``mamba2``...).
    name: ClassVar[str] = ""
    #: ``run --profile``: (regular expression, part) pairs naming the model part
    #: (``recurrent``, ``parallel`` or ``whole``: :data:`tflabench.model.parts.PARTS`) of
    #: the kernels launched; the first pattern found in a kernel's name (``re.search``)
    #: wins; kernels no pattern names count as ``other``.
    KERNEL_PARTS: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __init__(self, *, name: str | None = None, kernel_parts: tuple[tuple[str, str], ...] | None = None,
                 check_inputs: InputCheck | None = None):
        if name is not None:
            self.name = name  # type: ignore[misc]
        if kernel_parts is not None:
            self.KERNEL_PARTS = tuple(kernel_parts)  # type: ignore[misc]
        self.check_inputs = check_inputs

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def _check(self, params: BackendParams, shape: Shape, dtype) -> None:
        """Run :attr:`check_inputs` (ValueError when the kernel cannot take the case)."""
        if self.check_inputs is not None:
            self.check_inputs(params, shape, dtype)

    # ---------------------------------------------------------------- inputs, reference

    def make_inputs(
        self,
        params: BackendParams,
        shape: Shape,
        dtype: "torch.dtype",
        device: str,
        seed: int,
        requires_grad: bool = False,
    ) -> dict[str, Any]:
        """*Required.* The keyword inputs of the backend's ``forward``, in the kernel's
        native layout.

        Args:
            params: the backend's parameters (a family reads fields such as ``variant``).
            shape: the case's :class:`~tflabench.backends.base.Shape` (or the numerics
                gate's reduced one).
            dtype: element type of the activations (q, k, v, x...); gate pre-activations may
                be kept in float32 where the kernel expects that (say so in the docstring).
            device: ``"cuda"`` or ``"cpu"``.
            seed: seed for a ``torch.Generator`` (same seed -> same inputs).
            requires_grad: True for ``fwdbw``: set ``requires_grad`` on exactly the floating
                tensors that the backward differentiates (leaf tensors).

        Returns:
            dict name -> tensor (or plain value). The numerics gate converts each floating
            tensor to a float64 copy (keeping ``requires_grad``) before :meth:`reference`,
            and compares the ``.grad`` of every tensor with ``requires_grad``. Raises
            ValueError when the kernel cannot take the case (a length, a dtype).
        """
        raise NotImplementedError

    def reference(self, params: BackendParams, inputs: dict[str, Any]) -> "torch.Tensor":
        """The family's float64 ground truth on float64 ``inputs`` (same keys as
        :meth:`make_inputs`), differentiable by torch autograd in the kernel's gradient
        convention; same shape and layout as the backend's ``forward`` output. Raise
        NotImplementedError when the family has none (the gate then records no error)."""
        raise NotImplementedError

    def initial_state(self, params: BackendParams, inputs: dict[str, Any], seed: int,
                      requires_grad: bool = False) -> dict[str, Any] | None:
        """An initial state for ``inputs`` (name -> tensor), for ``verify``'s cases with an
        initial state; None (default) when the family's kernels take none. Tensors that the
        backward differentiates get ``requires_grad`` (their gradients are compared, e.g.
        ``dC0``)."""
        return None

    def reference_state(self, params: BackendParams, inputs: dict[str, Any],
                        state: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        """float64 counterpart of the backend's ``forward_state`` (output, last state as
        name -> tensor, names starting with ``last_``), differentiable. Default:
        NotImplementedError."""
        raise NotImplementedError

    # ---------------------------------------------------------------- numerics

    def tolerance(self, params: BackendParams, dtype: "torch.dtype") -> float:
        """Largest max-normalised error (``max|x - x_ref| / max|x_ref|``) of the output and
        the q/k/v gradients at ``dtype`` (full-precision dots for float32): the ``out``
        budget of :data:`tflabench.numerics.DEFAULT_BUDGETS`. The numerics gate and
        ``verify`` use :func:`tflabench.numerics.budget` per tensor (gate gradients looser);
        this is the one-number summary for tests and callers that compare one tensor."""
        name = str(dtype).replace("torch.", "")
        return budget("out", name, tf32=False)

    def numerics_family(self, params: BackendParams) -> str:
        """The family whose input regimes ``tflabench verify`` applies
        (:data:`tflabench.run.verify_case.FAMILY_PROFILES`): default :attr:`name`."""
        return self.name

    def gate_shape(self, params: BackendParams, shape: Shape, max_seq_len: int, chunk_size: int | None) -> Shape:
        """The reduced shape of the numerics gate: batch 1, at most 2 heads, ``seq_len =
        min(S, max(max_seq_len, 2 * chunk_size))`` (so the chunked path still runs over
        several chunks; ``chunk_size``: the backend's, None for none); head dimensions
        unchanged. Override where a kernel constrains S."""
        L = chunk_size or 0
        seq_len = min(shape.seq_len, max(max_seq_len, 2 * L))
        return dataclasses.replace(shape, batch=1, heads=min(shape.heads, 2), seq_len=seq_len)

    # ---------------------------------------------------------------- the analytic model

    def model_kind(self, params: BackendParams, shape: Shape, mode: str) -> tuple[str, dict] | None:
        """The analytic model's kind for this kernel (:data:`tflabench.model.KINDS`) and
        the keyword arguments of ``counts_for_case`` beyond the shape (``L``, ``d_state``)
        at ``mode`` (a chunk size chosen per mode, such as ``"auto"``, resolved), or None
        (default) where the model has no count for it. :meth:`model_counts`,
        :meth:`model_breakdown` and the physical floor are derived from it."""
        return None

    def model_breakdown(self, params: BackendParams, shape: Shape, mode: str):
        """The model's :class:`tflabench.model.Counts` of one call at ``shape`` and ``mode``
        (totals and rows, which :func:`tflabench.model.parts.split_parts` splits by
        part), from :meth:`model_kind`; None where the model has no count."""
        found = self.model_kind(params, shape, mode)
        if found is None:
            return None
        kind, kwargs = found
        return model_breakdown(kind, mode, shape, **kwargs)

    def model_counts(self, params: BackendParams, shape: Shape, mode: str) -> tuple[float, float] | None:
        """(FLOPs, bytes) of one call at ``shape`` and ``mode`` from the analytic model
        (:meth:`model_breakdown`'s totals), or None where the model has no count."""
        counts = self.model_breakdown(params, shape, mode)
        return None if counts is None else (float(counts.flops), float(counts.bytes))

    def kernel_part(self, params: BackendParams, kernel_name: str) -> str | None:
        """The model part (``recurrent``, ``parallel``, ``whole``) of a kernel the backend
        launched, by its name as the profiler reports it (:attr:`KERNEL_PARTS`); None
        (reported as ``other``) for a kernel no pattern names."""
        for pattern, part in self.KERNEL_PARTS:
            if re.search(pattern, kernel_name):
                return part
        return None
