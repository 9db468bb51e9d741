"""``fla_delta`` backend: the delta-rule kernels of flash-linear-attention (``fla-core``).

``op`` selects the kernel:

- ``chunk_gated_delta_rule``: ``fla.ops.gated_delta_rule.chunk_gated_delta_rule``, gated
  DeltaNet (Yang, Kautz, Hatamizadeh, ICLR 2025, eq. 10): a scalar log decay g_t per head
  and step and a write strength beta_t;
- ``chunk_delta_rule``: ``fla.ops.delta_rule.chunk_delta_rule``, DeltaNet (Yang et al.,
  NeurIPS 2024, eq. 1): the same without decay.

Both compute, per head, with the state S (d_qk x d_hv) and keys and queries L2-normalised in
the kernel (``use_qk_l2norm_in_kernel=True``, as fla's DeltaNet and gated DeltaNet layers):

    S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}ᵀ k_t)ᵀ,   o_t = S_tᵀ (scale q_t)

(g = 0 for DeltaNet; scale d_qk^-1/2). fla 0.6.0 runs them chunkwise with the WY
representation at chunk length 64 (``chunk_gated_delta_rule`` refuses chunk sizes other
than 16, 32, 64) and has no ``head_first`` layout: inputs are (B, T, H, D). What we measure
is pinned as fla-core 0.6.0 (``pyproject.toml``, extra ``peers``; docs/offline-peers.md).

Layout: the mLSTM's (paper App. E.3): 16 heads, d_qk 128, d_hv 256 at embedding 4096.
The analytic model has no published count of these kernels' FLOPs and bytes (the papers give
their asymptotic cost only), so :meth:`DeltaRuleFamily.model_kind` is None and ``report``
says "no model" (docs/offline-peers.md, section 5).

torch and the peer are imported inside the methods only (``backends/base.py``).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Literal

from tflabench.backends import register
from tflabench.backends.base import Backend, HeadLayoutParams, Shape, peer_unavailable, resolve_layout
from tflabench.backends.base import find_spec as _find_spec
from tflabench.backends.family import Family
from tflabench.backends.fla import backward_640_error, backward_640_refusal, bthd_inputs

INSTALL_HINT = "pip install fla-core==0.6.0 einops (Triton kernels: a CUDA GPU)"

#: op -> (module, function) in fla-core 0.6.0.
DELTA_OPS: dict[str, tuple[str, str]] = {
    "chunk_gated_delta_rule": ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
    "chunk_delta_rule": ("fla.ops.delta_rule", "chunk_delta_rule"),
}

#: The ops with a decay gate g (B, T, H).
GATED_OPS = frozenset({"chunk_gated_delta_rule"})

#: fla's chunk length of both ops (its default; the gated op takes 16, 32 or 64).
DELTA_CHUNK = 64

#: The epsilon of fla's in-kernel L2 norm (``fla.modules.l2norm.l2norm_fwd``):
#: x / sqrt(sum x² + eps).
L2NORM_EPS = 1e-6


class DeltaRuleParams(HeadLayoutParams):
    """What a suite may set for ``fla_delta``.

    Attributes:
        op: ``chunk_gated_delta_rule`` (default, gated DeltaNet) or ``chunk_delta_rule``
            (DeltaNet).
        heads, d_hv, d_qk, p_qk: head layout; with neither heads nor d_hv set, 16 heads with
            d_qk = 0.5 d_hv (the mLSTM's layout, paper App. E.3).
    """

    op: Literal["chunk_gated_delta_rule", "chunk_delta_rule"] = "chunk_gated_delta_rule"
    p_qk: float = 0.5


def l2_normalise(x, eps: float = L2NORM_EPS):
    """``x / sqrt(sum(x², -1) + eps)`` over the last dimension (fla's L2 norm), same dtype."""
    return x / (x * x).sum(-1, keepdim=True).add(eps).sqrt()


def delta_rule_reference(q, k, v, beta, g=None, scale=None, l2norm: bool = True):
    """The (gated) delta rule by its recurrence, one step at a time, float64, differentiable.

    With q, k L2-normalised (``l2norm``) and a_t = exp(g_t) (1 without g):
    S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}ᵀ k_t)ᵀ and o_t = S_tᵀ (scale q_t)
    (gated DeltaNet, Yang et al. ICLR 2025, eq. 10; DeltaNet, Yang et al. NeurIPS 2024,
    eq. 1; fla's conventions).

    Args:
        q, k: (B, T, H, d_qk); v: (B, T, H, d_hv); beta: (B, T, H) write strengths;
        g: (B, T, H) log decays or None (DeltaNet); any float dtype (computed in float64).
        scale: default d_qk^-1/2.

    Returns:
        o (B, T, H, d_hv) float64.
    """
    import torch

    q, k, v, beta = (t.to(torch.float64) for t in (q, k, v, beta))
    if l2norm:
        q, k = l2_normalise(q), l2_normalise(k)
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    decay = None if g is None else g.to(torch.float64).exp()
    state = q.new_zeros(B, H, K, v.shape[-1])
    outs = []
    for t in range(T):
        if decay is not None:
            state = decay[:, t, :, None, None] * state
        k_t = k[:, t]                                                   # (B, H, K)
        error = v[:, t] - torch.einsum("bhkv,bhk->bhv", state, k_t)     # (B, H, V)
        state = state + (beta[:, t, :, None] * k_t)[..., None] * error[:, :, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, state))
    return torch.stack(outs, dim=1)


@functools.lru_cache(maxsize=None)
def _delta_op(op: str):
    module, function = DELTA_OPS[op]
    return getattr(importlib.import_module(module), function)


class DeltaRuleFamily(Family):
    """The delta rules in fla's conventions (backend ``fla_delta``: gated DeltaNet, DeltaNet):
    inputs in fla's (B, T, H, .) layout with beta (and the log decay g of the gated op),
    float64 reference :func:`delta_rule_reference`, no model count. Reads the params' ``op``."""

    name = "delta_rule"
    #: fla's delta-rule kernels: the chunk-state kernels are the recurrent part, the
    #: intra-chunk ones (WY representation, triangular solve, outputs) the parallel part.
    KERNEL_PARTS = (
        (r"kernel_h\b|kernel_dhu\b|kernel_h_|kernel_dhu_|_h_fwd|_dhu_bwd", "recurrent"),
        (r"chunk|wy|solve_tril|kkt|cumsum|l2norm|recompute", "parallel"),
    )

    def make_inputs(self, params, shape, dtype, device, seed, requires_grad=False):
        """fla's native layout, contiguous: q, k (B, T, H, d_qk) and v (B, T, H, d_hv)
        ~ N(0, 1) in ``dtype``; beta = sigmoid(N(0, 1)) (B, T, H) in ``dtype`` (the layers'
        ``b_proj(x).sigmoid()``); for the gated op the log decay g = logsigmoid(N(3, 1))
        (B, T, H) in float32 (the layer computes its gate in float32). With
        ``requires_grad`` all are leaves with gradients. Raises ValueError for float32 with
        ``chunk_delta_rule`` (fla-core 0.6.0's ``ChunkDeltaRuleFunction`` asserts against it)."""
        import torch
        import torch.nn.functional as F

        if params.op == "chunk_delta_rule" and dtype == torch.float32:
            raise ValueError("dtype: fla's chunk_delta_rule refuses float32 (fla-core 0.6.0); use bfloat16 or float16")

        B, T, H = shape.batch, shape.seq_len, shape.heads
        inputs, normal = bthd_inputs(shape, dtype, device, seed)
        inputs["beta"] = torch.sigmoid(normal((B, T, H))).to(dtype)
        if params.op in GATED_OPS:
            gate_dtype = torch.float64 if dtype == torch.float64 else torch.float32
            inputs["g"] = F.logsigmoid(normal((B, T, H), mean=3.0)).to(gate_dtype)
        for t in inputs.values():
            t.requires_grad_(requires_grad)
        return inputs

    def reference(self, params: DeltaRuleParams, inputs: dict[str, Any]):
        """float64 delta rule (:func:`delta_rule_reference`), o (B, T, H, d_hv)."""
        return delta_rule_reference(inputs["q"], inputs["k"], inputs["v"], inputs["beta"],
                                    g=inputs.get("g"))

    def numerics_family(self, params: DeltaRuleParams) -> str:
        """``delta_rule_gated`` for the gated op (``verify`` redraws its log decay g as GLA's
        forget-gate regimes), else the family (no regime field: q and k are L2-normalised in
        the kernel, so scaling them changes nothing)."""
        return "delta_rule_gated" if params.op in GATED_OPS else self.name

    def model_kind(self, params: DeltaRuleParams, shape: Shape, mode: str):
        """None: no published FLOP/byte count of the chunkwise WY kernels (module docstring)."""
        return None


class DeltaRuleBackend(Backend):
    """flash-linear-attention's chunkwise gated DeltaNet and DeltaNet kernels."""

    name = "fla_delta"
    family = DeltaRuleFamily()
    description = ("flash-linear-attention chunk_gated_delta_rule | chunk_delta_rule (WY chunkwise, L 64); "
                   "16 heads, d_qk 128, d_hv 256 by default")
    install_hint = INSTALL_HINT
    requires = ("fla", "einops", "triton")
    Params = DeltaRuleParams
    default_heads = 16

    def layout(self, params: DeltaRuleParams, embedding_dim: int) -> tuple[int, int, int]:
        """(heads, d_qk, d_hv), default 16 heads with d_qk = d_hv / 2. Raises UserError
        naming the field."""
        return resolve_layout(params, embedding_dim, self.default_heads)

    def chunk_size(self, params: DeltaRuleParams) -> int:
        """The chunk length fla runs (64)."""
        return DELTA_CHUNK

    def available(self, params: DeltaRuleParams) -> str | None:
        """None when ``fla.ops`` imports the op and a CUDA GPU is present; else the reason
        with the install hint."""
        return peer_unavailable(self.installed(_find_spec),
                                install_hint=self.install_hint, load=lambda: _delta_op(params.op),
                                gpu_subject="fla's Triton kernels need",
                                import_subject=f"fla.ops ({params.op})")

    def unsupported_mode(self, params: DeltaRuleParams, mode: str) -> str | None:
        """``fwdbw`` of gated DeltaNet is unsupported where fla refuses its gated backward
        (fla issue #640: Hopper GPU with 3.4.0 <= triton < 3.7.1; the fla backend's rule)."""
        base = super().unsupported_mode(params, mode)
        if base is not None or mode != "fwdbw" or params.op not in GATED_OPS:
            return base
        return backward_640_refusal(params.op)

    def classify_error(self, params: DeltaRuleParams, mode: str, exc: BaseException) -> str | None:
        """fla's #640 refusal raised by the backward: the reason of an ``unavailable`` row."""
        return backward_640_error(params.op, exc)

    def uses_tf32(self, params, dtype, device) -> bool:
        """True for float32 on CUDA: fla's Triton ``tl.dot`` uses TF32 operands for fp32
        inputs by default (Triton's default input precision)."""
        import torch

        return dtype == torch.float32 and str(device).startswith("cuda")

    def forward(self, params: DeltaRuleParams, inputs: dict[str, Any]):
        """The fla op with its default scale (d_qk^-1/2), q and k L2-normalised in the kernel,
        no initial state; returns o (B, T, H, d_hv) in the input dtype."""
        fn = _delta_op(params.op)
        args = [inputs["q"], inputs["k"], inputs["v"]]
        if params.op in GATED_OPS:
            args.append(inputs["g"])
        out = fn(*args, inputs["beta"], use_qk_l2norm_in_kernel=True)
        return out[0] if isinstance(out, (tuple, list)) else out


register(DeltaRuleBackend())
