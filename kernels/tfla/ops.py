"""The registered operators ``tfla::mlstm_fwd`` and ``tfla::mlstm_bwd``: every Triton call of
``mlstm_sig`` / ``mlstm_exp`` (xl_chunk and limit_chunk, forward and backward, with and
without states) runs their bodies (docs/kernels.md, "Registered operators"); under
``torch.compile``, a trace, a dispatch or torch-function mode, functorch or a tensor subclass
through the operators themselves, otherwise (plain eager calls) by the direct route of
:func:`apply`, which runs the same bodies without the custom-op layers (docs/kernels.md,
"Host time").

``torch.library.custom_op`` with a fake-tensor shape function and ``register_autograd``:
``torch.compile(fullgraph=True)`` traces a training step through them without a graph break,
and ``torch.library.opcheck`` holds. The public functions check their arguments (plain
Python a trace follows) and call :func:`apply`; the plan (:func:`tfla.plan.plan_of`), the
kernel configuration and the launches happen inside the operator, where no trace looks.
Two values come from outside the arguments, each read once per call by a function that a
trace takes as a constant (``torch.compiler.assume_constant_result``): the active Tuning's
key (:func:`tfla.triton.tuning.tuning_key`) and whether Triton's interpreter serves CPU
tensors (:func:`tfla.triton.common.interpret_mode`). A compiled program keeps the values
it was traced with.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
from torch import Tensor

from tfla.triton.common import interpret_mode
from tfla.triton.fastlaunch import begin_call, end_call
from tfla.triton.replay import program, recorder
from tfla.triton.tuning import tuning_key

__all__ = ["apply", "eager", "kernels_run", "needs_grad", "mlstm_fwd", "mlstm_bwd",
           "forward_impl", "backward_impl"]

#: ``tuning_key`` and ``interpret_mode`` as a trace sees them: constants of the trace
_tuning_key = torch.compiler.assume_constant_result(tuning_key)
_interpret = torch.compiler.assume_constant_result(interpret_mode)


def kernels_run(q: Tensor) -> bool:
    """Whether a call with ``q`` runs the Triton kernels (CUDA tensors, or CPU tensors with
    TRITON_INTERPRET=1) rather than the PyTorch reference."""
    return q.device.type == "cuda" or _interpret()


def needs_grad(q, k, v, i, f, initial_state) -> bool:
    """Whether the call records a backward: grad mode on and an input (or a tensor of
    ``initial_state``) requiring gradients."""
    if not torch.is_grad_enabled():
        return False
    states = (initial_state if isinstance(initial_state, (tuple, list))
              else (initial_state,))
    return any(getattr(t, "requires_grad", False) for t in (q, k, v, i, f, *states))


#: (plan, kernel configuration) per operator arguments (:func:`_setup`)
_SETUPS: dict = {}


def _setup(q: Tensor, v: Tensor, variant: str, chunk_size: int, algorithm: str,
           normalize: bool, eps: float, return_last: bool, grad: bool, tuning: int,
           shape: tuple | None = None):
    """The plan (:func:`tfla.plan.plan_of`) and the kernel configuration of one call, from
    plain values; worked out once per shape, dtype and flags (one dictionary look-up
    after; also keyed by Triton's interpreter switch, on which the kernels' operand dtype
    depends). ``shape``: (B, NH, S, d_qk, d_hv) as ints where q's and v's may be symbolic."""
    B, NH, S, d_qk, d_hv = shape or (*q.shape, v.shape[-1])
    key = (variant, B * NH, S, d_qk, d_hv, q.dtype, q.device, chunk_size, algorithm,
           normalize, eps, return_last, grad, tuning, triton.knobs.runtime.interpret)
    found = _SETUPS.get(key)
    if found is None:
        from tfla.plan import plan_of
        from tfla.triton.chunkwise import Config
        from tfla.triton.tuning import tuning_of

        p = plan_of(variant, B * NH, S, d_qk, d_hv, q.dtype, q.device,
                    chunk_size or "auto", algorithm, grad, normalize, return_last, tuning,
                    True)
        two_level_walk = p.algorithm.endswith("_two_level")
        cfg = Config(variant=variant, normalize=normalize, eps=eps, L=p.chunk_size,
                     limit=algorithm == "limit_chunk", tuning=tuning_of(tuning),
                     walk=p.walk if two_level_walk else ())
        found = _SETUPS[key] = (p, cfg)
    return found


@torch.library.custom_op("tfla::mlstm_fwd", mutates_args=())
def mlstm_fwd(q: Tensor, k: Tensor, v: Tensor, i: Tensor, f: Tensor, C0: Optional[Tensor],
              n0: Optional[Tensor], m0: Optional[Tensor], variant: str, chunk_size: int,
              algorithm: str, normalize: bool, eps: float, return_last: bool, grad: bool,
              tuning: int) -> list[Tensor]:
    """The forward of one call on the Triton kernels, as :func:`tfla.plan` plans it.

    Args: q, k (B, NH, S, d_qk), v (B, NH, S, d_hv), i, f (B, NH, S); C0 (B, NH, d_qk, d_hv),
    n0 (B, NH, d_qk), m0 (B, NH) or None; ``variant`` "sig" | "exp"; ``chunk_size`` L or 0
    for "auto"; ``algorithm`` "xl_chunk" | "limit_chunk"; ``grad``: keep what the backward
    reads; ``tuning`` a :func:`tfla.triton.tuning.tuning_key`.

    Returns: [h (B, NH, S, d_hv) in q's dtype, (C_S, n_S[, m_S]) float32 where
    ``return_last``, then with ``grad`` the tensors the backward reads]
    (``tfla.triton.chunkwise.forward``).
    """
    return forward_impl(q, k, v, i, f, C0, n0, m0, variant, chunk_size, algorithm, normalize,
                        eps, return_last, grad, tuning)


def _tensors_key(*tensors) -> tuple:
    """What the launches of a call read from the tensors the caller passes: per tensor its
    dtype, 16-byte alignment, shape and strides (None for None)."""
    return tuple([None if t is None else (t.dtype, t.data_ptr() & 15, t.shape, t.stride())
                  for t in tensors])


def forward_impl(q, k, v, i, f, C0, n0, m0, variant, chunk_size, algorithm, normalize, eps,
                 return_last, grad, tuning) -> list:
    """:func:`mlstm_fwd`'s body, which the direct eager route (:func:`apply`) runs too. Its
    launches find their kept launches by their place in the call (``fastlaunch.begin_call``:
    the plan's key and the inputs' dtypes, alignment, shapes and strides decide them all);
    from a signature's second call on, the call's recorded program replays it
    (``tfla.triton.replay``)."""
    return _forward(q, k, v, i, f, C0, n0, m0, variant, chunk_size, algorithm, normalize, eps,
                    return_last, grad, tuning)[0]


def _forward(q, k, v, i, f, C0, n0, m0, variant, chunk_size, algorithm, normalize, eps,
             return_last, grad, tuning) -> tuple:
    """:func:`forward_impl`'s outputs and the call's signature number (None in Triton's
    interpreter), which the direct route's backward takes as its own signature's part."""
    from tfla.triton import chunkwise

    # nothing is kept in Triton's interpreter: no signature to work out there
    number = begin_call(None if triton.knobs.runtime.interpret else (
        "fwd", variant, chunk_size, algorithm, normalize, eps, return_last, grad, tuning,
        q.device, _tensors_key(q, k, v, i, f, C0, n0, m0)))
    try:
        found = None if number is None else program(number)
        if found is not None:
            return found.run((q, k, v, i, f, C0, n0, m0)), number
        p, cfg = _setup(q, v, variant, chunk_size, algorithm, normalize, eps, return_last,
                        grad, tuning)
        rec = None if number is None else recorder(number, (q, k, v, i, f, C0, n0, m0))
        if rec is None:
            return chunkwise.forward(q, k, v, i, f, C0, n0, m0, p, cfg, return_last,
                                     grad), number
        with rec:
            outs = chunkwise.forward(q, k, v, i, f, C0, n0, m0, p, cfg, return_last, grad)
        rec.finish(outs)
        return outs, number
    finally:
        end_call()


@mlstm_fwd.register_fake
def _mlstm_fwd_fake(q, k, v, i, f, C0, n0, m0, variant, chunk_size, algorithm, normalize, eps,
                    return_last, grad, tuning):
    """The shapes and dtypes of :func:`mlstm_fwd`'s outputs (the same plan decides). The
    plan depends on the sequence length and the head dimensions, so symbolic sizes are
    specialised to the example's (``int``)."""

    from tfla.triton.common import cdiv

    B, NH, S, d_qk, d_hv = (int(x) for x in (*q.shape, v.shape[-1]))
    p, cfg = _setup(q, v, variant, chunk_size, algorithm, normalize, eps, return_last, grad,
                    tuning, (B, NH, S, d_qk, d_hv))
    f32 = dict(dtype=torch.float32, device=q.device)
    outs = [q.new_empty((B, NH, S, d_hv))]
    if return_last:
        outs += [q.new_empty((B, NH, d_qk, d_hv), **f32), q.new_empty((B, NH, d_qk), **f32)]
        if cfg.is_exp and p.algorithm not in ("walk", "walk_segments"):
            outs.append(q.new_empty((B, NH, 1), **f32))
    if grad and p.algorithm not in ("walk", "walk_segments"):
        BNH, L = B * NH, cfg.L
        NC = cdiv(S, L)
        if normalize:
            outs.append(q.new_empty((BNH, NC * L), **f32))
        if not cfg.recompute_states:
            k_dtype = (torch.float32 if q.dtype == torch.bfloat16
                       and triton.knobs.runtime.interpret else q.dtype)
            outs += [q.new_empty((BNH, NC + 1, d_qk, d_hv), dtype=k_dtype),
                     q.new_empty((BNH, NC + 1), **f32)]
            outs += [q.new_empty((BNH, NC * L), **f32) for _ in range(4 if cfg.is_exp else 3)]
    return outs


