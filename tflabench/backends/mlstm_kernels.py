"""``mlstm_kernels`` backend: the TFLA paper authors' Triton kernels (NX-AI, 2.0.6).

``variant`` x ``algorithm`` select the peer kernel (``mlstm_kernels.torch.get_mlstm_kernel``
names, ``docs/tfla-kernels.md`` 1.6):

============  ===========  ======================================  ==========================
variant       algorithm    peer kernel                              default chunk_size
============  ===========  ======================================  ==========================
``sig``       xl_chunk     ``chunkwise--triton_xl_chunk_siging``   128 (paper App. E.3)
``exp``       xl_chunk     ``chunkwise--triton_xl_chunk``          128 (paper App. E.3)
``exp``       limit_chunk  ``chunkwise--triton_limit_chunk``       64 (paper App. E.3)
============  ===========  ======================================  ==========================

mLSTMsig's normaliser is passed explicitly (the peer's own default is ``normalize=True``;
the paper's mLSTMsig and the peer baselines use ``normalize=False``, which is ours).
On triton 3.6 the mLSTMexp ``xl_chunk`` kernel was once seen to abort the process while
compiling (2026-11-22); this project's H200 runs with the same
versions measured it (results/reference/h200/h100_7b, all rows ok). Were it to abort, the
runner's isolation turns that into a ``crash`` row.

Native layout (docs/tfla-kernels.md 1.1): q, k (B, NH, S, d_qk), v (B, NH, S, d_hv), i, f (B, NH, S),
contiguous. Paper App. E.3 layout at embedding 4096: 16 heads, d_hv 256, d_qk 128.

torch and the peer are imported inside the methods only (``backends/base.py``).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Literal

from pydantic import model_validator

from tflabench.backends import register
from tflabench.backends.base import find_spec as _find_spec
from tflabench.backends.base import Backend, HeadLayoutParams, Shape, peer_unavailable
from tflabench.backends.mlstm_family import MlstmFamily, mlstm_last_state

#: (variant, algorithm) -> (peer module, function, peer registry name).
PEER_KERNELS: dict[tuple[str, str], tuple[str, str, str]] = {
    ("sig", "xl_chunk"): ("mlstm_kernels.torch.chunkwise.triton_xl_chunk_siging",
                          "mlstm_siging_chunkwise__xl_chunk", "chunkwise--triton_xl_chunk_siging"),
    ("exp", "xl_chunk"): ("mlstm_kernels.torch.chunkwise.triton_xl_chunk",
                          "mlstm_chunkwise__xl_chunk", "chunkwise--triton_xl_chunk"),
    ("exp", "limit_chunk"): ("mlstm_kernels.torch.chunkwise.triton_limit_chunk",
                             "mlstm_chunkwise__limit_chunk", "chunkwise--triton_limit_chunk"),
}

#: Default chunk size per algorithm (paper App. E.3: xl_chunk 128, limit_chunk 64).
DEFAULT_CHUNK: dict[str, int] = {"xl_chunk": 128, "limit_chunk": 64}

#: mLSTM heads when a suite sets neither heads nor d_hv (paper App. E.3).
MLSTM_DEFAULT_HEADS = 16

INSTALL_HINT = "pip install mlstm_kernels einops (Triton kernels: a CUDA GPU)"



class MlstmKernelsParams(HeadLayoutParams):
    """What a suite may set for ``mlstm_kernels``.

    Attributes:
        variant: ``sig`` (mLSTMsig) or ``exp`` (mLSTMexp).
        algorithm: ``xl_chunk`` (TFLA) or ``limit_chunk`` (one level; mLSTMexp only: the peer
            has no mLSTMsig limit_chunk).
        chunk_size: L; default 128 (xl_chunk) / 64 (limit_chunk). Peer constraints, checked
            per case: S % 16 == 0; xl_chunk: for S < 128 the peer runs L = S (S a power of
            two), else L a power of two below 64 or a multiple of 64, dividing S; limit_chunk:
            L a power of two dividing S.
        normalize: mLSTMsig normaliser (None = False, the paper's mLSTMsig eqs. 22-23);
            mLSTMexp always normalises (None or True).
        eps: added to the normaliser (docs/tfla-kernels.md 1.2; peer default 1e-6).
        heads, d_hv, d_qk, p_qk: head layout; with neither heads nor d_hv set, 16 heads,
            d_qk = 0.5 d_hv (paper App. E.3: 16 heads, d_hv 256, d_qk 128 at 4096).
    """

    variant: Literal["sig", "exp"] = "sig"
    algorithm: Literal["xl_chunk", "limit_chunk"] = "xl_chunk"
    chunk_size: int | None = None
    normalize: bool | None = None
    eps: float = 1e-6
    p_qk: float = 0.5

    @model_validator(mode="after")
    def _check_combination(self):
        if (self.variant, self.algorithm) not in PEER_KERNELS:
            raise ValueError(f"algorithm: mlstm_kernels has no mLSTM{self.variant} {self.algorithm} "
                             f"(it has: sig/xl_chunk, exp/xl_chunk, exp/limit_chunk)")
        if self.variant == "exp" and self.normalize is False:
            raise ValueError("normalize: mLSTMexp always normalises; use None or True")
        L = self.chunk_size
        if L is not None and (L < 16 or (L & (L - 1) and L % 64)):
            raise ValueError(f"chunk_size: {self.chunk_size}; the peer takes a power of two >= 16 "
                             "or a multiple of 64")
        if self.eps < 0:
            raise ValueError(f"eps: {self.eps} must be >= 0")
        return self


@functools.lru_cache(maxsize=None)
def _peer_kernel(variant: str, algorithm: str):
    """The peer's public kernel function (imported here, in the worker)."""
    module, function, _ = PEER_KERNELS[(variant, algorithm)]
    return getattr(importlib.import_module(module), function)


def effective_chunk_size(params: MlstmKernelsParams, seq_len: int) -> int:
    """The chunk size the peer runs at sequence length ``seq_len``: for xl_chunk with
    S < 128 the peer uses L = S (``select_heuristic_xl_chunk_kernel_params``), else the
    requested L (default per algorithm)."""
    L = params.chunk_size or DEFAULT_CHUNK[params.algorithm]
    if params.algorithm == "xl_chunk" and seq_len < 128:
        return seq_len
    return L


def model_chunk(params: MlstmKernelsParams, shape: Shape, mode: str) -> int:
    """The chunk size the mLSTM model counts at: :func:`effective_chunk_size` at the
    shape's S (the family's ``model_chunk``)."""
    return effective_chunk_size(params, shape.seq_len)


def gate_seq_len(params: MlstmKernelsParams, seq_len: int, case_seq_len: int, chunk_size: int) -> int:
    """The numerics gate's S rounded up to a length the peer takes (a multiple of L, or of
    16 below 128 for xl_chunk; a power of two below 128 for xl_chunk), at most the case's
    S (the family's ``gate_seq_len``)."""
    step = chunk_size if seq_len >= 128 or params.algorithm == "limit_chunk" else 16
    S = min(case_seq_len, -(-seq_len // step) * step)
    if params.algorithm == "xl_chunk" and S < 128:
        S = min(case_seq_len, 1 << (S - 1).bit_length())
    return S


def check_inputs(params: MlstmKernelsParams, shape: Shape, dtype) -> None:
    """:func:`check_peer_shape` at the shape's S (the family's ``check_inputs``)."""
    check_peer_shape(params, shape.seq_len)


def check_peer_shape(params: MlstmKernelsParams, seq_len: int) -> None:
    """Raise ValueError when the peer cannot run ``seq_len`` with these params (the peer
    would fail an assertion): S % 16, power-of-two S below 128 (xl_chunk), S % L."""
    L = params.chunk_size or DEFAULT_CHUNK[params.algorithm]
    if seq_len % 16:
        raise ValueError(f"seq_len: mlstm_kernels needs S % 16 == 0, got S={seq_len}")
    if params.algorithm == "xl_chunk" and seq_len < 128:
        if seq_len & (seq_len - 1):
            raise ValueError(f"seq_len: mlstm_kernels xl_chunk needs a power of two below 128, got S={seq_len}")
        return
    if params.algorithm == "limit_chunk" and L & (L - 1):
        raise ValueError(f"chunk_size: mlstm_kernels limit_chunk needs a power of two, got {L}")
    if seq_len % L:
        raise ValueError(f"chunk_size: {L} does not divide S={seq_len} (mlstm_kernels needs S % L == 0)")


class MlstmKernelsBackend(Backend):
    """The TFLA paper authors' mLSTM Triton kernels (``mlstm_kernels``)."""

    name = "mlstm_kernels"
    #: The peer's Triton kernels name their kind (``mlstm_chunkwise__recurrent_fw_C_kernel``,
    #: ``..._parallel_bw_dQ_kernel``, ``mlstm_siging_chunkwise__...``). The peer constrains
    #: S (:func:`check_peer_shape`) and runs L = S at short S (:func:`effective_chunk_size`).
    family = MlstmFamily(
        kernel_parts=((r"chunkwise__recurrent_", "recurrent"), (r"chunkwise__parallel_", "parallel")),
        check_inputs=check_inputs, model_chunk=model_chunk, gate_seq_len=gate_seq_len)
    description = ("the authors' mLSTM kernels: mLSTMsig/mLSTMexp xl_chunk, mLSTMexp limit_chunk; "
                   "16 heads, d_qk 128, d_hv 256 by default")
    install_hint = INSTALL_HINT
    requires = ("mlstm_kernels", "einops", "triton")
    Params = MlstmKernelsParams
    default_heads = MLSTM_DEFAULT_HEADS

    def chunk_size(self, params: MlstmKernelsParams) -> int:
        """L requested (default 128 xl_chunk, 64 limit_chunk); for xl_chunk at S < 128 the
        peer runs L = S instead."""
        return params.chunk_size or DEFAULT_CHUNK[params.algorithm]

    def available(self, params: MlstmKernelsParams) -> str | None:
        """None when ``mlstm_kernels`` (and its dependency ``einops``) imports and a CUDA GPU
        is present; else the reason with the install hint."""
        return peer_unavailable(self.installed(_find_spec), install_hint=self.install_hint,
                                load=lambda: _peer_kernel(params.variant, params.algorithm),
                                gpu_subject="mlstm_kernels' Triton kernels need",
                                import_subject="mlstm_kernels")

    def note(self, params: MlstmKernelsParams, device: str) -> str | None:
        """The peer kernel's registry name and the normaliser setting."""
        normalize = bool(params.normalize) if params.variant == "sig" else True
        return f"{PEER_KERNELS[(params.variant, params.algorithm)][2]}, normalize={normalize}"

    def forward(self, params: MlstmKernelsParams, inputs: dict[str, Any]):
        """The peer kernel on (q, k, v, i, f) with ``chunk_size`` and ``eps`` (and
        ``normalize`` for mLSTMsig) passed explicitly; returns h (B, NH, S, d_hv) in the
        input dtype."""
        fn = _peer_kernel(params.variant, params.algorithm)
        kwargs: dict[str, Any] = {"chunk_size": self.chunk_size(params), "eps": params.eps}
        if params.variant == "sig":
            kwargs["normalize"] = bool(params.normalize)
        return fn(inputs["q"], inputs["k"], inputs["v"], inputs["i"], inputs["f"], **kwargs)

    def uses_tf32(self, params: MlstmKernelsParams, dtype, device) -> bool:
        """True for float32 on CUDA: the peer's Triton ``tl.dot`` calls use Triton's default
        input precision (TF32) for fp32 operands."""
        import torch

        return dtype == torch.float32 and str(device).startswith("cuda")

    def forward_state(self, params: MlstmKernelsParams, inputs, state):
        """The peer kernel with ``c_initial``, ``n_initial`` (``m_initial`` for mLSTMexp)
        and ``return_last_states=True`` -> (h, {last_C, last_n}) (mLSTMexp unstabilised)."""
        fn = _peer_kernel(params.variant, params.algorithm)
        kwargs: dict[str, Any] = {"chunk_size": self.chunk_size(params), "eps": params.eps,
                                  "return_last_states": True}
        if params.variant == "sig":
            kwargs["normalize"] = bool(params.normalize)
        if state is not None:
            kwargs["c_initial"], kwargs["n_initial"] = state["C0"], state["n0"]
            if params.variant == "exp":  # the peer asserts a 2-D m (B, NH) (its docstring says (B, NH, 1))
                kwargs["m_initial"] = state["m0"].reshape(state["m0"].shape[0], state["m0"].shape[1])
        h, last = fn(inputs["q"], inputs["k"], inputs["v"], inputs["i"], inputs["f"], **kwargs)
        return h, mlstm_last_state(tuple(last), params.variant)


register(MlstmKernelsBackend())
