"""Pieces shared by the TFLA Triton kernels: the interpreter switch and workaround, the SM
count, the dot precision and block sizes, program ids and positions of the flattened grids,
the intra-chunk gate matrix, tile access through TMA descriptors or pointers, and a launch
that fits shared memory."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from tfla.triton import fastlaunch as fast
from tfla.triton.fastlaunch import TmaArg

__all__ = ["interpret_mode", "num_sms", "dot_precision", "pow2", "cdiv", "head_block", "split_pid",
           "chunk_tile_pid", "tile_rows", "gate_exponent", "load_tile", "store_tile",
           "can_use_tma", "TmaArg", "descriptor", "gluon_descriptor", "launch", "gluon_sm90",
           "gluon_takes", "placeholder", "read_only_zeros"]


def interpret_mode() -> bool:
    """True when the environment sets TRITON_INTERPRET (parsed as Triton parses it: 1, true,
    yes, on): CPU tensors then run the Triton kernels (in Triton's interpreter) instead of
    the PyTorch reference. The environment, not ``triton.knobs.runtime.interpret``: a harness
    may compile the kernels (knob off) while CPU tensors still take the Triton path."""
    return bool(triton.knobs.getenv_bool("TRITON_INTERPRET", False))


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


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot input precision: exact fp32 ("ieee") for fp32 inputs, else the tensor-core
    default (docs/tfla-tiling.md 4.10)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def pow2(x: int) -> int:
    """The smallest power of two >= x (1 for x <= 1). Plain Python: the launchers call it
    (and :func:`cdiv`) on every call, where Triton's ``next_power_of_2`` and ``cdiv``, which
    also serve inside kernels, cost microseconds each."""
    return 1 << (max(int(x), 1) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers (the launchers' grids and chunk counts)."""
    return -(-a // b)


def head_block(d: int, cap: int) -> int:
    """A block of a head dimension d: its power of two, at least 16 (the smallest tl.dot
    side) and at most ``cap``."""
    return max(16, min(cap, pow2(d)))


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


@triton.jit
def tile_rows(c, j, L: tl.constexpr, B: tl.constexpr):
    """(positions inside the chunk, first sequence position, sequence positions) of tile j
    (B rows) of chunk c (L rows)."""
    loc = j * B + tl.arange(0, B)
    return loc, c * L + j * B, c * L + loc


# ---------------------------------------------------------------- the intra-chunk gate matrix

@triton.jit
def gate_exponent(b_q, m_q, b_kv, i_kv, r_loc, s_loc, KV_ROWS: tl.constexpr):
    """The exponent of the intra-chunk gate matrix of a query tile (rows r_loc of the chunk)
    and a key/value tile (s_loc): log D̃_rs - m_r = (b_r - b_s) + ī_s - m_r, and -inf above
    the diagonal (s > r; docs/tfla-kernels.md 2.4). The difference b_r - b_s is formed first
    (pitfall 8). m_q: the stabiliser per query row (m^comb; 0 for mLSTMsig), or None for
    none. KV_ROWS: the transposed tile (key/value rows, query columns), as dK and dV take it.
    """
    if KV_ROWS:
        d_log = b_q[None, :] - b_kv[:, None] + i_kv[:, None]
        if m_q is not None:
            d_log = d_log - m_q[None, :]
        causal = r_loc[None, :] >= s_loc[:, None]
    else:
        d_log = b_q[:, None] - b_kv[None, :] + i_kv[None, :]
        if m_q is not None:
            d_log = d_log - m_q[:, None]
        causal = r_loc[:, None] >= s_loc[None, :]
    return tl.where(causal, d_log, float("-inf"))


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
    if max(blocks) > 256:
        return False
    rows_ok = _TMA_ROWS
    for t in tensors:      # every launch asks (docs/kernels.md, "Host time")
        if t.data_ptr() & 15:
            return False
        key = (t.stride(), t.dtype)
        ok = rows_ok.get(key)
        if ok is None:
            size = t.element_size()
            ok = rows_ok[key] = key[0][-1] == 1 and all((s * size) % 16 == 0
                                                        for s in key[0][:-1])
        if not ok:
            return False
    return True


#: whether TMA can address the rows of a tensor, by (strides, dtype) (:func:`can_use_tma`)
_TMA_ROWS: dict = {}


def descriptor(t, block_shape, use_tma: bool):
    """A TMA descriptor over t (a :class:`TmaArg`, block ``block_shape``) when use_tma, else t
    itself (the kernels then use pointers)."""
    return TmaArg(t, tuple(block_shape)) if use_tma else t


def gluon_descriptor(t, block_shape):
    """A Gluon TMA descriptor over the 16-bit tensor t (a :class:`TmaArg`), its block in the
    NVMMA shared-memory layout that TMA and wgmma take (the Gluon kernels' tiles)."""
    block = tuple(block_shape)
    return TmaArg(t, block, _nvmma_layout(block, t.dtype))


@functools.lru_cache(maxsize=None)
def _nvmma_layout(block: tuple, dtype: torch.dtype):
    """The NVMMA shared-memory layout of a 16-bit block (one per block and dtype: the
    launchers ask for it on every call)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for(
        list(block), gl.bfloat16 if dtype == torch.bfloat16 else gl.float16)


#: the pipeline depth that fitted in shared memory, per kernel and compile-time configuration
#: (what :func:`launch` learnt; a property of the GPU and the compiled kernel)
_FITTED: dict = {}


def launch(kernel, grid, *args, num_stages: int | None = None, **kwargs):
    """kernel[grid](*args, num_stages=..., **kwargs), the TMA descriptors among ``args``
    given as :class:`TmaArg`; if its tiles do not fit in shared memory at that pipelining
    depth, retry with fewer stages, and remember the depth that fitted for this kernel and
    compile-time configuration (its keyword arguments and the dtypes of its tensors), so
    that only the first call of a configuration pays for the retry and one configuration's
    retry never lowers another's depth. ``num_stages`` None: Triton's default, no retry.

    A launch that Triton ran through its own launcher is kept (:mod:`tfla.triton.fastlaunch`):
    the next launch with the same kernel, grid, keyword arguments, device and argument key
    (each tensor's dtype and 16-byte alignment, each descriptor's dtype, block and layout,
    every other argument by type and value: at least what Triton specialises on) calls the
    compiled kernel's launcher directly, with the same arguments in the same order, on the
    stream Triton would take (docs/kernels.md, "Host time").

    Raises:
        triton.runtime.errors.OutOfResources: the tiles do not fit even with one stage.
    """
    place = fast.call_key(kernel)
    key = None if place is None else fast.key_in_call(place, kernel, grid, args, num_stages,
                                                      kwargs)
    if key is None:
        key = fast.key_of(kernel, grid, args, num_stages, kwargs)
    else:
        place = None                  # known: nothing to remember
    if key is not None:
        try:
            done = fast.run(key, args)
        except TypeError:      # an unhashable argument: no kept launch for it
            key = done = None
        if done is not None:
            return done
    fast.unkept()
    targs = [a.make() if type(a) is TmaArg else a for a in args]
    if num_stages is None:
        out = kernel[grid](*targs, **kwargs)
        if key is not None and fast.keep(key, kernel, out, args, targs, kwargs) and place:
            fast.remember(place, key)
        return out
    from triton.runtime.errors import OutOfResources

    # the keyword arguments in the order the launch site passes them (one site, one order:
    # no sort on every launch, docs/kernels.md "Host time")
    fitted = (kernel, num_stages, tuple(kwargs.items()),
              tuple([a.dtype for a in args if isinstance(a, torch.Tensor)]))
    ns = _FITTED.get(fitted, num_stages)
    while True:
        try:
            out = kernel[grid](*targs, num_stages=ns, **kwargs)
            _FITTED[fitted] = ns
            if (key is not None and fast.keep(key, kernel, out, args, targs,
                                              dict(kwargs, num_stages=ns)) and place):
                fast.remember(place, key)
            return out
        except OutOfResources:
            if ns <= 1:
                raise
            ns -= 1


def gluon_sm90(t: torch.Tensor) -> bool:
    """Whether the Gluon kernels (written for Hopper's wgmma) may run for tensor ``t``:
    Triton compiling (its interpreter cannot run Gluon) for sm_90, read from t's GPU (CUDA
    tensors) or Triton's active target (CPU tensors under a compile-only driver, as the CPU
    tests compile the kernels); False without either (no GPU driver on this machine)."""
    if triton.knobs.runtime.interpret:
        return False
    if t.is_cuda:
        index = t.device.index
        return _capability(index if index is not None else torch.cuda.current_device()) == (9, 0)
    try:
        target = triton.runtime.driver.active.get_current_target()
    except RuntimeError:
        return False
    return getattr(target, "backend", None) == "cuda" and getattr(target, "arch", 0) == 90


@functools.lru_cache(maxsize=None)
def _capability(device_index: int) -> tuple:
    """A CUDA device's compute capability, asked once per device (every backward asks;
    ``torch.cuda.get_device_capability`` costs microseconds: docs/kernels.md, "Host time")."""
    return torch.cuda.get_device_capability(device_index)


def placeholder(device: torch.device) -> torch.Tensor:
    """A one-element float32 tensor on ``device`` for a pointer argument that the launch's
    configuration never reads (the normaliser without normalisation): one per device, kept,
    so a call allocates none."""
    found = _PLACEHOLDERS.get(device)
    if found is None:
        found = _PLACEHOLDERS[device] = torch.empty((1,), device=device, dtype=torch.float32)
    return found


#: :func:`placeholder`'s tensors by device
_PLACEHOLDERS: dict = {}


def read_only_zeros(device: torch.device, n: int) -> torch.Tensor:
    """n float32 zeros on ``device`` for an input that a kernel only reads (never an output,
    never written): one per device and n, kept, so that a call neither allocates them nor
    launches a fill."""
    key = (device, n)
    found = _PLACEHOLDERS.get(key)
    if found is None:
        found = torch.zeros((n,), device=device, dtype=torch.float32)
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return found     # a CUDA graph being captured runs its fill only on replay
        _PLACEHOLDERS[key] = found
    return found


def gluon_takes(*tensors: torch.Tensor, blocks) -> bool:
    """Whether a Gluon kernel may take these tensors (the checks every Gluon rule shares):
    one 16-bit dtype for all, Triton compiling for sm_90 (:func:`gluon_sm90`) and rows TMA
    can address in tiles of ``blocks`` (:func:`can_use_tma`)."""
    dtype = tensors[0].dtype
    if dtype is not torch.bfloat16 and dtype is not torch.float16:
        return False
    for t in tensors:
        if t.dtype is not dtype:
            return False
    return gluon_sm90(tensors[0]) and can_use_tma(*tensors, blocks=blocks)
