"""The peers beyond the paper (fla_delta: gated DeltaNet and DeltaNet; mamba3: Mamba-3 SISO)
on the CPU.

Their GPU kernels cannot run here; these tests check the parameters, the mLSTM's head layout,
the availability reasons (the environment simulated), the native input layouts and each
float64 reference against an independent formulation. The GPU paths run in the suite.
"""

from __future__ import annotations

import math
import types

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from tflabench.backends import get_backend
from tflabench.backends import delta as delta_mod
from tflabench.backends import mamba as mamba_mod
from tflabench.backends.base import Shape

SHAPE = Shape(batch=2, seq_len=24, heads=3, d_qk=8, d_hv=12, dtype="bfloat16")


def _absent(monkeypatch, module, *names):
    """Make ``module._find_spec`` report ``names`` as not installed (others as present)."""

    def fake(name):
        if name in names:
            return None
        return types.SimpleNamespace(name=name, origin=None, submodule_search_locations=None)

    monkeypatch.setattr(module, "_find_spec", fake)


# ------------------------------------------------------------------------ registry, params, layout


@pytest.mark.parametrize("name, family", [("fla_delta", "delta_rule"), ("mamba3", "mamba3")])
def test_new_peer_names_resolve_to_their_backends_in_the_mlstm_layout(name, family):
    backend = get_backend(name)
    assert (backend.name, backend.family.name) == (name, family)
    # paper App. E.3, the mLSTM's layout at embedding 4096: 16 heads, d_qk 128, d_hv 256
    assert backend.layout(backend.parse_params({}), 4096) == (16, 128, 256)
    assert backend.layout(backend.parse_params({"heads": 8, "d_qk": 64, "d_hv": 128}), 4096) == (8, 64, 128)


def test_fla_delta_params_refuse_unknown_ops_and_fields():
    backend = get_backend("fla_delta")
    assert backend.parse_params({"op": "chunk_delta_rule"}).op == "chunk_delta_rule"
    with pytest.raises(ValidationError):
        backend.parse_params({"op": "fused_chunk_delta_rule"})
    with pytest.raises(ValidationError):
        backend.parse_params({"chunk_size": 32})
    assert backend.chunk_size(backend.parse_params({})) == delta_mod.DELTA_CHUNK


@pytest.mark.parametrize("raw", [{"chunk_size": 48}, {"chunk_size": 8}, {"rope_fraction": 0.25}])
def test_mamba3_params_refuse_what_the_kernel_cannot_take(raw):
    with pytest.raises(ValidationError):
        get_backend("mamba3").parse_params(raw)


@pytest.mark.parametrize("name", ["fla_delta", "mamba3"])
def test_new_peers_have_no_model_count(name):
    # no published FLOP/byte count: report says "no model", never a made-up bound
    backend = get_backend(name)
    params = backend.parse_params({})
    shape = Shape(batch=4, seq_len=1024, heads=16, d_qk=128, d_hv=256)
    assert backend.family.model_kind(params, shape, "fwd") is None
    assert backend.family.model_counts(params, shape, "fwdbw") is None


# ------------------------------------------------------------------------ availability


@pytest.mark.parametrize("missing", ["fla", "einops", "triton"])
def test_fla_delta_names_the_missing_package_and_the_pinned_install(monkeypatch, missing):
    _absent(monkeypatch, delta_mod, missing)
    backend = get_backend("fla_delta")
    reason = backend.available(backend.parse_params({}))
    assert reason.startswith(f"{missing} is not installed") and "fla-core==0.6.0" in reason


def test_fla_delta_without_a_gpu_says_so(monkeypatch):
    _absent(monkeypatch, delta_mod)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    backend = get_backend("fla_delta")
    assert "CUDA GPU" in backend.available(backend.parse_params({"op": "chunk_delta_rule"}))