@torch.library.custom_op("tfla::mlstm_bwd", mutates_args=())
def mlstm_bwd(dh: Optional[Tensor], dC_last: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor,
              i: Tensor, f: Tensor, C0: Optional[Tensor], n0: Optional[Tensor],
              m0: Optional[Tensor], C_last: Optional[Tensor], saved: list[Tensor],
              variant: str, chunk_size: int, algorithm: str, normalize: bool, eps: float,
              return_last: bool, tuning: int, with_dc0: bool) -> list[Tensor]:
    """The backward of one :func:`mlstm_fwd` call (same arguments; ``saved`` what it kept,
    C_last its C_S or None). Returns [dq, dk, dv, di, df] in their inputs' dtypes, and dC0
    (C0's dtype) where ``with_dc0`` (docs/tfla-kernels.md 1.5)."""
    return backward_impl(dh, dC_last, q, k, v, i, f, C0, n0, m0, C_last, saved, variant,
                         chunk_size, algorithm, normalize, eps, return_last, tuning, with_dc0)


def backward_impl(dh, dC_last, q, k, v, i, f, C0, n0, m0, C_last, saved, variant, chunk_size,
                  algorithm, normalize, eps, return_last, tuning, with_dc0,
                  forward_number=None) -> list:
    """:func:`mlstm_bwd`'s body, which the direct eager route (:func:`apply`) runs too.
    ``forward_number``: the signature number of the forward call whose tensors the backward
    takes (the direct route passes it): those tensors' dtypes, shapes, strides and alignment
    are that signature's, so only dh's and dC_last's are worked out."""
    from tfla.triton import chunkwise

    if triton.knobs.runtime.interpret:
        signature = None
    elif forward_number is not None:
        signature = ("bwd of", forward_number, with_dc0, _tensors_key(dh, dC_last))
    else:
        signature = ("bwd", variant, chunk_size, algorithm, normalize, eps, return_last,
                     with_dc0, tuning, q.device,
                     _tensors_key(dh, dC_last, q, k, v, i, f, C0, n0, m0, C_last, *saved))
    number = begin_call(signature)
    try:
        found = None if number is None else program(number)
        if found is not None:
            return found.run((dh, dC_last, q, k, v, i, f, C0, n0, m0, C_last, *saved))
        p, cfg = _setup(q, v, variant, chunk_size, algorithm, normalize, eps, return_last,
                        True, tuning)
        rec = None if number is None else recorder(
            number, (dh, dC_last, q, k, v, i, f, C0, n0, m0, C_last, *saved))
        if rec is None:
            return chunkwise.backward(dh, dC_last, q, k, v, i, f, C0, n0, m0, C_last, saved,
                                      p, cfg, with_dc0)
        with rec:
            outs = chunkwise.backward(dh, dC_last, q, k, v, i, f, C0, n0, m0, C_last, saved,
                                      p, cfg, with_dc0)
        rec.finish(outs)
        return outs
    finally:
        end_call()


