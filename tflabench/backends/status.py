"""Which mode of each peer can run here, and if not, exactly why and what would fix it.

``doctor`` prints :func:`peer_modes`; the result set keeps the same reasons in the rows of
cases that could not run (``unavailable``, from each backend's ``available`` /
``unsupported_mode``). The rows derive from the backends (issue 44): each names its backend,
its fix is that backend's ``install_hint`` where installing helps, whether the peer is
installed is the backend's ``installed`` (its ``requires``, looked up with ``find_spec``,
nothing imported), and the decisions are the backends' own (fla's #640 rule: the fla
backend's ``unsupported_mode`` under
:func:`tflabench.backends.base.environment_given`;
FlashAttention 3's build: :func:`tflabench.backends.flash_attn.fa3_build`), applied to the
environment given (so that tests can give one). Sources of the facts below (checked 2026-11-23):

- FLA gated backward: fla-core 0.6.0 ``fla/ops/common/chunk_o.py`` raises in
  ``chunk_bwd_dqkwg`` (used by ``chunk_simple_gla``'s backward, not by ``chunk_gla``'s)
  on Hopper with 3.4.0 <= triton < 3.7.1, because Triton 3.4-3.7.0 miscompiles that kernel
  there (fla issue #640: wrong dk/dg at BK = 64; fixed in Triton 3.7.1, fla PR #983). torch
  2.8-2.11 pin triton 3.4-3.6, torch 2.12.0 pins 3.7.0, torch >= 2.12.1 ships 3.7.1. fla's
  TileLang fallback for that kernel refuses ``chunk_simple_gla``: its backward keeps the
  states in float32 and the TileLang kernel needs ``h.dtype == q.dtype``. The bisection in
  #640 found the kernel wrong at key block width 64 only (32 and 128 within tolerance);
  ``TFLABENCH_FLA_640_GUARD=narrow`` (:func:`tflabench.backends.fla.guard_narrowed`) runs it
  where the block is not 64, with the numerics gate checking every gradient.
- FLA ``chunk_gla``: runs both modes; its first call autotunes for minutes per shape, which
  :mod:`tflabench.run.triton_cache` keeps across runs.
- FlashAttention 3: the ``fa3_fwd`` wheel is built with ``FLASHATTENTION_DISABLE_BACKWARD``;
  ``flash_attn_interface`` (fwd+bwd) is built from flash-attention's ``hopper/`` (not on
  the package index; hours of nvcc). FlashAttention 4 (``flash-attn-4`` 4.0.0b36, CuTe DSL,
  backend ``fa4``) has an sm90 backward (flash-attention PR #2128) and installs from the
  index (``flash-attn-4[cu13]`` for a CUDA 13 torch); ``nvidia-cutlass-dsl`` puts its
  ``cutlass`` package on ``sys.path`` through a ``.pth`` file, which a ``pip install
  --target`` on ``PYTHONPATH`` never runs, so ``<target>/nvidia_cutlass_dsl/dsl_packages``
  must be on ``PYTHONPATH`` then (docs/offline-peers.md).
- Lightning Attention 2: fla-core 0.6.0's ``chunk_lightning_attn`` is ``chunk_simple_gla``
  with a fixed per-head decay (``g_gamma``), whose backward does not pass through the #640
  guard; the original kernels are the ``lightning-attn`` package (pure Python + Triton).
  fla-core 0.6.0's ``fused_chunk_gla`` is a stub raising NotImplementedError;
  ``fused_chunk_simple_gla`` is the non-materialising form it keeps.
- Mamba (v1): ``selective_scan_fn`` needs mamba_ssm's compiled ``selective_scan_cuda``; a
  ``mamba_ssm`` wheel built with ``MAMBA_SKIP_CUDA_BUILD=TRUE`` has none. Building it needs a
  CUDA build of torch and nvcc of the same CUDA major version, and compiles many template
  instantiations (tens of minutes for sm_90 alone, hours for every architecture).
- Beyond the paper: fla-core 0.6.0's ``chunk_gated_delta_rule`` and ``chunk_delta_rule``
  (backend ``fla_delta``), and mamba_ssm 2.3.2's Mamba-3 SISO Triton kernels
  (``ops/triton/mamba3``, backend ``mamba3``; its MIMO form needs TileLang and its CuTe path
  is a decoding step, neither measured). FlashQLA has no package on the package index
  (``pip download flashqla``: no matching distribution, checked 2026-11-28), so it has no
  backend: its row says so.
- mlstm_kernels mLSTMexp ``xl_chunk`` is not listed: an abort while compiling was seen once on
  triton 3.6 (2026-11-22), but every H200 result set of this
  project with the same versions measured it (912a5aa, 6039bb3: all rows ok); a crash would
  be a ``crash`` row with its reason.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from tflabench.backends import get_backend
from tflabench.backends.base import environment_given, find_spec as _find_spec
from tflabench.backends.fla import fla_backward_refused
from tflabench.backends.mamba import MAMBA3_SINCE, SELECTIVE_SCAN_MODULE
from tflabench.backends.flash_attn import FA3_DISTRIBUTIONS, FA3_FORWARD_ONLY, fa3_build, fa3_build_text
from tflabench.environment import FLA_640_GUARD_ENV as GUARD_ENV
from tflabench.environment import _parse_version, is_hopper

#: FlashQLA's row: no backend, since no package of it installs (module docstring).
FLASHQLA_REASON = ("no FlashQLA package on the package index (pip download flashqla: no matching distribution), "
                   "so nothing installs beside the other peers; not measured")


@dataclasses.dataclass
class PeerMode:
    """One peer kernel in one mode: ``runs`` (True, False, or None when it depends on
    something not checked here), ``why`` it cannot run (or a caveat when it runs), ``fix``,
    and the ``backend`` that measures it (None: no backend)."""

    peer: str
    mode: str
    runs: bool | None
    why: str
    fix: str = ""
    backend: str | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _hint(backend: str) -> str:
    """The install hint of ``backend`` (its one home)."""
    return get_backend(backend).install_hint


def _not_installed(backend: str, find_spec) -> tuple[str, str] | None:
    """(why, fix) when ``backend``'s packages are not installed, by the backend's own
    :meth:`~tflabench.backends.base.Backend.installed` (``find_spec`` only, nothing
    imported): why is its reason without the install hint, fix the hint; None when installed."""
    found = get_backend(backend)
    reason = found.installed(find_spec)
    if reason is None:
        return None
    return reason.removesuffix(f"; {found.install_hint}"), found.install_hint


def _missing_row(peer: str, backend: str, find_spec) -> PeerMode | None:
    """The row of a peer whose backend's packages are not installed, else None."""
    missing = _not_installed(backend, find_spec)
    return None if missing is None else PeerMode(peer, "fwd, fwdbw", False, missing[0], missing[1], backend)