def test_mamba3_names_a_mamba_ssm_without_its_triton_kernels(monkeypatch):
    _absent(monkeypatch, mamba_mod)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def load():
        raise ModuleNotFoundError("No module named 'mamba_ssm.ops.triton.mamba3'")

    monkeypatch.setattr(mamba_mod, "_mamba3_siso_combined", load)
    backend = get_backend("mamba3")
    reason = backend.available(backend.parse_params({}))
    assert "no Mamba-3" in reason and "2.3.2" in reason


def test_mamba3_without_mamba_ssm_says_so(monkeypatch):
    _absent(monkeypatch, mamba_mod, "mamba_ssm")
    backend = get_backend("mamba3")
    assert backend.available(backend.parse_params({})).startswith("mamba_ssm is not installed")


# ------------------------------------------------------------------------ inputs


@pytest.mark.parametrize("op, gated", [("chunk_gated_delta_rule", True), ("chunk_delta_rule", False)])
def test_fla_delta_inputs_are_in_flas_layout(op, gated):
    backend = get_backend("fla_delta")
    inputs = backend.family.make_inputs(backend.parse_params({"op": op}), SHAPE, torch.bfloat16, "cpu", 3,
                                 requires_grad=True)
    B, T, H = SHAPE.batch, SHAPE.seq_len, SHAPE.heads
    assert inputs["q"].shape == inputs["k"].shape == (B, T, H, SHAPE.d_qk)
    assert inputs["v"].shape == (B, T, H, SHAPE.d_hv) and inputs["beta"].shape == (B, T, H)
    assert ("g" in inputs) is gated
    assert 0 < inputs["beta"].float().min() and inputs["beta"].float().max() < 1
    if gated:
        assert inputs["g"].dtype == torch.float32 and (inputs["g"] < 0).all()
    assert all(t.is_leaf and t.requires_grad for t in inputs.values())
    again = backend.family.make_inputs(backend.parse_params({"op": op}), SHAPE, torch.bfloat16, "cpu", 3)
    assert torch.equal(again["v"], inputs["v"].detach())


def test_fla_delta_rule_refuses_float32_as_fla_does():
    backend = get_backend("fla_delta")
    with pytest.raises(ValueError, match="float32"):
        backend.family.make_inputs(backend.parse_params({"op": "chunk_delta_rule"}), SHAPE, torch.float32, "cpu", 0)
    gated = backend.family.make_inputs(backend.parse_params({}), SHAPE, torch.float32, "cpu", 0)
    assert gated["q"].dtype == torch.float32


def test_mamba3_inputs_follow_the_module_and_refuse_other_dtypes():
    backend = get_backend("mamba3")
    params = backend.parse_params({})
    shape = Shape(batch=2, seq_len=16, heads=3, d_qk=8, d_hv=4)
    inputs = backend.family.make_inputs(params, shape, torch.bfloat16, "cpu", 0, requires_grad=True)
    assert inputs["q"].shape == (2, 16, 3, 8) and inputs["v"].shape == (2, 16, 3, 4)
    assert inputs["adt"].shape == inputs["dt"].shape == inputs["trap"].shape == (2, 3, 16)
    assert inputs["angles"].shape == (2, 16, 3, 2)          # N * 0.5 / 2 angles
    assert (inputs["dt"] > 0).all() and (inputs["adt"] < 0).all()
    assert all(t.is_leaf and t.requires_grad for t in inputs.values())
    full = backend.family.make_inputs(backend.parse_params({"rope_fraction": 1.0}), shape, torch.bfloat16, "cpu", 0)
    assert full["angles"].shape[-1] == 4
    with pytest.raises(ValueError, match="bfloat16"):
        backend.family.make_inputs(params, shape, torch.float32, "cpu", 0)
    with pytest.raises(ValueError, match="d_hv"):
        backend.family.make_inputs(params, Shape(1, 16, 1, 8, 12), torch.bfloat16, "cpu", 0)
    with pytest.raises(ValueError, match="even"):
        backend.family.make_inputs(params, Shape(1, 16, 1, 4, 8), torch.bfloat16, "cpu", 0)


# ------------------------------------------------------------------------ float64 references


