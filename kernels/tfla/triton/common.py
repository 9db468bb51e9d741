"""Pieces shared by the TFLA Triton kernels: the interpreter workaround, the SM count, program
ids of the flattened grids, tile access through TMA descriptors or pointers, and a launch
that fits shared memory."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

__all__ = ["interpret_mode", "num_sms", "split_pid", "chunk_tile_pid", "load_tile", "store_tile",
           "can_use_tma", "descriptor", "launch"]

def interpret_mode() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def _fix_interpreter_index() -> None:
    """Work around triton 3.6's interpreter under NumPy >= 2.4 (CPU tests only).

    The interpreter holds every scalar as a 1-element 1-d array and converts it for
    ``range()`` with ``int(array)``, which NumPy 2.4 refuses ("only 0-dimensional arrays can
    be converted to Python scalars"). We re-register ``__index__`` after the interpreter's own
    patching to read the single element instead. Nothing changes outside the interpreter, and
    nothing at all where int(array) still works. Idempotent; used by every kernel family.
    """
    import numpy as np
    import triton.runtime.interpreter as interp

    try:
        int(np.zeros(1, dtype=np.int32))
        return
    except TypeError:
        pass
    if getattr(interp, "_tfla_index_fix", False):
        return
    original = interp._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interp._patch_lang_tensor = patched
    interp._tfla_index_fix = True


if interpret_mode():
    _fix_interpreter_index()


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 0 on the CPU and in Triton's interpreter."""
    if device.type != "cuda" or interpret_mode():
        return 0
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# ---------------------------------------------------------------- program ids

@triton.jit
def split_pid(pid, n0, n1):
    """(i0, i1, rest) of a 1-D program id whose grid is flattened as rest x n1 x n0, with
    i0 (0 <= i0 < n0) fastest: the state kernels' (d_hv block, d_qk block, b·head)."""
    return pid % n0, (pid // n0) % n1, pid // (n0 * n1)


@triton.jit
def chunk_tile_pid(pid, n_blk, n_tile, NC):
    """(block, tile, chunk, b·head as int64) of the parallel kernels' 1-D grid, flattened as
    (b·head, chunk, tile, block) with the head-dimension block fastest: programs that share a
    chunk's tiles run next to each other (L2 reuse)."""
    blk, tile, cbh = split_pid(pid, n_blk, n_tile)
    return blk, tile, cbh % NC, (cbh // NC).to(tl.int64)


# ---------------------------------------------------------------- tile access (TMA or pointers)

@triton.jit
def load_tile(desc, ptr, bh, t0, d0, S, D, BL: tl.constexpr, BD: tl.constexpr,
              USE_TMA: tl.constexpr):
    """Rows t0..t0+BL, columns d0..d0+BD of a contiguous (BH, S, D) tensor at "head" bh;
    zeros outside. (Also serves the chunk states: (B·NH·(N_c+1), d_qk, d_hv) views.)

    With USE_TMA the tile comes through a host TensorDescriptor (block [1, BL, BD]), whose
    bounds checks give the zeros; otherwise through masked pointer loads, offsets in int64.
    """
    if USE_TMA:
        x = desc.load([bh.to(tl.int32), t0, d0]).reshape(BL, BD)
    else:
        t = t0 + tl.arange(0, BL)
        d = d0 + tl.arange(0, BD)
        x = tl.load(ptr + bh.to(tl.int64) * S * D + t[:, None] * D + d[None, :],
                    mask=(t < S)[:, None] & (d < D)[None, :], other=0.0)
    return x


@triton.jit
def store_tile(desc, ptr, x, bh, t0, d0, S, D, BL: tl.constexpr, BD: tl.constexpr,
               USE_TMA: tl.constexpr):
    """Store an (BL, BD) tile at rows t0.., columns d0.. of head bh of a contiguous (BH, S, D)
    tensor; parts outside are dropped."""
    if USE_TMA:
        desc.store([bh.to(tl.int32), t0, d0], x.reshape(1, BL, BD))
    else:
        t = t0 + tl.arange(0, BL)
        d = d0 + tl.arange(0, BD)
        tl.store(ptr + bh.to(tl.int64) * S * D + t[:, None] * D + d[None, :], x,
                 mask=(t < S)[:, None] & (d < D)[None, :])


def can_use_tma(*tensors, blocks) -> bool:
    """TMA needs 16-byte aligned bases and row strides and block sides <= 256."""
    if any(b > 256 for b in blocks):
        return False
    for t in tensors:
        if t.data_ptr() % 16 or t.stride(-1) != 1:
            return False
        if any((s * t.element_size()) % 16 for s in t.stride()[:-1]):
            return False
    return True


def descriptor(t, block_shape, use_tma: bool):
    """A TensorDescriptor over t when use_tma, else t itself (the kernels then use pointers)."""
    if not use_tma:
        return t
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(t, block_shape=list(block_shape))


def launch(kernel, grid, memo: dict, *args, num_stages: int, **kwargs):
    """kernel[grid](*args, num_stages=..., **kwargs); if its tiles do not fit in shared
    memory at that pipelining depth, retry with fewer stages, and remember the depth that
    fitted in ``memo`` (a dict kept per launch configuration by the caller) so that only the
    first call of a shape pays for the retry.

    Raises:
        triton.runtime.errors.OutOfResources: the tiles do not fit even with one stage.
    """
    from triton.runtime.errors import OutOfResources

    key = "stages_" + getattr(kernel, "__name__", str(id(kernel)))
    ns = min(num_stages, memo.get(key, num_stages))
    while True:
        try:
            out = kernel[grid](*args, num_stages=ns, **kwargs)
            memo[key] = ns
            return out
        except OutOfResources:
            if ns <= 1:
                raise
            ns -= 1
