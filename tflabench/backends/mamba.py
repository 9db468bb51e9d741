"""Mamba backends: ``mamba2`` (the Mamba 2 SSD Triton kernel), ``mamba`` (Mamba v1's
selective scan, a compiled CUDA extension) and ``mamba3`` (Mamba-3 SISO, Triton kernels of
mamba_ssm >= 2.3.2, forward and backward; :class:`Mamba3Backend`).

``mamba2`` calls ``mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined``, loaded
**without executing** ``mamba_ssm/__init__.py``: that file imports the v1 selective scan,
which needs the compiled ``selective_scan_cuda`` and fails without it (the ``mamba_ssm``
wheel this project's H200 runs used is built with ``MAMBA_SKIP_CUDA_BUILD=TRUE``). A stand-in
parent package (the real package directory as ``__path__``, nothing executed) is put in
``sys.modules["mamba_ssm"]`` of the worker, and the Triton submodules import normally
under it (:func:`import_mamba_submodule`).

Paper App. E.3: Mamba 2 with head dimension 64 and 4096 / 64 = 64 heads; state size 128,
one group, chunk 256 (the Mamba2 module's defaults).
Mamba (v1): the embedding dimension 4096 as the inner dimension, state size 16.

Mamba-3: the mLSTM's head layout (16 heads, state N = d_qk 128, head dimension P = d_hv 256).

Native layouts: Mamba-3 q, k (B, S, H, N), v (B, S, H, P), adt/dt/trap (B, H, S);
Mamba 2 x (B, S, H, P), dt (B, S, H), B/C (B, S, G, N); Mamba x (B, D, S),
B/C (B, N, S). The row's (heads, d_qk, d_hv) are (H, N, P) for Mamba 2 and (1, N, D) for
Mamba (d_qk is the state size N).

torch and the peer are imported inside the methods only (``backends/base.py``).
"""

from __future__ import annotations

import functools
import importlib
import math
import sys
import types
from typing import Any, Literal

from pydantic import field_validator

from tflabench.backends import register
from tflabench.backends.base import Backend, BackendParams, HeadLayoutParams, Shape, peer_unavailable, resolve_layout
from tflabench.backends.base import find_spec as _find_spec
from tflabench.backends.family import Family
from tflabench.errors import UserError

MAMBA2_INSTALL_HINT = ("pip install mamba_ssm einops (the Mamba 2 SSD Triton kernels need no compiled "
                       "extension; a CUDA GPU)")
MAMBA_INSTALL_HINT = ("install mamba_ssm with its compiled CUDA extension, built against this torch: the wheel "
                      "of benchmarks/build_peer_wheel.sh mamba from the wheelhouse (docs/offline-peers.md), or "
                      "pip install mamba-ssm --no-build-isolation (needs nvcc)")
#: Mamba (v1)'s compiled extension, which ``selective_scan_fn`` needs (a mamba_ssm wheel built
#: with ``MAMBA_SKIP_CUDA_BUILD=TRUE`` has none): :meth:`MambaBackend.available` and doctor's row.
SELECTIVE_SCAN_MODULE = "selective_scan_cuda"
#: The first mamba_ssm with Mamba-3's SISO Triton kernels (``ops/triton/mamba3``).
MAMBA3_SINCE = (2, 3, 2)
MAMBA3_INSTALL_HINT = ("pip install mamba_ssm>=2.3.2 einops (Mamba-3's SISO Triton kernels need no compiled "
                       "extension; a CUDA GPU with TMA, sm_90 or newer)")

#: Mamba 2 head dimension P when a suite sets neither heads nor d_hv (paper App. E.3).
MAMBA2_DEFAULT_HEAD_DIM = 64



def import_mamba_submodule(name: str):
    """Import ``mamba_ssm.<name>`` without running ``mamba_ssm/__init__.py``.

    When ``mamba_ssm`` is not imported yet, a stand-in module with the package directory as
    ``__path__`` is registered as ``sys.modules["mamba_ssm"]`` (so ``import mamba_ssm`` in
    this process then gives that stand-in, without ``Mamba``/``Mamba2`` classes). Raises
    ImportError when ``mamba_ssm`` is not installed, or the submodule's own import error.
    """
    if "mamba_ssm" not in sys.modules:
        spec = _find_spec("mamba_ssm")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("mamba_ssm is not installed")
        stub = types.ModuleType("mamba_ssm", "stand-in parent: mamba_ssm/__init__.py not executed")
        stub.__path__ = list(spec.submodule_search_locations)
        stub.__file__ = spec.origin
        stub.__spec__ = spec
        sys.modules["mamba_ssm"] = stub
    return importlib.import_module(f"mamba_ssm.{name}")


