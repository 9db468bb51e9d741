"""Input validation shared by the public mLSTM functions and the references.

Every check raises :class:`ValueError` with one line that names the argument, the value
it got and what is allowed (project rule: library kernel input checks raise ValueError).
Shapes and conventions: ``docs/tfla-kernels.md`` Section 1:
q, k (B, NH, S, d_qk); v (B, NH, S, d_hv); i, f (B, NH, S); states
C (B, NH, d_qk, d_hv), n (B, NH, d_qk), m (B, NH) or (B, NH, 1).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = [
    "Dims",
    "check_qkvif",
    "check_chunk_size",
    "check_choice",
    "check_initial_state",
    "check_kernel_dtype",
    "check_eps",
]

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class Dims(NamedTuple):
    """Sizes read off validated inputs."""

    B: int
    NH: int
    S: int
    d_qk: int
    d_hv: int


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor of shape {tuple(x.shape)}, dtype {x.dtype}, device {x.device}"
    return f"{type(x).__name__} {x!r}"


def check_qkvif(q, k, v, i, f) -> Dims:
    """Validate the five mLSTM inputs; return their sizes.

    Raises ValueError if an input is not a tensor, has the wrong rank, a size that does not
    match the others, a non-floating dtype, q/k/v of different dtypes, or lives on another
    device than q.

    Plain tensors whose shapes, dtypes and devices passed once pass again with one
    dictionary look-up (the checks read nothing else; docs/kernels.md, "Host time").
    """
    key = None
    if (type(q) is _TENSOR and type(k) is _TENSOR and type(v) is _TENSOR and type(i) is _TENSOR
            and type(f) is _TENSOR):
        key = (q.shape, k.shape, v.shape, i.shape, f.shape, q.dtype, k.dtype, v.dtype, i.dtype,
               f.dtype, q.device, k.device, v.device, i.device, f.device)
        found = _PASSED.get(key)
        if found is not None:
            return found
    dims = _check_qkvif(q, k, v, i, f)
    if key is not None:
        if len(_PASSED) >= 1024:
            _PASSED.clear()
        _PASSED[key] = dims
    return dims


_TENSOR = torch.Tensor
#: what :func:`check_qkvif` passed, by the inputs' shapes, dtypes and devices
_PASSED: dict = {}


def _check_qkvif(q, k, v, i, f) -> Dims:
    """:func:`check_qkvif`'s checks."""
    named = {"q": q, "k": k, "v": v, "i": i, "f": f}
    for name, x in named.items():
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name}: got {_describe(x)}; allowed: a torch.Tensor")
    for name, rank in (("q", 4), ("k", 4), ("v", 4), ("i", 3), ("f", 3)):
        x = named[name]
        if x.dim() != rank:
            want = "(B, NH, S, d)" if rank == 4 else "(B, NH, S)"
            raise ValueError(
                f"{name}: got rank {x.dim()} (shape {tuple(x.shape)}); allowed: rank {rank}, {want}"
            )
    for name, x in named.items():
        if not x.is_floating_point():
            raise ValueError(
                f"{name}: got dtype {x.dtype}; allowed: a floating dtype "
                "(float16, bfloat16, float32, float64)"
            )
        if x.device != q.device:
            raise ValueError(
                f"{name}: got device {x.device} but q is on {q.device}; allowed: all inputs on one device"
            )
    B, NH, S, d_qk = q.shape
    if S < 1:
        raise ValueError(f"q: got sequence length S={S} (shape {tuple(q.shape)}); allowed: S >= 1")
    if d_qk < 1:
        raise ValueError(f"q: got d_qk={d_qk}; allowed: d_qk >= 1")
    if tuple(k.shape) != tuple(q.shape):
        raise ValueError(
            f"k: got shape {tuple(k.shape)}; allowed: the shape of q, {tuple(q.shape)} (B, NH, S, d_qk)"
        )
    if tuple(v.shape[:3]) != (B, NH, S) or v.shape[3] < 1:
        raise ValueError(
            f"v: got shape {tuple(v.shape)}; allowed: ({B}, {NH}, {S}, d_hv) with d_hv >= 1 "
            "(B, NH, S as in q)"
        )
    for name in ("i", "f"):
        x = named[name]
        if tuple(x.shape) != (B, NH, S):
            raise ValueError(
                f"{name}: got shape {tuple(x.shape)}; allowed: ({B}, {NH}, {S}) = (B, NH, S) of q"
            )
    for name in ("k", "v"):
        x = named[name]
        if x.dtype != q.dtype:
            raise ValueError(f"{name}: got dtype {x.dtype}; allowed: the dtype of q, {q.dtype}")
    return Dims(B, NH, S, d_qk, v.shape[3])


