"""A call's host work recorded once per call signature, then replayed (docs/kernels.md,
"Host time").

Inside one operator body (``tfla.ops.forward_impl`` / ``backward_impl``) everything the host
does is decided by the call's signature (``fastlaunch.begin_call``: the plan's key and the
inputs' dtypes, 16-byte alignment, shapes and strides): which tensors are allocated, viewed
or filled, which kernels are launched with which grids and arguments, how the side stream
forks and joins. So once a call of a signature has run with every launch kept, a
:class:`Recorder` writes that call down as a :class:`Program`: the torch operations it
dispatched (seen by a ``TorchDispatchMode``), its kept launches (``fastlaunch.run``) and its
stream steps (:func:`step`), each with its tensor arguments as slots (the call's inputs, or
the output of an earlier operation) and everything else as constants. Later calls of the
signature run the program: the same operations on the same kind of arguments, the same
launches through the same C launchers, without the Python of the plan, the configuration
and the launch sites in between; the kernels see the same arguments, so the results are
bit for bit those of the recorded path. A program calls torch's own bindings of the
operators it recorded, drops what nothing reads, takes a view once, makes the views that
only launches read where a launch needs them (:class:`_Lazy`) and keeps each launch's
launcher arguments per descriptor address.

Not recorded (the body runs as before): the first call of a signature (its launches go
through Triton), a call with a launch that was not kept, a torch operation that returns
anything but tensors (nothing on the host may depend on the values), a CUDA stream being
captured, a dispatch mode already active, or once :data:`MAX_TRIES` recordings of a
signature failed.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from tfla.triton import fastlaunch as fast

__all__ = ["Program", "Recorder", "program", "recorder", "step", "clear", "ENABLED",
           "MAX_TRIES"]

#: programs by call signature number (``fastlaunch.begin_call``)
_PROGRAMS: dict = {}
#: calls seen and recordings tried, by signature number: (calls, failed recordings)
_SEEN: dict = {}
#: recordings of one signature tried before it is left to the plain path
MAX_TRIES = 3
#: replay at all (the tests switch it off to compare with the plain path)
ENABLED = True


class _Slot:
    """A tensor (or stream) of a program: an input of the call or an operation's output."""

    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i


class _Tma:
    """A TMA descriptor argument of a recorded launch: its tensor's slot, block, layout."""

    __slots__ = ("i", "block", "layout")

    def __init__(self, i, block, layout):
        self.i, self.block, self.layout = i, block, layout


def _binder(template):
    """A function env -> the arguments ``template`` names (slots looked up in ``env``,
    nested lists and tuples followed)."""
    pos = []
    for j, a in enumerate(template):
        t = type(a)
        if t is _Slot:
            pos.append((j, a.i))
        elif (t is list or t is tuple) and _has_slot(a):
            pos = None
            break
    if pos is None:
        def bind(env):
            return [_resolve(a, env) for a in template]
        return bind
    base = list(template)
    if not pos:
        return lambda env: base

    def bind(env):
        args = base.copy()
        for j, i in pos:
            args[j] = env[i]
        return args
    return bind


def _has_slot(a) -> bool:
    t = type(a)
    if t is _Slot or t is _Tma:
        return True
    if t is list or t is tuple:
        return any(_has_slot(x) for x in a)
    return False


def _resolve(a, env):
    t = type(a)
    if t is _Slot:
        return env[a.i]
    if t is list:
        return [_resolve(x, env) for x in a]
    if t is tuple:
        return tuple(_resolve(x, env) for x in a)
    return a


class Program:
    """A recorded call: ``run(inputs)`` replays it on new inputs (the tensors of the call in
    the recorder's order, None where absent) and returns the call's outputs, a list of
    tensors (or None) in the recorded order."""

    __slots__ = ("steps", "n_inputs", "size", "outputs", "launches")

    def __init__(self, steps, n_inputs, size, outputs, launches):
        self.steps, self.n_inputs, self.size = steps, n_inputs, size
        self.outputs, self.launches = outputs, launches

    def run(self, inputs) -> list:
        env = [*inputs, *([None] * (self.size - self.n_inputs))]
        for s in self.steps:
            s(env)
        return [None if i is None else env[i] for i in self.outputs]


def _op_step(fn, template, kwargs, outs):
    """A step that calls ``fn`` (a torch operation, a stream function) on the bound
    arguments and stores its outputs in the slots ``outs`` (a tuple or a list result: one
    slot per element; None: nothing stored)."""
    bind = _binder(template)
    kw = kwargs or {}
    fn = _fast(fn)
    if outs is None:
        def run(env):
            fn(*bind(env), **kw)
    elif type(outs) is int:
        def run(env):
            env[outs] = fn(*bind(env), **kw)
    else:
        def run(env):
            res = fn(*bind(env), **kw)
            for i, r in zip(outs, res):
                if i is not None:
                    env[i] = r
    return run


