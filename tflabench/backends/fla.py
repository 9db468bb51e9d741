"""``fla`` backend: chunkwise kernels of flash-linear-attention (``fla-core``, ``fla.ops``).

``op`` selects the kernel (paper App. E.3, Figures 4, 12, 13):

- ``chunk_simple_gla``: ``fla.ops.simple_gla.chunk_simple_gla``, a scalar log-forget gate
  per head and step, g (B, T, H) (mLSTMsig without input gate);
- ``chunk_gla``: ``fla.ops.gla.chunk_gla``, a log-forget gate per key dimension,
  g (B, T, H, K) (Yang et al. 2024, GLA);
- ``lightning_attn``: ``fla.ops.lightning_attn.chunk_lightning_attn``, a fixed decay per
  head, log γ_h = -(8 / H)(1 - layer_idx / num_layers) h (Lightning Attention 2; fla runs it
  through ``chunk_simple_gla`` with that g_gamma);
- ``fused_chunk_simple_gla``: ``fla.ops.simple_gla.fused_chunk_simple_gla``, the
  non-materialising form of simple GLA (paper App. E.3, Figure 12's "GLA (fused)"): one
  program per (batch, head, value block) walks the chunks in order with the state in
  registers, so no chunk state reaches HBM; chunk length min(64, T) fixed by fla;
- ``fused_chunk_gla``: ``fla.ops.gla.fused_chunk_gla``, the same for GLA's per-key gate. In
  fla-core 0.6.0 it is a stub that raises NotImplementedError ("deprecated, use chunk_gla");
  :meth:`FlaBackend.available` reports that, so use ``fused_chunk_simple_gla`` there.

fla's conventions (read from fla-core 0.6.0): inputs (B, T, H, K) / (B, T, H, V),
contiguous; g is a *log* forget gate (the state is multiplied by exp(g_t)); scale defaults
to K^-1/2 on the query; no input gate, no normaliser; o_t = (scale q_t)ᵀ S_t with
S_t = exp(g_t) S_{t-1} + k_t v_tᵀ. The gates here are logsigmoid(N(3, 1)), the forget-gate
distribution of the peer baselines.

Known refusal: fla's gated ``chunk_bwd_dqkwg`` (the backward of ``chunk_simple_gla`` with a
data-dependent g) raises a RuntimeError (fla issue #640) on Hopper GPUs with
3.4.0 <= triton < 3.7.1 (seen on an H200 with triton 3.6).
``unsupported_mode`` reports ``fwdbw`` unsupported there, per case, with that reason;
:meth:`FlaBackend.classify_error` recognises the RuntimeError itself. With
``TFLABENCH_FLA_640_GUARD=narrow`` the guard is lifted where fla's key block width is not 64
(:func:`guard_narrowed`; the bisection in #640 found only BK = 64 miscompiled), the numerics
gate judging every gradient, and the row's ``reason`` says so. Which path a measured
gated backward took is the ``ok`` row's ``reason`` (:meth:`FlaBackend.note`): fla's own
(no guard applies here) or the narrowed guard. ``chunk_gla`` (own backward kernels),
``lightning_attn`` (g_gamma, no g) and the fused forms (their own backward kernel) do not
pass through that guard in fla-core 0.6.0; the numerics gate checks them.

Paper App. E.3 layout at embedding 4096: chunk_gla and chunk_simple_gla 16 heads, d_hv 256,
d_qk 128 (as the mLSTM); lightning_attn 32 heads of d_qk = d_hv = 128 (Figure 13; Lightning
Attention 2 takes equal head dimensions up to 128).

torch and the peer are imported inside the methods only (``backends/base.py``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import re
import subprocess
import sys
from typing import Any, Literal

from pydantic import model_validator

from tflabench.backends import register
from tflabench.backends.base import (Backend, HeadLayoutParams, Shape, generator, peer_unavailable,
                                     resolve_layout)
from tflabench.backends.base import find_spec as _find_spec
from tflabench.backends.base import given_environment
from tflabench.backends.family import Family
from tflabench.environment import FLA_640_GUARD_ENV, _parse_version, fla_640_refused, is_hopper
from tflabench.environment import fla_640_guard_narrowed as guard_narrowed

INSTALL_HINT = "pip install fla-core einops (Triton kernels: a CUDA GPU)"

#: op -> (module, function) in fla-core.
FLA_OPS: dict[str, tuple[str, str]] = {
    "chunk_simple_gla": ("fla.ops.simple_gla", "chunk_simple_gla"),
    "chunk_gla": ("fla.ops.gla", "chunk_gla"),
    "lightning_attn": ("fla.ops.lightning_attn", "chunk_lightning_attn"),
    "fused_chunk_simple_gla": ("fla.ops.simple_gla", "fused_chunk_simple_gla"),
    "fused_chunk_gla": ("fla.ops.gla", "fused_chunk_gla"),
}

#: The non-materialising (fused) ops: chunk length fixed by fla, no chunk state in HBM.
FUSED_OPS = frozenset({"fused_chunk_simple_gla", "fused_chunk_gla"})

#: Ops with a log-forget gate per key dimension, g (B, T, H, K); the other gated ops take
#: g (B, T, H).
PER_KEY_GATE_OPS = frozenset({"chunk_gla", "fused_chunk_gla"})

#: Ops whose backward passes a data-dependent g to fla's guarded ``chunk_bwd_dqkwg``
#: (fla-core 0.6.0, fla/ops/common/chunk_o.py): refused on Hopper with triton in
#: [3.4.0, 3.7.1).
GUARDED_BACKWARD_OPS = frozenset({"chunk_simple_gla"})

#: Environment variable that narrows fla's #640 guard (see :func:`guard_narrowed`).
GUARD_ENV = FLA_640_GUARD_ENV

#: fla's default chunk size (``chunk_simple_gla``'s default, ``chunk_gla``'s for T >= 64).
FLA_DEFAULT_CHUNK = 64

#: (heads, p_qk) when a suite sets neither heads nor d_hv (paper App. E.3).
FLA_DEFAULT_LAYOUT: dict[str, tuple[int, float]] = {
    "chunk_simple_gla": (16, 0.5),
    "chunk_gla": (16, 0.5),
    "lightning_attn": (32, 1.0),
    "fused_chunk_simple_gla": (16, 0.5),
    "fused_chunk_gla": (16, 0.5),
}



def _version_tuple(text: str | None) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a version string such as ``3.6.0`` or ``3.7.0+git...``."""
    if not text:
        return None
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def triton_version() -> tuple[int, int, int] | None:
    """The installed triton's version from its distribution metadata (nothing imported);
    None when triton is not installed."""
    for dist in ("triton", "pytorch-triton"):
        try:
            return _version_tuple(importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def gpu_is_hopper() -> bool | None:
    """Whether the first visible GPU is a Hopper (compute capability 9.x, fla's
    ``IS_NVIDIA_HOPPER``); None when unknown. Creates no CUDA context: torch is asked
    only when it already initialised CUDA, otherwise ``nvidia-smi``."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.get_device_capability()[0] == 9
    major = _nvidia_smi_compute_major(os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip())
    return None if major is None else major == 9


@functools.lru_cache(maxsize=None)
def _nvidia_smi_compute_major(visible: str) -> int | None:
    """Major compute capability of a GPU by ``nvidia-smi`` (``visible``: the first entry
    of CUDA_VISIBLE_DEVICES when it is an index, else the first GPU); None when unknown."""
    cmd = ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]
    if visible.isdigit():
        cmd.append(f"--id={visible}")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.strip().splitlines()
    m = re.match(r"\s*(\d+)", lines[0]) if lines else None
    return int(m.group(1)) if m else None


def fla_backward_refused() -> tuple[bool, str]:
    """(refused, environment text) for fla's gated backward guard: Hopper GPU and
    3.4.0 <= triton < 3.7.1. In a process that has imported fla (the worker, after
    :meth:`FlaBackend.available`), fla's own flags decide; otherwise the triton version
    and the GPU's compute capability; within
    :func:`tflabench.backends.base.environment_given`, that environment's GPU name and triton."""
    given = given_environment()
    if given is not None:
        hopper = is_hopper(given.get("gpu_name"))
        return (fla_640_refused(hopper, _parse_version(given.get("triton"))),
                f"{given.get('gpu_name') or 'no GPU'}, Hopper={hopper}, triton {given.get('triton') or 'absent'}")
    fla_utils = sys.modules.get("fla.utils")
    if fla_utils is not None and hasattr(fla_utils, "TRITON_ABOVE_3_7_1"):  # fla's own flags
        hopper = bool(fla_utils.IS_NVIDIA_HOPPER)
        refused = hopper and bool(fla_utils.TRITON_ABOVE_3_4_0) and not bool(fla_utils.TRITON_ABOVE_3_7_1)
        return refused, f"Hopper GPU={hopper}, triton fla.utils flags"
    hopper = bool(gpu_is_hopper())
    tv = triton_version()
    version = ".".join(map(str, tv)) if tv else "absent"
    return fla_640_refused(hopper, tv), f"Hopper GPU={hopper}, triton {version}"


def backward_640_refusal(op: str) -> str | None:
    """Why fla's gated backward of ``op`` cannot run here (Hopper GPU with 3.4.0 <= triton <
    3.7.1, fla issue #640: fla raises before the backward), or None where it can; the one
    wording of the rule for every FLA backend whose backward fla guards."""
    refused, env = fla_backward_refused()
    if not refused:
        return None
    return (f"fla refuses the gated backward of {op} on Hopper with 3.4.0 <= triton < 3.7.1 "
            f"(fla issue #640; {env}); upgrade triton to >= 3.7.1 to measure fwdbw")


def backward_640_error(op: str, exc: BaseException) -> str | None:
    """The reason of an ``unavailable`` row when ``exc`` is fla's #640 refusal (a RuntimeError
    naming #640 raised by the backward), else None."""
    text = str(exc)
    if isinstance(exc, RuntimeError) and "#640" in text:
        return f"fla refused the backward of {op}: {text.strip().splitlines()[0]}"
    return None


def hopper_key_block(d_qk: int) -> int:
    """The key block width BK of fla-core 0.6.0's ``chunk_bwd_dqkwg`` on Hopper:
    ``min(max(next_power_of_2(K), 16), 128)`` (``CONST_TILING`` 128 there)."""
    p = 1 << max(0, int(d_qk) - 1).bit_length()
    return min(max(p, 16), 128)


def _narrow_guard_for(d_qk: int) -> str | None:
    """In the worker, before a guarded backward: lift fla's #640 guard in
    ``fla.ops.common.chunk_o`` when :func:`guard_narrowed` and BK != 64 (restore it
    otherwise). Returns which path the backward will take, for the row's ``reason``: fla's
    own (its guard does not apply here), the narrowed guard, or None where fla will refuse
    (the guard stands: BK 64, or the narrowing not asked for)."""
    refused, env = fla_backward_refused()
    module = sys.modules.get("fla.ops.common.chunk_o")
    lift = False
    if module is not None and hasattr(module, "TRITON_ABOVE_3_7_1"):
        original = getattr(module, "_tflabench_original_guard", None)
        if original is None:
            original = bool(module.TRITON_ABOVE_3_7_1)
            module._tflabench_original_guard = original
        lift = refused and guard_narrowed() and hopper_key_block(d_qk) != 64
        module.TRITON_ABOVE_3_7_1 = True if lift else original
    if not refused:
        return f"gated backward: fla's own path (its #640 guard does not apply: {env})"
    if lift:
        return (f"gated backward: fla's #640 guard narrowed ({GUARD_ENV}=narrow; key block width "
                f"{hopper_key_block(d_qk)}, not the miscompiled 64; {env}); dq, dk, dv, dg checked against float64")
    return None


class FlaParams(HeadLayoutParams):
    """What a suite may set for ``fla``.

    Attributes:
        op: ``chunk_simple_gla`` (default), ``chunk_gla``, ``lightning_attn``,
            ``fused_chunk_simple_gla`` or ``fused_chunk_gla`` (the non-materialising forms).
        chunk_size: chunk length for ``chunk_simple_gla`` / ``lightning_attn`` (a power of
            two; None = fla's default 64). ``chunk_gla`` and the fused forms fix it (64 for
            T >= 64) and refuse the field.
        layer_idx, num_layers: ``lightning_attn`` only (its decay; default 0 of 32 layers:
            log γ_h = -8 h / H).
        heads, d_hv, d_qk, p_qk: head layout; with neither heads nor d_hv set, 16 heads
            with d_qk = 0.5 d_hv (chunk_gla, chunk_simple_gla) or 32 heads with d_qk = d_hv
            (lightning_attn), paper App. E.3. ``p_qk`` None means that default.
    """

    op: Literal["chunk_simple_gla", "chunk_gla", "lightning_attn", "fused_chunk_simple_gla",
                "fused_chunk_gla"] = "chunk_simple_gla"
    chunk_size: int | None = None
    layer_idx: int | None = None
    num_layers: int | None = None
    p_qk: float | None = None  # type: ignore[assignment]

    @model_validator(mode="after")
    def _check_op_fields(self):
        if self.chunk_size is not None:
            if self.op == "chunk_gla" or self.op in FUSED_OPS:
                raise ValueError(f"chunk_size: {self.op} fixes its chunk size (64); leave chunk_size unset")
            if self.chunk_size < 16 or self.chunk_size & (self.chunk_size - 1):
                raise ValueError(f"chunk_size: fla takes a power of two >= 16, got {self.chunk_size}")
        if self.op != "lightning_attn" and (self.layer_idx is not None or self.num_layers is not None):
            raise ValueError(f"layer_idx / num_layers: only for op lightning_attn, not {self.op}")
        if self.num_layers is not None and self.num_layers < 1:
            raise ValueError(f"num_layers: must be >= 1, got {self.num_layers}")
        if self.layer_idx is not None and not 0 <= self.layer_idx < (self.num_layers or 32):
            raise ValueError(f"layer_idx: must be in [0, num_layers), got {self.layer_idx}")
        return self


def bthd_inputs(shape: Shape, dtype, device: str, seed: int):
    """FLA's layout: ``q``, ``k`` (B, T, H, d_qk) and ``v`` (B, T, H, d_hv) ~ N(0, 1) in
    ``dtype``, and ``normal(dims, mean=0.0)``, the float32 sampler of the same generator, for
    the family's further inputs (gates, beta) drawn after them. Deterministic in ``seed``;
    no ``requires_grad`` (the caller sets it once every input is made)."""
    import torch

    gen = generator(device, seed)
    B, T, H = shape.batch, shape.seq_len, shape.heads

    def normal(dims, mean=0.0):
        return torch.randn(dims, generator=gen, device=device, dtype=torch.float32) + mean

    inputs = {
        "q": normal((B, T, H, shape.d_qk)).to(dtype),
        "k": normal((B, T, H, shape.d_qk)).to(dtype),
        "v": normal((B, T, H, shape.d_hv)).to(dtype),
    }
    return inputs, normal


def lightning_log_decay(heads: int, layer_idx: int, num_layers: int):
    """Lightning Attention's per-head log decay, float64 (H,):
    log γ_h = -(8 / H)(1 - layer_idx / num_layers) h, h = 0..H-1 (as fla's chunk_lightning_attn)."""
    import torch

    return -(8.0 / heads * (1.0 - layer_idx / num_layers)) * torch.arange(heads, dtype=torch.float64)


def _gla_inputs(q, k, v, g, g_gamma, scale):
    """The GLA references' common preparation: float64 q, k, v; the log-forget gates g
    (from the per-head constant g_gamma when g is None); scale defaulting to d_qk^-1/2."""
    import torch

    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    if g is None:
        g = g_gamma.to(device=q.device, dtype=torch.float64).expand(B, T, H)
    return q, k, v, g.to(torch.float64), scale


def gla_reference(q, k, v, g=None, g_gamma=None, scale=None, chunk_size=64):
    """Gated linear attention in float64, chunked (exact), differentiable; fla's conventions.

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ (K x V), o_t = S_tᵀ (scale q_t). Within a chunk:
    o_t = Σ_{j<=t} (Σ_d q_td k_jd exp(G_td - G_jd)) v_j + (q_t ∘ exp(G_t))ᵀ S_prev, with G the
    cumulative log gate inside the chunk; the state carries across chunks (Yang et al. 2024,
    GLA chunkwise form; here every exponent is <= 0, so nothing overflows).

    Args:
        q, k: (B, T, H, K); v: (B, T, H, V).
        g: (B, T, H, K) (GLA) or (B, T, H) (simple GLA) log forget gates; or None with
        g_gamma: (H,) fixed log decay per head (Lightning Attention / RetNet).
        scale: default K^-1/2.
        chunk_size: block length of the computation (any >= 1; the result does not depend on it).

    Returns:
        o (B, T, H, V) float64.
    """
    import torch

    q, k, v, g, scale = _gla_inputs(q, k, v, g, g_gamma, scale)
    B, T, H, K = q.shape
    per_key = g.dim() == 4
    if not per_key:
        g = g[..., None]                                             # (B, T, H, 1): broadcasts over K
    q, k, v, g = (t.transpose(1, 2) for t in (q * scale, k, v, g))   # (B, H, T, .)
    state = q.new_zeros(B, H, K, v.shape[-1])
    outs = []
    for c0 in range(0, T, chunk_size):
        c1 = min(T, c0 + chunk_size)
        G = g[:, :, c0:c1].cumsum(2)                                 # (B, H, l, K or 1)
        qc, kc, vc = q[:, :, c0:c1], k[:, :, c0:c1], v[:, :, c0:c1]
        l = c1 - c0
        causal = torch.ones(l, l, dtype=torch.bool, device=q.device).tril()
        if per_key:
            diff = (G[:, :, :, None, :] - G[:, :, None, :, :]).masked_fill(~causal[..., None], float("-inf"))
            A = torch.einsum("bhtd,bhjd,bhtjd->bhtj", qc, kc, diff.exp())
        else:
            diff = (G[:, :, :, None, 0] - G[:, :, None, :, 0]).masked_fill(~causal, float("-inf"))
            A = (qc @ kc.transpose(-1, -2)) * diff.exp()
        outs.append(A @ vc + (qc * G.exp()) @ state)
        last = G[:, :, -1:, :]                                       # (B, H, 1, K)
        state = last.transpose(-1, -2).exp() * state + (kc * (last - G).exp()).transpose(-1, -2) @ vc
    return torch.cat(outs, dim=2).transpose(1, 2)


def gla_recurrent_reference(q, k, v, g=None, g_gamma=None, scale=None):
    """Gated linear attention by its recurrence, one step at a time, float64 (same
    arguments and result as :func:`gla_reference`; the ground truth it is tested against)."""
    import torch

    q, k, v, g, scale = _gla_inputs(q, k, v, g, g_gamma, scale)
    B, T, H, K = q.shape
    if g.dim() == 3:
        g = g[..., None].expand(B, T, H, K)
    state = q.new_zeros(B, H, K, v.shape[-1])
    outs = []
    for t in range(T):
        state = g[:, t].exp()[..., None] * state + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, state))
    return torch.stack(outs, dim=1)


