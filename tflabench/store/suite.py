"""Suites: YAML files that say what to measure, validated and expanded into cases.

A suite (see ``docs/harness.md`` for a full example)::

    name: cpu_demo                    # required; results go to results/<name>/<timestamp>/
    description: a small CPU suite
    device: auto                      # auto | cuda | cpu   (auto: cuda when available)
    dtype: float32                    # bfloat16 | float16 | float32 | float64, or a list
    modes: [fwd, fwdbw]
    seed: 0
    timing: {warmup: 10, iterations: 30, timeout_s: 300, flush_l2: false, sync_each: false, warmup_s: 0,
             cuda_graph: false}
    numerics: {check: true, max_seq_len: 512, tolerance: null}
    model: {embedding_dim: 4096}      # int or list
    sweep: {tokens: 65536, seq_len: [512, 1024]}     # batch = tokens / seq_len
    # or:  sweep: {batch: [1, 4], seq_len: [256, 512]}   (every batch x every length)
    kernels:
      - backend: tfla
        label: mLSTMsig TFLA xl_chunk    # the results' `kernel` column (default: backend + params)
        params: {variant: sig, chunk_size: [64, 128]}   # the backend's Params
        modes: [fwd]                     # optional: overrides the suite's modes
        timeout_s: 600                   # optional: overrides timing.timeout_s

Any list value in ``dtype``, ``modes``, ``model.embedding_dim``, ``sweep.seq_len``,
``sweep.batch`` and in a kernel's ``params`` expands (the cross product). Invalid suites
raise :class:`~tflabench.errors.UserError` with ``<file>: <field path>: <reason>`` before
anything runs: YAML syntax, unknown field, wrong type, unknown backend, ``tokens`` not
divisible by a sequence length, a kernel parameter its backend does not take (or a bad
value of one), an unresolvable head layout.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tflabench import bounds as B
from tflabench.backends import BackendParams, get_backend
from tflabench.errors import UserError
from tflabench.numerics import BudgetOverride, VerifySettings
from tflabench.store.files import check_plain_name
from tflabench.store.schema import IDENTITY_COLUMNS, case_id, params_json
from tflabench.text_safety import case_label, normalise_label, terminal_text
from tflabench.yaml_load import load_yaml

DTYPES = ("bfloat16", "float16", "float32", "float64")
DType = Literal["bfloat16", "float16", "float32", "float64"]
Mode = Literal["fwd", "fwdbw"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Timing(_Strict):
    """How each case is timed (paper App. E.3: median of 30 after 10 warm-ups)."""

    warmup: B.Int(0, B.MAX_ITERATIONS) = Field(10, description="untimed calls after the first call")
    iterations: B.Int(1, B.MAX_ITERATIONS) = Field(30, description="timed calls; the row gives their median etc.")
    timeout_s: B.Float(0.0, B.MAX_TIMEOUT_S, lo_open=True) = Field(
        300.0, description="wall-clock limit per case (worker killed past it)")
    flush_l2: bool = Field(False, description="overwrite a buffer larger than L2 before each timed call")
    sync_each: bool = Field(False, description="synchronise before each timed call, so that a call's CPU "
                            "launch overhead is timed (per-call latency); default: GPU time of back-to-back "
                            "calls, as triton.testing.do_bench (docs/harness.md, 'Timing method')")
    warmup_s: B.Float(0.0, B.MAX_TIMEOUT_S) = Field(
        0.0, description="after the warmup calls, untimed calls until this many seconds have passed, so that every "
        "kernel, short or long, is timed at the clock the GPU holds under sustained load (its power cap); "
        "0: by count only (docs/harness.md, 'Sustained clocks')")
    cuda_graph: bool = Field(False, description="after the warm-ups, capture one call as a CUDA graph and time its "
                             "replays: the GPU's work without the host's launch time between kernels; a kernel "
                             "that cannot be captured gives an error row; CUDA only (docs/harness.md, 'Timing "
                             "method')")


class Numerics(_Strict):
    """The numerics gate: output (and gradients in fwdbw) vs the family's float64 reference."""

    check: bool = True
    max_seq_len: B.Int(1, B.MAX_SEQ_LEN) = Field(512, description="gate runs at batch 1, <=2 heads, S <= this")
    tolerance: B.Float(0.0, B.MAX_BUDGET, lo_open=True) | None = Field(
        None, description="one max-normalised error accepted for every tensor (overrides budgets); default: "
        "per tensor and dtype (docs/numerics.md); numerics.check: false skips the gate")
    budgets: dict[Literal["float64", "float32", "tf32", "float16", "bfloat16"], BudgetOverride] = Field(
        default_factory=dict, description="per precision, per tensor class (out, state, grad, gate_grad)")
    verify: VerifySettings = Field(default_factory=VerifySettings, description="the grid of tflabench verify")