@mlstm_bwd.register_fake
def _mlstm_bwd_fake(dh, dC_last, q, k, v, i, f, C0, n0, m0, C_last, saved, variant, chunk_size,
                    algorithm, normalize, eps, return_last, tuning, with_dc0):
    """The shapes and dtypes of :func:`mlstm_bwd`'s outputs: those of its inputs."""
    grads = [torch.empty_like(x) for x in (q, k, v, i, f)]
    if with_dc0:
        grads.append(torch.empty_like(C0))
    return grads


#: the operators' scalar arguments, in order, after the tensors
_SCALARS = ("variant", "chunk_size", "algorithm", "normalize", "eps", "return_last", "grad",
            "tuning")


def _setup_context(ctx, inputs, output):
    q, k, v, i, f, C0, n0, m0 = inputs[:8]
    variant, chunk_size, algorithm, normalize, eps, return_last, _, tuning = inputs[8:]
    from tfla.triton.chunkwise import output_layout

    front = output_layout(variant == "exp", return_last)
    C_last = output[1] if return_last else None
    ctx.args = (variant, chunk_size, algorithm, normalize, eps, return_last, tuning)
    ctx.n_saved = len(output) - front
    ctx.has = (C0 is not None, n0 is not None, m0 is not None)
    ctx.save_for_backward(q, k, v, i, f, C0, n0, m0, C_last, *output[front:])
    ctx.set_materialize_grads(False)
    return front


