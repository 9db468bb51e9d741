"""The ``layer`` backend: one model layer around a registered cell (tflabench.backends.layer),
checked against the same layer written out in plain torch, on the CPU."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from tflabench.backends import get_backend
from tflabench.backends.base import Shape


def _inputs(params_raw: dict, shape: Shape, requires_grad=False):
    backend = get_backend("layer")
    params = backend.parse_params(params_raw)
    return backend, params, backend.family.make_inputs(params, shape, torch.float64, "cpu", 0, requires_grad)


def test_attention_layer_is_norm_projections_causal_attention_and_residual():
    shape = Shape(2, 16, 2, 4, 4, "float64")
    backend, params, x = _inputs({"mixer": "attention", "cell": "sdpa", "cell_params": {"impl": "math"},
                                  "heads": 2, "d_hv": 4, "d_qk": 4}, shape)
    y = backend.forward(params, x)
    xn = F.rms_norm(x["x"], (8,), x["w_norm"])
    q, k, v = (xn @ x["W_qkv"]).split([8, 8, 8], dim=-1)
    q, k, v = (t.view(2, 16, 2, 4).transpose(1, 2) for t in (q, k, v))
    att = torch.softmax((q @ k.transpose(-1, -2)) / math.sqrt(4) + torch.full((16, 16), -math.inf).triu(1), -1) @ v
    want = x["x"] + att.transpose(1, 2).reshape(2, 16, 8) @ x["W_out"]
    assert y.shape == (2, 16, 8)
    torch.testing.assert_close(y, want)


def test_mlstm_layer_gates_are_soft_capped_and_the_cell_sees_them():
    from tfla.reference import mlstm_parallel

    shape = Shape(1, 12, 2, 3, 4, "float64")
    backend, params, x = _inputs({"mixer": "mlstm", "cell": "tfla", "cell_params": {"impl": "reference",
                                  "chunk_size": 4}, "heads": 2, "d_qk": 3, "d_hv": 4}, shape)
    with torch.no_grad():
        x["W_if"].mul_(400.0)   # pre-activations far beyond the cap: the soft cap must hold them
    y = backend.forward(params, x)
    E = 8
    xn = F.rms_norm(x["x"], (E,), x["w_norm"])
    g = xn @ x["W_if"] + x["b_if"]
    assert g.abs().max() > 100
    g = 15.0 * torch.tanh(g / 15.0)
    i, f = g.transpose(1, 2).split(2, dim=1)
    q, k = ((xn @ x[w]).view(1, 12, 2, 3).transpose(1, 2) for w in ("W_q", "W_k"))
    v = (xn @ x["W_v"]).view(1, 12, 2, 4).transpose(1, 2)
    h = mlstm_parallel(q, k, v, i, f, variant="sig", normalize=False)
    h = F.rms_norm(h, (4,), x["w_hnorm"]).transpose(1, 2).reshape(1, 12, E)
    want = x["x"] + (h * torch.sigmoid(xn @ x["W_o"])) @ x["W_out"]
    # the cell runs chunkwise (L 4), the check's cell in parallel form: equal up to rounding
    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-5)


def test_layer_training_step_reaches_every_weight():
    shape = Shape(1, 8, 2, 4, 4, "float32")
    backend, params, x = _inputs({"mixer": "attention", "cell": "sdpa", "cell_params": {"impl": "math"},
                                  "heads": 2, "d_hv": 4, "d_qk": 4}, shape, requires_grad=True)
    backend.forward(params, x).sum().backward()
    for name in ("x", "w_norm", "W_qkv", "W_out"):
        assert x[name].grad is not None and x[name].grad.abs().sum() > 0, name


@pytest.mark.parametrize("raw, match", [
    ({"mixer": "mlstm", "cell": "sdpa"}, "cell"),
    ({"mixer": "attention", "cell": "tfla"}, "cell"),
    ({"mixer": "mlstm", "cell": "tfla", "cell_params": {"heads": 4}}, "head layout"),
])
def test_layer_params_refuse_a_cell_that_does_not_fit(raw, match):
    with pytest.raises(ValidationError, match=match):
        get_backend("layer").parse_params(raw)


def test_attention_cell_layout_is_read_off_the_family_not_a_probe(monkeypatch):
    """A bfloat16-only cell (FlashAttention 3 through the fa3_fwd wheel) must still place the
    layer's heads: the layout comes from the cell family's declaration, so no float32 probe
    reaches the cell's input check (which refused it: ValueError in every layer case)."""
    from tflabench.backends import flash_attn
    from tflabench.backends.layer import _seq_major

    monkeypatch.setattr(flash_attn, "resolve_fa3_interface", lambda interface: "fa3_fwd_interface")
    fa3 = get_backend("fa3")
    with pytest.raises(ValueError, match="bfloat16 only"):   # what a float32 probe ran into
        fa3.family.make_inputs(fa3.parse_params({}), Shape(1, 5, 2, 3, 7, "float32"), torch.float32, "cpu", 0)
    assert _seq_major(fa3) and _seq_major(get_backend("fa4"))
    assert not _seq_major(get_backend("sdpa"))