def _fla_rows(env: dict, find_spec) -> list[PeerMode]:
    peers = env.get("peers") or {}
    fla = peers.get("fla-core") or peers.get("flash-linear-attention") or "?"
    triton = _parse_version(env.get("triton"))
    hopper = is_hopper(env.get("gpu_name"))
    missing = [_missing_row(f"FLA {op}", "fla", find_spec) for op in ("chunk_simple_gla", "chunk_gla")]
    missing += [_missing_row(f"FLA {op} ({name})", "fla_delta", find_spec) for op, name in DELTA_PEERS]
    if any(row is not None for row in missing):
        return [row for row in missing if row is not None]
    out = [PeerMode("FLA chunk_simple_gla", "fwd", True, "", backend="fla")]
    # the verdict is the fla backend's own (its unsupported_mode, for the environment given)
    backend = get_backend("fla")
    with environment_given(env):
        refusal = backend.unsupported_mode(backend.parse_params({"op": "chunk_simple_gla"}), "fwdbw")
        guarded = fla_backward_refused()[0]
    if refusal is None and guarded:
        out.append(PeerMode(
            "FLA chunk_simple_gla", "fwdbw", True,
            f"fla's #640 guard narrowed ({GUARD_ENV}=narrow): its gated backward runs where the key block "
            "width is not 64 (d_qk 128 and 256 run 128) and is refused at 64; the numerics gate checks "
            "dq, dk, dv, dg against float64", backend="fla"))
    elif refusal is not None:
        tilelang = ("tilelang is installed but its kernel refuses chunk_simple_gla (float32 states)"
                    if find_spec("tilelang") is not None else
                    "fla's TileLang fallback would not help: it refuses chunk_simple_gla (float32 states)")
        out.append(PeerMode(
            "FLA chunk_simple_gla", "fwdbw", False,
            f"fla {fla}: {refusal.split('; upgrade')[0]}, its chunk_bwd_dqkwg, which Triton 3.4-3.7.0 "
            f"miscompiles there; {tilelang}",
            "triton >= 3.7.1 (torch >= 2.12.1 ships it); or TFLABENCH_FLA_640_GUARD=narrow: run it where "
            "fla's key block width is not 64 (d_qk 128 runs BK 128; #640 found BK 64 wrong), every "
            "gradient checked by the numerics gate", "fla"))
    else:
        out.append(PeerMode("FLA chunk_simple_gla", "fwdbw", True,
                            "" if hopper or triton is None else "not on Hopper: fla's #640 guard does not apply",
                            backend="fla"))
    out.append(PeerMode(
        "FLA chunk_gla", "fwd, fwdbw", True,
        "no #640 guard on its backward; its first call autotunes for minutes per shape",
        "keep Triton's autotune results: `tflabench run --triton-cache DIR` (fla stores them with "
        "cache_results=True; FLA_CACHE_RESULTS=1 is its default)", "fla"))
    for op, name in DELTA_PEERS:
        out.append(PeerMode(
            f"FLA {op} ({name})", "fwd, fwdbw", True,
            f"fla {fla}: chunkwise WY kernels, their own backward (no #640 guard); beyond the paper, no model count"
            + ("" if fla == "0.6.0" else "; the version measured is fla-core 0.6.0"),
            "" if fla == "0.6.0" else "pip install fla-core==0.6.0 (the pinned version)", "fla_delta"))
    return out


