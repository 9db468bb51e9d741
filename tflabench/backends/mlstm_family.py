"""The mLSTM family's one home: its inputs, float64 reference and states, shared by the
``tfla``, ``mlstm_kernels`` and ``custom`` backends (q, k (B, NH, S, d_qk), v (B, NH, S,
d_hv), gates i, f (B, NH, S)): :class:`MlstmFamily`, and the functions it is made of. torch
and ``tfla.reference`` are imported inside the functions.
"""

from __future__ import annotations

import dataclasses

from tflabench.backends.base import Shape, generator
from tflabench.backends.family import Family


def mlstm_reference(q, k, v, i, f, *, variant: str, normalize: bool | None = None, eps: float = 1e-6):
    """mLSTM float64 ground truth (``tfla.reference.mlstm_parallel`` with
    ``detach_normalizer=True``: the kernels' gradient convention, docs/tfla-kernels.md 1.5).

    Args:
        q, k: (B, NH, S, d_qk); v: (B, NH, S, d_hv); i, f: (B, NH, S) gate pre-activations.
        variant: ``"sig"`` (mLSTMsig) or ``"exp"`` (mLSTMexp).
        normalize: mLSTMsig normaliser on/off (None: the reference's default).

    Returns:
        h (B, NH, S, d_hv) float64. Raises NotImplementedError when ``tfla.reference`` is
        not importable (then the gate records no reference).
    """
    import torch

    try:
        from tfla.reference import mlstm_parallel
    except ImportError as exc:
        raise NotImplementedError(f"tfla.reference is not importable ({exc})") from None
    q, k, v, i, f = (x.to(torch.float64) for x in (q, k, v, i, f))
    return mlstm_parallel(q, k, v, i, f, variant=variant, normalize=normalize, eps=eps,
                          detach_normalizer=True)


def mlstm_initial_state(inputs: dict, variant: str, seed: int, requires_grad: bool = False) -> dict:
    """An mLSTM initial state for ``inputs`` (q (B, NH, S, d_qk), v (B, NH, S, d_hv)):
    ``C0`` (B, NH, d_qk, d_hv) and ``n0`` (B, NH, d_qk) ~ N(0, 1), float32 (float64 for
    float64 inputs); for ``variant="exp"`` also ``m0`` (B, NH, 1) zeros (the stabiliser:
    C0, n0 are then the plain states). Only C0 gets ``requires_grad`` (the kernels'
    convention, docs/tfla-kernels.md 1.5: dn0 and dm0 are not propagated)."""
    import torch

    q, v = inputs["q"], inputs["v"]
    B, NH, _, d_qk = q.shape
    d_hv = v.shape[-1]
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    gen = generator(str(q.device), seed)
    C0 = torch.randn(B, NH, d_qk, d_hv, generator=gen, device=q.device, dtype=torch.float32).to(dt)
    n0 = torch.randn(B, NH, d_qk, generator=gen, device=q.device, dtype=torch.float32).to(dt)
    state = {"C0": C0.requires_grad_(requires_grad), "n0": n0}
    if variant == "exp":
        state["m0"] = torch.zeros(B, NH, 1, device=q.device, dtype=dt)
    return state


def mlstm_state_tuple(state: dict | None, variant: str):
    """``(C0, n0[, m0])`` of an :func:`mlstm_initial_state` dict (None stays None): the
    ``initial_state`` argument of ``tfla`` and ``tfla.reference``."""
    if state is None:
        return None
    return tuple(state[n] for n in (("C0", "n0", "m0") if variant == "exp" else ("C0", "n0")))


def mlstm_last_state(last: tuple, variant: str) -> dict:
    """The last state as compared by ``verify``: ``last_C`` (B, NH, d_qk, d_hv) and
    ``last_n`` (B, NH, d_qk) in float64. For mLSTMexp the stabilised (C, n, m) are
    returned unstabilised, C exp(m) and n exp(m) (in float64, no overflow for m < 700),
    so that kernels with different max-state conventions compare alike."""
    import torch

    C, n = last[0].to(torch.float64), last[1].to(torch.float64)
    if variant == "exp":
        m = last[2].to(torch.float64).reshape(C.shape[0], C.shape[1])
        scale = torch.exp(m)
        C = C * scale[..., None, None]
        n = n * scale[..., None]
    return {"last_C": C, "last_n": n}


