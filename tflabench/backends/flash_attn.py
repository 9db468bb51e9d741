"""FlashAttention backends: ``fa3`` (FlashAttention 3), ``fa2`` (FlashAttention 2) and ``fa4``
(FlashAttention 4, CuTe DSL; :class:`Fa4Backend`).

- ``fa3`` runs through whichever interface is installed: ``flash_attn_interface`` (built
  from the flash-attention repository's ``hopper/`` folder; forward and backward) or
  ``fa3_fwd_interface`` (the ``fa3_fwd`` wheel; forward only, bf16 only, built with
  ``FLASHATTENTION_DISABLE_BACKWARD`` and ``FLASHATTENTION_DISABLE_FP16``). With only
  ``fa3_fwd``, ``fwdbw`` is reported unsupported per case.
- ``fa2`` runs ``flash_attn.flash_attn_func`` when the ``flash-attn`` package is installed.

Paper App. E.3: 32 heads of 128 at embedding 4096, causal, bf16. Native layout of
``flash_attn_func``: (B, S, NH, D), contiguous along D; the inputs are made in it, so the
timed call converts nothing. The float64 reference transposes to (B, NH, S, D) and back.

torch and the peers are imported inside the methods only (``backends/base.py``).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Literal

from tflabench.backends import register
from tflabench.backends.attention_family import AttentionFamily
from tflabench.backends.base import Backend, HeadLayoutParams, Shape
from tflabench.backends.base import find_spec as _find_spec
from tflabench.backends.sdpa import ATTENTION_DEFAULT_HEADS

#: FA3 interfaces in the order ``interface="auto"`` tries them: module -> has a backward.
FA3_INTERFACES: dict[str, bool] = {
    "flash_attn_interface": True,
    "fa3_fwd_interface": False,
}

#: FA3 interface module -> (distribution whose version it reports, compiled extension it
#: imports). The hopper/ build's extension is ``flash_attn_3._C`` (hopper/setup.py,
#: ``PACKAGE_NAME``); the fa3_fwd wheel's interface loads its own.
FA3_DISTRIBUTIONS: dict[str, tuple[str, str | None]] = {
    "flash_attn_interface": ("flash_attn_3", "flash_attn_3"),
    "fa3_fwd_interface": ("fa3_fwd", None),
}

#: What a forward-only FA3 says (availability, ``doctor``, the ok rows' reason).
FA3_FORWARD_ONLY = ("forward only: fa3_fwd wheel; fwd+bwd needs flash_attn_interface, "
                    "see docs/offline-peers.md")

FA3_INSTALL_HINT = (
    "install the flash_attn_3 wheel that benchmarks/build_peer_wheel.sh fa3 builds from flash-attention's "
    "hopper/ (module flash_attn_interface, fwd+bwd; docs/offline-peers.md), "
    "or pip install the fa3_fwd wheel (module fa3_fwd_interface, forward only)"
)
FA2_INSTALL_HINT = "pip install flash-attn --no-build-isolation"
FA4_INSTALL_HINT = (
    "pip install flash-attn-4 (module flash_attn.cute, CuTe DSL; flash-attn-4[cu13] for a CUDA 13 torch; "
    "brings nvidia-cutlass-dsl, apache-tvm-ffi, torch-c-dlpack-ext, quack-kernels); installed with --target, "
    "put <target>/nvidia_cutlass_dsl/dsl_packages on PYTHONPATH (nvidia-cutlass-dsl adds it through a .pth "
    "file, which only site-packages runs); a GPU node without internet: docs/offline-peers.md"
)


#: What ``note`` adds after the module it found.
_MODULE_NOTES: dict[str, str] = {
    "flash_attn_interface": " (FlashAttention 3 built from source: fwd+bwd)",
    "fa3_fwd_interface": " (the fa3_fwd wheel: forward only)",
    "flash_attn.cute": " (flash-attn-4, CuTe DSL: fwd+bwd)",
}



class FlashAttnParams(HeadLayoutParams):
    """What a suite may set for ``fa3`` / ``fa2``.

    Attributes:
        causal: causal mask (the paper's benchmark is causal).
        heads, d_hv, d_qk, p_qk: head layout; with neither ``heads`` nor ``d_hv`` set,
            32 heads of embedding / 32 (paper App. E.3).
    """

    causal: bool = True
    p_qk: float = 1.0


class Fa3Params(FlashAttnParams):
    """``fa3`` parameters: those of :class:`FlashAttnParams` plus

    Attributes:
        interface: ``auto`` (``flash_attn_interface`` if installed, else
            ``fa3_fwd_interface``), or one of them by name.
    """

    interface: Literal["auto", "flash_attn_interface", "fa3_fwd_interface"] = "auto"


def resolve_fa3_interface(interface: str) -> str | None:
    """The FA3 module ``interface`` resolves to here, or None when it is not installed.
    Looks modules up with ``find_spec`` only (nothing is imported)."""
    candidates = list(FA3_INTERFACES) if interface == "auto" else [interface]
    for module in candidates:
        if _find_spec(module) is not None:
            return module
    return None


def fa3_build(interface: str = "auto", find_spec=None) -> dict | None:
    """Which FlashAttention 3 build ``interface`` resolves to here, without importing it:
    ``{"module", "path" (its file, or None), "version" (its distribution's, or None),
    "backward" (bool), "extension_missing" (the compiled module it needs and lacks, or
    None)}``; None when no FA3 interface is installed. ``find_spec``: module lookup (default
    :func:`tflabench.backends.base.find_spec`; tests pass their own)."""
    import importlib.metadata

    find_spec = find_spec or _find_spec
    candidates = list(FA3_INTERFACES) if interface == "auto" else [interface]
    module = next((m for m in candidates if find_spec(m) is not None), None)
    if module is None:
        return None
    dist, extension = FA3_DISTRIBUTIONS[module]
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        version = None
    missing = extension if extension is not None and find_spec(extension) is None else None
    return {"module": module, "path": getattr(find_spec(module), "origin", None), "version": version,
            "backward": FA3_INTERFACES[module], "extension_missing": missing}


def _fa3_missing_text(interface: str) -> str:
    """Why no FA3 build of ``interface`` ("auto" or a module name) is found."""
    if interface == "auto":
        return "neither flash_attn_interface nor fa3_fwd_interface is installed"
    return f"{interface} is not installed"


def fa3_build_text(build: dict) -> str:
    """One line for ``doctor`` / ``backends``: module, version, path, and whether it has a
    backward (:func:`fa3_build`'s dict)."""
    what = "fwd+bwd" if build["backward"] else FA3_FORWARD_ONLY
    version = f" {build['version']}" if build.get("version") else ""
    where = f" at {build['path']}" if build.get("path") else ""
    return f"{build['module']}{version}{where} ({what})"


def _alias_fa3_fwd_config() -> None:
    """``fa3_fwd_interface.round_up_headdim`` imports ``flash_attn_config``, which the
    ``fa3_fwd`` wheel does not ship (it ships ``fa3_fwd_config``, same ``CONFIG``). Register
    the latter under the former's name unless a real ``flash_attn_config`` exists."""
    if "flash_attn_config" in sys.modules or _find_spec("flash_attn_config") is not None:
        return
    if _find_spec("fa3_fwd_config") is not None:
        sys.modules["flash_attn_config"] = importlib.import_module("fa3_fwd_config")


class _FlashAttnBase(Backend):
    """Shared by ``fa3`` and ``fa2``: inputs (B, S, NH, D), causal ``flash_attn_func``."""

    #: ``flash_attn_func``'s native layout (B, S, NH, D), contiguous; the float64 reference
    #: transposes to (B, NH, S, D) and back.
    family = AttentionFamily("BSHD")
    Params = FlashAttnParams
    default_heads = ATTENTION_DEFAULT_HEADS

    def _module(self, params) -> str | None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _load(self, params):
        """``flash_attn_func`` of the resolved module (imported here, in the worker)."""
        module = self._module(params)
        if module == "fa3_fwd_interface":
            _alias_fa3_fwd_config()
        return importlib.import_module(module).flash_attn_func

    def available(self, params) -> str | None:
        """None when the module is installed, imports, and a CUDA GPU is present; else the
        reason with the install hint."""
        module = self._module(params)
        if module is None:
            return f"{self._missing_text(params)}; {self.install_hint}"
        try:
            import torch
        except ImportError as exc:  # pragma: no cover - torch is a dependency
            return f"torch is not importable ({exc})"
        if not torch.cuda.is_available():
            return f"{module} needs a CUDA GPU (torch.cuda.is_available() is False)"
        try:
            self._load(params)
        except Exception as exc:  # a broken build (ABI mismatch, missing .so) is a reason, not a crash
            return f"{module} does not import ({type(exc).__name__}: {exc}); {self.install_hint}"
        return None

    def _missing_text(self, params) -> str:
        return "flash_attn is not installed"

    def note(self, params, device: str) -> str | None:
        """Which module ran, for the row's ``reason`` column (and ``tflabench backends``)."""
        module = self._module(params)
        return f"via {module}{_MODULE_NOTES.get(module, '')}" if module else None

    def forward(self, params, inputs: dict[str, Any]):
        """``flash_attn_func(q, k, v, causal=causal)`` (default scale d_qk^-1/2); returns
        (B, S, NH, d_hv). Interfaces that return ``(out, lse)`` give ``out``."""
        out = self._load(params)(inputs["q"], inputs["k"], inputs["v"], causal=params.causal)
        return out[0] if isinstance(out, (tuple, list)) else out


def fa3_check_inputs(params: Fa3Params, shape: Shape, dtype) -> None:
    """Raise ValueError for a dtype other than bfloat16 with ``fa3_fwd_interface`` (built
    without fp16; fp8 is not benchmarked): ``fa3``'s input check."""
    import torch

    if resolve_fa3_interface(params.interface) == "fa3_fwd_interface" and dtype != torch.bfloat16:
        raise ValueError(f"dtype: fa3_fwd_interface runs bfloat16 only, got {dtype}")


class Fa3Backend(_FlashAttnBase):
    """FlashAttention 3 through ``flash_attn_interface`` (fwd+bwd) or ``fa3_fwd_interface``
    (forward only)."""

    name = "fa3"
    family = AttentionFamily("BSHD", check_inputs=fa3_check_inputs)
    description = "FlashAttention 3 (flash_attn_interface fwd+bwd, or fa3_fwd_interface fwd only), causal"
    install_hint = FA3_INSTALL_HINT
    Params = Fa3Params

    def _module(self, params: Fa3Params) -> str | None:
        return resolve_fa3_interface(params.interface)

    def installed(self, find_spec=None, interface: str = "auto") -> str | None:
        """None when an FA3 build (:func:`fa3_build` for ``interface``) is installed with its
        compiled extension, else why not, ending with the install hint; nothing imported
        (``doctor``'s peer table passes its ``find_spec``)."""
        build = fa3_build(interface, find_spec=find_spec)
        if build is None:
            return f"{_fa3_missing_text(interface)}; {self.install_hint}"
        if build["extension_missing"]:
            return (f"{build['module']} is installed but its compiled extension {build['extension_missing']}._C "
                    f"is not; {self.install_hint}")
        return None

    def available(self, params: Fa3Params) -> str | None:
        """:meth:`installed` (a ``flash_attn_interface`` without its compiled
        ``flash_attn_3._C`` is named as such), then as the other FlashAttention backends."""
        return self.installed(interface=params.interface) or super().available(params)

    def note(self, params: Fa3Params, device: str) -> str | None:
        """Which FA3 build ran: module, version, path, and fwd+bwd or forward only."""
        build = fa3_build(params.interface)
        return f"via {fa3_build_text(build)}" if build else None

    def _missing_text(self, params: Fa3Params) -> str:
        return _fa3_missing_text(params.interface)

    def unsupported_mode(self, params: Fa3Params, mode: str) -> str | None:
        """``fwdbw`` is unsupported when the resolved interface is ``fa3_fwd_interface``
        (built without backward). Uses ``find_spec`` only (no import)."""
        base = super().unsupported_mode(params, mode)
        if base is not None:
            return base
        module = self._module(params)
        if mode == "fwdbw" and module is not None and not FA3_INTERFACES[module]:
            return (f"fa3 via {module}: {FA3_FORWARD_ONLY} (the fa3_fwd wheel is built without "
                    "backward; or measure fa4 / sdpa impl=cudnn)")
        return None


class Fa2Backend(_FlashAttnBase):
    """FlashAttention 2 through the ``flash_attn`` package."""

    name = "fa2"
    description = "FlashAttention 2 (flash_attn.flash_attn_func), causal"
    install_hint = FA2_INSTALL_HINT

    def _module(self, params) -> str | None:
        # flash_attn.flash_attn_interface, not the bare package: flash-attn-4 installs
        # flash_attn/cute/ without flash_attn/__init__.py, a namespace package with no FA2
        found = _find_spec("flash_attn") is not None and _find_spec("flash_attn.flash_attn_interface") is not None
        return "flash_attn" if found else None


class Fa4Backend(_FlashAttnBase):
    """FlashAttention 4 (``flash-attn-4``, CuTe DSL): ``flash_attn.cute.flash_attn_func``,
    forward and backward on Hopper (sm90) and Blackwell; FA3-class on an H200.

    Same layout and call as FA2/FA3 (q, k, v (B, S, NH, D), ``causal=``, default scale
    d_qk^-1/2). Its Python package ``cutlass`` (nvidia-cutlass-dsl) lives in
    ``nvidia_cutlass_dsl/dsl_packages`` and is put on ``sys.path`` by a ``.pth`` file: a
    ``pip install --target DIR`` on ``PYTHONPATH`` never runs it, so ``cutlass.cute`` is then
    missing unless ``DIR/nvidia_cutlass_dsl/dsl_packages`` is on ``PYTHONPATH`` too
    (:meth:`available` says so)."""

    name = "fa4"
    description = "FlashAttention 4 (flash-attn-4, CuTe DSL: flash_attn.cute fwd+bwd), causal"
    install_hint = FA4_INSTALL_HINT
    requires = ("flash_attn.cute", "cutlass")
    requires_missing = {
        "flash_attn.cute": "flash-attn-4 (flash_attn.cute) is not installed",
        "cutlass": ("found flash_attn.cute but not cutlass: nvidia-cutlass-dsl is missing, or installed with "
                    "--target, which skips the .pth file that puts its dsl_packages on sys.path"),
    }

    def _module(self, params) -> str | None:
        return "flash_attn.cute" if _find_spec("flash_attn.cute") is not None else None

    def available(self, params) -> str | None:
        """:meth:`installed` (flash_attn.cute and cutlass found), then as the other
        FlashAttention backends; a ``cutlass`` that does not import is named with its cause."""
        reason = self.installed(_find_spec) or super().available(params)
        if reason and "No module named 'cutlass" in reason:
            return ("flash_attn.cute cannot import cutlass (nvidia-cutlass-dsl): its packages are on sys.path "
                    "only through a .pth file, which a --target install on PYTHONPATH does not run; add "
                    "<target>/nvidia_cutlass_dsl/dsl_packages to PYTHONPATH (and install nvidia-cutlass-dsl-libs-cu13)")
        return reason


register(Fa3Backend())
register(Fa2Backend())
register(Fa4Backend())
