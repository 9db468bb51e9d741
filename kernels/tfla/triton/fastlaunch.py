"""The cached launch of a compiled Triton kernel (docs/kernels.md, "Host time").

``kernel[grid](*args)`` goes through Triton's ``JITFunction.run`` on every launch: it binds
and specialises the arguments, looks the compiled kernel up, checks the kernel's globals,
builds the launch metadata for the launch hooks, and the launcher then builds every host
TMA descriptor (``TensorDescriptor``, its checks, then ``cuTensorMapEncodeTiled``) again.
After the first launch of a specialisation none of that changes while the arguments keep
their kind, so :func:`keep` stores the compiled kernel with what the launch passed (its
grid, the keyword-argument values it bound, its launcher), and :func:`run` launches it
again through the same C launcher, with the same arguments in the same order, on the
stream Triton takes (the current stream of the current device): the kernel and its inputs
are Triton's, so the results are bit for bit those of ``kernel[grid]``.

The key (:func:`key_of`) is at least as fine as Triton's specialisation: the kernel, the
current device, the grid, the pipelining depth asked for, Triton's debug and
instrumentation knobs, every keyword argument by name, type and value, each tensor
argument's dtype and 16-byte alignment, each TMA descriptor's dtype, block and shared
layout (:class:`TmaArg`), every other argument by type and value (an int by value is finer
than Triton's divisibility classes). Encoded TMA descriptors are kept per address, shape
and strides (the caching allocator hands the same addresses to the next call), never the
tensors themselves.

Not taken (``kernel[grid]`` as before): Triton's interpreter (TRITON_INTERPRET), a kernel
that is not a ``JITFunction``, a ``JITFunction.run`` replaced (the compile-only tests and
the kernel matrix do), a launch hook set (a profiler), a launcher that allocates scratch
memory or whose form is not Triton 3.6's.
"""

from __future__ import annotations

import itertools
import threading

import triton
from torch import Tensor
from triton.knobs import HookChain
from triton.runtime import driver
from triton.runtime.jit import JITFunction

__all__ = ["TmaArg", "key_of", "run", "keep", "clear", "kept", "begin_call", "end_call",
           "call_key", "key_in_call", "remember", "set_recorder", "recorder", "unkept"]

#: Triton's launch path as imported: where a test or a harness replaces it, launches go
#: through the replacement (no cached launch)
_JIT_RUN = JITFunction.run
#: the cached launches by key (:func:`key_of`); emptied when it reaches MAX_KEPT
_KEPT: dict = {}
MAX_KEPT = 4096
#: encoded TMA descriptors a cached launch keeps (per launch), at most
MAX_DESCS = 256
#: the call that launches belong to, per thread (:func:`begin_call`): its signature and how
#: many launches it has made
_CALL = threading.local()
#: launch keys (:func:`key_of`) by place in a call: (the call signature's number, launch
#: number, kernel)
_BY_CALL: dict = {}
#: a number per call signature, never reused (hashed once per call, not once per launch)
_SIGNATURES: dict = {}
_NEXT_SIGNATURE = itertools.count()
#: check every key found by its place in a call against :func:`key_of` (AssertionError where
#: they differ; the tests set it)
VERIFY = False


class TmaArg:
    """A host TMA descriptor argument of a launch: the tensor, its block and, for the Gluon
    kernels, the block's shared-memory layout (``tfla.triton.common.descriptor`` and
    ``gluon_descriptor`` make them). ``common.launch`` turns it into Triton's
    ``TensorDescriptor`` where the launch goes through Triton (``kernel[grid]``); a kept
    launch (:func:`run`) passes the encoded descriptor it keeps per address, shape and
    strides, building and encoding one only for a new address."""

    __slots__ = ("t", "block", "layout")

    def __init__(self, t, block, layout=None):
        self.t, self.block, self.layout = t, block, layout

    def make(self):
        """Triton's host TensorDescriptor (Gluon's where a layout is given)."""
        if self.layout is None:
            from triton.tools.tensor_descriptor import TensorDescriptor

            return TensorDescriptor.from_tensor(self.t, block_shape=list(self.block))
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        return TensorDescriptor.from_tensor(self.t, list(self.block), self.layout)


def _idle(hook) -> bool:
    """Whether a launch hook calls nothing: None, or Triton's empty ``HookChain`` (Triton
    3.6 passes the chain to every launch, and builds the launch metadata for it)."""
    return hook is None or (type(hook) is HookChain and not hook.calls)


