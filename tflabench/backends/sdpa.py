"""torch SDPA backend (``sdpa``): causal softmax attention through
``torch.nn.functional.scaled_dot_product_attention`` with one implementation forced by
``torch.nn.attention.sdpa_kernel``.

Paper App. E.3 ("Torch FlashAttention" = ``SDPBackend.FLASH_ATTENTION``, "cuDNN
FlashAttention" = ``SDPBackend.CUDNN_ATTENTION``): 32 heads of 128 at embedding 4096,
causal, bf16. Native layout (B, NH, S, D), contiguous along D.

torch and the peers are imported inside the methods only (``backends/base.py``).
"""

from __future__ import annotations

from typing import Any, Literal

from tflabench.backends import register
from tflabench.backends.attention_family import AttentionFamily
from tflabench.backends.base import Backend, HeadLayoutParams

#: impl name -> ``torch.nn.attention.SDPBackend`` member name.
SDPA_IMPLS: dict[str, str] = {
    "flash": "FLASH_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
}


class SdpaParams(HeadLayoutParams):
    """What a suite may set for ``sdpa``.

    Attributes:
        impl: SDPA implementation forced with ``sdpa_kernel``: ``flash`` (FlashAttention 2
            in torch; also has a CPU kernel), ``cudnn``, ``efficient`` (memory-efficient),
            ``math`` (the unfused PyTorch composition; any device).
        causal: causal mask (the paper's benchmark is causal).
        heads, d_hv, d_qk, p_qk: head layout (:func:`~tflabench.backends.base.resolve_layout`);
            with neither ``heads`` nor ``d_hv`` set, 32 heads (d_qk = d_hv = 4096 / 32 = 128 at
            embedding 4096, paper App. E.3).
    """

    impl: Literal["flash", "cudnn", "efficient", "math"] = "flash"
    causal: bool = True
    p_qk: float = 1.0


#: Attention heads when a suite sets neither heads nor d_hv (paper App. E.3).
ATTENTION_DEFAULT_HEADS = 32


class SdpaBackend(Backend):
    """torch ``scaled_dot_product_attention`` with a forced implementation (``impl``)."""

    name = "sdpa"
    #: SDPA's native layout (B, NH, S, D), contiguous (no transpose in the timed call).
    family = AttentionFamily("BHSD")
    description = "torch SDPA (flash | cudnn | efficient | math), causal; 32 heads of 128 by default"
    install_hint = "pip install torch (flash/cudnn/efficient need a CUDA build and GPU)"
    Params = SdpaParams
    default_heads = ATTENTION_DEFAULT_HEADS

    def available(self, params: SdpaParams) -> str | None:
        """None when torch has the chosen implementation here. ``cudnn`` and ``efficient``
        need CUDA; ``flash`` and ``math`` also have CPU kernels."""
        try:
            import torch
            from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401
        except ImportError as exc:
            return f"torch.nn.attention is not importable ({exc}); {self.install_hint}"
        if params.impl in ("cudnn", "efficient") and not torch.cuda.is_available():
            return f"SDPA impl={params.impl} needs a CUDA GPU (torch.cuda.is_available() is False); {self.install_hint}"
        return None

    def forward(self, params: SdpaParams, inputs: dict[str, Any]):
        """``scaled_dot_product_attention(q, k, v, is_causal=causal)`` under
        ``sdpa_kernel(<impl>)``; returns (B, NH, S, d_hv) in the input dtype. Raises
        RuntimeError when the forced implementation cannot run these inputs."""
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(getattr(SDPBackend, SDPA_IMPLS[params.impl])):
            return torch.nn.functional.scaled_dot_product_attention(
                inputs["q"], inputs["k"], inputs["v"], is_causal=params.causal)


register(SdpaBackend())
