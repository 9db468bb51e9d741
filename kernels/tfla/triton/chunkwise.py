"""Host side of the chunkwise Triton kernels: the launch order and the saved tensors of every plan.

Used by :func:`tfla.mlstm_exp` (mLSTMexp ``xl_chunk``), :func:`tfla.mlstm_sig` (mLSTMsig
``xl_chunk``, the "tiled" algorithm) and :func:`tfla.limit_chunk.mlstm_limit_chunk`
(``limit_chunk``, both variants). Forward (docs/tfla-tiling.md 4.1): the recurrent
kernel (chunk states, b, m^comb), then the parallel H kernel. Backward: the recurrent dC
kernel, then the parallel dQ/dK/dV kernels (xl_chunk: three launches as in the paper's
Table 1, or dQ and one dK/dV launch where ``bw_config`` says so; limit_chunk: one fused
kernel per chunk), then the gate gradients (docs/tfla-kernels.md 3.4)
from the fp32 row sums q·dq and k·dk. :func:`forward` also runs mLSTMsig's
forward walk (``sig_walk_fw``), for the calls its rule takes, and
:func:`walk_forward_kernels` the walk as the forward of a call with gradients (rule W6).

Conventions (docs/tfla-kernels.md 1.3-1.5): states (C, n, m) in stabilised form, m_0 = 0 without an
initial state; the normaliser n_out and the max states are constants in the backward;
dC_last is used (with the last-state term T in df), dn_last and dm_last are ignored;
dn_0 and dm_0 are returned as zeros.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import threading
import types
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton

from tfla.triton import fastlaunch as fast
from tfla.triton import replay
from tfla.triton.common import num_sms, placeholder, pow2
from tfla.triton.replay import step
from tfla.triton.tuning import DEFAULT, Tuning, active_tuning

_MODULES = (
    "tfla.triton.chunkwise_recurrent",
    "tfla.triton.chunkwise_parallel_fw",
    "tfla.triton.chunkwise_parallel_bw",
    "tfla.triton.limit_parallel_bw",
    "tfla.triton.sig_walk_fw",
)


class KernelModules(NamedTuple):
    """The kernel modules by name (``tfla.triton.<module>``; :data:`MODULE_NAMES`)."""

    recurrent: types.ModuleType      # chunkwise_recurrent: gates, chunk states, dC, gate grads
    parallel_fw: types.ModuleType    # chunkwise_parallel_fw: the H kernel
    parallel_bw: types.ModuleType    # chunkwise_parallel_bw: dQ, dK/dV
    limit_bw: types.ModuleType       # limit_parallel_bw: one program per chunk (limit_chunk)
    sig_walk_fw: types.ModuleType    # sig_walk_fw: mLSTMsig's forward walk


#: each field of :class:`KernelModules` and the module it names
MODULE_NAMES = dict(zip(KernelModules._fields, (m.rsplit(".", 1)[1] for m in _MODULES)))


def kernels() -> KernelModules:
    """The kernel modules, (re)imported so that they match the current TRITON_INTERPRET.

    ``@triton.jit`` decides between compiled and interpreted kernels when a module is
    imported; a test that sets TRITON_INTERPRET=1 after an import would otherwise get
    compiled kernels for CPU tensors. Returns a :class:`KernelModules` (reach a module by
    its name: ``kernels().sig_walk_fw``); every call of a fwd+bwd asks, so the modules are kept and only checked
    against the switch (docs/kernels.md, "Host time"). Taking the modules anew after the
    switch changed forgets every kept launch and recorded program.
    """
    want = bool(triton.knobs.runtime.interpret)
    taken = _KERNEL_MODULES.get("mods")
    if taken is not None:
        for m in taken:         # a loop, not all(generator): every call of a fwd+bwd asks
            if m.INTERPRET != want:
                break
        else:
            return taken
    if want:
        from tfla.triton.common import _fix_interpreter_index
        _fix_interpreter_index()
    mods = [importlib.import_module(name) for name in _MODULES]
    if any(m.INTERPRET != want for m in mods):
        mods = [importlib.reload(m) for m in mods]   # chunkwise_recurrent first: the others import it
    if taken is not None:
        # kept launches and recorded programs hold the compiled kernels of the modules they
        # were made with: after the switch they would launch those, not the modules' own
        fast.clear()
        replay.clear()
    _KERNEL_MODULES["mods"] = KernelModules(*mods)
    return _KERNEL_MODULES["mods"]


#: the kernel modules :func:`kernels` last returned
_KERNEL_MODULES: dict = {}


@dataclass(frozen=True)
class Config:
    """What a call computes and how. variant "exp" | "sig"; L the chunk size actually used (a
    power of two >= 16); limit: the one-level limit_chunk kernels; tuning: the overrides of
    the tuning rules that every launch of the call (forward and backward) takes
    (:class:`tfla.triton.tuning.Tuning`; the default overrides nothing)."""

    variant: str
    normalize: bool
    eps: float
    L: int
    limit: bool
    tuning: Tuning = DEFAULT
    walk: tuple = ()

    @classmethod
    def make(cls, *, variant: str, normalize: bool, eps: float, L: int, limit: bool,
             walk: dict | None = None) -> "Config":
        """A Config with the Tuning active now (:func:`tfla.triton.tuning.use_tuning`).
        ``walk`` (mLSTMsig with gradients, :func:`train_walk_config`'s launch configuration):
        the forward is the walk at its chunk, storing the chunk states of L for the
        backward; None: the two-level forward."""
        return cls(variant=variant, normalize=normalize, eps=eps, L=L, limit=limit,
                   tuning=active_tuning(), walk=tuple(sorted((walk or {}).items())))

    @property
    def is_exp(self) -> bool:
        return self.variant == "exp"

    @property
    def recompute_states(self) -> bool:
        """Rerun the gate and state kernels in the backward instead of keeping the chunk
        states and gate vectors from the forward (off: docs/kernels.md, rule B1)."""
        return self.tuning.recompute_states


def effective_chunk(S: int, chunk_size: int) -> int:
    """The chunk size run: chunk_size, but no larger than the sequence needs (min 16).

    Any chunk size gives the same h and gradients up to round-off (docs/tfla-kernels.md 2.4), so a chunk
    longer than the padded sequence only adds padded work.
    """
    return min(chunk_size, max(16, pow2(S)))


def _as(x, dtype):
    """x in dtype; x itself (no torch call) where it has it already (docs/kernels.md,
    "Host time": no operation a call does not need)."""
    return x if x.dtype == dtype else x.to(dtype)


def _flat(x, *tail):
    return x.reshape(-1, *tail).contiguous() if x is not None else None


def forward_kernels(q, k, v, i, f, C0, n0, m0, cfg: Config, with_n: bool = True,
                    keep_states: bool = True):
    """Run the forward kernels on flattened (B*NH, ...) contiguous tensors.

    Returns h (BNH, S, d_hv), n_out (BNH, N_c*L) fp32, the states (C_st in the input
    dtype, n_st, m_st, C_last fp32) and the gate vectors (b, a, ī, m^intra, g, max a).
    with_n False (only without normalisation): the normaliser state is not computed.
    keep_states False (a call without gradients): only what h and the last state (with
    ``with_n``) need is stored: not C_st's slot N_c, C_last only with ``with_n`` (None
    otherwise), slot 0 not where the initial state is zero and the H kernel skips
    chunk 0's inter-chunk product (docs/kernels.md, rule S6)."""
    mods = kernels()
    rec, pfw = mods.recurrent, mods.parallel_fw
    gates = rec.chunk_gates(i, f, L=cfg.L, is_exp=cfg.is_exp)
    b_vec, a_vec, i_vec, mi_vec, g_ch, amax_ch = gates
    zero_first = (not keep_states and C0 is None and n0 is None
                  and pfw.skips_first_state(cfg.L, q.shape[-1], v.shape[-1], q.dtype, cfg.limit,
                                            cfg.is_exp, cfg.tuning))
    states = rec.recurrent_fw(k, v, a_vec, g_ch, amax_ch, C0, n0, m0, L=cfg.L, is_exp=cfg.is_exp,
                              with_n=with_n or cfg.normalize, tuning=cfg.tuning,
                              store_first=not zero_first, store_last=keep_states,
                              with_last=keep_states or with_n)
    C_st, n_st, m_st, _ = states
    h, n_out = pfw.parallel_fw(q, k, v, b_vec, i_vec, mi_vec, C_st, n_st, m_st, L=cfg.L,
                               is_exp=cfg.is_exp, normalize=cfg.normalize, eps=cfg.eps,
                               limit=cfg.limit, tuning=cfg.tuning, zero_first=zero_first)
    return h, n_out, states, gates