def _fast(fn):
    """The function a step calls for ``fn``: for the ATen operators a call makes (an
    ``OpOverload``), torch's own Python binding of the same overload where one takes the
    same arguments (:data:`_FAST`; an ``OpOverload`` parses its arguments against the
    schema, several times slower), else the operator's C++ entry."""
    found = _FAST.get(fn)
    if found is not None:
        return found
    return getattr(fn, "_op", fn)


_aten = torch.ops.aten
#: ATen overloads and torch's bindings that take the same positional and keyword arguments
_FAST = {
    _aten.empty.memory_format: torch.empty, _aten.zeros.default: torch.zeros,
    _aten.empty_like.default: torch.empty_like, _aten.zeros_like.default: torch.zeros_like,
    _aten.empty_strided.default: torch.empty_strided, _aten.view.default: Tensor.view,
    _aten.select.int: torch.select, _aten.clone.default: torch.clone,
    _aten.mul.Tensor: torch.mul, _aten.sum.dim_IntList: torch.sum,
    _aten.zero_.default: Tensor.zero_, _aten.fill_.Scalar: Tensor.fill_,
    _aten.copy_.default: Tensor.copy_, _aten.as_strided.default: torch.as_strided,
    _aten.unsqueeze.default: torch.unsqueeze, _aten.permute.default: torch.permute,
    _aten.transpose.int: torch.transpose,
}


class _Lazy:
    """A view that only launches read (:meth:`Recorder._program`): made from the tensor in
    slot ``root`` by ``chain`` (view functions and their other arguments) only where a
    launch needs its shape or strides (a TMA descriptor at a new address) or its address
    differs from the root's; a pointer argument at the root's address takes the root."""

    __slots__ = ("root", "chain", "same_ptr")

    def __init__(self, root, chain, same_ptr):
        self.root, self.chain, self.same_ptr = root, chain, same_ptr

    def make(self, env):
        t = env[self.root]
        for fn, rest in self.chain:
            t = fn(t, *rest)
        return t


def _launch_step(kept, template, device, lazy):
    """A step that launches the kept launch ``kept`` (``fastlaunch``) with the bound
    arguments on the stream current at replay; ``lazy`` the views made only where needed
    (slot -> :class:`_Lazy`). Where the launch takes TMA descriptors, the launcher's
    arguments are kept per the descriptors' addresses (their shapes, strides, blocks and
    layouts are the program's): a call with the tensors at the same addresses (the caching
    allocator hands them out again) only puts its tensors in."""
    slots, made = [], []
    for j, a in enumerate(template):
        if type(a) is _Slot:
            v = lazy.get(a.i)
            if v is None:
                slots.append((j, a.i))
            elif v.same_ptr:
                slots.append((j, v.root))
            else:
                made.append((j, v))
    descs = [(j, a.i, a.block, a.layout) for j, a in enumerate(template) if type(a) is _Tma]
    base = list(template)
    tma = fast.TmaArg

    def tensor(env, i):
        v = lazy.get(i)
        return env[i] if v is None else v.make(env)

    if not descs:
        def run(env):
            args = base.copy()
            for j, i in slots:
                args[j] = env[i]
            for j, v in made:
                args[j] = v.make(env)
            kept.go(args, device)
        return run
    if (made or any(meta is None for _, meta in kept.descs)
            or [j for j, _ in kept.descs] != [j for j, _, _, _ in descs]):
        def run(env):                  # descriptors that hold their tensor: none kept
            args = base.copy()
            for j, i in slots:
                args[j] = env[i]
            for j, v in made:
                args[j] = v.make(env)
            for j, i, block, layout in descs:
                args[j] = tma(tensor(env, i), block, layout)
            kept(args, device)
        return run
    # a lazy view's address is its root's plus a constant: the root's keys it
    desc_slots = tuple(lazy[i].root if i in lazy else i for _, i, _, _ in descs)
    at = {j: (i, block, layout) for j, i, block, layout in descs}
    metas = dict(kept.descs)
    slot_at = dict(slots)
    finals: dict = {}

    def build(env):
        """The launcher's arguments with these descriptors, and where the tensors go."""
        final, where = [], []
        for j, a in enumerate(base):
            if j in at:
                i, block, layout = at[j]
                final.extend(kept.encode(tma(tensor(env, i), block, layout), metas[j]))
            else:
                if j in slot_at:
                    where.append((len(final), slot_at[j]))
                final.append(a)
        return final, where

    def run(env):
        key = tuple([env[i].data_ptr() for i in desc_slots])
        found = finals.get(key)
        if found is None:
            found = build(env)
            if len(finals) >= fast.MAX_DESCS:
                finals.clear()
            finals[key] = found
        final, where = found
        final = final.copy()
        for p, i in where:
            final[p] = env[i]
        kept.go(final, device)
    return run


