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
from tflabench.backends.attention_family import attention_inputs, attention_reference
from tflabench.backends.base import Backend, HeadLayoutParams, Shape

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


def attention_model_kind(causal: bool) -> tuple[str, dict] | None:
    """The model kind of causal attention (FlashAttention accounting, ``tflabench.model``
    kind ``attention_causal``); None for non-causal, which the model does not count."""
    return ("attention_causal", {}) if causal else None


#: Attention kernels by name: cuDNN (``..._sdpa_..._fprop_...``), PyTorch's FlashAttention
#: (``flash_fwd_kernel``, ``flash_bwd_dot_do_o_kernel``), memory-efficient (``fmha_cutlassF``),
#: FlashAttention 3/4 (``flash`` in the name), and the math path's matrix products (cuBLAS
#: ``gemm`` / ``nvjet`` kernels; ``aten::bmm`` on the CPU) and softmax: all of it is
#: attention's parallel form (one part per pass). Copies and fills are ``other``.
ATTENTION_KERNEL_PARTS = (
    (r"(?i)sdpa|fmha|flash|attention|attn|softmax|gemm|xmma|cutlass|nvjet|bmm|matmul", "parallel"),
)


class SdpaBackend(Backend):
    """torch ``scaled_dot_product_attention`` with a forced implementation (``impl``)."""

    name = "sdpa"
    family = "attention"
    description = "torch SDPA (flash | cudnn | efficient | math), causal; 32 heads of 128 by default"
    install_hint = "pip install torch (flash/cudnn/efficient need a CUDA build and GPU)"
    Params = SdpaParams
    default_heads = ATTENTION_DEFAULT_HEADS
    KERNEL_PARTS = ATTENTION_KERNEL_PARTS

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

    def make_inputs(self, params, shape, dtype, device, seed, requires_grad=False):
        """q, k (B, NH, S, d_qk), v (B, NH, S, d_hv), N(0, 1) in ``dtype``: SDPA's native
        layout, contiguous (no transpose in the timed call)."""
        return attention_inputs(shape, dtype, device, seed, requires_grad, layout="BHSD")

    def forward(self, params: SdpaParams, inputs: dict[str, Any]):
        """``scaled_dot_product_attention(q, k, v, is_causal=causal)`` under
        ``sdpa_kernel(<impl>)``; returns (B, NH, S, d_hv) in the input dtype. Raises
        RuntimeError when the forced implementation cannot run these inputs."""
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(getattr(SDPBackend, SDPA_IMPLS[params.impl])):
            return torch.nn.functional.scaled_dot_product_attention(
                inputs["q"], inputs["k"], inputs["v"], is_causal=params.causal)

    def reference(self, params: SdpaParams, inputs: dict[str, Any]):
        """float64 softmax attention (:func:`tflabench.backends.attention_family.attention_reference`),
        (B, NH, S, d_hv)."""
        return attention_reference(inputs["q"], inputs["k"], inputs["v"], causal=params.causal)

    def model_kind(self, params: SdpaParams, shape: Shape, mode: str):
        """Model kind ``attention_causal`` (None when ``causal`` is False)."""
        return attention_model_kind(params.causal)


register(SdpaBackend())
