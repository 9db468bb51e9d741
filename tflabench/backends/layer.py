"""Backend ``layer``: one sequence-mixing layer of a language model around a registered kernel,
so that a suite times what reaches a training step, not the kernel alone.

``mixer: mlstm`` is the xLSTM 7B mLSTM layer (Beck et al., "xLSTM 7B", 2025, Section 3 and its
Figure 2; the TFLA paper's Section 5.3 trains it): an RMS pre-norm, the q, k, v projections,
the input and forget gate pre-activations per head (soft-capped at 15 by ``15 tanh(x / 15)``),
the output gate ``sigmoid(W_o x)``, the mLSTM cell (the ``cell`` backend: ours or the authors'),
a per-head RMS norm of h, the output gate, the output projection and the residual.
``mixer: attention`` is a causal self-attention layer of the same width: RMS pre-norm, one
q/k/v projection, the attention kernel (the ``cell`` backend: FlashAttention, cuDNN or flash
SDPA), the output projection and the residual. The embedding dimension is
``heads * d_hv`` (4096 at xLSTM 7B's 8 heads of 512 and at 32 attention heads of 128).

Inputs: the activations ``x`` (B, S, E) ~ N(0, 1) in the case dtype and the layer's weights
(``W_*``, scaled by 1/sqrt(fan-in); gate biases in float32, the forget gate's at +3 as the
peers' benchmark inputs), all leaf tensors with ``requires_grad`` for ``fwdbw``: a training
step computes the weights' gradients too. The layer has no float64 reference of its own: the
cell's numerics are those of its kernel suites (``tflabench verify``), and no analytic model
(``report`` says "no model").
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, model_validator

from tflabench.backends import get_backend, register
from tflabench.backends.base import Backend, BackendParams, HeadLayoutParams, Shape
from tflabench.backends.family import Family

#: the gate soft-cap of xLSTM 7B: pre-activations pass through ``cap * tanh(x / cap)``
GATE_SOFT_CAP = 15.0
#: the cell backends each mixer takes
CELLS = {"mlstm": ("tfla", "mlstm_kernels"), "attention": ("fa3", "fa4", "sdpa")}


class LayerParams(HeadLayoutParams):
    """What a suite may set for ``layer``.

    Attributes:
        mixer: ``mlstm`` (xLSTM 7B's mLSTM layer) or ``attention``.
        cell: the registered backend that runs the cell (:data:`CELLS`).
        cell_params: that backend's own parameters (its head layout is the layer's), as the
            suite gives them; validated with the layer's, and kept parsed (:func:`_cell`).
        heads, d_qk, d_hv, p_qk: the head layout; the embedding is ``heads * d_hv``.
    """

    mixer: Literal["mlstm", "attention"] = "mlstm"
    cell: str = "tfla"
    cell_params: dict[str, Any] = Field(default_factory=dict)
    #: the cell backend's ``Params`` of ``cell_params`` and the layer's head layout, parsed once
    _cell_parsed: BackendParams | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _cell_fits_mixer(self):
        allowed = CELLS[self.mixer]
        if self.cell not in allowed:
            raise ValueError(f"cell: got {self.cell!r} for mixer {self.mixer!r}; allowed: {', '.join(allowed)}")
        for key in ("heads", "d_qk", "d_hv", "p_qk"):
            if key in self.cell_params:
                raise ValueError(f"cell_params.{key}: the head layout is the layer's; set {key} beside cell")
        raw = dict(self.cell_params)
        raw.update({name: getattr(self, name) for name in ("heads", "d_qk", "d_hv") if getattr(self, name) is not None})
        try:
            self._cell_parsed = get_backend(self.cell).parse_params(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = f".{err['loc'][0]}" if err["loc"] else ""   # the field (not pydantic's union tags)
            raise ValueError(f"cell_params{where}: "
                             f"{str(err['msg']).removeprefix('Value error, ')}") from None
        return self


def _cell(params: LayerParams) -> tuple[Backend, BackendParams]:
    """The cell's backend and its parameters (the layer's head layout), as parsed with the
    layer's (:class:`LayerParams`)."""
    return get_backend(params.cell), params._cell_parsed


def _seq_major(cell: Backend) -> bool:
    """Whether the attention cell backend's q is (B, S, NH, D) (FlashAttention's layout) rather
    than (B, NH, S, D): its family's declared ``layout``. Read off the declaration, not off
    inputs made for a probe: a cell that runs bfloat16 only (the ``fa3_fwd`` wheel) refuses
    a probe in another dtype."""
    return cell.family.layout == "BSHD"


