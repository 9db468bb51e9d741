"""Backend ``tfla``: our TFLA mLSTM kernels (mLSTMsig / mLSTMexp, ``xl_chunk`` /
``limit_chunk``, any chunk size), or their PyTorch reference where the kernels cannot run.

``impl`` chooses what runs: ``triton`` (``tfla.mlstm_sig`` / ``tfla.mlstm_exp``; on the CPU
through Triton's interpreter, which the runner enables for CPU workers), ``reference``
(``tfla.reference.mlstm_chunkwise``, PyTorch, same chunk size; ``algorithm`` does not change
it), or ``auto`` (the Triton kernels on a GPU when they are installed, else the
reference). What ran is written in the ``reason`` column of every ``ok`` row
(``impl=...``), so reference rows are never mistaken for kernel timings.

Inputs: :func:`tflabench.backends.mlstm_family.mlstm_inputs` (q, k, v in the case dtype; gates in
float32 for bf16/fp16). Numerics reference: ``tfla.reference.mlstm_parallel`` in float64.
"""

from __future__ import annotations

import inspect
from typing import Literal

from pydantic import Field

from tflabench.backends import register
from tflabench.backends.base import Backend, HeadLayoutParams, Shape
from tflabench.backends.mlstm_family import MlstmFamily, mlstm_last_state, mlstm_state_tuple


class TflaParams(HeadLayoutParams):
    """Parameters of the ``tfla`` backend (defaults: the paper's Figure-4 mLSTM layout at
    embedding 4096: 16 heads, d_hv = 256, d_qk = d_hv / 2; App. E.3). ``chunk_size``: an int
    >= 1 or "auto" (the kernel's measured rule, ``tfla.plan``; the row records the size and
    the algorithm that ran)."""

    heads: int | None = 16
    p_qk: float = 0.5
    variant: Literal["sig", "exp"] = "sig"
    algorithm: Literal["xl_chunk", "limit_chunk"] = "xl_chunk"
    chunk_size: int | Literal["auto"] = 128
    normalize: bool = False
    eps: float = Field(1e-6, ge=0)
    impl: Literal["auto", "triton", "reference"] = "auto"


def _kernel(variant: str):
    import tfla

    return tfla.mlstm_sig if variant == "sig" else tfla.mlstm_exp


def _kernel_landed(variant: str) -> str | None:
    """None when ``tfla.mlstm_<variant>`` is the real kernel, else why not."""
    try:
        fn = _kernel(variant)
    except Exception as exc:  # ImportError, or an error inside tfla
        return f"tfla cannot be imported ({type(exc).__name__}: {exc})"
    try:
        names = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return None
    if "chunk_size" not in names:  # the placeholder takes (*args, **kwargs)
        return f"tfla.mlstm_{variant} is not implemented yet in this checkout"
    return None


def _reference_available() -> str | None:
    try:
        from tfla.reference import mlstm_chunkwise  # noqa: F401
    except Exception as exc:
        return f"tfla.reference cannot be imported ({type(exc).__name__}: {exc})"
    return None


