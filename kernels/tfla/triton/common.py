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


def tl_dtype(dtype: torch.dtype):
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[dtype]


@triton.jit
def logsigmoid(x):
    """Stable log σ(x) = min(x, 0) − log1p(exp(−|x|)) in fp32 (Pitfall 6 of the docs)."""
    t = tl.exp(-tl.abs(x))
    lp = tl.where(t < 1e-4, t * (1.0 - 0.5 * t), tl.log(1.0 + t))
    return tl.minimum(x, 0.0) - lp


@triton.jit
def exp_nonpos(x):
    """exp(min(x, 0)). Every gate exponent of mLSTMsig is <= 0 by construction (b is a
    cumsum of log σ(f̃) <= 0 and ī = log σ(ĩ) <= 0, so b_r - b_s + ī_s, g - b_s + ī_s and b_r
    are <= 0 on causal, in-range entries). Positions past S load b = 0 while the real b may
    be -1000: their exponents would overflow to inf and turn the zeros they multiply into
    NaN (issue 11). Clamping is exact on every real entry and bounds the padded ones by 1."""
    return tl.exp(tl.minimum(x, 0.0))


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

#: environment variable choosing the mLSTMsig xl_chunk algorithm ("tiled" or "walk");
#: OVERRIDES key "impl" wins over it; :func:`choose_sig_impl` decides when neither is set.
IMPL_ENV = "TFLA_SIG_IMPL"
SIG_IMPLS = ("tiled", "walk")


def choose_sig_impl(B, NH, S, d_qk, d_hv, L, dtype, device, needs_grad: bool = True) -> str:
    """Which mLSTMsig xl_chunk kernels run a shape: "tiled" or "walk" (a documented rule).

    "tiled": the paper's two-level TFLA (Sec. 3.2, Table 1), the kernels mLSTMexp uses with
    IS_EXP=False (tfla/triton/chunkwise*.py): a recurrent kernel writes the chunk states C_k
    every L steps, a parallel kernel tiled over (query tile, d_hv block, chunk) forms H
    (loop fusion of the inter- and intra-chunk terms, App. C.2), and the backward is the
    recurrent dC kernel plus the parallel dQ/dK/dV kernels. "walk": one program per
    (d_hv block, head, segment) walks the chunks with C on chip (sig_walk_fwd.py),
    no state in HBM, but the intra-chunk work of every chunk serialised in that program.

    Rule (measured on the H200, docs/kernels-sig-notes.md, version 5): "tiled" for every
    call. With TMA tiles the tiled forward beat the walk at every point measured, including
    the two kinds of shape where version 4 still sent forward-only calls to the walk: L 64
    (Figure 4's heads 1.28 vs 1.46 ms, 7B heads 2.18 vs 4.07, small heads 0.92 vs 1.10) and
    small grids (Figure 4 at S 32768, B 2, L 128: 1.17 vs 1.81 ms; S 65536: 1.27 vs 2.37).
    The walk stays reachable (forward only) as the measured baseline.
    Env TFLA_SIG_IMPL or OVERRIDES["impl"] force one.

    Raises:
        ValueError: TFLA_SIG_IMPL / OVERRIDES["impl"] not "tiled" or "walk".
    """
    forced = OVERRIDES.get("impl", os.environ.get(IMPL_ENV, ""))
    if forced:
        if forced not in SIG_IMPLS:
            raise ValueError(f"{IMPL_ENV}: got {forced!r}; allowed: 'tiled' or 'walk'")
        return forced
    return "tiled"



#: Tests (and the benchmark's variants) override fields of the heuristic here, e.g.
#: {"chunks_per_seg": 1, "BDHV": 16, "BL": 16}; dependent fields are recomputed.
OVERRIDES: dict = {}