def walk_forward_kernels(q, k, v, i, f, C0, n0, cfg: Config, with_last: bool):
    """mLSTMsig's forward for a call with gradients as the walk (``sig_walk_fw``, launch
    configuration ``cfg.walk``), storing the chunk states every L / (the walk's chunk)
    chunks: the same (h, n_out, states, gates) as :func:`forward_kernels` for the two-level
    backward at L (n_out and m_st are unread there, unnormalised mLSTMsig; n_st holds only
    n_S)."""
    mods = kernels()
    rec, walk = mods.recurrent, mods.sig_walk_fw
    BNH = q.shape[0]
    wcfg = dict(cfg.walk)
    # the backward's gates at L: before the walk only where its segment pass reads them;
    # else after it, so that the walk's launch does not wait on their allocations and launch
    # (a caller that synchronises each call sees that time: docs/kernel-measurements.md)
    early = wcfg.get("segments", 1) > 1 and cfg.L == 2 * wcfg["L"]
    gates = rec.chunk_gates(i, f, L=cfg.L, is_exp=False) if early else None
    h, C_last, n_last, C_st = walk.sig_walk_fw(
        q, k, v, i, f, C0, n0, **wcfg, with_last=with_last, states_every=cfg.L // wcfg["L"],
        gates_2l=gates)
    if gates is None:
        gates = rec.chunk_gates(i, f, L=cfg.L, is_exp=False)
    # unread (mLSTMsig has no max state), but an output of tfla::mlstm_fwd: zeros, so that
    # the operator's outputs are determined (torch.library.opcheck compares them)
    m_st = torch.zeros((BNH, C_st.shape[1]), device=q.device, dtype=torch.float32)
    n_st = n_last[:, None] if with_last else None
    return h, placeholder(q.device), (C_st, n_st, m_st, C_last), gates


