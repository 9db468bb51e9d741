"""The attention family's one home: its inputs and float64 reference, shared by the
``sdpa``, ``fa2`` / ``fa3`` / ``fa4`` and ``custom`` backends (q, k (.., d_qk), v (.., d_hv)):
:class:`AttentionFamily`, and the functions it is made of. torch is imported inside the functions.
"""

from __future__ import annotations

from tflabench.backends.base import Shape, generator
from tflabench.backends.family import Family


def attention_reference(q, k, v, *, causal: bool = True, scale: float | None = None):
    """Softmax attention in float64: ``softmax(q kᵀ * scale + causal mask) v``.

    Args:
        q: (B, NH, S, d_qk); k: (B, NH, S, d_qk); v: (B, NH, S, d_hv), any float dtype
            (computed in float64).
        causal: mask j > t (query t attends to keys 0..t).
        scale: default ``d_qk ** -0.5``.

    Returns:
        (B, NH, S, d_hv) float64, differentiable.
    """
    import torch

    q, k, v = (x.to(torch.float64) for x in (q, k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        S_q, S_k = s.shape[-2], s.shape[-1]
        mask = torch.ones(S_q, S_k, dtype=torch.bool, device=s.device).tril(S_k - S_q)
        s = s.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


def attention_inputs(shape: Shape, dtype, device: str, seed: int, requires_grad: bool = False,
                     layout: str = "BHSD") -> dict:
    """Attention inputs ``q``, ``k`` (d_qk) and ``v`` (d_hv) ~ N(0, 1) in ``dtype``, in
    ``layout`` ``"BHSD"`` (B, NH, S, D) or ``"BSHD"`` (B, S, NH, D; FlashAttention's).
    Deterministic in ``seed``; leaf tensors requiring grad when ``requires_grad``."""
    import torch

    if layout not in ("BHSD", "BSHD"):
        raise ValueError(f"layout: got {layout!r}; allowed: 'BHSD', 'BSHD'")
    gen = generator(device, seed)
    B, NH, S = shape.batch, shape.heads, shape.seq_len

    def randn(d):
        size = (B, NH, S, d) if layout == "BHSD" else (B, S, NH, d)
        x = torch.randn(*size, generator=gen, device=device, dtype=torch.float32)
        return x.to(dtype).requires_grad_(requires_grad)

    return {"q": randn(shape.d_qk), "k": randn(shape.d_qk), "v": randn(shape.d_hv)}


#: Attention kernels by name: cuDNN (``..._sdpa_..._fprop_...``), PyTorch's FlashAttention
#: (``flash_fwd_kernel``, ``flash_bwd_dot_do_o_kernel``), memory-efficient (``fmha_cutlassF``),
#: FlashAttention 3/4 (``flash`` in the name), and the math path's matrix products (cuBLAS
#: ``gemm`` / ``nvjet`` kernels; ``aten::bmm`` on the CPU) and softmax: all of it is
#: attention's parallel form (one part per pass). Copies and fills are ``other``.
ATTENTION_KERNEL_PARTS = (
    (r"(?i)sdpa|fmha|flash|attention|attn|softmax|gemm|xmma|cutlass|nvjet|bmm|matmul", "parallel"),
)


class AttentionFamily(Family):
    """Causal (or full) softmax attention (``sdpa``, ``fa2`` / ``fa3`` / ``fa4``; ``custom``
    with ``layout: attention``): inputs :func:`attention_inputs` in ``layout``, float64
    reference :func:`attention_reference` (computed on (B, NH, S, D) views and returned in
    ``layout``), model kind ``attention_causal``. Reads the params' ``causal`` (default True).

    Args (beyond :class:`~tflabench.backends.family.Family`'s):
        layout: ``"BHSD"`` (B, NH, S, D; SDPA's) or ``"BSHD"`` (B, S, NH, D;
            FlashAttention's), the kernel's native layout. Raises ValueError for another.
    """

    name = "attention"
    KERNEL_PARTS = ATTENTION_KERNEL_PARTS

    def __init__(self, layout: str = "BHSD", **kwargs):
        if layout not in ("BHSD", "BSHD"):
            raise ValueError(f"layout: got {layout!r}; allowed: 'BHSD', 'BSHD'")
        super().__init__(**kwargs)
        self.layout = layout

    def make_inputs(self, params, shape: Shape, dtype, device, seed, requires_grad=False):
        """q, k (.., d_qk), v (.., d_hv) ~ N(0, 1) in ``dtype``, contiguous, in the kernel's
        native ``layout`` ((B, NH, S, D) or (B, S, NH, D): no transpose in the timed call).
        Raises ValueError when the backend's ``check_inputs`` refuses the case."""
        self._check(params, shape, dtype)
        return attention_inputs(shape, dtype, device, seed, requires_grad, layout=self.layout)

    def reference(self, params, inputs):
        """float64 softmax attention (:func:`attention_reference`, causal as
        ``params.causal``) on (B, NH, S, D) views, returned in ``layout``: (B, NH, S, d_hv)
        or (B, S, NH, d_hv)."""
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        if self.layout == "BHSD":
            return attention_reference(q, k, v, causal=getattr(params, "causal", True))
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        return attention_reference(q, k, v, causal=getattr(params, "causal", True)).transpose(1, 2)

    def model_kind(self, params, shape: Shape, mode: str):
        """Model kind ``attention_causal`` (FlashAttention accounting); None for
        non-causal, which the model does not count."""
        return ("attention_causal", {}) if getattr(params, "causal", True) else None