def _grads(ctx, grads, bwd, forward_number=None):
    """The gradients of the eight tensor inputs from the output gradients ``grads`` (h's,
    then the last state's), ``bwd`` the backward (the operator or its body; the body takes
    the forward's signature number where there is one)."""
    q, k, v, i, f, C0, n0, m0, C_last, *saved = ctx.saved_tensors
    return_last = ctx.args[5]
    dh = grads[0]
    dC_last = grads[1] if return_last else None
    with_dc0 = bool(ctx.needs_input_grad[5]) and C0 is not None
    if forward_number is None:
        out = bwd(dh, dC_last, q, k, v, i, f, C0, n0, m0, C_last, saved, *ctx.args, with_dc0)
    else:
        out = bwd(dh, dC_last, q, k, v, i, f, C0, n0, m0, C_last, saved, *ctx.args, with_dc0,
                  forward_number)
    dC0 = out[5] if with_dc0 else None
    dn0 = torch.zeros_like(n0, dtype=torch.float32) if n0 is not None else None
    dm0 = torch.zeros_like(m0, dtype=torch.float32) if m0 is not None else None
    return (*out[:5], dC0, dn0, dm0)


def _backward(ctx, grads):
    return _grads(ctx, grads, torch.ops.tfla.mlstm_bwd) + (None,) * len(_SCALARS)


mlstm_fwd.register_autograd(_backward, setup_context=_setup_context)