def key_of(kernel, grid, args, num_stages, kwargs):
    """The key of a launch (module docstring), or None where the cached launch does not
    apply (a kernel that is not a ``JITFunction``, e.g. Triton's interpreter's; Triton's
    ``JITFunction.run`` replaced; a launch hook set). The kernel and the Gluon layouts by
    identity (a kept launch holds its kernel; the layouts are cached for good: an equal
    layout of another identity only misses)."""
    if not isinstance(kernel, JITFunction) or JITFunction.run is not _JIT_RUN:
        return None
    rt = triton.knobs.runtime
    if not (_idle(rt.launch_enter_hook) and _idle(rt.launch_exit_hook)):
        return None
    keys = []
    for a in args:
        t = type(a)
        if t is Tensor:
            keys.append((a.dtype, a.data_ptr() & 15))
        elif t is int:
            keys.append(a)
        elif t is TmaArg:
            keys.append((a.t.dtype, a.block, id(a.layout)))
        elif isinstance(a, Tensor):
            keys.append((a.dtype, a.data_ptr() & 15))
        else:
            keys.append((t, a))
    # Triton's run adds the debug and instrumentation knobs to the compile options
    return (id(kernel), driver.active.get_current_device(), grid, num_stages,
            tuple(kwargs.items()), tuple(map(type, kwargs.values())), tuple(keys), rt.debug,
            triton.knobs.compilation.instrumentation_mode)


def begin_call(signature) -> int | None:
    """The launches of this thread until :func:`end_call` make one call of the kernels whose
    every launch argument (kernel, grid, configuration, dtypes, 16-byte alignment, integers)
    ``signature`` decides: the caller's shapes, dtypes, flags and the alignment of the
    tensors it passes in; the tensors the call allocates itself are aligned. A launch then
    finds its key (:func:`key_of`) by its place in the call (:func:`call_key`) instead of
    working it out from the arguments (docs/kernels.md, "Host time"). ``signature`` None,
    Triton's interpreter, a launch hook set or Triton's launch path replaced: no call (keys
    as before). Returns the signature's number (``tfla.triton.replay`` keeps a call's
    program under it), or None where there is no call."""
    rt = triton.knobs.runtime
    if signature is not None:
        if (rt.interpret or JITFunction.run is not _JIT_RUN
                or not _idle(rt.launch_enter_hook) or not _idle(rt.launch_exit_hook)):
            signature = None
        else:
            signature = (signature, driver.active.get_current_device(), rt.debug,
                         triton.knobs.compilation.instrumentation_mode)
            number = _SIGNATURES.get(signature)
            if number is None:
                if len(_SIGNATURES) >= MAX_KEPT:
                    _SIGNATURES.clear()
                number = _SIGNATURES[signature] = next(_NEXT_SIGNATURE)
            signature = number
    _CALL.sig = signature
    _CALL.n = 0
    return signature


def end_call() -> None:
    """End the call :func:`begin_call` began on this thread."""
    _CALL.sig = None


def call_key(kernel):
    """The place of this launch in the current call of this thread (the signature's number,
    launch number, kernel), or None outside a call; counts the launch."""
    sig = getattr(_CALL, "sig", None)
    if sig is None:
        return None
    n = _CALL.n
    _CALL.n = n + 1
    return (sig, n, id(kernel))


def key_in_call(place, kernel, grid, args, num_stages, kwargs):
    """The key a launch at ``place`` (:func:`call_key`) had in an earlier call of the same
    signature, or None; with :data:`VERIFY`, checked against :func:`key_of`."""
    key = _BY_CALL.get(place)
    if key is not None and VERIFY:
        full = key_of(kernel, grid, args, num_stages, kwargs)
        assert key == full, f"launch {place[1]}: key by place {key} != {full}"
    return key


def remember(place, key) -> None:
    """Store the key of the launch at ``place`` (after it was kept)."""
    if len(_BY_CALL) >= MAX_KEPT:
        _BY_CALL.clear()
    _BY_CALL[place] = key


def run(key, args):
    """Launch the kernel kept under ``key`` with ``args`` (the launch site's positional
    arguments, TMA descriptors as ``TmaArg``); the CompiledKernel, or None where none is
    kept."""
    kept = _KEPT.get(key)
    if kept is None:
        return None
    rec = getattr(_CALL, "rec", None)
    if rec is None:
        return kept(args, key[1])
    rec.quiet += 1                  # the launch's own work is not the call's to record
    try:
        out = kept(args, key[1])
    finally:
        rec.quiet -= 1
    rec.launch(kept, args, key[1])
    return out


def set_recorder(rec) -> None:
    """The ``tfla.triton.replay.Recorder`` that the kept launches of this thread report to
    (:func:`run`), or None."""
    _CALL.rec = rec


def recorder():
    """The ``tfla.triton.replay.Recorder`` of this thread's current call, or None."""
    return getattr(_CALL, "rec", None)


def unkept() -> None:
    """This thread's current call does what its program could not replay (a launch through
    Triton, ``kernel[grid]``; a stream of another device): the call being recorded, if any,
    makes no program."""
    rec = getattr(_CALL, "rec", None)
    if rec is not None:
        rec.fail()