def check_kernel_dtype(q: torch.Tensor) -> None:
    """Raise ValueError unless q's dtype is one the Triton kernels take (fp16, bf16, fp32)."""
    if q.dtype not in KERNEL_DTYPES:
        raise ValueError(
            f"q: got dtype {q.dtype}; allowed for the Triton kernels: float16, bfloat16, float32 "
            "(float64 runs only through tfla.reference on the CPU)"
        )


def check_chunk_size(chunk_size, *, minimum: int = 1, power_of_two: bool = False,
                     name: str = "chunk_size") -> int:
    """Validate a chunk size: an int >= minimum, and a power of two if required."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise ValueError(f"{name}: got {_describe(chunk_size)}; allowed: an int >= {minimum}"
                         + (", a power of two" if power_of_two else ""))
    if chunk_size < minimum:
        raise ValueError(f"{name}: got {chunk_size}; allowed: >= {minimum}"
                         + (" and a power of two" if power_of_two else ""))
    if power_of_two and chunk_size & (chunk_size - 1):
        raise ValueError(f"{name}: got {chunk_size}; allowed: a power of two >= {minimum} "
                         "(16, 32, 64, 128, ...)")
    return chunk_size


def check_choice(name: str, value, allowed) -> None:
    """Raise ValueError unless value is one of allowed."""
    if value not in allowed:
        raise ValueError(f"{name}: got {value!r}; allowed: {', '.join(repr(a) for a in allowed)}")


def check_eps(eps) -> float:
    """eps must be a finite float >= 0."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0 <= float(eps) < float("inf")):
        raise ValueError(f"eps: got {eps!r}; allowed: a finite number >= 0")
    return float(eps)


def check_initial_state(initial_state, dims: Dims, device: torch.device, *, variant: str):
    """Validate an initial state; return (C0, n0, m0) with None for parts not given.

    Accepted: None; a tensor C0 (B, NH, d_qk, d_hv); a tuple/list (C0,), (C0, n0) or
    (C0, n0, m0) with n0 (B, NH, d_qk) or None and m0 (B, NH) / (B, NH, 1) or None.
    mLSTMsig has no max state: an m0 given for variant "sig" is accepted and ignored
    (docs/tfla-kernels.md 1.3). Raises ValueError naming ``initial_state[j]``.
    """
    if initial_state is None:
        return None, None, None
    if isinstance(initial_state, torch.Tensor):
        parts = [initial_state]
    elif isinstance(initial_state, (tuple, list)) and 1 <= len(initial_state) <= 3:
        parts = list(initial_state)
    else:
        raise ValueError(
            f"initial_state: got {_describe(initial_state)}; allowed: None, a tensor C0 or a tuple "
            "(C0, n0[, m0]) of tensors"
        )
    while len(parts) < 3:
        parts.append(None)
    B, NH, _, d_qk, d_hv = dims
    shapes = [((B, NH, d_qk, d_hv),), ((B, NH, d_qk),), ((B, NH), (B, NH, 1))]
    labels = ["C0 (B, NH, d_qk, d_hv)", "n0 (B, NH, d_qk)", "m0 (B, NH) or (B, NH, 1)"]
    for j, (x, allowed, label) in enumerate(zip(parts, shapes, labels)):
        if x is None:
            if j == 0:
                raise ValueError("initial_state[0]: got None; allowed: a tensor C0 of shape "
                                 f"({B}, {NH}, {d_qk}, {d_hv})")
            continue
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"initial_state[{j}]: got {_describe(x)}; allowed: a tensor {label}")
        if tuple(x.shape) not in allowed:
            raise ValueError(
                f"initial_state[{j}]: got shape {tuple(x.shape)}; allowed: "
                + " or ".join(str(a) for a in allowed) + f" for {label}"
            )
        if not x.is_floating_point():
            raise ValueError(f"initial_state[{j}]: got dtype {x.dtype}; allowed: a floating dtype")
        if x.device != device:
            raise ValueError(
                f"initial_state[{j}]: got device {x.device} but q is on {device}; allowed: q's device"
            )
    C0, n0, m0 = parts
    if m0 is not None:
        m0 = m0.reshape(B, NH)
        if variant == "sig":
            m0 = None
    return C0, n0, m0
