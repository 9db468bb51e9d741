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
- mlstm_kernels mLSTMexp ``xl_chunk`` is not listed: an abort while compiling was seen once on
  triton 3.6 (2026-11-22), but every H200 result set of this
  project with the same versions measured it (912a5aa, 6039bb3: all rows ok); a crash would
  be a ``crash`` row with its reason.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Callable

from tflabench.environment import FLA_640_GUARD_ENV as GUARD_ENV
from tflabench.environment import _parse_version, fla_640_guard_narrowed as guard_narrowed
from tflabench.environment import is_hopper


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
    """Every peer mode of the paper's Figures 4, 12 and 13 and what stops it, for the environment ``env``
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
        if guarded and guard_narrowed():
            out.append(PeerMode(
                "FLA chunk_simple_gla", "fwdbw", True,
                f"fla's #640 guard narrowed ({GUARD_ENV}=narrow): its gated backward runs where the key block "
                "width is not 64 (d_qk 128 and 256 run 128) and is refused at 64; the numerics gate checks "
                "dq, dk, dv, dg against float64"))
        elif guarded:
            tilelang = ("tilelang is installed but its kernel refuses chunk_simple_gla (float32 states)"
                        if find_spec("tilelang") is not None else
                        "fla's TileLang fallback would not help: it refuses chunk_simple_gla (float32 states)")
            out.append(PeerMode(
                "FLA chunk_simple_gla", "fwdbw", False,
                f"fla {fla} refuses its gated backward (chunk_bwd_dqkwg) on Hopper ({gpu}) with triton {tv}: "
                f"Triton 3.4-3.7.0 miscompiles that kernel there (fla issue #640); {tilelang}",
                "triton >= 3.7.1 (torch >= 2.12.1 ships it); or TFLABENCH_FLA_640_GUARD=narrow: run it where "
                "fla's key block width is not 64 (d_qk 128 runs BK 128; #640 found BK 64 wrong), every "
                "gradient checked by the numerics gate"))
        else:
            out.append(PeerMode("FLA chunk_simple_gla", "fwdbw", True,
                                "" if hopper or triton is None else "not on Hopper: fla's #640 guard does not apply"))
        out.append(PeerMode(
            "FLA chunk_gla", "fwd, fwdbw", True,
            "no #640 guard on its backward; its first call autotunes for minutes per shape",
            "keep Triton's autotune results: `tflabench run --triton-cache DIR` (fla stores them with "
            "cache_results=True; FLA_CACHE_RESULTS=1 is its default)"))

    # --- FlashAttention 3: flash_attn_interface (fwd+bwd, built from source) or the fa3_fwd wheel
    if find_spec("flash_attn_interface") is not None:
        out.append(PeerMode("FlashAttention 3", "fwd, fwdbw", True,
                            "found flash_attn_interface (built from flash-attention's hopper/): forward and backward"))
    elif find_spec("fa3_fwd_interface") is not None:
        out.append(PeerMode("FlashAttention 3", "fwd", True,
                            f"found fa3_fwd_interface (the fa3_fwd wheel {peers.get('fa3_fwd', '')})".replace(" )", ")")))
        out.append(PeerMode(
            "FlashAttention 3", "fwdbw", False,
            "flash_attn_interface not found; the fa3_fwd wheel is built with FLASHATTENTION_DISABLE_BACKWARD "
            "(forward only, bf16 only)",
            "build flash_attn_interface from flash-attention's hopper/ (hours of nvcc), or measure the "
            "FA3-class backward with FlashAttention 4 (backend fa4) or sdpa impl=cudnn"))
    else:
        out.append(PeerMode("FlashAttention 3", "fwd, fwdbw", False,
                            "neither flash_attn_interface (built from source) nor fa3_fwd_interface (fa3_fwd wheel) "
                            "is found", "build flash-attention's hopper/ (fwd+bwd), or pip install the fa3_fwd "
                            "wheel (forward only)"))

    # --- FlashAttention 4 (CuTe DSL): the FA3-class peer with a backward that installs from the index
    fa4 = peers.get("flash-attn-4")
    if find_spec("flash_attn.cute") is not None and find_spec("cutlass") is not None:
        out.append(PeerMode("FlashAttention 4 (CuTe DSL)", "fwd, fwdbw", True,
                            f"found flash_attn.cute (flash-attn-4 {fa4 or '?'}) and cutlass (nvidia-cutlass-dsl)"))
    elif find_spec("flash_attn.cute") is not None:
        out.append(PeerMode(
            "FlashAttention 4 (CuTe DSL)", "fwd, fwdbw", False,
            f"found flash_attn.cute (flash-attn-4 {fa4 or '?'}) but not cutlass: nvidia-cutlass-dsl is missing, "
            "or installed with --target, which skips the .pth file that puts its dsl_packages on sys.path",
            "pip install 'flash-attn-4[cu13]' (CUDA 13 torch) into site-packages, or add "
            "<target>/nvidia_cutlass_dsl/dsl_packages to PYTHONPATH (docs/offline-peers.md)"))
    else:
        out.append(PeerMode(
            "FlashAttention 4 (CuTe DSL)", "fwd, fwdbw", False,
            "flash_attn.cute not found: flash-attn-4 is not installed",
            "pip install -e '.[peers]' (Linux x86-64; add flash-attn-4[cu13] for a CUDA 13 torch); a GPU node "
            "without internet: docs/offline-peers.md"))

    # --- Lightning Attention 2 (paper Figure 13): fla's port and the original kernels
    if fla:
        out.append(PeerMode("FLA lightning_attn (Lightning Attention 2)", "fwd, fwdbw", True,
                            "fla's chunk_simple_gla with a fixed decay (no #640 guard: no data-dependent gate)"))
        out.append(PeerMode("FLA fused_chunk_simple_gla (non-materialising)", "fwd, fwdbw", True,
                            "its own fused forward and backward kernels (no #640 guard)"))
        if (_parse_version(fla) or (0,)) >= (0, 5):
            out.append(PeerMode("FLA fused_chunk_gla (non-materialising)", "fwd, fwdbw", False,
                                f"fla {fla} ships fused_chunk_gla as a stub that raises NotImplementedError",
                                "measure fused_chunk_simple_gla, its non-materialising form with a scalar gate"))
    if peers.get("lightning-attn") or find_spec("lightning_attn") is not None:
        out.append(PeerMode("Lightning Attention 2 (lightning-attn)", "fwd, fwdbw", True,
                            f"found lightning_attn {peers.get('lightning-attn', '')}".rstrip()
                            + ": its Triton kernels, head dimensions 16-128"))
    else:
        out.append(PeerMode("Lightning Attention 2 (lightning-attn)", "fwd, fwdbw", False,
                            "lightning-attn is not installed", "pip install lightning-attn einops"))

    # --- Mamba (v1) and Mamba 2
    if not peers.get("mamba_ssm"):
        out.append(PeerMode("Mamba 2 (SSD) / Mamba", "fwd, fwdbw", False, "mamba_ssm is not installed",
                            "pip install mamba_ssm einops (Mamba 2's SSD is Triton, no build needed)"))
    else:
        out.append(PeerMode("Mamba 2 (SSD)", "fwd, fwdbw", True, "Triton kernels; mamba_ssm/__init__ not executed"))
        if find_spec("selective_scan_cuda") is None:
            out.append(PeerMode(
                "Mamba (v1)", "fwd, fwdbw", False,
                f"mamba_ssm {peers['mamba_ssm']} has no compiled selective_scan_cuda (built with "
                "MAMBA_SKIP_CUDA_BUILD=TRUE), and selective_scan_fn has no other implementation",
                "on a machine with a CUDA build of torch and nvcc of its CUDA version: "
                "TORCH_CUDA_ARCH_LIST=9.0 MAMBA_FORCE_BUILD=TRUE pip install mamba_ssm --no-build-isolation "
                "(tens of minutes to hours of nvcc)"))
        else:
            out.append(PeerMode("Mamba (v1)", "fwd, fwdbw", True, "selective_scan_cuda compiled"))

    return out


__all__ = ["PeerMode", "peer_modes"]