def mlstm_reference_state(q, k, v, i, f, state: dict | None, *, variant: str,
                          normalize: bool | None = None, eps: float = 1e-6):
    """float64 mLSTM from an initial state: (h (B, NH, S, d_hv), :func:`mlstm_last_state`)
    by ``tfla.reference.mlstm_parallel(..., initial_state, return_last_state=True,
    detach_normalizer=True)``; for mLSTMsig without normaliser without ``last_n`` (the
    model never reads n; ``verify`` compares the states the reference returns). Raises
    NotImplementedError when tfla.reference is absent."""
    import torch

    try:
        from tfla.reference import mlstm_parallel
    except ImportError as exc:
        raise NotImplementedError(f"tfla.reference is not importable ({exc})") from None
    q, k, v, i, f = (x.to(torch.float64) for x in (q, k, v, i, f))
    init = mlstm_state_tuple(state, variant)
    if init is not None:
        init = tuple(t.to(torch.float64) for t in init)
    h, last = mlstm_parallel(q, k, v, i, f, variant=variant, normalize=normalize, eps=eps,
                             initial_state=init, return_last_state=True, detach_normalizer=True)
    states = mlstm_last_state(last, variant)
    if variant == "sig" and not normalize:
        # mLSTMsig without normaliser never reads n: not compared (mlstm_kernels leaves its
        # n_last unmaintained there: 1e35 measured under the interpreter)
        del states["last_n"]
    return h, states



def gate_dtype(dtype: "torch.dtype") -> "torch.dtype":
    """Dtype of the mLSTM gate pre-activations for activations of ``dtype``: float32 for
    bf16/fp16 (docs/tfla-verification.md pitfall 17), else ``dtype``."""
    import torch

    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def mlstm_inputs(shape: Shape, dtype, device: str, seed: int, requires_grad: bool = False,
                 gates_dtype=None) -> dict:
    """The mLSTM family's inputs (the peers' benchmark setting):
    ``q``, ``k`` (B, NH, S, d_qk), ``v`` (B, NH, S, d_hv) ~ N(0, 1) in ``dtype``; input gate
    ``i`` ~ N(0, 1) and forget gate ``f`` ~ N(3, 1) pre-activations (B, NH, S) in
    ``gates_dtype`` (default :func:`gate_dtype`). Deterministic in ``seed``; with
    ``requires_grad`` all five are leaf tensors requiring grad."""
    import torch

    gen = generator(device, seed)
    B, NH, S = shape.batch, shape.heads, shape.seq_len
    gd = gates_dtype or gate_dtype(dtype)

    def randn(*size, dt, mean=0.0):
        x = torch.randn(*size, generator=gen, device=device, dtype=torch.float32)
        return (x + mean).to(dt).requires_grad_(requires_grad)

    return {
        "q": randn(B, NH, S, shape.d_qk, dt=dtype),
        "k": randn(B, NH, S, shape.d_qk, dt=dtype),
        "v": randn(B, NH, S, shape.d_hv, dt=dtype),
        "i": randn(B, NH, S, dt=gd),
        "f": randn(B, NH, S, dt=gd, mean=3.0),
    }


def mlstm_normalize(params) -> bool:
    """The mLSTM normaliser the kernels run with these params: ``params.normalize`` (None
    counts as False, the paper's mLSTMsig eqs. 22-23) for mLSTMsig; always True for
    mLSTMexp (which ``tfla.reference`` takes as None or True alike)."""
    return bool(getattr(params, "normalize", False)) if params.variant == "sig" else True


def mlstm_model_chunk(params, shape: Shape, mode: str) -> int | None:
    """The chunk size L the mLSTM model counts at: ``params.chunk_size``, with ``"auto"``
    resolved to the size ``tfla.plan`` picks for this mode, head dimension and dtype."""
    L = getattr(params, "chunk_size", None)
    if L == "auto":
        import torch

        from tfla.plan import resolve_chunk
        L = resolve_chunk("auto", params.variant, d_qk=shape.d_qk, d_hv=shape.d_hv,
                          grad=mode == "fwdbw", dtype=getattr(torch, shape.dtype),
                          algorithm=getattr(params, "algorithm", "xl_chunk"))
    return L