#: fla_delta's ops and the names of their models.
DELTA_PEERS = (("chunk_gated_delta_rule", "gated DeltaNet"), ("chunk_delta_rule", "DeltaNet"))


def _fa3_rows(env: dict, find_spec) -> list[PeerMode]:
    build = fa3_build("auto", find_spec=find_spec)
    if build is not None and build["version"] is None:  # the environment given may know it (tests, a set's metadata)
        dist = FA3_DISTRIBUTIONS[build["module"]][0]
        build = {**build, "version": (env.get("peers") or {}).get(dist)}
    found = f"found {fa3_build_text(build)}" if build is not None else ""
    missing = _missing_row("FlashAttention 3", "fa3", find_spec)   # the fa3 backend's own verdict
    if missing is not None:
        return [dataclasses.replace(missing, why=f"{found}: {missing.why}" if found else missing.why)]
    if build["backward"]:
        return [PeerMode("FlashAttention 3", "fwd, fwdbw", True, found, backend="fa3")]
    return [PeerMode("FlashAttention 3", "fwd", True, found, backend="fa3"),
            PeerMode("FlashAttention 3", "fwdbw", False,
                     f"{FA3_FORWARD_ONLY}; the fa3_fwd wheel is built with FLASHATTENTION_DISABLE_BACKWARD "
                     "(forward only, bf16 only)",
                     "install the flash_attn_3 wheel that benchmarks/build_peer_wheel.sh fa3 builds from "
                     "flash-attention's hopper/ (docs/offline-peers.md), or measure the FA3-class backward "
                     "with FlashAttention 4 (backend fa4) or sdpa impl=cudnn", "fa3")]


def _fa4_rows(env: dict, find_spec) -> list[PeerMode]:
    fa4 = (env.get("peers") or {}).get("flash-attn-4")
    missing = _missing_row("FlashAttention 4 (CuTe DSL)", "fa4", find_spec)
    if missing is not None:
        return [missing]
    return [PeerMode("FlashAttention 4 (CuTe DSL)", "fwd, fwdbw", True,
                     f"found flash_attn.cute (flash-attn-4 {fa4 or '?'}) and cutlass (nvidia-cutlass-dsl)",
                     backend="fa4")]