def _delta_by_transitions(q, k, v, beta, g):
    """S_t = a_t (I - beta_t k_t k_tᵀ) S_{t-1} + beta_t k_t v_tᵀ with explicit d_qk x d_qk
    transition matrices (the generalised Householder form), per batch and head, float64."""
    q, k = (F.normalize(x.double(), dim=-1, eps=0.0) for x in (q, k))
    v, beta = v.double(), beta.double()
    B, T, H, K = q.shape
    out = torch.zeros(B, T, H, v.shape[-1], dtype=torch.float64)
    eye = torch.eye(K, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            S = torch.zeros(K, v.shape[-1], dtype=torch.float64)
            for t in range(T):
                a = 1.0 if g is None else math.exp(float(g[b, t, h]))
                kt = k[b, t, h][:, None]
                S = a * (eye - beta[b, t, h] * kt @ kt.T) @ S + beta[b, t, h] * kt @ v[b, t, h][None, :]
                out[b, t, h] = S.T @ (q[b, t, h] * K ** -0.5)
    return out


@pytest.mark.parametrize("gated", [True, False])
def test_delta_rule_reference_matches_the_householder_product_form(gated):
    gen = torch.Generator().manual_seed(1)
    B, T, H, K, V = 1, 12, 2, 6, 5
    q, k = torch.randn(B, T, H, K, generator=gen), torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, H, V, generator=gen)
    beta = torch.rand(B, T, H, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, H, generator=gen) + 2) if gated else None
    # l2norm's eps 1e-6 against eps 0 on keys of norm ~2.4: far below 1e-6
    got = delta_mod.delta_rule_reference(q, k, v, beta, g=g)
    assert torch.allclose(got, _delta_by_transitions(q, k, v, beta, g), atol=1e-6, rtol=1e-6)


def test_gated_delta_rule_with_full_forgetting_is_one_write_per_step():
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 8, 1, 4, generator=gen), torch.randn(1, 8, 1, 4, generator=gen)
    v, beta = torch.randn(1, 8, 1, 3, generator=gen), torch.rand(1, 8, 1, generator=gen)
    g = torch.full((1, 8, 1), -1e4)      # exp(g) = 0: the state holds only this step's write
    got = delta_mod.delta_rule_reference(q, k, v, beta, g=g)
    qn, kn = delta_mod.l2_normalise(q.double()), delta_mod.l2_normalise(k.double())
    want = (beta.double()[..., None] * (qn * kn).sum(-1, keepdim=True) * 0.5) * v.double()
    assert torch.allclose(got, want, atol=1e-12)


