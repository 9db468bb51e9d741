"""Backend ``custom``: a user's own kernel, named by import path, measured like any other.

Suite entry::

    - backend: custom
      label: my mLSTM
      params:
        function: mypkg.kernels:my_mlstm        # or path/to/file.py:my_mlstm
        layout: mlstm                           # mlstm | attention
        variant: sig                            # mlstm reference: sig | exp
        heads: 16
        d_qk: 128
        d_hv: 256
        chunk_size: 128                         # passed as chunk_size= when set
        kwargs: {normalize: false}              # any further keyword arguments

The function is called as ``fn(q, k, v, i, f, **kwargs)`` for ``layout: mlstm`` (q, k:
(B, NH, S, d_qk); v: (B, NH, S, d_hv); i, f: (B, NH, S) gate pre-activations, float32 for
bf16/fp16 runs) or ``fn(q, k, v, **kwargs)`` for ``layout: attention`` (q, k: (B, NH, S,
d_qk); v: (B, NH, S, d_hv); causal). It returns the output (B, NH, S, d_hv), or a tuple
whose first element is it. The numerics gate compares it with the family reference
(mLSTM: ``tfla.reference.mlstm_parallel`` with ``variant``/``normalize``; attention:
causal softmax attention) in float64, or with ``reference: module:function`` when given
(called like the kernel, on float64 inputs). A path ending in ``.py`` is loaded from that
file (relative to the working directory).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any, Literal

from pydantic import Field

from tflabench.backends import register
from tflabench.backends.attention_family import AttentionFamily
from tflabench.backends.base import Backend, HeadLayoutParams, Shape
from tflabench.backends.family import Family
from tflabench.backends.mlstm_family import MlstmFamily


class CustomParams(HeadLayoutParams):
    """Parameters of the ``custom`` backend (see the module docstring)."""

    function: str = Field(pattern=r"^[^:]+:[A-Za-z_][A-Za-z0-9_.]*$")
    layout: Literal["mlstm", "attention"] = "mlstm"
    variant: Literal["sig", "exp"] = "sig"
    normalize: bool = False
    causal: bool = True
    chunk_size: int | None = Field(None, ge=1)
    reference: str | None = Field(None, pattern=r"^[^:]+:[A-Za-z_][A-Za-z0-9_.]*$")
    kwargs: dict[str, Any] = Field(default_factory=dict)


def load_callable(spec: str):
    """The object named by ``module.path:attr.path`` or ``file.py:attr``.

    Raises ImportError / AttributeError with the cause (the backend turns them into an
    ``unavailable`` reason)."""
    module_name, _, attr = spec.rpartition(":")
    if module_name.endswith(".py"):
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            raise ImportError(f"file {module_name!r} does not exist")
        name = f"tflabench_custom_{abs(hash(path))}"
        module = sys.modules.get(name)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            loader_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{spec} is not callable")
    return obj


class CustomFamily(Family):
    """A user's kernel (backend ``custom``; row family ``custom``): the knowledge of the
    family its ``layout`` names (:class:`~tflabench.backends.mlstm_family.MlstmFamily` or
    :class:`~tflabench.backends.attention_family.AttentionFamily` in (B, NH, S, D)), with
    the user's own float64 reference where ``reference: module:function`` is given."""

    name = "custom"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.layouts: dict[str, Family] = {"mlstm": MlstmFamily(), "attention": AttentionFamily("BHSD")}

    def make_inputs(self, params: CustomParams, shape: Shape, dtype, device, seed, requires_grad=False):
        """The inputs of the ``layout``'s family: q, k (B, NH, S, d_qk), v (B, NH, S, d_hv)
        in ``dtype`` (and for ``mlstm`` the gate pre-activations i, f (B, NH, S), float32 for
        bf16/fp16)."""
        return self.layouts[params.layout].make_inputs(params, shape, dtype, device, seed, requires_grad)

    def reference(self, params: CustomParams, inputs):
        """``reference: module:function`` called like the kernel on the float64 inputs
        (first element of a tuple), else the ``layout``'s family reference (mLSTM with
        ``variant`` / ``normalize``; causal softmax attention with ``causal``), (B, NH, S, d_hv)."""
        if params.reference:
            fn = load_callable(params.reference)
            names = "qkvif" if params.layout == "mlstm" else "qkv"
            out = fn(*(inputs[n] for n in names))
            return out[0] if isinstance(out, (tuple, list)) else out
        return self.layouts[params.layout].reference(params, inputs)

    def numerics_family(self, params: CustomParams) -> str:
        """``mlstm`` or ``attention`` (the ``layout``): the input regimes ``verify`` applies."""
        return params.layout

    def model_kind(self, params: CustomParams, shape: Shape, mode: str):
        """``attention_causal`` (causal attention layout; None non-causal), else
        ``mlstm_sig`` / ``mlstm_exp`` at the chunk size."""
        return self.layouts[params.layout].model_kind(params, shape, mode)


class CustomBackend(Backend):
    name = "custom"
    family = CustomFamily()
    description = "a user's kernel by import path (module:function), mLSTM- or attention-style inputs"
    install_hint = "make the module importable (PYTHONPATH) or give a file path ending in .py"
    Params = CustomParams

    def available(self, params: CustomParams) -> str | None:
        try:
            load_callable(params.function)
            if params.reference:
                load_callable(params.reference)
        except Exception as exc:
            return f"cannot load {params.function!r}: {type(exc).__name__}: {exc}; {self.install_hint}"
        return None

    def _call(self, fn, params: CustomParams, inputs):
        kwargs = dict(params.kwargs)
        if params.chunk_size is not None:
            kwargs.setdefault("chunk_size", params.chunk_size)
        names = "qkvif" if params.layout == "mlstm" else "qkv"
        out = fn(*(inputs[n] for n in names), **kwargs)
        return out[0] if isinstance(out, (tuple, list)) else out

    def forward(self, params: CustomParams, inputs):
        return self._call(load_callable(params.function), params, inputs)

    def uses_tf32(self, params: CustomParams, dtype, device) -> bool | None:
        """Unknown (None) for float32 on CUDA: the TF32 budget applies and the row says
        ``unknown``; False on the CPU and for other dtypes."""
        import torch

        if dtype == torch.float32 and str(device).startswith("cuda"):
            return None
        return False


register(CustomBackend())
