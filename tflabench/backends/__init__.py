"""Registry of backends: registry name -> :class:`~tflabench.backends.base.Backend`.

Backend modules are imported lazily, by module name, the first time one of their names is
asked for (:data:`BACKEND_MODULES`). A module file that is missing or fails to import
never breaks ``import tflabench.backends``: its names resolve to a placeholder backend
that reports itself unavailable with the import error (suites naming it still load; its
parameters are then not validated).

To add a backend, see the "How to add a backend" section of
:mod:`tflabench.backends.base`: write the module, end it with ``register(MyBackend())``,
and add its names to :data:`BACKEND_MODULES`.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping

from tflabench.backends.base import (  # noqa: F401  (re-exported for backend modules)
    MODES,
    Backend,
    BackendParams,
    HeadLayoutParams,
    Shape,
    resolve_layout,
)
from tflabench.backends.family import Family
from tflabench.errors import UserError
from tflabench.store.schema import row_params

#: Registry name -> module that registers it. The peers' modules are written against the
#: contract in ``base.py``; ``custom`` takes a user's ``module:function``.
BACKEND_MODULES: dict[str, str] = {
    "tfla": "tflabench.backends.tfla",
    "mlstm_kernels": "tflabench.backends.mlstm_kernels",
    "sdpa": "tflabench.backends.sdpa",
    "fa3": "tflabench.backends.flash_attn",
    "fa2": "tflabench.backends.flash_attn",
    "fa4": "tflabench.backends.flash_attn",
    "mamba2": "tflabench.backends.mamba",
    "mamba": "tflabench.backends.mamba",
    "mamba3": "tflabench.backends.mamba",
    "fla": "tflabench.backends.fla",
    "fla_delta": "tflabench.backends.delta",
    "lightning_attn": "tflabench.backends.lightning",
    "custom": "tflabench.backends.custom",
    "layer": "tflabench.backends.layer",
}

_REGISTRY: dict[str, Backend] = {}
_IMPORT_ERRORS: dict[str, str] = {}


def register(backend: Backend) -> Backend:
    """Add ``backend`` under ``backend.name`` (replacing an earlier one of that name, so
    tests can register test-only backends). Returns it. Raises ValueError when the name is
    empty or the family is not a :class:`~tflabench.backends.family.Family` with a name."""
    if not backend.name or not isinstance(getattr(backend, "family", None), Family) or not backend.family.name:
        raise ValueError(f"backend {type(backend).__name__} needs a name and a family")
    _REGISTRY[backend.name] = backend
    return backend


def _load_module(module: str) -> str | None:
    """Import ``module`` once; None on success, else the error text (remembered)."""
    if module in _IMPORT_ERRORS:
        return _IMPORT_ERRORS[module] or None
    try:
        importlib.import_module(module)
    except Exception as exc:  # a broken or missing module must not break the registry
        _IMPORT_ERRORS[module] = f"{type(exc).__name__}: {exc}"
    else:
        _IMPORT_ERRORS[module] = ""
    return _IMPORT_ERRORS[module] or None


class _UncheckedParams(BackendParams):
    """A missing backend's parameters: taken as given (a module-level class, so that a case
    holding them pickles into a worker)."""

    model_config = {"extra": "allow", "frozen": True}


class _MissingBackend(Backend):
    """Stands in for a known name whose module is missing or fails to import."""

    Params = _UncheckedParams

    def __init__(self, name: str, module: str, error: str):
        self.name = name  # type: ignore[misc]
        self.family = Family(name="unknown")  # type: ignore[misc]
        self.description = f"(module {module} not importable)"  # type: ignore[misc]
        self._reason = f"backend module {module} cannot be imported ({error})"

    def layout(self, params, embedding_dim):
        try:
            return resolve_layout(params, embedding_dim)
        except (UserError, TypeError):
            return (0, 0, 0)

    def available(self, params):
        return self._reason

    def unsupported_mode(self, params, mode):
        return None


def known_names() -> list[str]:
    """Every backend name: the built-in ones and any registered at run time, sorted."""
    return sorted(set(BACKEND_MODULES) | set(_REGISTRY))


def get_backend(name: str) -> Backend:
    """The backend registered as ``name``, importing its module on first use.

    A known name whose module cannot be imported gives a placeholder whose
    ``available()`` returns the import error. Raises UserError for an unknown name,
    listing the known ones.
    """
    if name in _REGISTRY:
        return _REGISTRY[name]
    module = BACKEND_MODULES.get(name)
    if module is None:
        raise UserError(f"unknown backend {name!r}; known: {', '.join(known_names())}")
    error = _load_module(module)
    if name in _REGISTRY:
        return _REGISTRY[name]
    if error is None:
        error = f"it does not register a backend named {name!r}"
    return _MissingBackend(name, module, error)


def all_backends() -> list[Backend]:
    """Every known backend (importing all backend modules; placeholders for those that
    fail), sorted by name."""
    return [get_backend(name) for name in known_names()]


def reset_import_cache() -> None:
    """Forget failed module imports so that the next lookup retries them (tests)."""
    for module, err in list(_IMPORT_ERRORS.items()):
        if err:
            del _IMPORT_ERRORS[module]


def params_of_row(row: Mapping[str, Any]) -> BackendParams:
    """The typed ``Params`` of a result row read back from a set: its ``params`` column
    (:func:`tflabench.store.results.row_params`) validated by the row's ``backend``; the one
    place a row's parameters become a backend's model (``--profile``'s model parts; the run
    path never parses: its cases carry their typed parameters).

    Raises UserError for an unknown backend, pydantic's ValidationError for parameters the
    backend does not take (now).
    """
    return get_backend(str(row.get("backend"))).parse_params(row_params(row))