def _threshold(name: str) -> Any:
    lo, hi, lo_open, hi_open, integer = B.THRESHOLD_RANGES[name]
    return Annotated[int if integer else float,
                     B.in_range(lo, hi, lo_open=lo_open, hi_open=hi_open, integer=integer)] | None


def _axis(value: Any) -> Any:
    """A field validator: a list-valued sweep axis must pass :func:`tflabench.bounds.axis_problem`."""
    if isinstance(value, (list, tuple)):
        problem = B.axis_problem(list(value))
        if problem:
            raise ValueError(problem)
    return value


class CompareSettings(_Strict):
    """Per-suite thresholds for ``tflabench compare`` (docs/ci.md, "How compare decides");
    unset fields keep compare's defaults. Copied into the result set's metadata."""

    time_threshold: _threshold("time_threshold") = Field(None, description="relative change of the median time "
                                                         "reported")
    alpha: _threshold("alpha") = Field(None, description="significance level of the rank test")
    min_samples: _threshold("min_samples") = Field(None, description="fewest samples per side for the rank test")
    mem_threshold: _threshold("mem_threshold") = Field(None, description="relative change of peak_mem_bytes "
                                                       "reported")
    mem_floor_bytes: _threshold("mem_floor_bytes") = Field(None, description="smallest absolute memory change "
                                                           "reported")


class ModelSettings(_Strict):
    """Model-level settings: the embedding dimension the head layouts split."""

    embedding_dim: B.Int(1, B.MAX_EMBEDDING_DIM) | list[B.Int(1, B.MAX_EMBEDDING_DIM)] = 4096

    @field_validator("embedding_dim")
    @classmethod
    def _axes(cls, value: Any) -> Any:
        return _axis(value)


class Sweep(_Strict):
    """Shapes: ``tokens`` + ``seq_len`` (batch = tokens / seq_len; paper App. E.3) or
    ``batch`` x ``seq_len``."""

    tokens: B.Int(1, B.MAX_TOKENS) | None = None
    batch: B.Int(1, B.MAX_BATCH) | list[B.Int(1, B.MAX_BATCH)] | None = None
    seq_len: B.Int(1, B.MAX_SEQ_LEN) | list[B.Int(1, B.MAX_SEQ_LEN)]

    @field_validator("batch", "seq_len")
    @classmethod
    def _axes(cls, value: Any) -> Any:
        return _axis(value)


class KernelSpec(_Strict):
    """One kernel entry: a backend and its parameters (validated by the backend's Params)."""

    backend: str
    label: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    modes: list[Mode] | None = None
    timeout_s: B.Float(0.0, B.MAX_TIMEOUT_S, lo_open=True) | None = Field(
        None, description="overrides timing.timeout_s for this kernel")

    @field_validator("modes")
    @classmethod
    def _axes(cls, value: Any) -> Any:
        return _axis(value)