class TflaBackend(Backend):
    name = "tfla"
    #: Our Triton kernels (kernels/tfla/triton): the chunk gates, their gradients and the
    #: state kernels (forward, the walk's segment states, the backward's recompute, δC) are
    #: the recurrent part; the output and δQ/δK/δV kernels the parallel part; mLSTMsig's
    #: forward walk computes both. The inputs carry ``_device`` (forward picks the
    #: implementation by it); the model counts at the chunk size run ("auto" resolved).
    family = MlstmFamily(device_input=True, kernel_parts=(
        (r"_sig_walk_fw_kernel", "whole"),
        (r"_gates_kernel|_gate_grads_kernel|_recurrent_fw_kernel|_recurrent_bw_kernel"
         r"|_sig_segment_states_kernel", "recurrent"),
        (r"_parallel_fw_kernel|_parallel_fw_gluon_kernel|_dq_kernel|_dq_gluon_kernel"
         r"|_dq_once_kernel|_dkv_kernel|_dkv_once_kernel|_dkv_fused_kernel|_dkv_gluon_kernel"
         r"|_limit_bw_kernel", "parallel"),
    ))
    description = "TFLA mLSTM kernels of this project (mLSTMsig/mLSTMexp, xl_chunk/limit_chunk)"
    install_hint = "part of tflabench: pip install -e ."
    Params = TflaParams

    def chunk_size(self, params: TflaParams) -> int | None:
        """params.chunk_size, or None for "auto" (the row gets the size run from run_plan)."""
        return None if params.chunk_size == "auto" else int(params.chunk_size)

    def run_plan(self, params: TflaParams, shape: Shape, mode: str, dtype, device: str) -> dict:
        """{chunk_size, algorithm} from ``tfla.plan`` for the Triton kernels; {"algorithm":
        "reference"} (and the resolved chunk size) where the PyTorch reference runs."""
        import torch

        from tfla.plan import plan, resolve_chunk

        dims = (shape.batch, shape.heads, shape.seq_len)
        q = torch.empty(*dims, shape.d_qk, dtype=dtype, device="meta")
        v = torch.empty(*dims, shape.d_hv, dtype=dtype, device="meta")
        grad = mode == "fwdbw"
        if self._impl(params, device) != "triton":
            return {"chunk_size": resolve_chunk(params.chunk_size, params.variant,
                                                d_qk=shape.d_qk, d_hv=shape.d_hv, grad=grad,
                                                dtype=dtype),
                    "algorithm": "reference"}
        p = plan(params.variant, q, v, chunk_size=params.chunk_size, algorithm=params.algorithm,
                 grad=grad, normalize=params.variant == "sig" and params.normalize,
                 device=torch.device(device))
        return {"chunk_size": p.chunk_size, "algorithm": p.algorithm}

    def _impl(self, params: TflaParams, device: str | None = None) -> str:
        if params.impl != "auto":
            return params.impl
        if device is not None and not device.startswith("cuda"):
            return "reference"
        return "triton" if _kernel_landed(params.variant) is None else "reference"

    def available(self, params: TflaParams) -> str | None:
        if params.impl == "triton":
            return _kernel_landed(params.variant)
        if params.impl == "reference":
            return _reference_available()
        if _kernel_landed(params.variant) is None:
            return None
        return _reference_available()

    def note(self, params: TflaParams, device: str) -> str:
        impl = self._impl(params, device)
        if impl == "triton":
            where = " (Triton interpreter on the CPU)" if not device.startswith("cuda") else ""
            return f"impl=triton: tfla.mlstm_{params.variant} {params.algorithm}{where}"
        why = "" if params.impl == "reference" else "; Triton kernels not used here"
        return f"impl=reference: tfla.reference.mlstm_chunkwise (PyTorch){why}"

    def forward(self, params: TflaParams, inputs):
        out = self._run(params, inputs, None, False)
        return out[0] if isinstance(out, tuple) else out

    def uses_tf32(self, params: TflaParams, dtype, device) -> bool:
        """False: float32 runs use exact fp32 dots (``input_precision="ieee"``, every kernel:
        ``dot_precision``; docs/tfla-tiling.md 4.10); the reference is PyTorch."""
        return False

    def forward_state(self, params: TflaParams, inputs, state):
        """``tfla.mlstm_<variant>(..., initial_state=(C0, n0[, m0]), return_last_state=True)``
        -> (h, {last_C, last_n}) (mLSTMexp states unstabilised)."""
        h, last = self._run(params, inputs, mlstm_state_tuple(state, params.variant), True)
        return h, mlstm_last_state(last, params.variant)

    def _run(self, params: TflaParams, inputs, initial_state, return_last_state: bool):
        q, k, v, i, f = (inputs[n] for n in "qkvif")
        impl = self._impl(params, inputs.get("_device", str(q.device)))
        normalize = params.normalize if params.variant == "sig" else None
        if impl == "triton":
            fn = _kernel(params.variant)
            kwargs = dict(chunk_size=params.chunk_size, algorithm=params.algorithm)
            if params.variant == "sig":
                kwargs["normalize"] = params.normalize
            else:
                kwargs["eps"] = params.eps
            return fn(q, k, v, i, f, initial_state=initial_state,
                      return_last_state=return_last_state, **kwargs)
        from tfla.reference import mlstm_chunkwise

        return mlstm_chunkwise(q, k, v, i, f, variant=params.variant, chunk_size=params.chunk_size,
                               normalize=normalize, eps=params.eps, initial_state=initial_state,
                               return_last_state=return_last_state)


register(TflaBackend())