def _freeze(a):
    """A hashable form of a template (slots by number)."""
    t = type(a)
    if t is _Slot:
        return ("slot", a.i)
    if t is list or t is tuple:
        return (t.__name__, *map(_freeze, a))
    if isinstance(a, Tensor):
        return ("tensor", id(a))
    return (type(a).__name__, a)


def _uses(a, into: set) -> None:
    """The slots a template names, added to ``into``."""
    t = type(a)
    if t is _Slot or t is _Tma:
        into.add(a.i)
    elif t is list or t is tuple:
        for x in a:
            _uses(x, into)
    elif t is dict:
        for x in a.values():
            _uses(x, into)


class Recorder(TorchDispatchMode):
    """Records one call (module docstring): ``with rec:`` around the body, then
    :meth:`finish` with the outputs. The inputs are slots 0..n-1 in the order given.

    What a plain call does that a program need not: ``detach`` of a fresh tensor (the
    dispatch of a factory function under a mode adds it) shares its input's slot; a view
    taken twice with the same arguments is taken once; an operation without side effects
    whose outputs nothing reads is dropped."""

    def __init__(self, number: int, inputs):
        super().__init__()
        self.number = number
        self.ok = True
        self.records: list = []        # (kind, fn, template, kwargs, outs, removable)
        self.slots: dict = {}          # id(object) -> slot
        self.held: list = []           # every object with a slot, alive while recording
        self.views: dict = {}          # (view op, frozen arguments) -> its output's slot
        self.launches = 0
        self.objects: dict = {}        # slot -> the object it held in this call
        self.n_inputs = len(inputs)
        for j, t in enumerate(inputs):
            self.held.append(t)
            self.objects[j] = t
            if t is not None:
                if id(t) in self.slots:   # one tensor twice: a later call may pass two
                    self.ok = False
                self.slots[id(t)] = j
        self.size = self.n_inputs
        self.quiet = 0                 # inside a recorded step: its torch calls are its own

    # -- slots -------------------------------------------------------------------------
    def _new(self, obj) -> int:
        found = self.slots.get(id(obj))
        if found is not None:
            return found
        i = self.size
        self.size += 1
        self.slots[id(obj)] = i
        self.held.append(obj)
        self.objects[i] = obj
        return i

    def _alias(self, obj, i: int) -> None:
        self.slots[id(obj)] = i
        self.held.append(obj)

    def _template(self, a):
        t = type(a)
        if isinstance(a, Tensor):
            i = self.slots.get(id(a))
            if i is None:               # made before the call and kept (a placeholder)
                self.held.append(a)
                return a
            return _Slot(i)
        if t is fast.TmaArg:
            i = self.slots.get(id(a.t))
            if i is None:
                self.held.append(a.t)
                return a
            return _Tma(i, a.block, a.layout)
        if t is list:
            return [self._template(x) for x in a]
        if t is tuple:
            return tuple(self._template(x) for x in a)
        i = self.slots.get(id(a))
        return a if i is None else _Slot(i)

    # -- what the call does ----------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.quiet or not self.ok:
            return out
        template = self._template(list(args))
        kw = {k: self._template(v) for k, v in (kwargs or {}).items()}
        if any(_has_slot(v) for v in kw.values()):
            self.ok = False              # tensors as keyword arguments: not replayed
            return out
        schema = getattr(func, "_schema", None)
        removable = schema is not None and not schema.is_mutable
        if isinstance(out, Tensor):
            if func is _DETACH and type(template[0]) is _Slot:
                self._alias(out, template[0].i)
                return out
            if getattr(func, "is_view", False) and not kw:
                key = (func, _freeze(template))
                found = self.views.get(key)
                if found is not None:
                    self._alias(out, found)
                    return out
                self.views[key] = self._new(out)
                self.records.append(("op", func, template, kw, self.views[key], removable))
                return out
            self.records.append(("op", func, template, kw, self._new(out), removable))
        elif type(out) in (tuple, list) and all(o is None or isinstance(o, Tensor) for o in out):
            self.records.append(("op", func, template, kw,
                                 [None if o is None else self._new(o) for o in out], removable))
        elif out is None:
            self.records.append(("op", func, template, kw, None, False))
        else:                            # a value the host could branch on: no program
            self.ok = False
        return out

    def launch(self, kept, args, device) -> None:
        """A kept launch ``kept`` (``fastlaunch``) with the launch site's ``args``."""
        if self.quiet or not self.ok:
            return
        self.launches += 1
        self.records.append(("launch", kept, self._template(list(args)), device, None, False))

    def fail(self) -> None:
        """Something of the call cannot be replayed (a launch through Triton)."""
        self.ok = False

    def step(self, fn, args, out) -> None:
        """A step that ran ``fn(*args)`` outside torch's dispatch (stream functions) and
        returned ``out`` (kept as a slot where later steps pass it)."""
        if self.ok:
            self.records.append(("op", fn, self._template(list(args)), None,
                                 None if out is None else self._new(out), False))

    def __enter__(self):
        fast.set_recorder(self)
        return super().__enter__()

    def __exit__(self, *exc):
        fast.set_recorder(None)
        return super().__exit__(*exc)

    def _program(self, outs) -> Program:
        live = {i for i in outs if i is not None}
        kept = []
        for rec in reversed(self.records):
            kind, fn, template, kw, res, removable = rec
            if removable:
                made = [res] if type(res) is int else [i for i in res if i is not None]
                if not any(i in live for i in made):
                    continue
            _uses(template, live)
            if kind == "op":
                _uses(kw, live)
            kept.append(rec)
        kept.reverse()
        # views that only launches (or such views) read: made where a launch needs them
        forced = {i for i in outs if i is not None}
        lazy_out = set()
        for kind, fn, template, kw, res, _ in reversed(kept):
            if kind == "launch":
                continue
            if (type(res) is int and res not in forced and fn in _VIEWS and not kw
                    and type(template[0]) is _Slot and not _has_slot(template[1:])):
                lazy_out.add(res)
                continue
            _uses(template, forced)
            _uses(kw, forced)
        lazy: dict = {}
        steps = []
        for kind, fn, template, kw, res, _ in kept:
            if kind == "op" and res in lazy_out and type(res) is int:
                src = template[0].i
                root, chain = ((lazy[src].root, lazy[src].chain) if src in lazy
                               else (src, ()))
                view, base = self.objects[res], self.objects[root]
                lazy[res] = _Lazy(root, (*chain, (_fast(fn), tuple(template[1:]))),
                                  view.data_ptr() == base.data_ptr()
                                  and view.dtype == base.dtype)
                continue
            steps.append(_launch_step(fn, template, kw, lazy) if kind == "launch"
                         else _op_step(fn, template, kw, res))
        return Program(tuple(steps), self.n_inputs, self.size, tuple(outs), self.launches)

    def finish(self, outputs) -> None:
        """Store the program of this call (``outputs`` its result list), if the call could
        be recorded."""
        ok = self.ok and self.launches > 0
        outs = []
        if ok:
            for t in outputs:
                i = None if t is None else self.slots.get(id(t))
                if t is not None and i is None:
                    ok = False
                    break
                outs.append(i)
        if ok:
            _PROGRAMS[self.number] = self._program(outs)
        else:
            calls, tries = _SEEN.get(self.number, (0, 0))
            _SEEN[self.number] = (calls, tries + 1)
        self.held.clear()
        self.slots.clear()
        self.views.clear()
        self.records.clear()
        self.objects.clear()