class _Direct(torch.autograd.Function):
    """The eager route of a call with gradients (:func:`apply`): the operators' bodies
    (:func:`forward_impl`, :func:`backward_impl`) and their autograd (:func:`_setup_context`,
    :func:`_grads`) under a plain ``torch.autograd.Function``, without the dispatcher and
    the custom-op layers around them. Returns h (and the last state) only: the tensors the
    backward reads are kept on ``ctx``."""

    @staticmethod
    def forward(ctx, q, k, v, i, f, C0, n0, m0, scalars):
        output, ctx.forward_number = _forward(q, k, v, i, f, C0, n0, m0, *scalars)
        front = _setup_context(ctx, (q, k, v, i, f, C0, n0, m0, *scalars), output)
        return tuple(output[:front])

    @staticmethod
    def backward(ctx, *grads):
        if _profiling():
            with torch.autograd.profiler.record_function("tfla::mlstm_bwd"):
                return _grads(ctx, grads, backward_impl, ctx.forward_number) + (None,)
        return _grads(ctx, grads, backward_impl, ctx.forward_number) + (None,)


def _profiling() -> bool:
    """Whether torch's profiler records now (the direct route then names its calls as the
    operators do)."""
    return torch.autograd.profiler._is_profiler_enabled


def eager(*tensors) -> bool:
    """Whether a call may take the direct eager route (:func:`apply`): no trace or transform
    that the registered operators exist for is active (``torch.jit`` tracing, a
    ``TorchDispatchMode`` such as FakeTensorMode or a FlopCounterMode, a torch-function
    mode, functorch's vmap / grad) and every tensor is a plain ``torch.Tensor`` (or
    ``nn.Parameter``; a subclass such as a FakeTensor takes the operators). Called only
    outside ``torch.compile`` (:func:`apply` asks ``torch.compiler.is_compiling`` first)."""
    if (torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled()
            or torch._C._functorch.peek_interpreter_stack() is not None
            or torch._C._get_tracing_state() is not None):
        return False
    for t in tensors:
        if t is not None and type(t) is not torch.Tensor and type(t) is not _PARAMETER:
            return False
    return True


_PARAMETER = torch.nn.Parameter


def apply(q: Tensor, k: Tensor, v: Tensor, i: Tensor, f: Tensor, C0, n0, m0, *, variant: str,
          chunk_size, algorithm: str, normalize: bool, eps: float, return_last: bool,
          grad: bool):
    """One call of the Triton kernels (arguments checked by the public function;
    ``chunk_size`` an int or "auto"). Returns h, or (h, (C_S, n_S)) for mLSTMsig and
    (h, (C_S, n_S, m_S)) for mLSTMexp, as the references return them.

    Under ``torch.compile`` and wherever :func:`eager` says no, through the registered
    operator :func:`mlstm_fwd` (and its autograd, :func:`mlstm_bwd`). Otherwise the direct
    eager route runs the operators' bodies themselves: without gradients
    :func:`forward_impl`, with gradients :class:`_Direct`; the same kernels on the same
    arguments, so the same h, last state and gradients bit for bit, at a fraction of the
    host time (the custom-op layers cost more than the launches; docs/kernels.md, "Host
    time")."""
    scalars = (variant, 0 if chunk_size == "auto" else chunk_size, algorithm, normalize, eps,
               return_last, grad, _tuning_key())
    if torch.compiler.is_compiling() or not eager(q, k, v, i, f, C0, n0, m0):
        outs = torch.ops.tfla.mlstm_fwd(q, k, v, i, f, C0, n0, m0, *scalars)
    elif _profiling():
        with torch.autograd.profiler.record_function("tfla::mlstm_fwd"):
            outs = (_Direct.apply(q, k, v, i, f, C0, n0, m0, scalars) if grad
                    else forward_impl(q, k, v, i, f, C0, n0, m0, *scalars))
    elif grad:
        outs = _Direct.apply(q, k, v, i, f, C0, n0, m0, scalars)
    else:
        outs = forward_impl(q, k, v, i, f, C0, n0, m0, *scalars)
    if not return_last:
        return outs[0]
    if variant == "exp":
        return outs[0], (outs[1], outs[2], outs[3])
    return outs[0], (outs[1], outs[2])
