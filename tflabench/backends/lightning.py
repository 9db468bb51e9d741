"""``lightning_attn`` backend: Lightning Attention 2's original Triton kernels (the
``lightning-attn`` package, ``lightning_attn.ops.triton.lightning_attn2``; Qin et al. 2024),
the core of MiniMax-01 (paper App. E.3, Figure 13).

Lightning Attention 2 is linear attention with a fixed decay per head, computed without
materialising chunk states: the forward walks the sequence in blocks of 64 with the state
(d_qk x 32 value columns) in registers, one program per (batch x head, 32 value columns); the
backward runs an intra-block kernel in parallel over blocks and an inter-block kernel that walks
the blocks in order (paper App. A). fla's ``chunk_lightning_attn`` (backend ``fla``, op
``lightning_attn``) computes the same function with fla's materialising ``chunk_simple_gla``.

Conventions (read from lightning-attn 0.0.5): q, k (B, H, T, d), v (B, H, T, e), contiguous;
``s`` (H,) float32, the per-head decay rate, the state multiplied by exp(-s_h) per step; no
scale on q kᵀ, no input gate, no normaliser: o_t = Σ_{j<=t} exp(-s_h (t - j)) (q_t · k_j) v_j.
The decay here is fla's and MiniMax's layer formula, s_h = (8 / H)(1 - layer_idx / num_layers) h
(:func:`tflabench.backends.fla.lightning_log_decay`), so both backends compute one function;
q is drawn N(0, 1/d_qk) (fla's default scale d_qk^-1/2 folded into the input, the kernel has
none). The kernel loads whole head rows: d_qk and d_hv powers of two in 16..128 (the paper:
"identical head dimensions for queries, keys and values up to 128").

torch and the peer are imported inside the methods only (``backends/base.py``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from typing import Any

from pydantic import model_validator

from tflabench.backends import register
from tflabench.backends.base import Backend, HeadLayoutParams, Shape, peer_unavailable
from tflabench.backends.family import Family
from tflabench.backends.base import find_spec as _find_spec
from tflabench.backends.fla import gla_reference, lightning_log_decay
from tflabench.errors import UserError

INSTALL_HINT = "pip install lightning-attn einops (Triton kernels: a CUDA GPU)"

#: The kernel's block length (``BLOCK`` of lightning_attn2, forward and backward).
LIGHTNING_BLOCK = 64

#: Head dimensions the kernel takes (it loads a whole head row: tl.arange over d and e).
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)



@functools.lru_cache(maxsize=None)
def _kernel():
    """``lightning_attn2`` (the autograd function with decay) of the installed package."""
    return importlib.import_module("lightning_attn.ops.triton.lightning_attn2").lightning_attn2


class LightningParams(HeadLayoutParams):
    """What a suite may set for ``lightning_attn``.

    Attributes:
        layer_idx, num_layers: the decay's layer position (default 0 of 32:
            s_h = 8 h / H), as fla's ``chunk_lightning_attn``.
        heads, d_hv, d_qk, p_qk: head layout; with neither heads nor d_hv set, 32 heads with
            d_qk = d_hv (paper Figure 13: 32 heads of 128 at embedding 4096).
    """

    layer_idx: int = 0
    num_layers: int = 32
    p_qk: float = 1.0

    @model_validator(mode="after")
    def _check_decay_fields(self):
        if self.num_layers < 1:
            raise ValueError(f"num_layers: must be >= 1, got {self.num_layers}")
        if not 0 <= self.layer_idx < self.num_layers:
            raise ValueError(f"layer_idx: must be in [0, num_layers), got {self.layer_idx}")
        return self


class LightningFamily(Family):
    """Lightning Attention 2 (``lightning_attn``; row family ``gla``, as fla's ops): linear
    attention with a fixed decay per head in the kernel's (B, H, T, d) layout, float64
    reference :func:`tflabench.backends.fla.gla_reference`, model kind ``simple_gla_fused``.
    Reads the params' ``layer_idx`` and ``num_layers`` (the decay)."""

    name = "gla"

    def make_inputs(self, params, shape, dtype, device, seed, requires_grad=False):
        """The kernel's layout, contiguous, in ``dtype``: q (B, H, T, d_qk) ~ N(0, 1/d_qk)
        (fla's default scale folded in), k (B, H, T, d_qk), v (B, H, T, d_hv) ~ N(0, 1); the
        decay rates s (H,) float32 (no gradient). With ``requires_grad`` q, k, v are leaves
        with gradients."""
        import torch

        gen = torch.Generator(device=device).manual_seed(seed)
        B, T, H = shape.batch, shape.seq_len, shape.heads

        def normal(dims):
            return torch.randn(dims, generator=gen, device=device, dtype=torch.float32)

        inputs = {
            "q": (normal((B, H, T, shape.d_qk)) * shape.d_qk ** -0.5).to(dtype),
            "k": normal((B, H, T, shape.d_qk)).to(dtype),
            "v": normal((B, H, T, shape.d_hv)).to(dtype),
        }
        for t in inputs.values():
            t.requires_grad_(requires_grad)
        decay = -lightning_log_decay(H, params.layer_idx, params.num_layers)
        inputs["s"] = decay.to(device=device, dtype=torch.float32).contiguous()
        return inputs

    def reference(self, params: LightningParams, inputs: dict[str, Any]):
        """float64 linear attention with the per-head decay exp(-s_h) and no scale
        (:func:`tflabench.backends.fla.gla_reference` on (B, T, H, .) views),
        o (B, H, T, d_hv)."""
        q, k, v = (inputs[n].transpose(1, 2) for n in ("q", "k", "v"))
        return gla_reference(q, k, v, g_gamma=-inputs["s"], scale=1.0).transpose(1, 2)

    def model_kind(self, params: LightningParams, shape: Shape, mode: str):
        """Model kind ``simple_gla_fused`` (no chunk state in HBM) at L = 64."""
        return "simple_gla_fused", {"L": LIGHTNING_BLOCK}


class LightningBackend(Backend):
    """Lightning Attention 2, the original Triton kernels (``lightning-attn``)."""

    name = "lightning_attn"
    family = LightningFamily()
    description = ("Lightning Attention 2, original Triton kernels (lightning-attn: lightning_attn2), "
                   "fixed decay per head, no chunk state in HBM; 32 heads of 128 by default")
    install_hint = INSTALL_HINT
    requires = ("lightning_attn", "einops", "triton")
    Params = LightningParams
    default_heads = 32

    def layout(self, params: LightningParams, embedding_dim: int) -> tuple[int, int, int]:
        """(heads, d_qk, d_hv): 32 heads of embedding / 32 unless set (paper Figure 13).
        Raises UserError naming the field when a head dimension is one the kernel cannot take."""
        heads, d_qk, d_hv = super().layout(params, embedding_dim)
        for field, d in (("d_qk", d_qk), ("d_hv", d_hv)):
            if d not in SUPPORTED_HEAD_DIMS:
                raise UserError(f"{field}: lightning_attn takes head dimensions "
                                f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))} (its kernel loads whole head "
                                f"rows), got {d}")
        return heads, d_qk, d_hv

    def chunk_size(self, params: LightningParams) -> int:
        """The kernel's block length, 64."""
        return LIGHTNING_BLOCK

    def available(self, params: LightningParams) -> str | None:
        """None when ``lightning_attn`` imports and a CUDA GPU is present; else the reason
        with the install hint."""
        return peer_unavailable(self.installed(_find_spec),
                                install_hint=self.install_hint, load=_kernel,
                                gpu_subject="lightning_attn's Triton kernels need",
                                import_subject="lightning_attn")

    def note(self, params: LightningParams, device: str) -> str | None:
        """The kernel and the package's version, for the row's ``reason``."""
        try:
            version = importlib.metadata.version("lightning-attn")
        except importlib.metadata.PackageNotFoundError:
            version = "(version unknown)"
        return f"lightning_attn2 (lightning-attn {version}), block {LIGHTNING_BLOCK}, no chunk state in HBM"

    def uses_tf32(self, params, dtype, device) -> bool:
        """True on CUDA: the kernel upcasts its tiles to float32 before ``tl.dot``, which
        Triton runs with TF32 operands by default."""
        return str(device).startswith("cuda")

    def forward(self, params: LightningParams, inputs: dict[str, Any]):
        """``lightning_attn2(q, k, v, s)``; returns o (B, H, T, d_hv) in the input dtype."""
        return _kernel()(inputs["q"], inputs["k"], inputs["v"], inputs["s"])


register(LightningBackend())