def _stub_reason(fn) -> str | None:
    """The reason when ``fn`` is fla's removed-op stub (fla-core 0.6.0's ``fused_chunk_gla``
    takes only ``**kwargs`` and raises NotImplementedError); None for a real kernel, which
    refuses a call without arguments with a TypeError before running anything."""
    try:
        fn()
    except NotImplementedError as exc:
        return (f"fla {_fla_version()} ships {fn.__name__} as a stub ({str(exc).strip()}); its "
                "non-materialising form there is op fused_chunk_simple_gla (scalar gate), or install a "
                "fla-core that still has it")
    except Exception:
        return None
    return None


def _fla_version() -> str:
    try:
        return importlib.metadata.version("fla-core")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


@functools.lru_cache(maxsize=None)
def _fla_op(op: str):
    module, function = FLA_OPS[op]
    return getattr(importlib.import_module(module), function)


def lightning_position(params: FlaParams) -> tuple[int, int]:
    """(layer_idx, num_layers) of fla's ``lightning_attn`` decay (default 0 of 32)."""
    return (params.layer_idx or 0), (params.num_layers or 32)


class GlaFamily(Family):
    """Gated linear attention in fla's conventions (backend ``fla``: chunk_gla,
    chunk_simple_gla, lightning_attn and the fused forms): inputs in fla's (B, T, H, .)
    layout, float64 reference :func:`gla_reference`, model kinds ``gla``, ``simple_gla``
    and their ``_fused`` forms. Reads the params' ``op``, ``chunk_size``, ``layer_idx`` and
    ``num_layers``."""

    name = "gla"
    #: fla's chunk kernels: the state kernels (``chunk_fwd_kernel_h``, ``chunk_bwd_kernel_dh``)
    #: are the recurrent part, the others (outputs, gradients, cumulative gates) the parallel
    #: part. The GLA model is not split by kernel, so ``report`` sets both against the pass.
    KERNEL_PARTS = (
        (r"kernel_h\b|kernel_dh\b|kernel_h_|kernel_dh_|_h_fwd_|_h_bwd_", "recurrent"),
        (r"chunk|cumsum|gla|lightning", "parallel"),
    )

    def make_inputs(self, params, shape, dtype, device, seed, requires_grad=False):
        """fla's native layout, contiguous, in ``dtype`` ("bf16 everywhere", as the peer
        baselines): q, k (B, T, H, d_qk), v (B, T, H, d_hv) ~ N(0, 1); log forget gates
        g = logsigmoid(N(3, 1)) of shape (B, T, H) (chunk_simple_gla, fused_chunk_simple_gla)
        or (B, T, H, d_qk) (chunk_gla, fused_chunk_gla); no g for lightning_attn. With ``requires_grad`` all are leaves with
        gradients."""
        import torch
        import torch.nn.functional as F

        B, T, H = shape.batch, shape.seq_len, shape.heads
        inputs, normal = bthd_inputs(shape, dtype, device, seed)
        if params.op in PER_KEY_GATE_OPS:
            inputs["g"] = F.logsigmoid(normal((B, T, H, shape.d_qk), mean=3.0)).to(dtype)
        elif params.op != "lightning_attn":
            inputs["g"] = F.logsigmoid(normal((B, T, H), mean=3.0)).to(dtype)
        for t in inputs.values():
            t.requires_grad_(requires_grad)
        return inputs

    def reference(self, params: FlaParams, inputs: dict[str, Any]):
        """float64 gated linear attention in fla's conventions (:func:`gla_reference`),
        o (B, T, H, d_hv)."""
        if params.op == "lightning_attn":
            layer_idx, num_layers = lightning_position(params)
            gamma = lightning_log_decay(inputs["q"].shape[2], layer_idx, num_layers)
            return gla_reference(inputs["q"], inputs["k"], inputs["v"], g_gamma=gamma)
        return gla_reference(inputs["q"], inputs["k"], inputs["v"], g=inputs["g"])

    def model_kind(self, params: FlaParams, shape: Shape, mode: str):
        """Model kinds ``gla`` (chunk_gla), ``simple_gla`` (chunk_simple_gla and
        lightning_attn, the same computation with a fixed decay), ``gla_fused`` and
        ``simple_gla_fused`` (the fused forms: no chunk state in HBM), at chunk length L."""
        kind = "gla" if params.op in PER_KEY_GATE_OPS else "simple_gla"
        if params.op in FUSED_OPS:
            kind += "_fused"
        return kind, {"L": params.chunk_size or FLA_DEFAULT_CHUNK}