class LayerFamily(Family):
    """One language-model layer around a cell kernel (backend ``layer``; module docstring):
    ``x`` and the layer's weights as inputs; no float64 reference (the layer's numerics
    are its cell's) and no model count."""

    name = "layer"

    def make_inputs(self, params: LayerParams, shape: Shape, dtype, device, seed, requires_grad=False):
        """``x`` (B, S, E) and the weights of :func:`layer_forward` (module docstring)."""
        import torch

        gen = torch.Generator(device=device).manual_seed(seed)
        E, NH = shape.heads * shape.d_hv, shape.heads

        def randn(*size, scale=1.0, mean=0.0, dt=dtype):
            x = torch.randn(*size, generator=gen, device=device, dtype=torch.float32) * scale + mean
            return x.to(dt).requires_grad_(requires_grad)

        def weight(fan_in, fan_out):
            return randn(fan_in, fan_out, scale=1.0 / math.sqrt(fan_in))

        inputs = {"x": randn(shape.batch, shape.seq_len, E), "w_norm": randn(E, scale=0.0, mean=1.0)}
        if params.mixer == "mlstm":
            inputs.update(
                W_q=weight(E, NH * shape.d_qk), W_k=weight(E, NH * shape.d_qk), W_v=weight(E, E),
                W_if=weight(E, 2 * NH), b_if=torch.cat([torch.zeros(NH), torch.full((NH,), 3.0)]).to(
                    device).requires_grad_(requires_grad),
                W_o=weight(E, E), w_hnorm=randn(shape.d_hv, scale=0.0, mean=1.0), W_out=weight(E, E))
        else:
            inputs.update(W_qkv=weight(E, NH * (2 * shape.d_qk + shape.d_hv)), W_out=weight(E, E))
        inputs["_shape"] = shape
        return inputs

    def reference(self, params: LayerParams, inputs):
        """None to give: raises NotImplementedError (the gate records no reference)."""
        raise NotImplementedError("the layer's numerics are its cell's (the kernel suites, tflabench verify)")


class LayerBackend(Backend):
    name = "layer"
    family = LayerFamily()
    description = "one language-model layer (xLSTM 7B mLSTM layer or attention) around a kernel, fwd and fwd+bwd"
    install_hint = "the cell backend's own (tflabench backends)"
    Params = LayerParams
    default_heads = 8

    def chunk_size(self, params: LayerParams) -> int | None:
        backend, cell_params = _cell(params)
        return backend.chunk_size(cell_params)

    def run_plan(self, params: LayerParams, shape: Shape, mode: str, dtype, device: str) -> dict:
        backend, cell_params = _cell(params)
        return backend.run_plan(cell_params, shape, mode, dtype, device)

    def available(self, params: LayerParams) -> str | None:
        backend, cell_params = _cell(params)
        reason = backend.available(cell_params)
        return None if reason is None else f"cell {params.cell}: {reason}"

    def unsupported_mode(self, params: LayerParams, mode: str) -> str | None:
        backend, cell_params = _cell(params)
        reason = backend.unsupported_mode(cell_params, mode)
        return None if reason is None else f"cell {params.cell}: {reason}"

    def note(self, params: LayerParams, device: str) -> str | None:
        backend, cell_params = _cell(params)
        inner = backend.note(cell_params, device)
        return f"{params.mixer} layer, cell {params.cell}" + (f" ({inner})" if inner else "")

    def forward(self, params: LayerParams, inputs):
        return layer_forward(params, inputs)


def layer_forward(params: LayerParams, inputs: dict[str, Any]):
    """One layer on ``inputs`` (:meth:`LayerFamily.make_inputs`): returns y (B, S, E) in x's
    dtype, ``x + W_out(...)`` (module docstring for the two mixers)."""
    import torch
    import torch.nn.functional as F

    backend, cell_params = _cell(params)
    x, shape = inputs["x"], inputs["_shape"]
    B, S, E = x.shape
    NH, d_qk, d_hv = shape.heads, shape.d_qk, shape.d_hv
    xn = F.rms_norm(x, (E,), inputs["w_norm"])

    def heads(t, d):  # (B, S, NH*d) -> the cell's layout
        t = t.reshape(B, S, NH, d)
        return t if seq_major else t.transpose(1, 2).contiguous()

    if params.mixer == "mlstm":
        seq_major = False
        q, k, v = heads(xn @ inputs["W_q"], d_qk), heads(xn @ inputs["W_k"], d_qk), heads(xn @ inputs["W_v"], d_hv)
        gates = (xn.float() @ inputs["W_if"].float() + inputs["b_if"])
        gates = GATE_SOFT_CAP * torch.tanh(gates / GATE_SOFT_CAP)            # (B, S, 2 NH)
        i, f = gates.transpose(1, 2).split(NH, dim=1)                        # (B, NH, S) each
        h = backend.forward(cell_params, {"q": q, "k": k, "v": v, "i": i.contiguous(), "f": f.contiguous(),
                                          "_device": str(x.device)})         # (B, NH, S, d_hv)
        h = F.rms_norm(h, (d_hv,), inputs["w_hnorm"]).transpose(1, 2).reshape(B, S, E)
        mixed = h * torch.sigmoid(xn @ inputs["W_o"])
    else:
        seq_major = _seq_major(backend)
        q, k, v = (xn @ inputs["W_qkv"]).split([NH * d_qk, NH * d_qk, NH * d_hv], dim=-1)
        o = backend.forward(cell_params, {"q": heads(q, d_qk), "k": heads(k, d_qk), "v": heads(v, d_hv)})
        mixed = (o if seq_major else o.transpose(1, 2)).reshape(B, S, E)
    return x + mixed.to(x.dtype) @ inputs["W_out"]


register(LayerBackend())