def train_walk_config(S: int, L: int, walk_chunk: int, d_qk: int, d_hv: int, BNH: int, dtype,
                      device, return_last: bool, tuning: Tuning = DEFAULT) -> dict | None:
    """The walk's launch configuration for an unnormalised mLSTMsig call with gradients at
    chunk L (the backward's, already clamped to S), or None where the two-level forward
    runs: the walk at ``walk_chunk`` (``tfla.plan.WALK_CHUNK``, clamped to S) where
    :func:`sig_walk_fw.walk_config`'s rule takes it (``train=True``; ``dtype`` the caller's
    q dtype), that chunk divides L, and the backward keeps the forward's states (not
    ``tuning.recompute_states``)."""
    walk = kernels().sig_walk_fw
    L_walk = effective_chunk(S, walk_chunk)
    if tuning.recompute_states or L % L_walk:
        return None
    return walk.walk_config(L_walk, d_qk, d_hv, BNH, dtype, num_sms(device), return_last,
                            tuning, train=True, S=S, states_every=L // L_walk)


def forward(q, k, v, i, f, C0, n0, m0, plan, cfg: Config, return_last: bool,
            grad: bool) -> list:
    """The forward of one call as :func:`tfla.plan` planned it (``plan.algorithm``: the
    two-level or limit_chunk kernels, the walk, or the walk storing the chunk states for
    the two-level backward); inputs (B, NH, S, d) / (B, NH, S), C0, n0, m0 or None.

    Returns the list the operator ``tfla::mlstm_fwd`` returns (:func:`output_layout`): h
    (B, NH, S, d_hv) in q's dtype; with ``return_last`` C_S (B, NH, d_qk, d_hv) and n_S
    (B, NH, d_qk), float32, and for mLSTMexp m_S (B, NH, 1); with ``grad`` what the backward
    reads: n_out where ``cfg.normalize`` (unread without the normaliser: the backward then
    passes a placeholder), and unless ``cfg.recompute_states`` the chunk states C_st, m_st and the
    gate vectors b, a, ī (and m^intra for mLSTMexp)."""
    B, NH, S, d_qk = q.shape
    d_hv = v.shape[-1]
    out_dtype = q.dtype
    q, k, v = _dot_operands(q, k, v)
    qf, kf, vf = _flat(q, S, d_qk), _flat(k, S, d_qk), _flat(v, S, d_hv)
    i_f, f_f = _flat(i, S), _flat(f, S)
    C0f, n0f = _flat(C0, d_qk, d_hv), _flat(n0, d_qk)
    m0f = _flat(m0) if (m0 is not None and cfg.is_exp) else None
    if plan.algorithm in ("walk", "walk_segments"):
        out = kernels().sig_walk_fw.sig_walk_fw(qf, kf, vf, i_f, f_f, C0f, n0f, **dict(plan.walk),
                                                with_last=return_last)
        if not return_last:
            return [_as(out.reshape(B, NH, S, d_hv), out_dtype)]
        h, C_last, n_last = out
        return [_as(h.reshape(B, NH, S, d_hv), out_dtype), C_last.reshape(B, NH, d_qk, d_hv),
                n_last.reshape(B, NH, d_qk)]
    if cfg.walk:
        h, n_out, states, gates = walk_forward_kernels(qf, kf, vf, i_f, f_f, C0f, n0f, cfg,
                                                       with_last=return_last)
    else:
        h, n_out, states, gates = forward_kernels(qf, kf, vf, i_f, f_f, C0f, n0f, m0f, cfg,
                                                  with_n=return_last, keep_states=grad)
    C_st, n_st, m_st, C_last_f = states
    outs = [_as(h.reshape(B, NH, S, d_hv), out_dtype)]
    if return_last:
        outs += [C_last_f.reshape(B, NH, d_qk, d_hv), n_st[:, -1].reshape(B, NH, d_qk).clone()]
        if cfg.is_exp:
            outs.append(m_st[:, -1].reshape(B, NH, 1).clone())
    if grad:
        if cfg.normalize:
            outs.append(n_out)
        if not cfg.recompute_states:
            outs += [C_st, m_st, *gates[:4 if cfg.is_exp else 3]]
    return outs


def output_layout(is_exp: bool, return_last: bool) -> int:
    """How many of :func:`forward`'s outputs come before the tensors kept for the backward:
    h, then the last state (C, n, and m for mLSTMexp) where asked for."""
    return 1 + (3 if is_exp else 2) * return_last


def backward(dh, dC_last, q, k, v, i, f, C0, n0, m0, C_last, saved, plan, cfg: Config,
             with_dc0: bool) -> list:
    """The backward of one call (docs/tfla-tiling.md 4.1, docs/tfla-kernels.md 3.4): the
    recurrent dC kernel, the parallel dQ/dK/dV kernels (xl_chunk: dQ beside the state
    gradient on a side stream, rule B7, then dK/dV; ``plan.fused_bw``: the one-program-per-
    chunk kernel), then the gate gradients. dh (B, NH, S, d_hv) or None; dC_last
    (B, NH, d_qk, d_hv) or None; ``saved`` what :func:`forward` kept. Returns [dq, dk, dv,
    di, df] in their inputs' dtypes, and dC0 in C0's where ``with_dc0``."""
    B, NH, S, d_qk = q.shape
    d_hv = v.shape[-1]
    dtypes = (q.dtype, k.dtype, v.dtype, i.dtype, f.dtype)
    q, k, v = _dot_operands(q, k, v)
    qf, kf, vf = _flat(q, S, d_qk), _flat(k, S, d_qk), _flat(v, S, d_hv)
    i_f, f_f = _flat(i, S), _flat(f, S)
    mods = kernels()
    rec, pbw, lbw = mods.recurrent, mods.parallel_bw, mods.limit_bw
    if cfg.normalize:
        n_out, *saved = saved
    else:
        n_out = placeholder(q.device)
    if cfg.recompute_states:
        C0f, n0f = _flat(C0, d_qk, d_hv), _flat(n0, d_qk)
        m0f = _flat(m0) if (m0 is not None and cfg.is_exp) else None
        gates = rec.chunk_gates(i_f, f_f, L=cfg.L, is_exp=cfg.is_exp)
        C_st, _, m_st, _ = rec.recurrent_fw(kf, vf, gates[1], gates[4], gates[5], C0f, n0f,
                                            m0f, L=cfg.L, is_exp=cfg.is_exp, with_n=False,
                                            tuning=cfg.tuning)
        gates = gates[:4]
    else:
        C_st, m_st = saved[:2]
        gates = tuple(saved[2:6]) if cfg.is_exp else (*saved[2:5], saved[2])
    b_vec, _, _, mi_vec = gates
    if dh is None:
        dh = torch.zeros((B, NH, S, d_hv), device=qf.device, dtype=qf.dtype)
    dhf = _flat(_as(dh, qf.dtype), S, d_hv)
    dCf = _flat(_as(dC_last, torch.float32), d_qk, d_hv) if dC_last is not None else None
    state_bw = functools.partial(rec.recurrent_bw, qf, b_vec, mi_vec, m_st, n_out, dhf, dCf,
                                 L=cfg.L, is_exp=cfg.is_exp, normalize=cfg.normalize,
                                 eps=cfg.eps, d_hv=d_hv, with_dc0=with_dc0, tuning=cfg.tuning)
    kw = dict(L=cfg.L, is_exp=cfg.is_exp, normalize=cfg.normalize, eps=cfg.eps,
              tuning=cfg.tuning)
    if plan.fused_bw:
        dC_st, dC_0 = state_bw()
        dq, dk, dv, qdq, kdk = lbw.limit_parallel_bw(qf, kf, vf, gates, m_st, n_out, C_st,
                                                     dC_st, dhf, **kw)
    else:
        # dQ needs no state gradient: on a side stream it runs beside the state-gradient
        # kernel, whose few long programs leave most of the GPU idle at long sequences
        # (docs/kernels.md, rule B7). That kernel is launched first, so that its programs
        # hold their SMs before dQ's grid fills the rest (launched after dQ, it waited for
        # dQ's last programs in a CUDA graph of the call); where dQ runs in Gluon (B12),
        # dQ first. The tiled kernels skip the inter-chunk products with a zero state (B6).
        dq_first = pbw.dq_in_gluon(qf, kf, vf, C_st, dhf, L=cfg.L, is_exp=cfg.is_exp,
                                   normalize=cfg.normalize, tuning=cfg.tuning)
        with _side_stream(qf) as fork:
            if not dq_first:
                with fork.main():
                    dC_st, dC_0 = state_bw()
            dq, qdq = pbw.parallel_bw_dq(qf, kf, vf, gates, m_st, n_out, C_st, dhf,
                                         has_c0=C0 is not None, **kw)
        if dq_first:
            dC_st, dC_0 = state_bw()
        dk, dv, kdk = pbw.parallel_bw_dkv(qf, kf, vf, gates, m_st, n_out, dC_st, dhf,
                                          has_dc_last=dCf is not None, **kw)
        fork.join(dq, qdq)
    del C_st, dC_st
    # gate gradients (docs/tfla-kernels.md 3.4): dī = k·dk, df̄_t = sum_{u>=t}(q·dq - k·dk) + T
    T = (dCf * C_last.reshape(-1, d_qk, d_hv)).sum((-2, -1)) if dCf is not None else None
    di, df = rec.gate_grads(qdq, kdk, i_f, f_f, T, is_exp=cfg.is_exp)
    grads = [_as(dq.reshape(B, NH, S, d_qk), dtypes[0]), _as(dk.reshape(B, NH, S, d_qk), dtypes[1]),
             _as(dv.reshape(B, NH, S, d_hv), dtypes[2]), _as(di.reshape(B, NH, S), dtypes[3]),
             _as(df.reshape(B, NH, S), dtypes[4])]
    if with_dc0:
        grads.append(_as(dC_0.reshape(B, NH, d_qk, d_hv), C0.dtype))
    return grads


#: the side stream of each CUDA device (:func:`_side_stream`)
_SIDE_STREAMS: dict = {}


@contextlib.contextmanager
def _side_stream(x: torch.Tensor):
    """``with _side_stream(x) as fork:`` runs the block's CUDA launches on a second stream of
    x's device that starts after the work queued so far. Inside the block, ``with
    fork.main():`` launches on the stream the fork left (after the fork, before the side
    stream's launches that follow it); ``fork.join(*outputs)`` then makes the current stream
    wait for the side stream and marks the outputs as used there. On the CPU (Triton's
    interpreter) everything runs in line and both do nothing."""
    if not x.is_cuda:
        yield types.SimpleNamespace(main=contextlib.nullcontext, join=lambda *outputs: None)
        return
    # each stream function through replay.step: a call being recorded keeps it as a step of
    # its program (torch's dispatch, which records the rest, does not see them)
    main = step(_current_stream, x.device)
    side = _SIDE_STREAMS.get(x.device)
    if side is None:
        side = _SIDE_STREAMS[x.device] = torch.cuda.Stream(x.device)
    step(_wait_for, side, main, 0)

    def join(*outputs):
        step(_wait_for, main, side, 1)
        for t in outputs:
            step(torch.Tensor.record_stream, t, main)

    if x.device.index != torch.cuda.current_device():
        fast.unkept()               # a program would switch streams the other way
        with torch.cuda.stream(side):
            yield types.SimpleNamespace(main=lambda: torch.cuda.stream(main), join=join)
        return
    # x on the current device (the usual case): switch streams with torch.cuda.set_stream,
    # which torch.cuda.stream's context manager calls too, without building one per switch
    # (docs/kernels.md, "Host time")
    step(torch.cuda.set_stream, side)
    try:
        yield types.SimpleNamespace(main=lambda: _on_stream(main, side), join=join)
    finally:
        step(torch.cuda.set_stream, main)


def _current_stream(device: torch.device) -> torch.cuda.Stream:
    """The current stream of a CUDA ``device``: one ``torch.cuda.Stream`` object per stream,
    found by its handle (``torch.cuda.current_stream`` builds a new object on every call;
    docs/kernels.md, "Host time")."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, torch._C._cuda_getCurrentRawStream(index))
    found = _STREAMS.get(key)
    if found is None:
        if len(_STREAMS) >= 64:
            _STREAMS.clear()
        found = _STREAMS[key] = torch.cuda.current_stream(index)
    return found


#: streams by (device index, handle) (:func:`_current_stream`)
_STREAMS: dict = {}
#: the fork's and the join's event, by device index and thread (:func:`_events`)
_EVENTS: dict = {}
#: the C++ base of ``torch.cuda.Event`` (its record and wait without the Python wrappers)
_EVENT_BASE = getattr(torch._C, "_CudaEventBase", None)


def _events(index: int) -> tuple:
    """Two CUDA events of device ``index`` for this thread's forks and joins, made once and
    recorded again by every call: a stream's wait takes the event as it was recorded when
    the wait was queued, so a later recording does not move an earlier wait."""
    key = (index, threading.get_ident())
    found = _EVENTS.get(key)
    if found is None:
        with torch.cuda.device(index):
            found = _EVENTS[key] = (torch.cuda.Event(), torch.cuda.Event())
    return found


def _wait_for(waiter: torch.cuda.Stream, stream: torch.cuda.Stream, which: int) -> None:
    """``waiter`` runs what is queued on it after what is queued on ``stream`` so far
    (``torch.cuda.Stream.wait_stream``, without its Python wrappers, through this thread's
    kept event ``which``: 0 the fork's, 1 the join's)."""
    event = _events(waiter.device_index)[which]
    _EVENT_BASE.record(event, stream)
    _EVENT_BASE.wait(event, waiter)


@contextlib.contextmanager
def _on_stream(stream, back):
    """``with _on_stream(stream, back):`` launches on ``stream`` (of the current device),
    then sets ``back`` again."""
    step(torch.cuda.set_stream, stream)
    try:
        yield
    finally:
        step(torch.cuda.set_stream, back)


def _dot_operands(q, k, v):
    """q, k, v as the kernels take them: Triton 3.6's CPU interpreter multiplies bfloat16
    tl.dot operands wrongly (numpy has no bfloat16), so there the kernels see float32 copies
    of the (bf16-exact) values and the callers round h back; gradients flow through the casts
    in bfloat16."""
    if q.dtype == torch.bfloat16 and triton.knobs.runtime.interpret:
        return q.float(), k.float(), v.float()
    return q, k, v
