"""The backend contract: what every kernel implements so the runner can measure it.

A backend is one small object (a subclass of :class:`Backend`, registered with
:func:`tflabench.backends.register`): its parameters, whether it can run here, the forward
call and what it plans to run. What the kernels of one family share (inputs, float64
reference, budgets, the analytic model's counts, the model part of each kernel) is its
``family``, a :class:`tflabench.backends.family.Family` instance with one home per family.
The runner and :mod:`tflabench.run.measure` call only the methods below and the family's,
in a worker process, and never special-case a family (``docs/ARCHITECTURE.md``,
"Contract: backends").

How to add a backend
--------------------
1. Create ``tflabench/backends/<family>.py``. Import torch and the peer package **inside**
   the methods, never at module top: the module is imported in the parent process to
   validate suites and list backends, where the peer may be missing or broken.
2. Subclass :class:`Backend`; set ``name`` (the suite's ``backend:`` value), ``family`` (an
   instance of the family's :class:`~tflabench.backends.family.Family`: reuse
   :class:`~tflabench.backends.mlstm_family.MlstmFamily` or
   :class:`~tflabench.backends.attention_family.AttentionFamily`, or write one: its
   ``make_inputs``, ``reference`` (float64 ground truth for the numerics gate) and
   ``model_kind`` (the analytic model's counts), and its ``KERNEL_PARTS`` for ``run
   --profile``), ``description``, ``install_hint`` and ``requires`` (the modules
   :meth:`Backend.installed` looks up); declare ``Params`` (subclass :class:`BackendParams`,
   or :class:`HeadLayoutParams` for the usual heads / d_qk / d_hv fields, with the
   family's defaults). Every field is something a suite may set; unknown keys are refused.
3. Implement :meth:`Backend.available` and :meth:`Backend.forward`; override
   :meth:`Backend.unsupported_mode` / :meth:`Backend.layout` / :meth:`Backend.chunk_size`
   where the defaults do not fit.
4. End the module with ``register(MyBackend())`` (several backends may share a module), and
   add ``"<name>": "tflabench.backends.<family>"`` to ``BACKEND_MODULES`` in
   ``tflabench/backends/__init__.py``.

Call order in the worker, per case (one mode each), ``family`` being ``backend.family``:
``Params.model_validate(raw)`` -> ``available(params)`` -> ``unsupported_mode(params, mode)``
-> ``family.make_inputs(params, shape, ...)`` -> ``forward(params, inputs)`` (first call,
timed apart) -> numerics gate at ``family.gate_shape(..., chunk_size(params))``: ``forward``
vs ``family.reference`` on float64 copies -> warm-ups, peak memory, timed iterations of
``forward`` (+ ``backward`` for ``fwdbw``) -> ``family.model_counts(params, shape, mode)``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib.util
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

from pydantic import BaseModel, ConfigDict, model_validator

from tflabench.bounds import MAX_KERNEL_PARAM, check_number
from tflabench.errors import UserError
from tflabench.model import SHAPE_SYMBOLS, counts_for_case

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: The modes a case can measure: ``fwd`` (forward only, inputs without requires_grad) and
#: ``fwdbw`` (forward, then ``backward`` of a fixed output gradient).
MODES: tuple[str, ...] = ("fwd", "fwdbw")


@dataclasses.dataclass(frozen=True)
class Shape:
    """The problem size of one case.

    Attributes:
        batch: B, sequences per call.
        seq_len: S (the paper's T), tokens per sequence.
        heads: NH.
        d_qk: query/key head dimension.
        d_hv: value/hidden head dimension.
        dtype: the case's activation dtype name (``bfloat16``, ``float16``, ``float32``,
            ``float64``); :func:`model_breakdown` derives ``bytes_qkv`` from it.
    """

    batch: int
    seq_len: int
    heads: int
    d_qk: int
    d_hv: int
    dtype: str = "bfloat16"

    @property
    def bytes_qkv(self) -> int:
        """Bytes per element of the activations (2 for bf16/fp16, 4 fp32, 8 fp64)."""
        return {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}.get(self.dtype, 2)

    @property
    def bytes_gate(self) -> int:
        """Bytes per gate pre-activation element as :func:`tflabench.backends.mlstm_family.mlstm_inputs` makes them
        (:func:`~tflabench.backends.mlstm_family.gate_dtype`: float32 for 16-bit activations, else the activations' size)."""
        return 4 if self.dtype in ("bfloat16", "float16") else self.bytes_qkv

    @property
    def tokens(self) -> int:
        """B * S."""
        return self.batch * self.seq_len


class BackendParams(BaseModel):
    """Base of every backend's ``Params``: frozen, and ``extra="forbid"`` so that a suite
    naming a parameter the backend does not take fails validation (suite field path and
    the allowed names are reported by :mod:`tflabench.store.suite`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="after")
    def _bounded_numbers(self):
        """Every number field finite and within +-:data:`tflabench.bounds.MAX_KERNEL_PARAM`
        (a head count or chunk size of 1e12, or an eps of inf, fails at load, not per case)."""
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                reason = check_number(value, -MAX_KERNEL_PARAM, MAX_KERNEL_PARAM, integer=isinstance(value, int))
                if reason:
                    raise ValueError(f"{name}: {reason}")
        return self


class HeadLayoutParams(BackendParams):
    """Head layout fields shared by most backends (paper App. E.3: embedding 4096 is split
    into heads per family). Resolution in :func:`resolve_layout`:

    - ``heads`` and ``d_hv`` both set: used as given (heads * d_hv need not equal the
      embedding dimension);
    - only ``heads``: ``d_hv = embedding_dim / heads``; only ``d_hv``:
      ``heads = embedding_dim / d_hv`` (must divide);
    - ``d_qk`` set: used; else ``d_qk = p_qk * d_hv`` (must be an integer).

    Subclasses give the family's defaults (e.g. mLSTM ``heads=16, p_qk=0.5``; attention
    ``heads=32, p_qk=1``).
    """

    heads: int | None = None
    d_hv: int | None = None
    d_qk: int | None = None
    p_qk: float = 1.0


def resolve_layout(params: Any, embedding_dim: int, default_heads: int | None = None) -> tuple[int, int, int]:
    """(heads, d_qk, d_hv) from :class:`HeadLayoutParams` fields and the embedding dimension.

    ``default_heads``: the family's number of heads when neither ``heads`` nor ``d_hv`` is
    set (paper App. E.3; e.g. 32 for attention, 16 for the mLSTM); None: one must be set.

    Raises UserError naming the field when the layout cannot be resolved (neither
    ``heads`` nor ``d_hv`` given and no ``default_heads``, a non-divisible embedding
    dimension, a non-integer ``p_qk * d_hv``, or a value < 1).
    """
    heads = getattr(params, "heads", None)
    d_hv = getattr(params, "d_hv", None)
    d_qk = getattr(params, "d_qk", None)
    p_qk = getattr(params, "p_qk", 1.0)
    if heads is None and d_hv is None:
        if default_heads is None:
            raise UserError("heads / d_hv: neither is set; set heads or d_hv (the other is embedding_dim / it)")
        heads = default_heads
    if heads is None:
        if embedding_dim % d_hv:
            raise UserError(f"d_hv: {d_hv} does not divide embedding_dim {embedding_dim}; set heads as well")
        heads = embedding_dim // d_hv
    elif d_hv is None:
        if embedding_dim % heads:
            raise UserError(f"heads: {heads} does not divide embedding_dim {embedding_dim}; set d_hv as well")
        d_hv = embedding_dim // heads
    if d_qk is None:
        d_qk_f = p_qk * d_hv
        if abs(d_qk_f - round(d_qk_f)) > 1e-9:
            raise UserError(f"p_qk: {p_qk} * d_hv {d_hv} = {d_qk_f} is not an integer; set d_qk instead")
        d_qk = int(round(d_qk_f))
    for field, value in (("heads", heads), ("d_qk", d_qk), ("d_hv", d_hv)):
        if value < 1:
            raise UserError(f"{field}: {value} must be >= 1")
    return int(heads), int(d_qk), int(d_hv)


class Backend:
    """A kernel the harness can measure (thin: parameters, availability, forward, plan).
    Subclass, set the class attributes, implement the methods marked *required*. All
    methods run in the worker process; ``Params``, ``layout``, ``chunk_size``,
    ``unsupported_mode`` and ``installed`` also run in the parent (suite validation,
    ``tflabench backends``, ``doctor``) and must not import torch or peer packages.

    Class attributes:
        name: registry name, the suite's ``backend:`` value (e.g. ``"sdpa"``).
        family: the kernel family's knowledge, a
            :class:`~tflabench.backends.family.Family` instance (inputs, float64 reference,
            budgets, model counts, kernel parts); its ``name`` is the row's ``family``
            (``mlstm``, ``attention``, ``mamba2``, ``mamba``, ``gla``, ``custom``...).
        description: one line for ``tflabench backends``.
        install_hint: what to install when unavailable (e.g. ``pip install fla-core``).
        requires: the modules that must be installed for the kernel to run, looked up by
            :meth:`installed` in this order (``find_spec`` only, nothing imported).
        requires_missing: module -> what :meth:`installed` says when it is missing
            (default "<module> is not installed").
        modes: the modes it can ever run; others are reported unavailable.
        Params: pydantic model of what a suite may set (subclass of :class:`BackendParams`).
        default_heads: the family's number of heads when a suite sets neither ``heads``
            nor ``d_hv`` (paper App. E.3), for the default :meth:`layout`; None: one must
            be set.
    """

    name: ClassVar[str] = ""
    family: ClassVar[Any]  # a tflabench.backends.family.Family (which imports this module)
    description: ClassVar[str] = ""
    install_hint: ClassVar[str] = ""
    requires: ClassVar[tuple[str, ...]] = ()
    requires_missing: ClassVar[Mapping[str, str]] = {}
    modes: ClassVar[tuple[str, ...]] = MODES
    Params: ClassVar[type[BackendParams]] = BackendParams
    default_heads: ClassVar[int | None] = None

    # ---------------------------------------------------------------- parameters, shapes

    def parse_params(self, raw: dict) -> BackendParams:
        """Validate a suite's parameter dict into ``Params`` (raises pydantic ValidationError)."""
        return self.Params.model_validate(raw)

    def layout(self, params: BackendParams, embedding_dim: int) -> tuple[int, int, int]:
        """(heads, d_qk, d_hv) for an embedding dimension (default: :func:`resolve_layout`
        on :class:`HeadLayoutParams` fields with :attr:`default_heads`). Raises UserError
        naming the field."""
        return resolve_layout(params, embedding_dim, self.default_heads)

    def chunk_size(self, params: BackendParams) -> int | None:
        """The chunk size L the kernel runs with, for the row's ``chunk_size`` column
        (default: ``params.chunk_size`` if the field exists, else None)."""
        value = getattr(params, "chunk_size", None)
        return int(value) if value is not None else None

    def run_plan(self, params: BackendParams, shape, mode: str, dtype, device: str) -> dict:
        """What the kernel will actually run for this case: a dict with any of ``chunk_size``
        (int: the size run, where the params leave it to the kernel) and ``algorithm`` (str),
        written into the row. Default: {} (nothing to add). Runs in the worker."""
        return {}

    # ---------------------------------------------------------------- availability

    def installed(self, find_spec: Callable[[str], Any] | None = None) -> str | None:
        """Whether the packages the kernel needs are installed, without importing them:
        None when every module of :attr:`requires` is found, else why not (the first
        missing module's :attr:`requires_missing` text, or "<module> is not installed"),
        ending with ``; <install_hint>``. ``find_spec``: module lookup (default
        :func:`find_spec`; ``doctor``'s peer table and tests pass their own). Runs in the
        parent (``doctor``) and in :meth:`available`."""
        lookup = find_spec if find_spec is not None else _default_find_spec
        for module in self.requires:
            if lookup(module) is None:
                return f"{self.requires_missing.get(module, f'{module} is not installed')}; {self.install_hint}"
        return None

    def available(self, params: BackendParams) -> str | None:
        """*Required.* None when the kernel can run here (package importable, device
        present...), else the reason, ending with the install hint. Runs in the worker;
        may import the peer. Must not raise for a missing package."""
        raise NotImplementedError

    def unsupported_mode(self, params: BackendParams, mode: str) -> str | None:
        """None when ``mode`` (``fwd`` / ``fwdbw``) can run with these params, else the
        reason (the case becomes ``unavailable``). Default: refuses modes not in
        :attr:`modes`. Override for environment-dependent refusals (e.g. a backward that a
        triton version breaks); may import the peer (it runs in the worker)."""
        if mode not in self.modes:
            return f"{self.name} has no {mode} (supports: {', '.join(self.modes)})"
        return None

    def classify_error(self, params: BackendParams, mode: str, exc: BaseException) -> str | None:
        """The reason when ``exc``, raised by the kernel, means the mode cannot run in this
        environment (a refusal, not a bug), so the case becomes ``unavailable`` rather than
        ``error``. Default None: every exception is an ``error`` (or ``oom``)."""
        return None

    def note(self, params: BackendParams, device: str) -> str | None:
        """Optional text put in the ``reason`` column of an ``ok`` row, to label what
        actually ran (e.g. ``"impl=reference: PyTorch chunkwise reference"``). Default None."""
        return None

    # ---------------------------------------------------------------- running

    def forward(self, params: BackendParams, inputs: dict[str, Any]) -> "torch.Tensor":
        """*Required.* Run the kernel once on ``inputs``; return the output tensor (for
        ``fwdbw`` the harness calls ``out.backward(grad)`` with a fixed gradient of the
        same shape). Return only the main output (e.g. h, not the last states)."""
        raise NotImplementedError

    def uses_tf32(self, params: BackendParams, dtype: "torch.dtype", device: str) -> bool | None:
        """Whether the kernel's float32 matrix products use TF32 operands (a 10-bit
        mantissa) at ``dtype`` on ``device``: the numerics budget row (``tf32`` or
        ``float32``) and the row's ``tf32`` column. Default: False on the CPU and for
        other dtypes; on CUDA float32, torch's ``torch.backends.cuda.matmul.allow_tf32``
        (what torch matmuls do). Triton kernels use TF32 for fp32 ``tl.dot`` unless they
        ask otherwise: their backends override. None: unknown (the TF32 budget applies)."""
        import torch

        if dtype != torch.float32 or not str(device).startswith("cuda"):
            return False
        return bool(torch.backends.cuda.matmul.allow_tf32)

    def forward_state(self, params: BackendParams, inputs: dict[str, Any],
                      state: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        """Run the kernel from ``state`` (None: zeros) and return (output, last state as
        name -> tensor, names starting with ``last_``), for kernels whose family's
        :meth:`~tflabench.backends.family.Family.initial_state` is not None. Default:
        NotImplementedError."""
        raise NotImplementedError


# ------------------------------------------------------------------------ helpers

#: The environment the backends' environment-dependent decisions read (a dict as
#: :func:`tflabench.environment.collect` gives it: ``gpu_name``, ``triton``, ``peers``),
#: or None: this machine, probed. Set by :func:`environment_given`.
_GIVEN_ENVIRONMENT: contextvars.ContextVar[dict | None] = contextvars.ContextVar("given_environment", default=None)


@contextlib.contextmanager
def environment_given(env: dict):
    """Within the block, a backend's :meth:`Backend.unsupported_mode` decides for ``env`` (a
    dict as :func:`tflabench.environment.collect` gives it) instead of probing this machine:
    doctor's peer table (:mod:`tflabench.backends.status`) asks the backends themselves
    about the environment it reports, so each rule has one home (tests give made-up ones)."""
    token = _GIVEN_ENVIRONMENT.set(dict(env))
    try:
        yield
    finally:
        _GIVEN_ENVIRONMENT.reset(token)


def given_environment() -> dict | None:
    """The environment :func:`environment_given` set, or None (probe this machine)."""
    return _GIVEN_ENVIRONMENT.get()



def find_spec(module: str):
    """``importlib.util.find_spec`` without importing the module: its spec, or None when it
    is absent or looking it up fails. Peer modules import it as ``_find_spec``, which tests
    replace to simulate installed packages."""
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None


#: :meth:`Backend.installed`'s default lookup (its argument shadows the name).
_default_find_spec = find_spec


def peer_unavailable(not_installed: str | None, *, install_hint: str, gpu_subject: str,
                     load: Callable[[], Any], import_subject: str) -> str | None:
    """The usual :meth:`Backend.available` of a peer with CUDA-only kernels.

    Checks, in order: the packages are installed (``not_installed``: the backend's
    :meth:`Backend.installed`, returned as it is when not None), a CUDA GPU is present,
    and ``load()`` (the peer's kernel import) raises nothing.

    Returns:
        None when all hold; else one line naming the first that fails, with
        ``install_hint`` where installing helps. ``gpu_subject`` opens the no-GPU line
        ("<gpu_subject> a CUDA GPU ..."), ``import_subject`` the import-failure line.
    """
    if not_installed is not None:
        return not_installed
    import torch

    if not torch.cuda.is_available():
        return f"{gpu_subject} a CUDA GPU (torch.cuda.is_available() is False)"
    try:
        load()
    except Exception as exc:
        return f"{import_subject} does not import ({type(exc).__name__}: {exc}); {install_hint}"
    return None


def model_breakdown(kind: str, mode: str, shape: Shape, **kwargs: Any):
    """``tflabench.model.counts_for_case(kind, mode, B=, NH=, S=, d_qk=, d_hv=, **kwargs)``
    at ``shape`` (its fields named by :data:`tflabench.model.SHAPE_SYMBOLS`) (kinds: ``mlstm_sig``, ``mlstm_exp``, ``mlstm_exp_limit``,
    ``attention_causal``, ``mamba2_ssd``, ``gla``, ``simple_gla``; kwargs e.g. ``L``,
    ``d_state``; ``bytes_qkv`` defaults to ``shape.bytes_qkv``): a
    :class:`tflabench.model.Counts`, or None when the model has no count for these
    arguments (NotImplementedError / ValueError / UserError)."""
    kwargs.setdefault("bytes_qkv", shape.bytes_qkv)
    try:
        sizes = {SHAPE_SYMBOLS[name]: getattr(shape, name) for name in ("batch", "heads", "seq_len", "d_qk", "d_hv")}
        return counts_for_case(kind, mode, **sizes, **kwargs)
    except (NotImplementedError, ValueError, TypeError, UserError):
        return None


def generator(device: str, seed: int):
    """A ``torch.Generator`` on ``device`` seeded with ``seed`` (the families' input samplers)."""
    import torch

    return torch.Generator(device=device).manual_seed(int(seed))