class MlstmFamily(Family):
    """The mLSTM family (``tfla``, ``mlstm_kernels``; ``custom`` with ``layout: mlstm``):
    inputs :func:`mlstm_inputs`, float64 reference :func:`mlstm_reference` (states:
    :func:`mlstm_initial_state`, :func:`mlstm_reference_state`), model kinds ``mlstm_sig``,
    ``mlstm_exp`` (xl_chunk) and ``mlstm_exp_limit``. Reads the params' ``variant``,
    ``normalize`` (:func:`mlstm_normalize`), ``eps`` (default 1e-6), ``algorithm`` (default
    ``xl_chunk``) and ``chunk_size``.

    Args (beyond :class:`~tflabench.backends.family.Family`'s):
        model_chunk: ``(params, shape, mode) -> L``, the chunk size the kernel runs (default
            :func:`mlstm_model_chunk`; a peer that picks its own at short S passes its rule).
        gate_seq_len: ``(params, reduced S, case S, chunk size) -> S``, rounding the numerics
            gate's S to a length the kernel takes (default: as reduced).
        device_input: add ``_device`` (a plain value: the device name) to the inputs, for a
            backend whose forward picks its implementation by device.
    """

    name = "mlstm"

    def __init__(self, *, model_chunk=None, gate_seq_len=None, device_input: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.model_chunk = model_chunk or mlstm_model_chunk
        self.gate_seq_len = gate_seq_len
        self.device_input = device_input

    def make_inputs(self, params, shape: Shape, dtype, device, seed, requires_grad=False):
        """The mLSTM family's inputs (:func:`mlstm_inputs`, the same for every backend of the
        family for the same seed): q, k (B, NH, S, d_qk), v (B, NH, S, d_hv) ~ N(0, 1) in
        ``dtype``; input-gate pre-activations i ~ N(0, 1) and forget-gate pre-activations
        f ~ N(3, 1), (B, NH, S), in float32 for bf16/fp16 activations (the peers upcast them
        themselves; the distributions of the peers' benchmarks), contiguous; with
        ``requires_grad`` all five are leaves with gradients. Raises ValueError when the
        backend's ``check_inputs`` refuses the case (e.g. a length the peer cannot run)."""
        self._check(params, shape, dtype)
        inputs = mlstm_inputs(shape, dtype, device, seed, requires_grad)
        if self.device_input:
            inputs["_device"] = device  # plain value: lets forward pick the implementation
        return inputs

    def reference(self, params, inputs):
        """float64 mLSTM of the same variant and normaliser (:func:`mlstm_reference`:
        ``tfla.reference``, normaliser and max state detached as the kernels' gradients,
        docs/tfla-kernels.md 1.5); h (B, NH, S, d_hv). NotImplementedError without
        ``tfla.reference``."""
        return mlstm_reference(*(inputs[n] for n in "qkvif"), variant=params.variant,
                               normalize=mlstm_normalize(params), eps=getattr(params, "eps", 1e-6))

    def initial_state(self, params, inputs, seed, requires_grad=False):
        """C0, n0 (and m0 = 0 for mLSTMexp): :func:`mlstm_initial_state`."""
        return mlstm_initial_state(inputs, params.variant, seed, requires_grad)

    def reference_state(self, params, inputs, state):
        """float64 (h, {last_C, last_n}) from ``state``: :func:`mlstm_reference_state`."""
        return mlstm_reference_state(*(inputs[n] for n in "qkvif"), state, variant=params.variant,
                                     normalize=mlstm_normalize(params), eps=getattr(params, "eps", 1e-6))

    def gate_shape(self, params, shape: Shape, max_seq_len: int, chunk_size: int | None) -> Shape:
        """The default reduced shape, its S rounded by ``gate_seq_len`` where given (at most
        the case's S)."""
        reduced = super().gate_shape(params, shape, max_seq_len, chunk_size)
        if self.gate_seq_len is None or reduced.seq_len == shape.seq_len:
            return reduced
        return dataclasses.replace(reduced, seq_len=self.gate_seq_len(params, reduced.seq_len, shape.seq_len,
                                                                      chunk_size))

    def model_kind(self, params, shape: Shape, mode: str):
        """``mlstm_sig``, ``mlstm_exp`` (xl_chunk) or ``mlstm_exp_limit`` (``algorithm:
        limit_chunk``) at the chunk size the kernel runs (``model_chunk``)."""
        kind = "mlstm_sig" if params.variant == "sig" else (
            "mlstm_exp_limit" if getattr(params, "algorithm", "xl_chunk") == "limit_chunk" else "mlstm_exp")
        return kind, {"L": self.model_chunk(params, shape, mode)}
