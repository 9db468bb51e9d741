"""The attention family's one home: its inputs and float64 reference, shared by the
``sdpa``, ``fa2`` / ``fa3`` / ``fa4`` and ``custom`` backends (q, k (.., d_qk), v (.., d_hv)).
torch is imported inside the functions.
"""

from __future__ import annotations

from tflabench.backends.base import Shape, generator


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