def _mamba3_qkv(seed: int, B: int, S: int, H: int, N: int, P: int):
    """q, k (B, S, H, N) and v (B, S, H, P) ~ N(0, 1) of a seeded generator, and the generator."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, S, H, N, generator=gen), torch.randn(B, S, H, N, generator=gen)
    return q, k, torch.randn(B, S, H, P, generator=gen), gen


def test_mamba3_reference_without_trapezoid_rotation_or_bias_is_mamba2s_ssd():
    B, S, H, N, P = 1, 10, 2, 4, 3
    q, k, v, gen = _mamba3_qkv(4, B, S, H, N, P)
    dt = torch.rand(B, H, S, generator=gen) * 0.5 + 0.01
    A = -(torch.rand(H, generator=gen) + 0.5)
    adt = A[None, :, None] * dt
    trap = torch.full((B, H, S), 60.0)     # sigmoid -> 1: no term of the previous step
    zeros_bias = torch.zeros(H, N)
    angles = torch.zeros(B, S, H, N // 2)  # tanh(0) = 0: no rotation
    D = torch.rand(H, generator=gen)
    got = mamba_mod.mamba3_reference(q, k, v, adt, dt, trap, zeros_bias, zeros_bias, angles, D=D)
    # SSD: state_t = exp(dt A) state + dt x Bᵀ, y = state C + D x, with x = v, B = k, C = q
    want = torch.stack([
        mamba_mod.ssd_recurrent_reference(v[:, :, h:h + 1], dt.transpose(1, 2)[:, :, h:h + 1], A[h:h + 1],
                                          k[:, :, h:h + 1], q[:, :, h:h + 1], D=D[h:h + 1], dt_softplus=False)[:, :, 0]
        for h in range(H)], dim=2)
    assert torch.allclose(got, want, atol=1e-10)


def test_mamba3_reference_trapezoid_and_rotation():
    B, S, H, N, P = 1, 6, 1, 4, 2
    q, k, v, gen = _mamba3_qkv(5, B, S, H, N, P)
    dt = torch.full((B, H, S), 0.3)
    adt = torch.zeros(B, H, S)             # no decay
    trap = torch.full((B, H, S), -60.0)    # sigmoid -> 0: only the previous step's term
    bias = torch.zeros(H, N)
    angles = torch.randn(B, S, H, N // 2, generator=gen)
    D = torch.zeros(H)
    y = mamba_mod.mamba3_reference(q, k, v, adt, dt, trap, bias, bias, angles, D=D)
    # t = 0 sees no earlier step; t = 1 sees dt v_0 (k̃_0 · q̃_1): the rotation by θ_1 - θ_0
    assert torch.allclose(y[:, 0], torch.zeros_like(y[:, 0]), atol=1e-12)
    theta = (torch.tanh(angles.double()) * math.pi * 0.3).cumsum(1)[0, :, 0]     # (S, N/2)
    delta = theta[1] - theta[0]
    k0 = k[0, 0, 0].double().reshape(N // 2, 2)
    q1 = q[0, 1, 0].double().reshape(N // 2, 2)
    # rot(k0, θ0) · rot(q1, θ1) = k0 · rot(q1, θ1 - θ0)
    q1r = torch.stack((q1[:, 0] * delta.cos() - q1[:, 1] * delta.sin(),
                       q1[:, 0] * delta.sin() + q1[:, 1] * delta.cos()), dim=-1)
    want = 0.3 * (k0 * q1r).sum() * v[0, 0, 0].double()
    assert torch.allclose(y[0, 1, 0], want, atol=1e-10)


# ------------------------------------------------------------------------ report: "no model"


def test_report_says_no_model_for_a_measured_kernel_the_model_does_not_count():
    import pandas as pd
    from rich.console import Console

    from tflabench.report.tables import summary_table

    rows = pd.DataFrame([
        {"kernel": "Gated DeltaNet (FLA chunk)", "mode": "fwd", "status": "ok", "ms_median": 1.5,
         "flops": float("nan"), "tflops_per_s": float("nan"), "batch": 4, "seq_len": 1024},
        {"kernel": "mLSTMsig TFLA", "mode": "fwd", "status": "ok", "ms_median": 1.0,
         "flops": 2.5e12, "tflops_per_s": 2500.0, "batch": 4, "seq_len": 1024},
        {"kernel": "Mamba-3 (SISO, Triton)", "mode": "fwd", "status": "unavailable", "ms_median": float("nan"),
         "flops": float("nan"), "tflops_per_s": float("nan"), "batch": 4, "seq_len": 1024},
    ])
    console = Console(width=300, record=True)
    console.print(summary_table(rows))
    lines = {line.split("│")[1].strip(): line for line in console.export_text().splitlines()
             if line.count("│") > 2}
    assert "no model" in lines["Gated DeltaNet (FLA chunk)"]
    assert "2.5e+03" in lines["mLSTMsig TFLA"] and "no model" not in lines["mLSTMsig TFLA"]
    assert "no model" not in lines["Mamba-3 (SISO, Triton)"]      # nothing measured: no claim either way


@pytest.mark.parametrize("name, gates", [("fla_delta", {"beta", "g"}),
                                         ("mamba3", {"adt", "dt", "trap", "angles", "q_bias", "k_bias", "D"})])
def test_every_gradient_of_the_new_peers_has_a_budget_class(name, gates):
    from tflabench.numerics import tensor_class

    backend = get_backend(name)
    inputs = backend.family.make_inputs(backend.parse_params({}), Shape(1, 8, 1, 8, 8), torch.bfloat16, "cpu", 0,
                                 requires_grad=True)
    classes = {key: tensor_class("d" + key) for key in inputs}
    assert {key for key, cls in classes.items() if cls == "gate_grad"} == gates
    assert all(cls == "grad" for key, cls in classes.items() if key not in gates)


def test_the_html_report_says_no_model_too():
    from tflabench.report.html import _results_table

    nan = float("nan")
    records = [
        {"kernel": "DeltaNet (FLA chunk)", "mode": "fwd", "status": "ok", "ms_median": 2.0, "flops": nan,
         "tflops_per_s": nan, "roofline_fraction": nan, "batch": 4, "seq_len": 1024},
        {"kernel": "mLSTMsig TFLA", "mode": "fwd", "status": "ok", "ms_median": 1.0, "flops": 2.5e12,
         "tflops_per_s": 2500.0, "roofline_fraction": 0.5, "batch": 4, "seq_len": 1024},
    ]
    html, _ = _results_table(records)
    delta_row, ours_row = (part for part in html.split("<tr")[2:4])
    assert delta_row.count("no model") == 2 and "DeltaNet" in delta_row
    assert "no model" not in ours_row and "2.5e+03" in ours_row


def test_verify_applies_forget_gate_regimes_to_gated_deltanet_only():
    from tflabench.numerics import VerifySettings
    from tflabench.run.verify_case import FAMILY_PROFILES, regimes_for

    backend = get_backend("fla_delta")
    gated = backend.family.numerics_family(backend.parse_params({}))
    plain = backend.family.numerics_family(backend.parse_params({"op": "chunk_delta_rule"}))
    settings = VerifySettings()
    assert len(regimes_for(gated, settings)) > len(regimes_for(plain, settings)) >= 1
    inputs = backend.family.make_inputs(backend.parse_params({}), SHAPE, torch.bfloat16, "cpu", 0, requires_grad=True)
    spec = settings.regime(next(n for n in regimes_for(gated, settings) if settings.regime(n).f is not None))
    redrawn = FAMILY_PROFILES[gated].apply(inputs, spec, torch.Generator().manual_seed(1))
    assert not torch.equal(redrawn["g"], inputs["g"]) and (redrawn["g"] <= 0).all()
    assert redrawn["g"].requires_grad and redrawn["q"] is inputs["q"]


def test_gated_deltanet_backward_follows_flas_640_rule_and_deltanet_does_not(monkeypatch):
    """fla guards the gated DeltaNet backward as GLA's (seen on an H200 with triton 3.6.0: a
    RuntimeError naming #640): fwdbw is unavailable with the reason, DeltaNet's is not."""
    from tflabench.backends import fla as fla_mod

    backend = get_backend("fla_delta")
    gated, plain = backend.parse_params({"op": "chunk_gated_delta_rule"}), backend.parse_params({"op": "chunk_delta_rule"})
    monkeypatch.setattr(fla_mod, "fla_backward_refused", lambda: (True, "Hopper GPU=True, triton 3.6.0"))
    reason = backend.unsupported_mode(gated, "fwdbw")
    assert "#640" in reason and "chunk_gated_delta_rule" in reason and "3.7.1" in reason
    assert backend.unsupported_mode(gated, "fwd") is None and backend.unsupported_mode(plain, "fwdbw") is None
    monkeypatch.setattr(fla_mod, "fla_backward_refused", lambda: (False, "Hopper GPU=True, triton 3.7.1"))
    assert backend.unsupported_mode(gated, "fwdbw") is None
    error = RuntimeError("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for gated "
                         "chunk_bwd_dqkwg (see #640). Please upgrade Triton to >= 3.7.1")
    assert "#640" in backend.classify_error(gated, "fwdbw", error)
    assert backend.classify_error(gated, "fwdbw", ValueError("other")) is None