_DETACH = torch.ops.aten.detach.default
#: view operators a program may make only where a launch needs them (:class:`_Lazy`)
_VIEWS = {_aten.view.default, _aten._unsafe_view.default, _aten.reshape.default,
          _aten.alias.default}


def program(number):
    """The program recorded for signature ``number`` (None: no call), or None."""
    if number is None or not ENABLED:
        return None
    return _PROGRAMS.get(number)


def recorder(number, inputs):
    """A :class:`Recorder` for this call of signature ``number`` (its tensors ``inputs``),
    or None where this call runs without recording: replay off, the signature's first call,
    :data:`MAX_TRIES` failed recordings, a dispatch mode active, or a CUDA stream being
    captured (a graph's allocations and fills must not become a program's constants)."""
    if not ENABLED or number is None:
        return None
    calls, tries = _SEEN.get(number, (0, 0))
    if len(_SEEN) >= fast.MAX_KEPT:
        _SEEN.clear()
    _SEEN[number] = (calls + 1, tries)
    if calls == 0 or tries >= MAX_TRIES:
        return None
    if torch._C._len_torch_dispatch_stack():
        return None
    for t in inputs:
        if t is not None:
            if t.is_cuda and torch.cuda.is_current_stream_capturing():
                return None
            break
    if len(_PROGRAMS) >= fast.MAX_KEPT:
        _PROGRAMS.clear()
    return Recorder(number, inputs)


def step(fn, *args):
    """``fn(*args)``, recorded as a step of the current call's program where one is being
    recorded (stream functions, which torch's dispatch does not see: the side stream's fork
    and join). Returns what ``fn`` returns."""
    rec = fast.recorder()
    if rec is None:
        return fn(*args)
    rec.quiet += 1
    try:
        out = fn(*args)
    finally:
        rec.quiet -= 1
    rec.step(fn, args, out)
    return out


def clear() -> None:
    """Forget every program (tests; ``chunkwise.kernels`` when it takes the kernel modules anew)."""
    _PROGRAMS.clear()
    _SEEN.clear()