class Suite(_Strict):
    """A whole suite file (schema; see the module docstring)."""

    name: str = Field(min_length=1)
    description: str = ""
    device: Literal["auto", "cuda", "cpu"] = "auto"
    dtype: DType | list[DType] = "bfloat16"
    modes: list[Mode] = Field(default_factory=lambda: ["fwd", "fwdbw"], min_length=1)
    seed: B.Int(0, B.MAX_SEED) = 0
    timing: Timing = Field(default_factory=Timing)
    numerics: Numerics = Field(default_factory=Numerics)
    model: ModelSettings = Field(default_factory=ModelSettings)
    sweep: Sweep
    kernels: list[KernelSpec] = Field(min_length=1)
    compare: CompareSettings = Field(default_factory=CompareSettings)
    max_cases: B.Int(1, B.MAX_MAX_CASES) = Field(
        B.DEFAULT_MAX_CASES, description="refuse a suite that expands to more cases (a typo in a sweep "
        "can ask for millions); raise it to run a larger suite on purpose")

    @field_validator("dtype", "modes")
    @classmethod
    def _axes(cls, value: Any) -> Any:
        return _axis(value)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        # the name becomes the directory <out>/<name>/: no separator, no '..' (docs/harness.md)
        try:
            return check_plain_name(value, "a suite name")
        except UserError as exc:
            raise ValueError(str(exc)) from None


#: Top-level and nested field names, for docs and error messages.
SUITE_FIELDS = {
    "": list(Suite.model_fields),
    "timing": list(Timing.model_fields),
    "numerics": list(Numerics.model_fields),
    "model": list(ModelSettings.model_fields),
    "sweep": list(Sweep.model_fields),
    "kernels[]": list(KernelSpec.model_fields),
    "compare": list(CompareSettings.model_fields),
}


@dataclasses.dataclass(frozen=True)
class Case:
    """One measurement: a kernel configuration x shape x mode (one result row).

    Identity (the result row's identity columns) plus how to measure it (timing and
    numerics settings). ``params`` is the backend's validated, frozen ``Params`` (parsed
    once, by :func:`expand_cases`); its canonical JSON, :attr:`params_json`, is the row's
    ``params`` column and part of :attr:`case_id`. ``chunk_size`` is the identity column:
    the chunk size the parameters fix (``Backend.chunk_size``), None where the backend
    picks it per call (``chunk_size: auto``; the size that ran is the row's
    ``chunk_size_run``) or has none. The worker pool sends a Case to its workers as it is
    (pickled, the typed ``params`` with it).
    """

    suite: str
    kernel: str
    backend: str
    family: str
    params: BackendParams
    mode: str
    dtype: str
    device: str
    batch: int
    seq_len: int
    heads: int
    d_qk: int
    d_hv: int
    chunk_size: int | None
    embedding_dim: int
    warmup: int = 10
    warmup_s: float = 0.0
    iterations: int = 30
    timeout_s: float = 300.0
    flush_l2: bool = False
    sync_each: bool = False
    cuda_graph: bool = False
    seed: int = 0
    check_numerics: bool = True
    numerics_max_seq_len: int = 512
    tolerance: float | None = None
    #: JSON of the suite's ``numerics.budgets`` (None: the defaults).
    numerics_budgets: str | None = None
    #: ``tflabench verify`` only: JSON of the case's regime spec, initial state and name;
    #: None for ``run`` cases (its ``name`` is the row's ``numerics_case`` column).
    verify: str | None = None
    #: ``run --profile``: after the timings, profile the kernels of a few calls
    #: (:func:`tflabench.run.kernel_profile.capture`; the row's ``kernel_profile`` column).
    profile: bool = False
    #: ``run --gpu-trace``: sample the GPU's clock, power and slowdown reasons over the timed
    #: calls (:class:`tflabench.run.gpu_trace.GpuTrace`; the row's GPU trace columns).
    gpu_trace: bool = False

    @functools.cached_property
    def params_json(self) -> str:
        """The canonical JSON of :attr:`params` (sorted keys, compact; the row's ``params``
        column): the serialised form, never parsed back on the run path."""
        return params_json(self.params.model_dump(mode="json"))

    @property
    def numerics_case(self) -> str | None:
        """The verify case's name (identity column), None for ``run`` cases."""
        return json.loads(self.verify)["name"] if self.verify else None

    def identity(self) -> dict:
        """The identity columns of the result row (without ``case_id``; ``params`` as
        :attr:`params_json`)."""
        out = {col: getattr(self, col) for col in IDENTITY_COLUMNS[1:] if col != "params"}
        out["params"] = self.params_json
        return out

    @functools.cached_property
    def case_id(self) -> str:
        """Stable id of the case (:func:`tflabench.store.schema.case_id`)."""
        return case_id(self.identity())

    def describe(self) -> str:
        """The case's label (:func:`tflabench.text_safety.case_label`) for progress bars and logs."""
        return case_label(self.identity())

    def __hash__(self) -> int:  # by its id: a layer's params (a dict inside) do not hash
        return hash(self.case_id)