def choose_config(B, NH, S, d_qk, d_hv, L, dtype, device) -> SigConfig:
    """Tiles per shape, cached (no tuning ever happens inside a timed call).

    Heuristic (docs/kernels-sig-notes.md): the running state C (d_qk x BDHV, fp32) stays in
    registers, so BDQK*BDHV <= 128*128 (half that for fp32); BL = 64 for d_qk <= 256 (wgmma
    needs M >= 64), smaller for wider heads so that the Q and K tiles fit in shared memory;
    chunk 128 with d_qk <= 128 runs as one 128-row tile with 64-wide d_hv blocks. Segments
    are added only when (d_hv blocks x heads) < 2 x SMs, then about four programs per SM.
    Tiles come through TMA with 2 pipeline stages. Only the walk's forward uses this config:
    it has no backward (calls that need gradients take the tiled kernels, choose_sig_impl).
    """
    key = (B, NH, S, d_qk, d_hv, L, dtype, str(device), tuple(sorted(OVERRIDES.items())))
    cfg = _CONFIG_CACHE.get(key)
    if cfg is not None:
        return cfg
    esize = torch.empty((), dtype=dtype).element_size()
    BDQK = max(16, next_pow2(d_qk))
    bdhv_cap = max(16, 16384 // BDQK) if esize <= 2 else max(16, 8192 // BDQK)
    BDHV = OVERRIDES.get("BDHV", min(max(16, next_pow2(d_hv)), bdhv_cap))
    bl_cap = 64 if BDQK * esize <= 512 else (32 if BDQK * esize <= 1024 else 16)
    if L == 128 and BDQK * esize <= 256 and "BL" not in OVERRIDES:
        # chunk 128 as one 128-row tile (flat kernels), with a narrower d_hv block so that
        # the 128 x 128 score tile and C still fit in registers
        bl_cap = 128
        BDHV = OVERRIDES.get("BDHV", min(BDHV, 64))
    BL = min(L, OVERRIDES.get("BL", bl_cap))
    n_jv = triton.cdiv(d_hv, BDHV)
    n_chunks = triton.cdiv(S, L)
    target = 2 * num_sms(device) or 1
    # segments only when one program per (d_hv block, head) leaves at least half the SMs
    # idle (target = 2 x SMs); then as many as keep the grid within two waves (one program
    # per SM: the kernels use the whole register file). The segment states cost a local-
    # state pass and a scan: at 128 programs on 132 SMs (Fig. 4, S 32768) one segment ran
    # 1.95 ms against 2.40-2.64 ms for 2-16 segments (notes, "Open lead"), so the bound
    # is progs < SMs / 2, not progs < SMs.
    progs = n_jv * B * NH
    n_seg = max(1, min(n_chunks, (2 * target) // progs)) if 4 * progs < target else 1
    chunks_per_seg = triton.cdiv(n_chunks, n_seg)
    if "chunks_per_seg" in OVERRIDES:
        chunks_per_seg = max(1, min(n_chunks, OVERRIDES["chunks_per_seg"]))
    n_seg = triton.cdiv(n_chunks, chunks_per_seg)
    num_warps = OVERRIDES.get("num_warps", 8 if BDQK * BDHV >= 8192 and BL >= 64 else 4)
    BDQK_R = min(BDQK, 64)
    BDHV_R = min(max(16, next_pow2(d_hv)), 64)
    BLR = min(L, OVERRIDES.get("BLR", 64))
    cfg = SigConfig(L=L, BL=BL, BDQK=BDQK, BDHV=BDHV, n_jv=n_jv, n_seg=n_seg,
                    chunks_per_seg=chunks_per_seg, n_chunks=n_chunks, num_warps=num_warps,
                    num_stages=OVERRIDES.get("num_stages", 2), BDQK_R=BDQK_R, BDHV_R=BDHV_R,
                    BLR=BLR, num_warps_r=OVERRIDES.get("num_warps_r", 4),
                    num_stages_r=OVERRIDES.get("num_stages_r", 2),
                    use_tma=OVERRIDES.get("use_tma", True))
    _CONFIG_CACHE[key] = cfg
    return cfg


# ---------------------------------------------------------------- tile access (TMA or pointers)

@triton.jit
def load_tile(desc, ptr, bh, t0, d0, s_bh, s_s, S, D, BL: tl.constexpr, BD: tl.constexpr,
              USE_TMA: tl.constexpr):
    """Rows t0..t0+BL, columns d0..d0+BD of a (BH, S, D) tensor at head bh; zeros outside.

    With USE_TMA the tile comes through a host TensorDescriptor (block [1, BL, BD]), whose
    bounds checks give the zeros; otherwise through masked pointer loads.
    """
    if USE_TMA:
        x = desc.load([bh.to(tl.int32), t0, d0]).reshape(BL, BD)
    else:
        t = t0 + tl.arange(0, BL)
        d = d0 + tl.arange(0, BD)
        x = tl.load(ptr + bh.to(tl.int64) * s_bh + t[:, None] * s_s + d[None, :],
                    mask=(t < S)[:, None] & (d < D)[None, :], other=0.0)
    return x


@triton.jit
def store_tile(desc, ptr, x, bh, t0, d0, s_bh, s_s, S, D, BL: tl.constexpr, BD: tl.constexpr,
               USE_TMA: tl.constexpr):
    """Store an (BL, BD) tile at rows t0.., columns d0.. of head bh; parts outside are dropped."""
    if USE_TMA:
        desc.store([bh.to(tl.int32), t0, d0], x.reshape(1, BL, BD))
    else:
        t = t0 + tl.arange(0, BL)
        d = d0 + tl.arange(0, BD)
        tl.store(ptr + bh.to(tl.int64) * s_bh + t[:, None] * s_s + d[None, :], x,
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


@triton.jit
def _state_combine_kernel(LOC, G, INIT, OUT, N, n_seg, REVERSE: tl.constexpr,
                          HAS_INIT: tl.constexpr, BLOCK: tl.constexpr):
    """Sequential scan over segments of flattened states (N elements per head).

    Forward (REVERSE False): OUT[p] = X_p with X_0 = INIT (or 0), X_{p+1} = exp(G[p]) X_p + LOC[p],
    for LOC of segments 0..n_seg-2. Reverse: OUT[n_seg-1] = INIT (or 0),
    OUT[p-1] = exp(G[p]) OUT[p] + LOC[p-1] where LOC[p-1] belongs to segment p.
    """
    pb = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    o = pb * BLOCK + tl.arange(0, BLOCK)
    m = o < N
    if HAS_INIT:
        x = tl.load(INIT + bh * N + o, mask=m, other=0.0).to(tl.float32)
    else:
        x = tl.zeros([BLOCK], dtype=tl.float32)
    for j in range(0, n_seg):
        if REVERSE:
            p = n_seg - 1 - j
        else:
            p = j
        tl.store(OUT + (bh * n_seg + p) * N + o, x, mask=m)
        if j < n_seg - 1:
            if REVERSE:
                g = tl.load(G + bh * n_seg + p)
                loc = tl.load(LOC + (bh * (n_seg - 1) + p - 1) * N + o, mask=m, other=0.0)
            else:
                g = tl.load(G + bh * n_seg + p)
                loc = tl.load(LOC + (bh * (n_seg - 1) + p) * N + o, mask=m, other=0.0)
            x = x * tl.exp(g) + loc


def state_combine(loc, G, init, n_seg, N, reverse: bool):
    """Scan the per-segment local states loc (BH, n_seg-1, N) into (BH, n_seg, N)."""
    BH = G.shape[0]
    out = torch.empty((BH, n_seg, N), dtype=torch.float32, device=G.device)
    BLOCK = 1024 if N >= 1024 else max(16, next_pow2(N))
    _state_combine_kernel[(triton.cdiv(N, BLOCK), BH)](
        loc if loc is not None else out, G, init if init is not None else out, out, N, n_seg,
        REVERSE=reverse, HAS_INIT=init is not None, BLOCK=BLOCK, num_warps=4)
    return out


def launch(kernel, grid, cfg, *args, num_stages: int, **kwargs):
    """kernel[grid](*args, num_stages=..., **kwargs); if its tiles do not fit in shared
    memory at that pipelining depth, retry with fewer stages, and remember the depth that
    fitted in ``cfg`` (an object with attributes, or a dict kept per launch configuration)
    so that only the first call of a shape pays for the retry.

    Raises:
        triton.runtime.errors.OutOfResources: the tiles do not fit even with one stage.
    """
    from triton.runtime.errors import OutOfResources

    memo = cfg if isinstance(cfg, dict) else cfg.__dict__
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
