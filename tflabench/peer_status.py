"""Which mode of each peer of the paper can run here, and if not, exactly why and what would fix it.

``doctor`` prints :func:`peer_modes`; the result set keeps the same reasons in the rows of
cases that could not run (``unavailable``, from each backend's ``available`` /
``unsupported_mode``). Sources of the facts below (checked 2026-11-23):

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
  :mod:`tflabench.triton_cache` keeps across runs.
- FlashAttention 3: the ``fa3_fwd`` wheel is built with ``FLASHATTENTION_DISABLE_BACKWARD``;
  ``flash_attn_interface`` (fwd+bwd) is built from flash-attention's ``hopper/`` (not on
  the package index; hours of nvcc). FlashAttention 4 (``flash-attn-4`` 4.0.0b36, CuTe DSL,
  backend ``fa4``) has an sm90 backward (flash-attention PR #2128) and installs from the
  index, but its ``nvidia-cutlass-dsl-libs-cu13`` wheel is 88 MiB (more than one device
  call carries) and ``nvidia-cutlass-dsl`` puts its ``cutlass`` package on ``sys.path``
  through a ``.pth`` file, which a ``pip install --target`` on ``PYTHONPATH`` never runs:
  that, and the missing ``cuda-bindings``/``protobuf``, is why ``cutlass.cute`` was "not
  found" on 2026-11-22 (checked on the CPU with Python 3.12: with
  ``<target>/nvidia_cutlass_dsl/dsl_packages`` on ``PYTHONPATH`` and those two wheels,
  ``import cutlass.cute`` works).
- Mamba (v1): ``selective_scan_fn`` needs mamba_ssm's compiled ``selective_scan_cuda``; the
  ``mamba_ssm`` wheel here was built with ``MAMBA_SKIP_CUDA_BUILD=TRUE``. Building it needs
  nvcc (``nvidia-cuda-nvcc`` on the package index, plus the CUDA headers) matching torch's
  CUDA major version, and compiles many template instantiations (tens of minutes for all
  architectures; restrict to sm_90 for an H200).
- mlstm_kernels mLSTMexp ``xl_chunk`` is not listed: an abort while compiling was seen once on
  triton 3.6 (2026-11-22, with the same wheels), but every H200 result set of this
  project with the same versions measured it (912a5aa, 6039bb3: all rows ok); a crash would
  be a ``crash`` row with its reason.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Callable

from tflabench.environment import _parse_version, is_hopper


@dataclasses.dataclass
class PeerMode:
    """One peer kernel in one mode: ``runs`` (True, False, or None when it depends on
    something not checked here), ``why`` it cannot run (or a caveat when it runs), ``fix``."""

    peer: str
    mode: str
    runs: bool | None
    why: str
    fix: str = ""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _spec(module: str):
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None


def peer_modes(env: dict, find_spec: Callable[[str], object] = _spec) -> list[PeerMode]:
    """Every peer mode of the paper's Figure 4 and what stops it, for the environment ``env``
    (:func:`tflabench.environment.collect`: ``gpu_name``, ``triton``, ``peers``).
    ``find_spec`` looks modules up (tests replace it)."""
    peers = env.get("peers") or {}
    triton = _parse_version(env.get("triton"))
    tv = env.get("triton") or "absent"
    hopper = is_hopper(env.get("gpu_name"))
    gpu = env.get("gpu_name") or "no GPU"
    out: list[PeerMode] = []

    # --- FLA
    fla = peers.get("fla-core") or peers.get("flash-linear-attention")
    if not fla:
        for op in ("chunk_simple_gla", "chunk_gla"):
            out.append(PeerMode(f"FLA {op}", "fwd, fwdbw", False, "fla-core is not installed",
                                "pip install fla-core einops"))
    else:
        guarded = hopper and triton is not None and (3, 4) <= triton < (3, 7, 1)
        out.append(PeerMode("FLA chunk_simple_gla", "fwd", True, ""))
        if guarded:
            tilelang = ("tilelang is installed but its kernel refuses chunk_simple_gla (float32 states)"
                        if find_spec("tilelang") is not None else
                        "fla's TileLang fallback would not help: it refuses chunk_simple_gla (float32 states)")
            out.append(PeerMode(
                "FLA chunk_simple_gla", "fwdbw", False,
                f"fla {fla} refuses its gated backward (chunk_bwd_dqkwg) on Hopper ({gpu}) with triton {tv}: "
                f"Triton 3.4-3.7.0 miscompiles that kernel there (fla issue #640); {tilelang}",
                "triton >= 3.7.1 for the fla worker (torch >= 2.12.1 ships it; with this torch, a separate "
                "environment for fla's workers: the triton 3.9.0 wheel is 286 MB, so on a GPU node without "
                "internet bring it on a data volume); or TFLABENCH_FLA_640_GUARD=narrow: run it where fla's key block width is not 64 "
                "(d_qk 128 runs BK 128; #640 found BK 64 wrong), every gradient checked by the numerics gate"))
        else:
            out.append(PeerMode("FLA chunk_simple_gla", "fwdbw", True,
                                "" if hopper or triton is None else "not on Hopper: fla's #640 guard does not apply"))
        out.append(PeerMode(
            "FLA chunk_gla", "fwd, fwdbw", True,
            "no #640 guard on its backward; its first call autotunes for minutes per shape",
            "keep Triton's autotune results: `tflabench run --triton-cache DIR` (fla stores them with "
            "cache_results=True; FLA_CACHE_RESULTS=1 is its default)"))

    # --- FlashAttention 3
    if find_spec("flash_attn_interface") is not None:
        out.append(PeerMode("FlashAttention 3", "fwd, fwdbw", True, "flash_attn_interface (fwd+bwd)"))
    elif find_spec("fa3_fwd_interface") is not None:
        out.append(PeerMode("FlashAttention 3", "fwd", True, "fa3_fwd_interface"))
        out.append(PeerMode(
            "FlashAttention 3", "fwdbw", False,
            f"only the fa3_fwd wheel ({peers.get('fa3_fwd', '?')}) is installed: built with "
            "FLASHATTENTION_DISABLE_BACKWARD (forward only, bf16 only)",
            "build flash_attn_interface from flash-attention's hopper/ (hours of nvcc); or FlashAttention 4 (backend fa4: flash-attn-4, CuTe DSL, sm90 backward), whose "
            "nvidia-cutlass-dsl needs its dsl_packages dir on PYTHONPATH when installed with --target "
            "(benchmarks/fa4_prepare.sh, device_fa4.sh); meanwhile `sdpa impl=cudnn` is the FA3-class fwdbw"))
    else:
        out.append(PeerMode("FlashAttention 3", "fwd, fwdbw", False, "neither flash_attn_interface nor fa3_fwd is "
                            "installed", "pip install the fa3_fwd wheel (forward) or build hopper/ (fwd+bwd)"))

    # --- FlashAttention 4 (CuTe DSL): the FA3-class peer with a backward that installs from the index
    if find_spec("flash_attn.cute") is not None:
        out.append(PeerMode("FlashAttention 4 (CuTe DSL)", "fwd, fwdbw", True, "flash_attn.cute"))
    else:
        out.append(PeerMode(
            "FlashAttention 4 (CuTe DSL)", "fwd, fwdbw", False,
            "flash-attn-4 is not installed",
            "pip install flash-attn-4 (its nvidia-cutlass-dsl-libs-cu13 wheel is 88 MiB); for a GPU node without "
            "internet: benchmarks/fa4_prepare.sh downloads the wheels, benchmarks/device_fa4.sh installs them "
            "there (cutlass's dsl_packages on PYTHONPATH)"))

    # --- Mamba (v1) and Mamba 2
    if not peers.get("mamba_ssm"):
        out.append(PeerMode("Mamba 2 (SSD) / Mamba", "fwd, fwdbw", False, "mamba_ssm is not installed",
                            "pip install mamba_ssm einops (Mamba 2's SSD is Triton, no build needed)"))
    else:
        out.append(PeerMode("Mamba 2 (SSD)", "fwd, fwdbw", True, "Triton kernels; mamba_ssm/__init__ not executed"))
        if find_spec("selective_scan_cuda") is None:
            out.append(PeerMode(
                "Mamba (v1)", "fwd, fwdbw", False,
                f"mamba_ssm {peers['mamba_ssm']} has no compiled selective_scan_cuda (a wheel built with "
                "MAMBA_SKIP_CUDA_BUILD=TRUE); selective_scan_fn has no other implementation",
                "build it against this torch: nvcc of torch's CUDA major version (nvidia-cuda-nvcc wheel + CUDA "
                "headers), then MAMBA_FORCE_BUILD=TRUE pip install mamba_ssm --no-build-isolation (TORCH_CUDA_ARCH_LIST=9.0 "
                "for an H100/H200 only builds faster)"))
        else:
            out.append(PeerMode("Mamba (v1)", "fwd, fwdbw", True, "selective_scan_cuda compiled"))

    return out


__all__ = ["PeerMode", "peer_modes"]