@dataclasses.dataclass
class LoadedSuite:
    """A validated suite: the schema object, its file path and the file's sha256; ``params``:
    each kernel entry's parameter combinations as its backend's typed ``Params``, parsed once
    (by the first :func:`expand_cases`, which :func:`load_suite` runs) and shared by the cases
    of every later expansion."""

    suite: Suite
    path: Path
    sha256: str
    params: dict[tuple[int, str], BackendParams] = dataclasses.field(default_factory=dict, repr=False,
                                                                     compare=False)


# --------------------------------------------------------------------------- errors


def _path_str(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _allowed_fields(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names allowed at the parent of ``loc`` in ``model``."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        current = _model_in(ann)
        if current is None:
            return []
    return list(getattr(current, "model_fields", {}))


def _model_in(ann: Any) -> Any:
    import typing

    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in typing.get_args(ann):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _strip_union(loc: tuple) -> tuple:
    """Drop pydantic's union-member tags (e.g. ``'int'``, ``'list[int]'``) from a loc."""
    tags = {"int", "str", "float", "bool", "none"}
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p in tags)))


def _format_validation(error: ValidationError, model: type[BaseModel], prefix: tuple = ()) -> str:
    """One line for a pydantic ValidationError: ``path: reason`` of the most specific error
    (union members tried in turn report one error each; the deepest location wins)."""
    errors = [dict(e, loc=_strip_union(tuple(e["loc"]))) for e in error.errors()]
    # a misspelled field (`kernals:`) also makes the real one missing: name the misspelling
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    first = max(unknown or errors, key=lambda e: len(e["loc"]))
    loc = first["loc"]
    path = _path_str(prefix + loc)
    if first["type"] == "extra_forbidden":
        import difflib

        allowed = _allowed_fields(model, loc)
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1) if loc else []
        reason = ("unknown field" + (f"; did you mean {close[0]!r}?" if close else "")
                  + (f" (allowed: {', '.join(allowed)})" if allowed else ""))
    elif first["type"] == "missing":
        reason = "required field is missing"
    elif first["type"] == "value_error":  # our validators' messages name the value already
        reason = str(first["msg"]).removeprefix("Value error, ")
    else:
        value = first.get("input")
        reason = first["msg"] if isinstance(value, (dict, list)) else f"{first['msg']} (got {value!r})"
    more = len({e["loc"] for e in errors if e["loc"] != loc[: len(e["loc"])]})
    return f"{path}: {reason}" + (f" (and {more} more error{'s' if more > 1 else ''})" if more else "")


# --------------------------------------------------------------------------- loading


