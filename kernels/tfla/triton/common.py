"""Pieces shared by the mLSTMsig Triton kernels: gate preparation, helpers, tile choice.

Gate arrays (docs/tfla-kernels.md 2.1, 2.4), computed once per call by
:func:`sig_gate_prep` in float32, shape (B*NH, S):

- ``gi``: log input gate ī_t = log σ(ĩ_t)
- ``gb``: chunk-local inclusive cumsum b_{k,r} = Σ_{s<=r} log σ(f̃_{k,s}) (restarts every L)

Every kernel reads these instead of recomputing the sigmoid and the cumsum, so that chunks
longer than a tile need no carry between tiles.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

__all__ = ["next_pow2", "interpret_mode", "num_sms", "tl_dtype", "logsigmoid", "sig_gate_prep",
           "SigConfig", "choose_config"]


def next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def interpret_mode() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def _fix_interpreter_index() -> None:
    """Work around triton 3.6's interpreter under NumPy >= 2.4 (CPU tests only).

    The interpreter holds every scalar as a 1-element 1-d array and converts it for
    ``range()`` with ``int(array)``, which NumPy 2.4 refuses ("only 0-dimensional arrays can
    be converted to Python scalars"). We re-register ``__index__`` after the interpreter's own
    patching to read the single element instead. Nothing changes outside the interpreter.
    """
    import triton.runtime.interpreter as interp

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


@functools.lru_cache(maxsize=None)
def num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def tl_dtype(dtype: torch.dtype):
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[dtype]


@triton.jit
def logsigmoid(x):
    """Stable log σ(x) = min(x, 0) − log1p(exp(−|x|)) in fp32 (Pitfall 6 of the docs)."""
    t = tl.exp(-tl.abs(x))
    lp = tl.where(t < 1e-4, t * (1.0 - 0.5 * t), tl.log(1.0 + t))
    return tl.minimum(x, 0.0) - lp


@triton.jit
def _sig_gate_prep_kernel(I, F, GI, GB, S, L: tl.constexpr, BLOCK: tl.constexpr):
    # program (chunk c, bh): ī and the chunk-local inclusive cumsum of log σ(f̃)
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    carry = tl.zeros([1], dtype=tl.float32)
    for off in range(0, L, BLOCK):
        t = c * L + off + tl.arange(0, BLOCK)
        m = t < S
        ig = tl.load(I + bh * S + t, mask=m, other=0.0).to(tl.float32)
        fg = tl.load(F + bh * S + t, mask=m, other=0.0).to(tl.float32)
        lf = tl.where(m, logsigmoid(fg), 0.0)
        b = tl.cumsum(lf, axis=0) + carry
        tl.store(GI + bh * S + t, logsigmoid(ig), mask=m)
        tl.store(GB + bh * S + t, b, mask=m)
        carry = carry + tl.sum(lf, axis=0)


def sig_gate_prep(i: torch.Tensor, f: torch.Tensor, L: int):
    """(gi, gb) float32 (BH, S) from gate pre-activations i, f (BH, S) contiguous, chunk L."""
    BH, S = i.shape
    gi = torch.empty((BH, S), dtype=torch.float32, device=i.device)
    gb = torch.empty_like(gi)
    n_chunks = triton.cdiv(S, L)
    block = min(L, 1024)
    _sig_gate_prep_kernel[(n_chunks, BH)](i, f, gi, gb, S, L=L, BLOCK=block, num_warps=4)
    return gi, gb


class SigConfig:
    """Tile sizes and launch parameters for one problem shape (a documented heuristic).

    L: chunk size; BL: sequence tile inside a chunk (L is a multiple of it);
    BDQK: the whole d_qk (padded to a power of two); BDHV: the d_hv block of one program;
    n_jv: number of d_hv blocks; n_seg: sequence segments run in parallel (states at the
    segment starts are materialised by the recurrent kernel); chunks_per_seg;
    BLR/BDQK_R/BDHV_R: tiles of the recurrent kernels.
    """

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __repr__(self):
        return "SigConfig(" + ", ".join(f"{k}={v}" for k, v in sorted(self.__dict__.items())) + ")"


_CONFIG_CACHE: dict = {}

#: Tests (and the benchmark's variants) override fields of the heuristic here, e.g.
#: {"chunks_per_seg": 1, "BDHV": 16, "BL": 16}; dependent fields are recomputed.
OVERRIDES: dict = {}


def choose_config(B, NH, S, d_qk, d_hv, L, dtype, device) -> SigConfig:
    """Tiles per shape, cached (no tuning ever happens inside a timed call).

    Heuristic (docs/kernels-sig-notes.md): the running state C (d_qk x BDHV, fp32) stays in
    registers, so BDQK*BDHV <= 128*128; BL = 64 for d_qk <= 256 (wgmma needs M >= 64), smaller
    for wider heads so that the Q and K tiles fit in shared memory; segments are added until
    the grid has about two programs per SM.
    """
    key = (B, NH, S, d_qk, d_hv, L, dtype, str(device), tuple(sorted(OVERRIDES.items())))
    cfg = _CONFIG_CACHE.get(key)
    if cfg is not None:
        return cfg
    esize = torch.empty((), dtype=dtype).element_size()
    BDQK = max(16, next_pow2(d_qk))
    BDHV = OVERRIDES.get("BDHV", min(max(16, next_pow2(d_hv)), max(16, 16384 // BDQK)))
    n_jv = triton.cdiv(d_hv, BDHV)
    bl_cap = 64 if BDQK * esize <= 512 else (32 if BDQK * esize <= 1024 else 16)
    BL = min(L, OVERRIDES.get("BL", bl_cap))
    n_chunks = triton.cdiv(S, L)
    if device.type == "cuda" and not interpret_mode():
        target = 2 * num_sms(device.index if device.index is not None else torch.cuda.current_device())
    else:
        target = 1
    progs = n_jv * B * NH
    n_seg = max(1, min(n_chunks, math.ceil(target / progs)))
    chunks_per_seg = triton.cdiv(n_chunks, n_seg)
    if "chunks_per_seg" in OVERRIDES:
        chunks_per_seg = max(1, min(n_chunks, OVERRIDES["chunks_per_seg"]))
    n_seg = triton.cdiv(n_chunks, chunks_per_seg)
    num_warps = OVERRIDES.get("num_warps", 8 if BDQK * BDHV >= 8192 and BL >= 64 else 4)
    BDQK_R = min(BDQK, 64)
    BDHV_R = min(max(16, next_pow2(d_hv)), 64)
    BLR = min(L, OVERRIDES.get("BLR", 64))
    BDHV_B = OVERRIDES.get("BDHV_B", BDHV)
    cfg = SigConfig(L=L, BL=BL, BDQK=BDQK, BDHV=BDHV, n_jv=n_jv, n_seg=n_seg,
                    chunks_per_seg=chunks_per_seg, n_chunks=n_chunks, num_warps=num_warps,
                    num_stages=OVERRIDES.get("num_stages", 1), BDQK_R=BDQK_R, BDHV_R=BDHV_R,
                    BLR=BLR, num_warps_r=OVERRIDES.get("num_warps_r", 4),
                    BDHV_B=BDHV_B, n_jv_b=triton.cdiv(d_hv, BDHV_B),
                    num_warps_b=OVERRIDES.get("num_warps_b", num_warps),
                    num_stages_b=OVERRIDES.get("num_stages_b", 1))
    _CONFIG_CACHE[key] = cfg
    return cfg