class FlaBackend(Backend):
    """flash-linear-attention's chunkwise GLA, simple GLA and Lightning Attention kernels, and
    the fused (non-materialising) GLA forms."""

    name = "fla"
    family = GlaFamily()
    description = ("flash-linear-attention chunk_simple_gla | chunk_gla | lightning_attn | "
                   "fused_chunk_simple_gla | fused_chunk_gla; "
                   "16 heads, d_qk 128, d_hv 256 by default (lightning: 32 of 128)")
    install_hint = INSTALL_HINT
    requires = ("fla", "einops", "triton")
    Params = FlaParams

    def layout(self, params: FlaParams, embedding_dim: int) -> tuple[int, int, int]:
        """(heads, d_qk, d_hv) with the op's defaults (paper App. E.3). Raises UserError
        naming the field."""
        heads, p_qk = FLA_DEFAULT_LAYOUT[params.op]
        params = params.model_copy(update={"p_qk": p_qk if params.p_qk is None else params.p_qk})
        return resolve_layout(params, embedding_dim, default_heads=heads)

    def chunk_size(self, params: FlaParams) -> int:
        """The chunk length fla runs (default 64; chunk_gla and the fused forms: 64 for T >= 64)."""
        return params.chunk_size or FLA_DEFAULT_CHUNK

    def available(self, params: FlaParams) -> str | None:
        """None when ``fla.ops`` imports the op and a CUDA GPU is present; else the reason
        with the install hint."""
        reason = peer_unavailable(self.installed(_find_spec),
                                  install_hint=self.install_hint, load=lambda: _fla_op(params.op),
                                  gpu_subject="fla's Triton kernels need",
                                  import_subject=f"fla.ops ({params.op})")
        if reason is None and params.op == "fused_chunk_gla":
            return _stub_reason(_fla_op(params.op))
        return reason

    def unsupported_mode(self, params: FlaParams, mode: str) -> str | None:
        """``fwdbw`` of ``chunk_simple_gla`` is unsupported where fla refuses its gated
        backward: Hopper GPU with 3.4.0 <= triton < 3.7.1 (fla issue #640). Creates no CUDA
        context (see :func:`fla_backward_refused`)."""
        base = super().unsupported_mode(params, mode)
        if base is not None or mode != "fwdbw" or params.op not in GUARDED_BACKWARD_OPS:
            return base
        reason = backward_640_refusal(params.op)
        if reason and guard_narrowed():
            return None  # decided per call in the worker (key block width), checked by the gate
        if reason:
            return (f"{reason} (or {GUARD_ENV}=narrow where the key block width is not 64, "
                    "the miscompiled case)")
        return None

    def classify_error(self, params: FlaParams, mode: str, exc: BaseException) -> str | None:
        """The unsupported-mode reason when ``exc`` is fla's #640 refusal (a RuntimeError
        naming #640 raised by the backward), else None; for a runner that maps such errors
        to ``unavailable`` rows instead of ``error``."""
        reason = backward_640_error(params.op, exc)
        if reason and guard_narrowed():
            reason += f" ({GUARD_ENV}=narrow keeps the guard at key block width 64, the miscompiled case)"
        return reason

    _backward_path: str | None = None

    def note(self, params: FlaParams, device: str) -> str | None:
        """For a measured ``chunk_simple_gla`` forward+backward: which path its gated backward
        took (set by :meth:`forward`): fla's own, where its #640 guard does not apply, or
        the guard narrowed by ``TFLABENCH_FLA_640_GUARD=narrow``. None otherwise."""
        return self._backward_path if params.op in GUARDED_BACKWARD_OPS else None

    def uses_tf32(self, params, dtype, device) -> bool:
        """True for float32 on CUDA: the peer's Triton ``tl.dot`` uses TF32 operands for
        fp32 inputs by default (Triton's default input precision)."""
        import torch

        return dtype == torch.float32 and str(device).startswith("cuda")

    def forward(self, params: FlaParams, inputs: dict[str, Any]):
        """The fla op with its default scale (d_qk^-1/2) and no initial state; returns
        o (B, T, H, d_hv) in the input dtype."""
        fn = _fla_op(params.op)
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        self._backward_path = None
        if params.op in GUARDED_BACKWARD_OPS and q.requires_grad:
            self._backward_path = _narrow_guard_for(q.shape[-1])
        kwargs: dict[str, Any] = {}
        if params.chunk_size is not None:
            kwargs["chunk_size"] = params.chunk_size
        if params.op == "lightning_attn":
            layer_idx, num_layers = lightning_position(params)
            out = fn(q, k, v, layer_idx, num_layers, **kwargs)
        else:
            out = fn(q, k, v, g=inputs["g"], **kwargs)
        return out[0] if isinstance(out, (tuple, list)) else out


register(FlaBackend())