def load_suite(path: str | os.PathLike) -> LoadedSuite:
    """Read and validate a suite file (schema, backends and their parameters, sweep).

    Returns a :class:`LoadedSuite`. Raises UserError ``<file>: <field path>: <reason>`` for
    a missing file, YAML syntax, a key given twice, aliases that expand beyond
    :data:`tflabench.yaml_load.MAX_VALUES`, unknown field, wrong type, a number out of its
    range (:mod:`tflabench.bounds`), an empty sweep axis or a value repeated in one, unknown
    backend, a parameter the backend does not take, ``tokens`` not divisible by a sequence
    length, an unresolvable head layout, two kernel entries with one label, or more cases
    than ``max_cases``. Expansion with :func:`expand_cases` then cannot fail.
    """
    p = Path(path)
    if p.is_dir():
        raise UserError(f"suite file {str(p)!r} is a directory; give a suite YAML file (e.g. suites/cpu_demo.yaml)")
    if not p.is_file():
        raise UserError(f"suite file {str(p)!r} does not exist")
    data = load_yaml(p)
    raw_bytes = p.read_bytes()
    if not isinstance(data, dict):
        raise UserError(f"{p}: a suite is a YAML mapping (name, sweep, kernels, ...), got {type(data).__name__}")
    try:
        suite = Suite.model_validate(data)
    except ValidationError as exc:
        raise UserError(f"{p}: {_format_validation(exc, Suite)}") from None
    loaded = LoadedSuite(suite=suite, path=p, sha256=hashlib.sha256(raw_bytes).hexdigest())
    try:
        expand_cases(loaded, device="cpu")  # validates backends, params, sweep, layouts
    except UserError as exc:
        raise UserError(f"{p}: {exc}") from None
    return loaded


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _shapes(sweep: Sweep) -> list[tuple[int, int]]:
    """(batch, seq_len) pairs of the sweep; UserError (field path) when invalid."""
    seq_lens = _as_list(sweep.seq_len)
    for n, s in enumerate(seq_lens):
        if s < 1:
            raise UserError(f"sweep.seq_len[{n}]: {s} must be >= 1")
    if sweep.tokens is not None and sweep.batch is not None:
        raise UserError("sweep: give tokens (batch = tokens / seq_len) or batch, not both")
    if sweep.tokens is not None:
        out = []
        for n, s in enumerate(seq_lens):
            if sweep.tokens % s:
                raise UserError(f"sweep.seq_len[{n}]: tokens {sweep.tokens} is not divisible by seq_len {s}")
            out.append((sweep.tokens // s, s))
        return out
    if sweep.batch is None:
        raise UserError("sweep: give tokens (batch = tokens / seq_len) or batch")
    batches = _as_list(sweep.batch)
    for n, b in enumerate(batches):
        if b < 1:
            raise UserError(f"sweep.batch[{n}]: {b} must be >= 1")
    return [(b, s) for b in batches for s in seq_lens]


def _expand_params(params: dict) -> list[tuple[dict, dict]]:
    """Cross product over list-valued params: [(values, {key: index in its list})]."""
    keys = list(params)
    lists = [_as_list(params[k]) for k in keys]
    out = []
    for combo in itertools.product(*[list(enumerate(v)) for v in lists]):
        values = {k: v for k, (_, v) in zip(keys, combo)}
        index = {k: i for k, (i, _) in zip(keys, combo) if isinstance(params[k], (list, tuple))}
        out.append((values, index))
    return out


def _default_label(backend: str, values: dict) -> str:
    """Label of a kernel entry without ``label``: the backend and its parameters as given
    (one combination of the expanded lists), e.g. ``tfla variant=sig chunk_size=64``."""
    return " ".join([backend] + [f"{k}={v}" for k, v in values.items()])


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``; others unchanged."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def require_device(suite_name: str, device: str) -> None:
    """Raise UserError when ``device`` is ``cuda`` and torch sees no GPU, with the one
    suggestion ``run`` and ``verify`` both give (both take ``--device cpu``)."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserError(f"suite {suite_name!r} asks for device cuda, but torch sees no GPU; pass --device cpu "
                            "to run it on this CPU (our Triton kernels in the interpreter: slow, keep shapes "
                            "small), or set device: auto in the suite")


def _parse_params(backend, spec: KernelSpec, where: str, values: dict, index: dict) -> BackendParams:
    """One parameter combination of kernel entry ``where`` (``kernels[n]``) validated by its
    backend: the backend's typed ``Params``. ``index``: the position of each list-valued key's
    value in its list. Raises UserError ``<where>.params.<key>[i]: <reason>``."""
    try:
        return backend.parse_params(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = err["loc"][0] if err["loc"] else None
        at = f"{where}.params"
        if key is not None:
            at += f".{key}" + (f"[{index[key]}]" if key in index else "")
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(backend.Params.model_fields) or "nothing"
            raise UserError(f"{at}: not a parameter of backend {spec.backend!r}; it takes: {allowed}") from None
        if err["type"] == "value_error":  # the Params' own checks name the value already
            msg = str(err["msg"]).removeprefix("Value error, ")
            name, sep, rest = msg.partition(": ")
            if key is None and sep and name in values:  # "field: reason" of a model check
                at += f".{name}" + (f"[{index[name]}]" if name in index else "")
                msg = rest
            raise UserError(f"{at}: {msg}") from None
        raise UserError(f"{at}: {err['msg']} (got {err.get('input')!r})") from None


def expand_cases(loaded: LoadedSuite | Suite, device: str | None = None) -> list[Case]:
    """All cases of a suite, in run order: kernels in file order, then parameter
    combinations, embedding dimensions, dtypes, shapes (batch, seq_len), modes.

    Args:
        device: the device the cases run on (default: the suite's, ``auto`` resolved).

    Raises UserError (field path: reason) for an unknown backend, a parameter the backend
    does not take or a bad value, an empty or repeating list of parameter values, an
    invalid sweep, an unresolvable layout, a label shared by two kernel entries, more cases
    than the suite's ``max_cases``, two entries that give the same case, or a
    ``timing.warmup_s`` not below a kernel's timeout.
    """
    suite = loaded.suite if isinstance(loaded, LoadedSuite) else loaded
    parsed = loaded.params if isinstance(loaded, LoadedSuite) else {}   # parsed once per suite
    device = device or resolve_device(suite.device)
    embeddings = _as_list(suite.model.embedding_dim)
    dtypes = _as_list(suite.dtype)
    _check_case_count(suite)  # from the axes' lengths, before any list is built
    shapes = _shapes(suite.sweep)
    cases: list[Case] = []
    label_of: dict[str, int] = {}  # label -> the kernel entry that has it
    for kn, spec in enumerate(suite.kernels):
        where = f"kernels[{kn}]"
        try:
            backend = get_backend(spec.backend)
        except UserError as exc:
            raise UserError(f"{where}.backend: {exc}") from None
        modes = spec.modes if spec.modes is not None else suite.modes
        timeout_s = spec.timeout_s or suite.timing.timeout_s
        if suite.timing.warmup_s >= timeout_s:
            at = f"{where}.timeout_s" if spec.timeout_s else "timing.timeout_s"
            raise UserError(f"timing.warmup_s: {suite.timing.warmup_s:g} s is not below {at} ({timeout_s:g} s), "
                            "so every case would be killed while it warms up; lower timing.warmup_s or raise "
                            f"{at}")
        for key, value in spec.params.items():
            problem = B.axis_problem(list(value)) if isinstance(value, (list, tuple)) else None
            if problem:
                raise UserError(f"{where}.params.{key}: {problem}")
        for values, index in _expand_params(spec.params):
            label = normalise_label(spec.label or _default_label(spec.backend, values))  # NFC, no zero-width
            owner = label_of.setdefault(label, kn)
            if owner != kn:
                raise UserError(
                    f"{where}.label: {terminal_text(repr(label), 200)} is also the label of kernels[{owner}] "
                    "(compared after Unicode normalisation, invisible characters removed); a label names one kernel "
                    "(the rows, resume and compare match on it): give each entry its own label, or one entry "
                    "with the differing parameter as a list")
            key = (kn, json.dumps(values, sort_keys=True, default=str))
            params = parsed.get(key)
            if params is None:
                params = parsed[key] = _parse_params(backend, spec, where, values, index)
            chunk = backend.chunk_size(params)
            for emb in embeddings:
                try:
                    heads, d_qk, d_hv = backend.layout(params, emb)
                except UserError as exc:
                    raise UserError(f"{where}.params: {exc}") from None
                for dtype in dtypes:
                    for batch, seq_len in shapes:
                        for mode in modes:
                            cases.append(Case(
                                suite=suite.name, kernel=label, backend=spec.backend,
                                family=backend.family.name, params=params, mode=mode,
                                dtype=dtype, device=device, batch=batch, seq_len=seq_len,
                                heads=heads, d_qk=d_qk, d_hv=d_hv, chunk_size=chunk,
                                embedding_dim=emb, warmup=suite.timing.warmup,
                                warmup_s=suite.timing.warmup_s,
                                iterations=suite.timing.iterations,
                                timeout_s=timeout_s,
                                flush_l2=suite.timing.flush_l2,
                                sync_each=suite.timing.sync_each,
                                cuda_graph=suite.timing.cuda_graph, seed=suite.seed,
                                check_numerics=suite.numerics.check,
                                numerics_max_seq_len=suite.numerics.max_seq_len,
                                tolerance=suite.numerics.tolerance,
                                numerics_budgets=budgets_json(suite.numerics.budgets),
                            ))
    seen: dict[str, Case] = {}
    for case in cases:
        other = seen.setdefault(case.case_id, case)
        if other is not case:
            raise UserError(f"kernels: the case {case.describe()} is given twice (its parameters "
                            f"{case.params_json} name the same kernel); give each kernel once")
    return cases


def case_count(suite: "Suite") -> int:
    """How many cases ``suite`` expands to: the product of its axes' lengths (parameter
    lists, embedding dimensions, dtypes, shapes, modes), summed over its kernels; computed
    from the lengths alone, so no list of shapes or cases is built (docs/harness.md,
    "Suite format": a sweep of millions is refused at once)."""
    embeddings, dtypes = _as_list(suite.model.embedding_dim), _as_list(suite.dtype)
    seq_lens = len(_as_list(suite.sweep.seq_len))
    shapes = seq_lens if suite.sweep.tokens is not None or suite.sweep.batch is None else (
        len(_as_list(suite.sweep.batch)) * seq_lens)
    total = 0
    for spec in suite.kernels:
        combos = math.prod(len(v) if isinstance(v, (list, tuple)) else 1 for v in spec.params.values())
        modes = spec.modes if spec.modes is not None else suite.modes
        total += combos * len(embeddings) * len(dtypes) * shapes * len(modes)
    return total


def _check_case_count(suite: "Suite") -> None:
    """UserError when the suite's cross product holds more than ``max_cases`` cases,
    counted from the axes' lengths before any case or shape is built (:func:`case_count`)."""
    total = case_count(suite)
    if total > suite.max_cases:
        raise UserError(f"max_cases: the suite expands to {total:,} cases, more than max_cases {suite.max_cases:,}; "
                        "check the sweep and the parameter lists, or set max_cases in the suite to run that "
                        f"many on purpose (at most {B.MAX_MAX_CASES:,})")


def budgets_json(budgets: dict) -> str | None:
    """The ``Case.numerics_budgets`` text of a suite's ``numerics.budgets`` (None when empty)."""
    if not budgets:
        return None
    return json.dumps({k: v.model_dump(exclude_none=True) for k, v in budgets.items()}, sort_keys=True)


def default_suite_path() -> Path:
    """``suites/cpu_demo.yaml`` of the checkout (the default of ``tflabench run``)."""
    return Path(__file__).resolve().parents[2] / "suites" / "cpu_demo.yaml"