def _lightning_rows(env: dict, find_spec) -> list[PeerMode]:
    peers = env.get("peers") or {}
    fla = peers.get("fla-core") or peers.get("flash-linear-attention") or "?"
    out = []
    if _not_installed("fla", find_spec) is None:
        out.append(PeerMode("FLA lightning_attn (Lightning Attention 2)", "fwd, fwdbw", True,
                            "fla's chunk_simple_gla with a fixed decay (no #640 guard: no data-dependent gate)",
                            backend="fla"))
        out.append(PeerMode("FLA fused_chunk_simple_gla (non-materialising)", "fwd, fwdbw", True,
                            "its own fused forward and backward kernels (no #640 guard)", backend="fla"))
        if (_parse_version(fla) or (0,)) >= (0, 5):
            out.append(PeerMode("FLA fused_chunk_gla (non-materialising)", "fwd, fwdbw", False,
                                f"fla {fla} ships fused_chunk_gla as a stub that raises NotImplementedError",
                                "measure fused_chunk_simple_gla, its non-materialising form with a scalar gate", "fla"))
    missing = _missing_row("Lightning Attention 2 (lightning-attn)", "lightning_attn", find_spec)
    out.append(missing or PeerMode("Lightning Attention 2 (lightning-attn)", "fwd, fwdbw", True,
                                   f"found lightning_attn {peers.get('lightning-attn', '')}".rstrip()
                                   + ": its Triton kernels, head dimensions 16-128", backend="lightning_attn"))
    return out


def _mamba_rows(env: dict, find_spec) -> list[PeerMode]:
    version = (env.get("peers") or {}).get("mamba_ssm") or "?"
    out = [_missing_row("Mamba 2 (SSD)", "mamba2", find_spec)
           or PeerMode("Mamba 2 (SSD)", "fwd, fwdbw", True, "Triton kernels; mamba_ssm/__init__ not executed",
                       backend="mamba2")]
    out.append(_missing_row("Mamba (v1)", "mamba", find_spec)
               or PeerMode("Mamba (v1)", "fwd, fwdbw", True, f"{SELECTIVE_SCAN_MODULE} compiled", backend="mamba"))
    missing = _missing_row("Mamba-3 (SISO)", "mamba3", find_spec)
    if missing is not None:
        out.append(missing)
    elif (_parse_version(version) or (0,)) >= MAMBA3_SINCE:
        out.append(PeerMode("Mamba-3 (SISO)", "fwd, fwdbw", True,
                            f"mamba_ssm {version}: Triton kernels (mamba3_siso_combined, TMA: sm_90 or newer); "
                            "beyond the paper, no model count", backend="mamba3"))
    else:
        out.append(PeerMode("Mamba-3 (SISO)", "fwd, fwdbw", False,
                            f"mamba_ssm {version} has no Mamba-3 (ops/triton/mamba3 arrived in "
                            f"{'.'.join(map(str, MAMBA3_SINCE))})",
                            _hint("mamba3"), "mamba3"))
    return out


def peer_modes(env: dict, find_spec: Callable[[str], object] = _find_spec) -> list[PeerMode]:
    """Every peer mode (the paper's Figures 4, 12 and 13, and the rows beyond the paper) and
    what stops it, for the environment ``env`` (:func:`tflabench.environment.collect`:
    ``gpu_name``, ``triton``, ``peers``; the versions named in the rows). Whether a peer
    is installed is its backend's :meth:`~tflabench.backends.base.Backend.installed` with
    ``find_spec`` (default :func:`tflabench.backends.base.find_spec`; tests replace it), so
    nothing is imported and doctor stays fast in the parent process."""
    return [*_fla_rows(env, find_spec), *_fa3_rows(env, find_spec), *_fa4_rows(env, find_spec),
            *_lightning_rows(env, find_spec), *_mamba_rows(env, find_spec),
            PeerMode("FlashQLA (TileLang)", "fwd, fwdbw", False, FLASHQLA_REASON,
                     "none published to install; docs/offline-peers.md")]


__all__ = ["PeerMode", "peer_modes"]