@functools.lru_cache(maxsize=None)
def _chunk_scan_combined():
    return import_mamba_submodule("ops.triton.ssd_combined").mamba_chunk_scan_combined


@functools.lru_cache(maxsize=None)
def _mamba3_siso_combined():
    return import_mamba_submodule("ops.triton.mamba3.mamba3_siso_combined").mamba3_siso_combined


@functools.lru_cache(maxsize=None)
def _selective_scan_fn():
    return import_mamba_submodule("ops.selective_scan_interface").selective_scan_fn


def _inverse_softplus_dt_bias(n: int, gen, device: str):
    """Per-channel dt bias as the Mamba modules initialise it: dt ~ log-uniform in
    [1e-3, 1e-1] (floored at 1e-4), bias = softplus^-1(dt) = dt + log(-expm1(-dt)); float32."""
    import torch

    u = torch.rand(n, generator=gen, device=device, dtype=torch.float32)
    dt = torch.exp(u * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
    return dt + torch.log(-torch.expm1(-dt))


# ------------------------------------------------------------------------ references


def _ssd_inputs(x, dt, A, B, C, dt_bias, dt_softplus):
    """The SSD references' common preparation: float64, groups of B and C repeated to
    one per head, dt biased and passed through softplus as the kernel does."""
    import torch
    import torch.nn.functional as F

    x, dt, A, B, C = (t.to(torch.float64) for t in (x, dt, A, B, C))
    H, G = x.shape[2], B.shape[2]
    B = B.repeat_interleave(H // G, dim=2)
    C = C.repeat_interleave(H // G, dim=2)
    if dt_bias is not None:
        dt = dt + dt_bias.to(torch.float64)
    if dt_softplus:
        dt = F.softplus(dt)
    return x, dt, A, B, C


def ssd_reference(x, dt, A, B, C, D=None, dt_bias=None, dt_softplus=True, chunk_size=64):
    """Mamba 2 SSD in float64, chunked (exact; O(S * chunk_size) memory), differentiable.

    Recurrence (per head h, group g = h // (H / G)): with Δ_t = softplus(dt_t + dt_bias)
    (or dt_t + dt_bias without softplus), state_t = exp(Δ_t A) state_{t-1} + Δ_t x_t B_tᵀ
    (P x N), y_t = state_t C_t + D x_t (Dao & Gu 2024, SSD). Within a chunk the output is
    (C Bᵀ ∘ W) (Δ x) with W_tj = exp(Σ_{j<s<=t} Δ_s A) for j <= t, plus the decayed carried
    state; between chunks the state is carried as in the recurrence.

    Args:
        x: (B, S, H, P); dt: (B, S, H) (before bias and softplus); A: (H,) (negative);
        B, C: (B, S, G, N); D: (H,) or (H, P) or None; dt_bias: (H,) or None.
        chunk_size: block length of the computation (any >= 1; the result does not depend on it).

    Returns:
        y (B, S, H, P) float64.
    """
    import torch

    x, dt, A, B, C = _ssd_inputs(x, dt, A, B, C, dt_bias, dt_softplus)
    b, S, H, P = x.shape
    a = dt * A                                              # (b, S, H) log decay per step
    state = x.new_zeros(b, H, P, B.shape[-1])
    ys = []
    for c0 in range(0, S, chunk_size):
        c1 = min(S, c0 + chunk_size)
        cum = a[:, c0:c1].transpose(1, 2).cumsum(-1)        # (b, H, l)
        l = c1 - c0
        causal = torch.ones(l, l, dtype=torch.bool, device=x.device).tril()
        seg = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, float("-inf"))
        Bc, Cc = B[:, c0:c1].transpose(1, 2), C[:, c0:c1].transpose(1, 2)  # (b, H, l, N)
        xdt = (x[:, c0:c1] * dt[:, c0:c1, :, None]).transpose(1, 2)         # (b, H, l, P)
        y = ((Cc @ Bc.transpose(-1, -2)) * seg.exp()) @ xdt
        y = y + cum.exp()[..., None] * (Cc @ state.transpose(-1, -2))
        ys.append(y.transpose(1, 2))
        last = cum[..., -1:]
        state = last.exp()[..., None] * state + (xdt * (last - cum).exp()[..., None]).transpose(-1, -2) @ Bc
    y = torch.cat(ys, dim=1)
    if D is not None:
        Dd = D.to(torch.float64)
        y = y + (Dd[:, None] if Dd.dim() == 1 else Dd) * x
    return y


def ssd_recurrent_reference(x, dt, A, B, C, D=None, dt_bias=None, dt_softplus=True):
    """Mamba 2 SSD by its recurrence, one step at a time, float64 (same arguments and
    result as :func:`ssd_reference`; the ground truth it is tested against)."""
    import torch

    x, dt, A, B, C = _ssd_inputs(x, dt, A, B, C, dt_bias, dt_softplus)
    b, S, H, P = x.shape
    state = x.new_zeros(b, H, P, B.shape[-1])
    ys = []
    for t in range(S):
        decay = torch.exp(dt[:, t] * A)[..., None, None]                   # (b, H, 1, 1)
        state = decay * state + (dt[:, t, :, None, None] * x[:, t, :, :, None]) * B[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", state, C[:, t]))
    y = torch.stack(ys, dim=1)
    if D is not None:
        Dd = D.to(torch.float64)
        y = y + (Dd[:, None] if Dd.dim() == 1 else Dd) * x
    return y


def selective_scan_reference(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=True):
    """Mamba (v1) selective scan in float64, step by step, differentiable.

    With Δ = softplus(delta + delta_bias): h_t = exp(Δ_t A) ∘ h_{t-1} + Δ_t u_t B_t
    (per channel d: an N-vector), y_t = C_t · h_t + D u_t, then y ∘ silu(z) (Gu & Dao 2023,
    Algorithm 2).

    Args:
        u, delta, z: (B, D, S); A: (D, N); B, C: (B, N, S); D, delta_bias: (D,) or None.

    Returns:
        y (B, D, S) float64.
    """
    import torch
    import torch.nn.functional as F

    u, delta, A, B, C = (t.to(torch.float64) for t in (u, delta, A, B, C))
    if delta_bias is not None:
        delta = delta + delta_bias.to(torch.float64)[:, None]
    if delta_softplus:
        delta = F.softplus(delta)
    h = u.new_zeros(u.shape[0], u.shape[1], A.shape[1])
    ys = []
    for t in range(u.shape[-1]):
        h = torch.exp(delta[:, :, t, None] * A) * h + (delta[:, :, t] * u[:, :, t])[..., None] * B[:, None, :, t]
        ys.append((h * C[:, None, :, t]).sum(-1))
    y = torch.stack(ys, dim=-1)
    if D is not None:
        y = y + D.to(torch.float64)[:, None] * u
    if z is not None:
        y = y * F.silu(z.to(torch.float64))
    return y


def mamba3_reference(q, k, v, adt, dt, trap, q_bias, k_bias, angles, D=None):
    """Mamba-3 (SISO, trapezoidal discretisation, data-dependent rotary) by its recurrence,
    one step at a time, float64, differentiable; the conventions of mamba_ssm 2.3.2's
    ``mamba3_siso_combined`` (its docstring and step kernel; Lahoti et al. 2026, Mamba-3).

    Per head: θ_t = Σ_{s<=t} π tanh(angles_s) dt_s (one angle per pair of adjacent key
    dimensions, pairs beyond ``angles``' width unrotated); q̃_t, k̃_t the rotations by θ_t of
    q_t + q_bias and k_t + k_bias; λ_t = sigmoid(trap_t), α_t = exp(adt_t);
    h_t = α_t h_{t-1} + α_t dt_t (1 - λ_t) v_{t-1} k̃_{t-1}ᵀ + λ_t dt_t v_t k̃_tᵀ (d_hv x d_qk,
    nothing before t = 0), y_t = h_t q̃_t + D v_t.

    Args:
        q, k: (B, S, H, N); v: (B, S, H, P); adt, dt, trap: (B, H, S) (adt = A dt, dt after
        softplus, trap before its sigmoid); q_bias, k_bias: (H, N); angles: (B, S, H, A),
        A <= N / 2, before tanh; D: (H,) or None.

    Returns:
        y (B, S, H, P) float64.
    """
    import math as _math

    import torch

    q, k, v, adt, dt, trap, q_bias, k_bias, angles = (
        t.to(torch.float64) for t in (q, k, v, adt, dt, trap, q_bias, k_bias, angles))
    B_, S, H, N = q.shape
    n_angles = angles.shape[-1]
    dt_bsh = dt.transpose(1, 2)                                              # (B, S, H)
    theta = (torch.tanh(angles) * _math.pi * dt_bsh[..., None]).cumsum(1)   # (B, S, H, A)
    cos, sin = theta.cos(), theta.sin()

    def rotate(x):
        pairs = x.reshape(*x.shape[:-1], N // 2, 2)
        x0, x1 = pairs[..., :n_angles, 0], pairs[..., :n_angles, 1]
        rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
        return torch.cat((rotated, pairs[..., n_angles:, :]), dim=-2).reshape(x.shape)

    q_rot = rotate(q + q_bias)
    k_rot = rotate(k + k_bias)
    lam = torch.sigmoid(trap)                                                # (B, H, S)
    alpha = adt.exp()
    state = v.new_zeros(B_, H, v.shape[-1], N)
    ys = []
    for t in range(S):
        state = alpha[:, :, t, None, None] * state
        if t > 0:
            w_prev = (alpha[:, :, t] * dt[:, :, t] * (1 - lam[:, :, t]))[..., None, None]
            state = state + w_prev * v[:, t - 1, :, :, None] * k_rot[:, t - 1, :, None, :]
        state = state + (lam[:, :, t] * dt[:, :, t])[..., None, None] * v[:, t, :, :, None] * k_rot[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", state, q_rot[:, t]))
    y = torch.stack(ys, dim=1)
    if D is not None:
        y = y + D.to(torch.float64)[:, None] * v
    return y


# ------------------------------------------------------------------------ Mamba 2


def _chunk_power_of_two(value: int) -> int:
    """The kernels' chunk size: a power of two >= 16 (Mamba 2's SSD and Mamba-3's SISO
    kernels tile by it); raises ValueError naming the value otherwise."""
    if value < 16 or value & (value - 1):
        raise ValueError(f"must be a power of two >= 16, got {value}")
    return value


class Mamba2Params(BackendParams):
    """What a suite may set for ``mamba2``.

    Attributes:
        heads: H; d_hv: the head dimension P. With neither set, P = 64 and H = embedding / 64
            (paper App. E.3); with one set, the other is embedding / it.
        d_state: state size N (default 128, the Mamba2 module's; shown as ``d_qk``).
        ngroups: G, groups sharing B and C (default 1); must divide H.
        chunk_size: the SSD chunk length (default 256, the module's); a power of two >= 16.
    """

    heads: int | None = None
    d_hv: int | None = None
    d_state: int = 128
    ngroups: int = 1
    chunk_size: int = 256

    @field_validator("d_state", "ngroups", "heads", "d_hv")
    @classmethod
    def _positive(cls, value):
        if value is not None and value < 1:
            raise ValueError(f"must be >= 1, got {value}")
        return value

    @field_validator("chunk_size")
    @classmethod
    def _power_of_two(cls, value):
        return _chunk_power_of_two(value)


class Mamba2Family(Family):
    """Mamba 2's SSD (backend ``mamba2``): Mamba2-module-like inputs in the kernel's
    (B, S, H, .) layout, float64 reference :func:`ssd_reference`, model kind ``mamba2_ssd``.
    Reads the params' ``ngroups`` and ``chunk_size``."""

    name = "mamba2"
    #: The SSD kernels of mamba_ssm.ops.triton: chunk states and state passing are the
    #: recurrent part, the scores, cumulative decays and chunk scan the parallel part.
    KERNEL_PARTS = (
        (r"_chunk_state_|_state_passing_", "recurrent"),
        (r"_chunk_scan_|_bmm_chunk_|_chunk_cumsum_", "parallel"),
    )

    def gate_shape(self, params: Mamba2Params, shape: Shape, max_seq_len: int, chunk_size: int | None) -> Shape:
        """The default reduced shape, with a whole number of groups of heads (B and C are
        shared by H / G heads)."""
        import dataclasses

        reduced = super().gate_shape(params, shape, max_seq_len, chunk_size)
        G = params.ngroups
        heads = G * max(1, min(2, shape.heads // G)) if shape.heads >= G else shape.heads
        return dataclasses.replace(reduced, heads=heads)

    def make_inputs(self, params, shape, dtype, device, seed, requires_grad=False):
        """Mamba2-module-like inputs in the kernel's native layout, contiguous:

        - x (B, S, H, P), B and C (B, S, G, N): N(0, 1) in ``dtype``;
        - dt (B, S, H): the dt projection's output, N(0, 1) in ``dtype``; the kernel adds
          ``dt_bias`` and applies softplus (``dt_softplus=True``), as the module does;
        - A (H,) float32 = -U(1, 16) (the module's ``A_init_range``, A = -exp(A_log));
        - D (H,) float32 ones (the module's init); dt_bias (H,) float32 = softplus^-1 of a
          log-uniform dt in [1e-3, 1e-1] (the module's init).

        With ``requires_grad`` all seven are leaves with gradients (the layer's trainables
        and activations). Raises ValueError when ngroups does not divide H.
        """
        import torch

        B_, S, H, P, N, G = shape.batch, shape.seq_len, shape.heads, shape.d_hv, shape.d_qk, params.ngroups
        if H % G:
            raise ValueError(f"ngroups: {G} does not divide heads {H}")
        gen = torch.Generator(device=device).manual_seed(seed)

        def normal(dims):
            return torch.randn(dims, generator=gen, device=device, dtype=torch.float32).to(dtype)

        inputs = {
            "x": normal((B_, S, H, P)),
            "dt": normal((B_, S, H)),
            "A": -(1.0 + 15.0 * torch.rand(H, generator=gen, device=device, dtype=torch.float32)),
            "B": normal((B_, S, G, N)),
            "C": normal((B_, S, G, N)),
            "D": torch.ones(H, device=device, dtype=torch.float32),
            "dt_bias": _inverse_softplus_dt_bias(H, gen, device),
        }
        for t in inputs.values():
            t.requires_grad_(requires_grad)
        return inputs

    def reference(self, params: Mamba2Params, inputs: dict[str, Any]):
        """float64 SSD (:func:`ssd_reference`), y (B, S, H, P)."""
        return ssd_reference(inputs["x"], inputs["dt"], inputs["A"], inputs["B"], inputs["C"],
                             D=inputs["D"], dt_bias=inputs["dt_bias"], dt_softplus=True)

    def model_kind(self, params: Mamba2Params, shape: Shape, mode: str):
        """Model kind ``mamba2_ssd`` with N = d_state and Q = chunk_size."""
        return "mamba2_ssd", {"L": params.chunk_size, "d_state": shape.d_qk}


class Mamba2Backend(Backend):
    """Mamba 2's SSD Triton kernel ``mamba_chunk_scan_combined`` (no compiled extension)."""

    name = "mamba2"
    family = Mamba2Family()
    description = "Mamba 2 SSD Triton kernel (mamba_chunk_scan_combined); 64 heads of 64, state 128"
    install_hint = MAMBA2_INSTALL_HINT
    requires = ("mamba_ssm", "einops", "triton")
    Params = Mamba2Params

    def layout(self, params: Mamba2Params, embedding_dim: int) -> tuple[int, int, int]:
        """(H, N, P): heads, state size (as d_qk), head dimension (as d_hv). Raises UserError
        naming the field for a non-dividing embedding or ngroups."""
        heads, d_hv = params.heads, params.d_hv
        if heads is None and d_hv is None:
            d_hv = MAMBA2_DEFAULT_HEAD_DIM
        view = types.SimpleNamespace(heads=heads, d_hv=d_hv, d_qk=params.d_state, p_qk=1.0)
        heads, d_qk, d_hv = resolve_layout(view, embedding_dim)
        if heads % params.ngroups:
            raise UserError(f"ngroups: {params.ngroups} does not divide heads {heads}")
        return heads, d_qk, d_hv

    def available(self, params: Mamba2Params) -> str | None:
        """None when the SSD Triton module imports (without ``mamba_ssm/__init__``) and a
        CUDA GPU is present; else the reason with the install hint."""
        return peer_unavailable(self.installed(_find_spec),
                                install_hint=self.install_hint, load=_chunk_scan_combined,
                                gpu_subject="the Mamba 2 SSD Triton kernel needs",
                                import_subject="mamba_ssm.ops.triton.ssd_combined")

    def note(self, params, device):
        return "mamba_chunk_scan_combined, mamba_ssm/__init__ not executed"

    def forward(self, params: Mamba2Params, inputs: dict[str, Any]):
        """``mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias,
        dt_softplus=True)`` (z=None, as the Mamba2 module with its gated RMSNorm);
        returns y (B, S, H, P) in the input dtype."""
        return _chunk_scan_combined()(
            inputs["x"], inputs["dt"], inputs["A"], inputs["B"], inputs["C"], params.chunk_size,
            D=inputs["D"], dt_bias=inputs["dt_bias"], dt_softplus=True)

    def uses_tf32(self, params, dtype, device) -> bool:
        """True for float32 on CUDA: the peer's Triton ``tl.dot`` uses TF32 operands for
        fp32 inputs by default (Triton's default input precision)."""
        import torch

        return dtype == torch.float32 and str(device).startswith("cuda")


# ------------------------------------------------------------------------ Mamba (v1)


class MambaParams(BackendParams):
    """What a suite may set for ``mamba``.

    Attributes:
        d_inner: channels D of the selective scan (default: the embedding dimension, paper
            App. E.3: "we use our embedding dimension of 4096"); shown as ``d_hv`` with one head.
        d_state: state size N (default 16, paper App. E.3); shown as ``d_qk``.
    """

    d_inner: int | None = None
    d_state: int = 16

    @field_validator("d_inner", "d_state")
    @classmethod
    def _positive(cls, value):
        if value is not None and value < 1:
            raise ValueError(f"must be >= 1, got {value}")
        return value


class MambaFamily(Family):
    """Mamba (v1)'s selective scan (backend ``mamba``): Mamba-module-like inputs in
    ``selective_scan_fn``'s (B, D, S) layout, float64 reference
    :func:`selective_scan_reference`, no model count."""

    name = "mamba"

    def make_inputs(self, params, shape, dtype, device, seed, requires_grad=False):
        """Mamba-module-like inputs in ``selective_scan_fn``'s native layout, contiguous
        (D = shape.d_hv channels, N = shape.d_qk):

        - u, z (B, D, S) and the dt projection's output delta (B, D, S): N(0, 1) in ``dtype``;
        - B, C (B, N, S): N(0, 1) in ``dtype`` (input-dependent, shared by the channels);
        - A (D, N) float32 = -[1, 2, ..., N] per channel (the module's S4D-real A_log init);
        - D (D,) float32 ones; delta_bias (D,) float32 = softplus^-1 of a log-uniform dt in
          [1e-3, 1e-1] (the module's dt_proj bias init).

        With ``requires_grad`` all eight are leaves with gradients.
        """
        import torch

        B_, S, Dm, N = shape.batch, shape.seq_len, shape.d_hv * shape.heads, shape.d_qk
        gen = torch.Generator(device=device).manual_seed(seed)

        def normal(dims):
            return torch.randn(dims, generator=gen, device=device, dtype=torch.float32).to(dtype)

        inputs = {
            "u": normal((B_, Dm, S)),
            "delta": normal((B_, Dm, S)),
            "A": -torch.arange(1, N + 1, device=device, dtype=torch.float32).repeat(Dm, 1),
            "B": normal((B_, N, S)),
            "C": normal((B_, N, S)),
            "D": torch.ones(Dm, device=device, dtype=torch.float32),
            "z": normal((B_, Dm, S)),
            "delta_bias": _inverse_softplus_dt_bias(Dm, gen, device),
        }
        for t in inputs.values():
            t.requires_grad_(requires_grad)
        return inputs

    def reference(self, params: MambaParams, inputs: dict[str, Any]):
        """float64 selective scan (:func:`selective_scan_reference`), y (B, D, S)."""
        return selective_scan_reference(inputs["u"], inputs["delta"], inputs["A"], inputs["B"],
                                        inputs["C"], D=inputs["D"], z=inputs["z"],
                                        delta_bias=inputs["delta_bias"], delta_softplus=True)


class MambaBackend(Backend):
    """Mamba (v1) ``selective_scan_fn``: needs ``mamba_ssm``'s compiled ``selective_scan_cuda``."""

    name = "mamba"
    family = MambaFamily()
    description = "Mamba selective scan (compiled selective_scan_cuda); D = embedding, state 16"
    install_hint = MAMBA_INSTALL_HINT
    requires = ("mamba_ssm", "einops", SELECTIVE_SCAN_MODULE)
    requires_missing = {SELECTIVE_SCAN_MODULE: "mamba_ssm has no compiled extension selective_scan_cuda "
                                               "(a build with MAMBA_SKIP_CUDA_BUILD=TRUE has none), and "
                                               "selective_scan_fn has no other implementation"}
    Params = MambaParams

    def layout(self, params: MambaParams, embedding_dim: int) -> tuple[int, int, int]:
        """(1, N, D): one "head" of D = d_inner channels (default the embedding), state N."""
        return 1, params.d_state, params.d_inner or embedding_dim

    def available(self, params: MambaParams) -> str | None:
        """None when ``selective_scan_cuda`` (the compiled extension) and the interface
        import and a CUDA GPU is present; else the reason with the install hint."""
        return peer_unavailable(self.installed(_find_spec),
                                install_hint=self.install_hint, load=_selective_scan_fn,
                                gpu_subject="selective_scan_cuda needs",
                                import_subject="mamba_ssm's selective scan")

    def forward(self, params: MambaParams, inputs: dict[str, Any]):
        """``selective_scan_fn(u, delta, A, B, C, D, z=z, delta_bias=delta_bias,
        delta_softplus=True)``, as the Mamba module calls it; y (B, D, S)."""
        return _selective_scan_fn()(
            inputs["u"], inputs["delta"], inputs["A"], inputs["B"], inputs["C"], inputs["D"],
            z=inputs["z"], delta_bias=inputs["delta_bias"], delta_softplus=True)


# ------------------------------------------------------------------------ Mamba-3


class Mamba3Params(HeadLayoutParams):
    """What a suite may set for ``mamba3``.

    Attributes:
        heads, d_hv, d_qk, p_qk: head layout (heads H, state size N as d_qk, head dimension P
            as d_hv); with neither heads nor d_hv set, 16 heads with d_qk = 0.5 d_hv (the
            mLSTM's layout, paper App. E.3). mamba_ssm needs powers of two for N and P.
        chunk_size: the kernel's chunk length (default 64, the Mamba3 module's for SISO).
        rope_fraction: share of the key dimensions rotated (0.5, the module's default, or 1.0):
            N * rope_fraction / 2 angles per head.
    """

    p_qk: float = 0.5
    chunk_size: int = 64
    rope_fraction: Literal[0.5, 1.0] = 0.5

    @field_validator("chunk_size")
    @classmethod
    def _power_of_two(cls, value):
        return _chunk_power_of_two(value)


class Mamba3Family(Family):
    """Mamba-3 SISO (backend ``mamba3``): Mamba3-module-like inputs in the kernel's
    (B, S, H, .) layout, float64 reference :func:`mamba3_reference`, no model count.
    Reads the params' ``rope_fraction``."""

    name = "mamba3"
    #: mamba3's Triton kernels: its forward walks the chunks with the state on chip in one
    #: kernel, so nothing splits into recurrent and parallel parts; all count as ``whole``.
    KERNEL_PARTS = ((r"mamba3|angle_dt|dqkv|dzdo|ddt", "whole"),)

    def make_inputs(self, params, shape, dtype, device, seed, requires_grad=False):
        """Mamba3-module-like inputs in the kernel's layout, contiguous (H heads, N = d_qk,
        P = d_hv, A = N * rope_fraction / 2 angles):

        - q (C), k (B): (B, S, H, N); v (x): (B, S, H, P): N(0, 1) in bfloat16 (the module
          normalises B and C by RMSNorm, so unit scale);
        - dt (B, H, S) float32 = softplus(N(0, 1) + dt_bias), dt_bias the module's init
          (softplus^-1 of a log-uniform dt in [1e-3, 1e-1]); adt = A dt with
          A = -max(softplus(N(0, 1)), 1e-4) (the module's A_floor), float32;
        - trap (B, H, S) N(0, 1) bfloat16 (before its sigmoid); angles (B, S, H, A) N(0, 1)
          bfloat16 (before tanh); q_bias, k_bias (H, N) float32 ones and D (H,) float32 ones
          (the module's init).

        With ``requires_grad`` all ten are leaves with gradients. Raises ValueError for a
        dtype other than bfloat16 (``mamba3_siso_combined`` casts q, k, v, trap and angles
        to bfloat16 itself), for d_qk or d_hv not a power of two (its TMA tiles), and for an
        odd number of angles (its kernel asserts an even count).
        """
        import torch
        import torch.nn.functional as F

        if dtype != torch.bfloat16:
            raise ValueError(f"dtype: mamba3_siso_combined runs bfloat16 only, got {dtype}")
        B_, S, H, N, P = shape.batch, shape.seq_len, shape.heads, shape.d_qk, shape.d_hv
        for field, value in (("d_qk", N), ("d_hv", P)):
            if value < 2 or value & (value - 1):
                raise ValueError(f"{field}: mamba3_siso_combined takes a power of two, got {value}")
        n_angles = int(N * params.rope_fraction) // 2
        if n_angles % 2:
            raise ValueError(f"d_qk: {N} * rope_fraction {params.rope_fraction} / 2 = {n_angles} angles; "
                             "mamba3_siso_combined takes an even number")
        gen = torch.Generator(device=device).manual_seed(seed)

        def normal(dims):
            return torch.randn(dims, generator=gen, device=device, dtype=torch.float32)

        dt = F.softplus(normal((B_, H, S)) + _inverse_softplus_dt_bias(H, gen, device)[:, None])
        A = -F.softplus(normal((B_, H, S))).clamp(min=1e-4)
        inputs = {
            "q": normal((B_, S, H, N)).to(dtype),
            "k": normal((B_, S, H, N)).to(dtype),
            "v": normal((B_, S, H, P)).to(dtype),
            "adt": (A * dt).contiguous(),
            "dt": dt.contiguous(),
            "trap": normal((B_, H, S)).to(dtype),
            "q_bias": torch.ones(H, N, device=device, dtype=torch.float32),
            "k_bias": torch.ones(H, N, device=device, dtype=torch.float32),
            "angles": normal((B_, S, H, n_angles)).to(dtype),
            "D": torch.ones(H, device=device, dtype=torch.float32),
        }
        for t in inputs.values():
            t.requires_grad_(requires_grad)
        return inputs

    def reference(self, params: Mamba3Params, inputs: dict[str, Any]):
        """float64 Mamba-3 (:func:`mamba3_reference`), y (B, S, H, P)."""
        return mamba3_reference(inputs["q"], inputs["k"], inputs["v"], inputs["adt"], inputs["dt"],
                                inputs["trap"], inputs["q_bias"], inputs["k_bias"], inputs["angles"],
                                D=inputs["D"])

    def model_kind(self, params: Mamba3Params, shape: Shape, mode: str):
        """None: Mamba-3 has no published FLOP/byte count of its kernels (docs/offline-peers.md, section 5)."""
        return None


class Mamba3Backend(Backend):
    """Mamba-3 SISO through ``mamba_ssm.ops.triton.mamba3.mamba3_siso_combined`` (Triton
    forward and backward; mamba_ssm's TileLang path is its MIMO variant and its CuTe path a
    decoding step, neither measured here)."""

    name = "mamba3"
    family = Mamba3Family()
    description = "Mamba-3 SISO Triton kernel (mamba3_siso_combined); 16 heads, state 128, head dim 256 by default"
    install_hint = MAMBA3_INSTALL_HINT
    requires = ("mamba_ssm", "einops", "triton")
    Params = Mamba3Params
    default_heads = 16

    def layout(self, params: Mamba3Params, embedding_dim: int) -> tuple[int, int, int]:
        """(H, N, P) as (heads, d_qk, d_hv). Raises UserError naming the field."""
        return resolve_layout(params, embedding_dim, self.default_heads)

    def available(self, params: Mamba3Params) -> str | None:
        """None when ``mamba_ssm.ops.triton.mamba3`` imports (without ``mamba_ssm/__init__``)
        and a CUDA GPU is present; else the reason with the install hint (a mamba_ssm before
        2.3.2 has no ``ops/triton/mamba3``)."""
        reason = peer_unavailable(self.installed(_find_spec),
                                  install_hint=self.install_hint, load=_mamba3_siso_combined,
                                  gpu_subject="Mamba-3's Triton kernels need",
                                  import_subject="mamba_ssm.ops.triton.mamba3.mamba3_siso_combined")
        if reason and "No module named 'mamba_ssm.ops.triton.mamba3" in reason:
            since = ".".join(map(str, MAMBA3_SINCE))
            return f"this mamba_ssm has no Mamba-3 (ops/triton/mamba3 arrived in {since}); {self.install_hint}"
        return reason

    def note(self, params, device):
        return "mamba3_siso_combined (Triton), mamba_ssm/__init__ not executed"

    def forward(self, params: Mamba3Params, inputs: dict[str, Any]):
        """``mamba3_siso_combined(Q=q, K=k, V=v, ADT=adt, DT=dt, Trap=trap, Q_bias=q_bias,
        K_bias=k_bias, Angles=angles, D=D, Z=None, chunk_size=chunk_size)`` (as the Mamba3
        module with its output norm); y (B, S, H, P)."""
        return _mamba3_siso_combined()(
            Q=inputs["q"], K=inputs["k"], V=inputs["v"], ADT=inputs["adt"], DT=inputs["dt"],
            Trap=inputs["trap"], Q_bias=inputs["q_bias"], K_bias=inputs["k_bias"],
            Angles=inputs["angles"], D=inputs["D"], Z=None, chunk_size=params.chunk_size)


register(Mamba2Backend())
register(MambaBackend())
register(Mamba3Backend())