def keep(key, kernel, compiled, args, targs, kwargs) -> bool:
    """Keep the launch that ``kernel[grid](*targs, **kwargs)`` just made (``compiled`` its
    CompiledKernel; ``args`` the launch site's arguments, ``targs`` them with Triton's
    descriptors) under ``key``. Returns whether it was kept: not where the launcher is not
    Triton 3.6's CUDA launcher in form (a launch with scratch memory, a descriptor argument
    whose position the launcher does not take as one)."""
    launcher = getattr(compiled, "_run", None)
    if launcher is None or getattr(compiled, "function", None) is None:
        return False
    if (getattr(launcher, "global_scratch_size", 1) or getattr(launcher, "profile_scratch_size", 1)
            or not hasattr(launcher, "launch_cooperative_grid")):
        return False
    descs = [j for j, a in enumerate(args) if type(a) is TmaArg]
    fn = launcher.launch
    code = getattr(fn, "__code__", None)
    if code is not None and code.co_name == "inner":      # wrap_handle_tensordesc's wrapper
        cells = dict(zip(code.co_freevars, fn.__closure__ or ()))
        if not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= set(cells):
            return False
        raw = cells["launcher"].cell_contents
        indices = sorted(cells["tensordesc_indices"].cell_contents)
        metas = list(cells["tensordesc_meta"].cell_contents)
        expand = fn.__globals__.get("make_tensordesc_arg")
        if indices != descs or expand is None or len(metas) != len(descs):
            return False
    elif code is None and not descs:                       # the C launcher itself
        raw, metas, expand = fn, [], None
    else:
        return False
    binder = kernel.device_caches[key[1]][4]
    bound, _, _ = binder(*targs, **kwargs)
    tail = tuple(list(bound.values())[len(args):])
    if len(_KEPT) >= MAX_KEPT:
        _KEPT.clear()
    _KEPT[key] = _Launch(kernel, compiled, raw, tuple(key[2]), launcher, tail,
                         tuple(zip(descs, metas)), expand, dict(kwargs))
    return True


class _Launch:
    """One kept launch: the compiled kernel, its C launcher and what every launch passes."""

    __slots__ = ("kernel", "compiled", "raw", "grid", "coop", "pdl", "function", "packed",
                 "tail", "descs", "expand", "encoded", "kwargs")

    def __init__(self, kernel, compiled, raw, grid, launcher, tail, descs, expand, kwargs):
        self.kernel = kernel        # held: the key names it by identity
        self.kwargs = kwargs        # what ``kernel[grid]`` took besides the arguments (tests)
        self.compiled, self.raw, self.tail = compiled, raw, tail
        self.grid = (grid + (1, 1))[:3]
        self.coop = launcher.launch_cooperative_grid
        self.pdl = launcher.launch_pdl
        self.function = compiled.function
        self.packed = compiled.packed_metadata
        self.descs, self.expand = descs, expand
        self.encoded: dict = {}

    def __call__(self, args, device):
        return self.go(self.final(args) if self.descs else args, device)

    def final(self, args) -> list:
        """The launcher's arguments for the launch site's ``args``: each TMA descriptor
        expanded into its encoded form (kept per address, shape and strides)."""
        final = list(args)
        encoded = self.encoded
        for j, meta in reversed(self.descs):       # from the back: positions stay valid
            a = args[j]
            t = a.t
            dk = (j, t.data_ptr(), t.shape, t.stride())
            ex = encoded.get(dk)
            if ex is None:
                ex = self.encode(a, meta)
                if meta is not None:              # no tensor in it: safe to keep
                    if len(encoded) >= MAX_DESCS:
                        encoded.clear()
                    encoded[dk] = ex
            final[j:j + 1] = ex
        return final

    def encode(self, a: TmaArg, meta) -> list:
        """The launcher's arguments for descriptor ``a`` (``meta`` its position's metadata):
        built and encoded (``cuTensorMapEncodeTiled``) for its address, shape and strides."""
        return self.expand(a.make(), meta)

    def go(self, final, device):
        """Launch with the launcher's arguments ``final`` (:meth:`final`) on the current
        stream of ``device``."""
        gx, gy, gz = self.grid
        self.raw(gx, gy, gz, driver.active.get_current_stream(device), self.function, self.coop,
                 self.pdl, None, None, self.packed, None, None, None, *final, *self.tail)
        return self.compiled


def clear() -> None:
    """Forget every kept launch and every key by place (tests; ``chunkwise.kernels`` when it takes
    the kernel modules anew)."""
    _KEPT.clear()
    _BY_CALL.clear()
    _SIGNATURES.clear()


def kept() -> int:
    """How many launches are kept."""
    return len(_KEPT)
