"""The peer backends (mlstm_kernels, sdpa, fa3, fa2, mamba2, mamba, fla) on the CPU.

The peers' GPU kernels cannot run here; these tests check what can be checked honestly on
a CPU: registry names, parameter validation, the paper's head layouts (App. E.3), the
availability reasons (with the environment simulated where needed), the native input
layouts, the SDPA backend end to end with impl=math, and each float64 reference against an
independent formulation.
"""

from __future__ import annotations

import dataclasses
import math
import os
import stat
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from tflabench.backends import get_backend
from tflabench.backends import fla as fla_mod
from tflabench.backends import lightning as lightning_mod
from tflabench.backends import flash_attn as fa_mod
from tflabench.backends import mamba as mamba_mod
from tflabench.backends import mlstm_kernels as mk_mod
from tflabench.backends.base import Shape
from tflabench.errors import UserError

PEER_NAMES = ("mlstm_kernels", "sdpa", "fa3", "fa2", "mamba2", "mamba", "fla", "lightning_attn")


def _max_norm_err(x, ref):
    return ((x.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


def _absent(monkeypatch, module, *names):
    """Make ``module._find_spec`` report ``names`` as not installed (others as present)."""
    real = module._find_spec

    def fake(name):
        if name in names:
            return None
        return real(name) or types.SimpleNamespace(name=name, origin=None, submodule_search_locations=None)

    monkeypatch.setattr(module, "_find_spec", fake)


# ------------------------------------------------------------------------ registry, params


def test_each_peer_name_resolves_to_its_own_backend_without_importing_peers():
    families = {"mlstm_kernels": "mlstm", "sdpa": "attention", "fa3": "attention", "fa2": "attention",
                "mamba2": "mamba2", "mamba": "mamba", "fla": "gla", "lightning_attn": "gla"}
    for name in PEER_NAMES:
        backend = get_backend(name)
        assert backend.name == name
        assert backend.family.name == families[name]
        assert backend.available.__qualname__ != "_MissingBackend.available"
    for peer in ("mlstm_kernels", "fla", "mamba_ssm", "fa3_fwd_interface", "flash_attn"):
        assert peer not in sys.modules


def test_unknown_parameter_is_refused_by_every_peer_backend():
    for name in PEER_NAMES:
        with pytest.raises(ValidationError) as err:
            get_backend(name).parse_params({"no_such_field": 1})
        assert err.value.errors()[0]["type"] == "extra_forbidden"


@pytest.mark.parametrize("name, raw, fragment", [
    ("mlstm_kernels", {"variant": "sig", "algorithm": "limit_chunk"}, "no mLSTMsig limit_chunk"),
    ("mlstm_kernels", {"variant": "exp", "normalize": False}, "always normalises"),
    ("mlstm_kernels", {"chunk_size": 96}, "power of two"),
    ("mlstm_kernels", {"variant": "lstm"}, "variant"),
    ("sdpa", {"impl": "flash3"}, "impl"),
    ("fa3", {"interface": "flash_attn"}, "interface"),
    ("mamba2", {"chunk_size": 100}, "power of two"),
    ("mamba2", {"ngroups": 0}, "ngroups"),
    ("mamba", {"d_state": 0}, "d_state"),
    ("fla", {"op": "chunk_gla", "chunk_size": 64}, "fixes its chunk size"),
    ("fla", {"op": "chunk_simple_gla", "layer_idx": 1}, "only for op lightning_attn"),
    ("fla", {"op": "lightning_attn", "layer_idx": 4, "num_layers": 4}, "layer_idx"),
    ("fla", {"chunk_size": 48}, "power of two"),
])
def test_invalid_parameter_values_are_refused_naming_the_field(name, raw, fragment):
    with pytest.raises(ValidationError) as err:
        get_backend(name).parse_params(raw)
    assert fragment in str(err.value)


def test_valid_parameter_combinations_are_accepted():
    assert get_backend("mlstm_kernels").parse_params({"variant": "exp", "algorithm": "limit_chunk"})
    assert get_backend("mlstm_kernels").parse_params({"variant": "sig", "normalize": True, "chunk_size": 256})
    assert get_backend("sdpa").parse_params({"impl": "cudnn", "causal": False})
    assert get_backend("fla").parse_params({"op": "lightning_attn", "layer_idx": 3, "num_layers": 24})
    assert get_backend("mamba2").parse_params({"d_state": 64, "ngroups": 8, "chunk_size": 128})


# ------------------------------------------------------------------------ layouts


@pytest.mark.parametrize("name, raw, expected", [
    # paper App. E.3 at embedding 4096: mLSTM and FLA 16 heads, d_hv 256, d_qk 128;
    # attention 32 heads of 128; Mamba 2 64 heads of 64, state 128; Mamba D = 4096, state 16;
    # Lightning Attention (Figure 13) 32 heads of 128.
    ("mlstm_kernels", {}, (16, 128, 256)),
    ("fla", {"op": "chunk_simple_gla"}, (16, 128, 256)),
    ("fla", {"op": "chunk_gla"}, (16, 128, 256)),
    ("fla", {"op": "lightning_attn"}, (32, 128, 128)),
    ("lightning_attn", {}, (32, 128, 128)),
    ("fla", {"op": "fused_chunk_simple_gla"}, (16, 128, 256)),
    ("sdpa", {}, (32, 128, 128)),
    ("fa3", {}, (32, 128, 128)),
    ("fa2", {}, (32, 128, 128)),
    ("mamba2", {}, (64, 128, 64)),
    ("mamba", {}, (1, 16, 4096)),
])
def test_default_layouts_are_the_papers_at_embedding_4096(name, raw, expected):
    backend = get_backend(name)
    assert backend.layout(backend.parse_params(raw), 4096) == expected


@pytest.mark.parametrize("name, raw, expected", [
    # Figure 12 / 5 setting: 8 heads, d_hv 512, d_qk 256 (paper App. E.3)
    ("mlstm_kernels", {"heads": 8}, (8, 256, 512)),
    ("fla", {"heads": 8}, (8, 256, 512)),
    # Figure 14: d_qk = d_hv = d, heads = 4096 / d
    ("mlstm_kernels", {"d_hv": 64, "p_qk": 1.0}, (64, 64, 64)),
    ("sdpa", {"d_hv": 64}, (64, 64, 64)),
    ("fa3", {"heads": 16}, (16, 256, 256)),
    ("fla", {"op": "lightning_attn", "d_hv": 64}, (64, 64, 64)),
    ("lightning_attn", {"heads": 64}, (64, 64, 64)),                # Figure 13's other layout
    ("fla", {"op": "fused_chunk_simple_gla", "heads": 8}, (8, 256, 512)),   # Figure 12
    ("fla", {"d_qk": 64, "heads": 16}, (16, 64, 256)),
    ("mamba2", {"d_hv": 128, "d_state": 64}, (32, 64, 128)),
    ("mamba2", {"heads": 32}, (32, 128, 128)),
    ("mamba", {"d_inner": 8192, "d_state": 32}, (1, 32, 8192)),
])
def test_layout_overrides_follow_the_params(name, raw, expected):
    backend = get_backend(name)
    assert backend.layout(backend.parse_params(raw), 4096) == expected


def test_unresolvable_layouts_raise_user_errors_naming_the_field():
    with pytest.raises(UserError, match="heads"):
        get_backend("sdpa").layout(get_backend("sdpa").parse_params({"heads": 3}), 4096)
    with pytest.raises(UserError, match="ngroups"):
        m2 = get_backend("mamba2")
        m2.layout(m2.parse_params({"ngroups": 3}), 4096)


# ------------------------------------------------------------------------ availability


@pytest.mark.parametrize("name, module, missing, hint", [
    ("mlstm_kernels", mk_mod, "mlstm_kernels", "pip install mlstm_kernels"),
    ("mlstm_kernels", mk_mod, "einops", "einops"),
    ("fla", fla_mod, "fla", "pip install fla-core"),
    ("mamba2", mamba_mod, "mamba_ssm", "pip install mamba_ssm"),
    ("fa2", fa_mod, "flash_attn", "pip install flash-attn"),
])
def test_missing_package_gives_reason_with_install_hint(monkeypatch, name, module, missing, hint):
    _absent(monkeypatch, module, missing)
    backend = get_backend(name)
    reason = backend.available(backend.parse_params({}))
    assert reason is not None
    assert f"{missing} is not installed" in reason
    assert hint in reason


def test_fa3_without_either_interface_names_both_and_how_to_get_them(monkeypatch):
    _absent(monkeypatch, fa_mod, "flash_attn_interface", "fa3_fwd_interface")
    fa3 = get_backend("fa3")
    reason = fa3.available(fa3.parse_params({}))
    assert "neither flash_attn_interface nor fa3_fwd_interface is installed" in reason
    assert "hopper/" in reason and "fa3_fwd" in reason


def test_fa3_with_only_the_forward_wheel_reports_fwdbw_unsupported(monkeypatch):
    _absent(monkeypatch, fa_mod, "flash_attn_interface")
    fa3 = get_backend("fa3")
    params = fa3.parse_params({})
    assert fa_mod.resolve_fa3_interface("auto") == "fa3_fwd_interface"
    assert fa3.unsupported_mode(params, "fwd") is None
    reason = fa3.unsupported_mode(params, "fwdbw")
    assert reason is not None and "forward only" in reason


def test_fa3_says_which_build_it_found_and_whether_it_has_a_backward(monkeypatch):
    _absent(monkeypatch, fa_mod, "flash_attn_interface")
    fa3 = get_backend("fa3")
    params = fa3.parse_params({})
    assert "forward only: fa3_fwd wheel; fwd+bwd needs flash_attn_interface, see docs/offline-peers.md" in (
        fa3.unsupported_mode(params, "fwdbw"))
    build = fa_mod.fa3_build("auto")
    assert (build["module"], build["backward"]) == ("fa3_fwd_interface", False)
    assert fa3.note(params, "cuda").startswith("via fa3_fwd_interface") and "forward only" in fa3.note(params, "cuda")
    specs = {"flash_attn_interface": types.SimpleNamespace(origin="/x/flash_attn_interface.py"),
             "flash_attn_3": types.SimpleNamespace(origin="/x/flash_attn_3/__init__.py")}
    built = fa_mod.fa3_build("auto", find_spec=specs.get)
    assert built["module"] == "flash_attn_interface" and built["backward"] and built["extension_missing"] is None
    text = fa_mod.fa3_build_text(built)       # a version between the two where flash_attn_3 is installed
    assert text.startswith("flash_attn_interface") and text.endswith(" at /x/flash_attn_interface.py (fwd+bwd)")
    without_ext = fa_mod.fa3_build("auto", find_spec={"flash_attn_interface": specs["flash_attn_interface"]}.get)
    assert without_ext["extension_missing"] == "flash_attn_3"
    assert fa_mod.fa3_build("auto", find_spec=lambda name: None) is None


def test_fa3_interface_without_its_extension_is_unavailable_with_that_reason(monkeypatch):
    _absent(monkeypatch, fa_mod, "flash_attn_3")
    fa3 = get_backend("fa3")
    reason = fa3.available(fa3.parse_params({}))
    assert "flash_attn_3._C" in reason and "build_peer_wheel.sh fa3" in reason


def test_fa3_prefers_the_fwd_bwd_interface_and_then_supports_fwdbw(monkeypatch):
    _absent(monkeypatch, fa_mod)  # both interfaces "installed"
    fa3 = get_backend("fa3")
    assert fa_mod.resolve_fa3_interface("auto") == "flash_attn_interface"
    assert fa3.unsupported_mode(fa3.parse_params({}), "fwdbw") is None
    forced = fa3.parse_params({"interface": "fa3_fwd_interface"})
    assert fa3.unsupported_mode(forced, "fwdbw") is not None


def test_fa3_fwd_config_is_aliased_as_flash_attn_config(monkeypatch, tmp_path):
    (tmp_path / "fa3_fwd_config.py").write_text("CONFIG = {'build_flags': {'marker': 1}}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn_config", raising=False)
    monkeypatch.delitem(sys.modules, "fa3_fwd_config", raising=False)
    fa_mod._alias_fa3_fwd_config()
    assert sys.modules["flash_attn_config"].CONFIG["build_flags"]["marker"] == 1
    import flash_attn_config  # noqa: F401  (resolves to the alias)

    assert flash_attn_config.CONFIG["build_flags"]["marker"] == 1
    for name in ("flash_attn_config", "fa3_fwd_config"):
        sys.modules.pop(name, None)


def test_mamba_v1_without_compiled_extension_is_unavailable_with_reason(monkeypatch):
    _absent(monkeypatch, mamba_mod, "selective_scan_cuda")
    mamba = get_backend("mamba")
    reason = mamba.available(mamba.parse_params({}))
    assert "selective_scan_cuda" in reason and "MAMBA_SKIP_CUDA_BUILD" in reason
    assert "pip install mamba-ssm --no-build-isolation" in reason


def test_gpu_only_peers_report_no_cuda_when_packages_are_present(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name, module in (("mlstm_kernels", mk_mod), ("fla", fla_mod), ("mamba2", mamba_mod), ("fa2", fa_mod)):
        _absent(monkeypatch, module)
        backend = get_backend(name)
        reason = backend.available(backend.parse_params({}))
        assert reason is not None and "CUDA GPU" in reason, (name, reason)
    sdpa = get_backend("sdpa")
    assert "CUDA GPU" in sdpa.available(sdpa.parse_params({"impl": "cudnn"}))
    assert sdpa.available(sdpa.parse_params({"impl": "math"})) is None


def test_mamba_submodule_loads_under_a_stand_in_parent_without_running_its_init(monkeypatch, tmp_path):
    pkg = tmp_path / "mamba_ssm"
    (pkg / "ops").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('selective_scan_cuda missing')\n")
    (pkg / "ops" / "__init__.py").write_text("")
    (pkg / "ops" / "kernel.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.kernel"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ImportError):
        __import__("mamba_ssm")
    module = mamba_mod.import_mamba_submodule("ops.kernel")
    assert module.VALUE == 7
    assert sys.modules["mamba_ssm"].__path__ == [str(pkg)]
    for name in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.kernel"):
        sys.modules.pop(name, None)


# ------------------------------------------------------------------------ fla's backward refusal


def _fla_env(monkeypatch, hopper, triton):
    monkeypatch.delitem(sys.modules, "fla.utils", raising=False)
    monkeypatch.setattr(fla_mod, "gpu_is_hopper", lambda: hopper)
    monkeypatch.setattr(fla_mod, "triton_version", lambda: triton)


@pytest.mark.parametrize("hopper, triton, refused", [
    (True, (3, 6, 0), True),    # the H200 of this project's runs
    (True, (3, 4, 0), True),
    (True, (3, 7, 0), True),
    (True, (3, 7, 1), False),   # fla's guard: < 3.7.1 (fla-core 0.6.0, ops/common/chunk_o.py)
    (True, (3, 3, 1), False),
    (False, (3, 6, 0), False),  # not Hopper
    (None, (3, 6, 0), False),   # unknown GPU: not refused up front
])
def test_fla_simple_gla_fwdbw_is_unsupported_on_hopper_with_triton_3_4_to_3_7_0(monkeypatch, hopper, triton, refused):
    _fla_env(monkeypatch, hopper, triton)
    fla = get_backend("fla")
    params = fla.parse_params({"op": "chunk_simple_gla"})
    assert fla.unsupported_mode(params, "fwd") is None
    reason = fla.unsupported_mode(params, "fwdbw")
    assert (reason is not None) == refused
    if refused:
        assert "#640" in reason and "3.7.1" in reason


def test_fla_ops_outside_the_guarded_backward_keep_fwdbw(monkeypatch):
    _fla_env(monkeypatch, True, (3, 6, 0))
    fla = get_backend("fla")
    for op in ("chunk_gla", "lightning_attn"):
        assert fla.unsupported_mode(fla.parse_params({"op": op}), "fwdbw") is None


def test_fla_refusal_uses_flas_own_flags_once_fla_is_imported(monkeypatch):
    monkeypatch.setattr(fla_mod, "gpu_is_hopper", lambda: False)  # would say "not refused"
    fake = types.SimpleNamespace(IS_NVIDIA_HOPPER=True, TRITON_ABOVE_3_4_0=True, TRITON_ABOVE_3_7_1=False)
    monkeypatch.setitem(sys.modules, "fla.utils", fake)
    fla = get_backend("fla")
    assert "#640" in fla.unsupported_mode(fla.parse_params({}), "fwdbw")
    fake.TRITON_ABOVE_3_7_1 = True
    assert fla.unsupported_mode(fla.parse_params({}), "fwdbw") is None


def test_fla_refusal_error_is_recognised_as_an_unsupported_mode():
    fla = get_backend("fla")
    params = fla.parse_params({})
    # the message fla-core 0.6.0 raises (fla/ops/common/chunk_o.py)
    exc = RuntimeError("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for "
                       "gated chunk_bwd_dqkwg (see #640). Please upgrade Triton to >= 3.7.1")
    assert "#640" in fla.classify_error(params, "fwdbw", exc)
    assert fla.classify_error(params, "fwdbw", RuntimeError("CUDA out of memory")) is None
    assert fla.classify_error(params, "fwdbw", ValueError("see #640")) is None


def test_triton_version_and_nvidia_smi_capability_are_parsed(monkeypatch, tmp_path):
    assert fla_mod._version_tuple("3.7.0+git9c7bc0a3") == (3, 7, 0)
    assert fla_mod._version_tuple("3.6") == (3, 6, 0)
    assert fla_mod._version_tuple("") is None
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '9.0'\necho '8.0'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    fla_mod._nvidia_smi_compute_major.cache_clear()
    try:
        assert fla_mod.gpu_is_hopper() is True
        fake.write_text("#!/bin/sh\necho '8.0'\n")
        fla_mod._nvidia_smi_compute_major.cache_clear()
        assert fla_mod.gpu_is_hopper() is False
    finally:
        fla_mod._nvidia_smi_compute_major.cache_clear()


# ------------------------------------------------------------------------ inputs


@pytest.mark.parametrize("name, raw, shapes", [
    ("mlstm_kernels", {}, {"q": (2, 4, 64, 8), "k": (2, 4, 64, 8), "v": (2, 4, 64, 16),
                           "i": (2, 4, 64), "f": (2, 4, 64)}),
    ("sdpa", {}, {"q": (2, 4, 64, 8), "k": (2, 4, 64, 8), "v": (2, 4, 64, 16)}),
    ("fa3", {}, {"q": (2, 64, 4, 8), "k": (2, 64, 4, 8), "v": (2, 64, 4, 16)}),
    ("fa2", {}, {"q": (2, 64, 4, 8), "k": (2, 64, 4, 8), "v": (2, 64, 4, 16)}),
    ("fla", {"op": "chunk_simple_gla"}, {"q": (2, 64, 4, 8), "k": (2, 64, 4, 8), "v": (2, 64, 4, 16),
                                         "g": (2, 64, 4)}),
    ("fla", {"op": "chunk_gla"}, {"q": (2, 64, 4, 8), "k": (2, 64, 4, 8), "v": (2, 64, 4, 16),
                                  "g": (2, 64, 4, 8)}),
    ("fla", {"op": "lightning_attn"}, {"q": (2, 64, 4, 8), "k": (2, 64, 4, 8), "v": (2, 64, 4, 16)}),
    ("fla", {"op": "fused_chunk_simple_gla"}, {"q": (2, 64, 4, 8), "k": (2, 64, 4, 8), "v": (2, 64, 4, 16),
                                               "g": (2, 64, 4)}),
    ("fla", {"op": "fused_chunk_gla"}, {"q": (2, 64, 4, 8), "k": (2, 64, 4, 8), "v": (2, 64, 4, 16),
                                        "g": (2, 64, 4, 8)}),
    ("mamba2", {}, {"x": (2, 64, 4, 16), "dt": (2, 64, 4), "A": (4,), "B": (2, 64, 1, 8),
                    "C": (2, 64, 1, 8), "D": (4,), "dt_bias": (4,)}),
    ("mamba", {}, {"u": (2, 64, 64), "delta": (2, 64, 64), "A": (64, 8), "B": (2, 8, 64),
                   "C": (2, 8, 64), "D": (64,), "z": (2, 64, 64), "delta_bias": (64,)}),
])
def test_inputs_come_in_the_native_layout_as_contiguous_leaves(name, raw, shapes):
    backend = get_backend(name)
    params = backend.parse_params(raw)
    shape = Shape(batch=2, seq_len=64, heads=4, d_qk=8, d_hv=16)
    if name == "mamba":
        shape = Shape(batch=2, seq_len=64, heads=1, d_qk=8, d_hv=64)
    inputs = backend.family.make_inputs(params, shape, torch.bfloat16, "cpu", seed=3, requires_grad=True)
    assert {k: tuple(v.shape) for k, v in inputs.items()} == shapes
    for key, t in inputs.items():
        assert t.is_contiguous() and t.is_leaf and t.requires_grad, key
    again = backend.family.make_inputs(params, shape, torch.bfloat16, "cpu", seed=3)
    for key in inputs:
        assert torch.equal(inputs[key].detach(), again[key]) and not again[key].requires_grad
    activations = {"q", "k", "v", "x", "B", "C", "u", "z", "delta", "dt"}
    for key in activations & set(inputs):
        assert inputs[key].dtype == torch.bfloat16, key


def test_gate_distributions_are_the_benchmark_settings():
    shape = Shape(batch=4, seq_len=512, heads=8, d_qk=16, d_hv=16)
    mk = get_backend("mlstm_kernels")
    m = mk.family.make_inputs(mk.parse_params({}), shape, torch.bfloat16, "cpu", seed=0)
    # the peers' benchmark setting: forget pre-activations ~ N(3, 1), input ~ N(0, 1)
    assert abs(m["f"].float().mean().item() - 3.0) < 0.05 and abs(m["f"].float().std().item() - 1.0) < 0.05
    assert abs(m["i"].float().mean().item()) < 0.05 and abs(m["i"].float().std().item() - 1.0) < 0.05
    fla = get_backend("fla")
    g = fla.family.make_inputs(fla.parse_params({}), shape, torch.float32, "cpu", seed=0)["g"]
    # logsigmoid of N(3, 1): all negative, mean E[logsigmoid(3 + Z)] by quadrature
    z = torch.linspace(-8, 8, 20001, dtype=torch.float64)
    expected = (F.logsigmoid(3 + z) * torch.exp(-z * z / 2)).sum() / torch.exp(-z * z / 2).sum()
    assert (g < 0).all() and abs(g.mean().item() - expected.item()) < 0.01
    m2 = get_backend("mamba2")
    x = m2.family.make_inputs(m2.parse_params({}), Shape(1, 64, 64, 8, 8), torch.float32, "cpu", seed=0)
    dt = F.softplus(x["dt_bias"])  # the module's init: dt in [1e-3, 1e-1]
    assert (dt >= 1e-3 * 0.999).all() and (dt <= 0.1 * 1.001).all()
    assert (x["A"] <= -1).all() and (x["A"] >= -16).all()


def test_mlstm_kernels_refuses_sequence_lengths_the_peer_cannot_run():
    mk = get_backend("mlstm_kernels")
    for raw, S, fragment in (({}, 200, "S % 16"), ({}, 96, "power of two"), ({}, 320, "does not divide"),
                             ({"variant": "exp", "algorithm": "limit_chunk", "chunk_size": 192}, 384,
                              "power of two")):
        with pytest.raises(ValueError, match=fragment):
            mk.family.make_inputs(mk.parse_params(raw), Shape(1, S, 1, 8, 8), torch.float32, "cpu", seed=0)
    mk.family.make_inputs(mk.parse_params({}), Shape(1, 64, 1, 8, 8), torch.float32, "cpu", seed=0)
    mk.family.make_inputs(mk.parse_params({"chunk_size": 256}), Shape(1, 512, 1, 8, 8), torch.float32, "cpu", seed=0)


def test_mlstm_kernels_gate_shape_is_a_length_the_peer_runs():
    mk = get_backend("mlstm_kernels")
    case = Shape(batch=4, seq_len=8192, heads=16, d_qk=128, d_hv=256)
    for raw, max_len in (({}, 300), ({"chunk_size": 256}, 300), ({"variant": "exp", "algorithm": "limit_chunk"}, 100),
                         ({}, 50)):
        params = mk.parse_params(raw)
        gate = mk.family.gate_shape(params, case, max_len, mk.chunk_size(params))
        mk_mod.check_peer_shape(params, gate.seq_len)  # raises if the peer could not run it
        assert gate.seq_len <= case.seq_len and gate.batch == 1 and gate.heads <= 2


def test_mamba2_gate_shape_keeps_whole_groups():
    m2 = get_backend("mamba2")
    params = m2.parse_params({"ngroups": 4})
    gate = m2.family.gate_shape(params, Shape(2, 4096, 64, 128, 64), 512, m2.chunk_size(params))
    assert gate.heads % 4 == 0 and gate.heads <= 8 and gate.seq_len == 512


# ------------------------------------------------------------------------ SDPA end to end


def test_sdpa_math_runs_on_cpu_and_matches_its_float64_reference_forward_and_backward():
    sdpa = get_backend("sdpa")
    params = sdpa.parse_params({"impl": "math"})
    assert sdpa.available(params) is None
    shape = Shape(batch=2, seq_len=48, heads=3, d_qk=16, d_hv=16, dtype="float32")
    inputs = sdpa.family.make_inputs(params, shape, torch.float32, "cpu", seed=1, requires_grad=True)
    out = sdpa.forward(params, inputs)
    ref_inputs = {k: v.detach().double().requires_grad_(True) for k, v in inputs.items()}
    ref = sdpa.family.reference(params, ref_inputs)
    assert out.shape == ref.shape == (2, 3, 48, 16) and out.dtype == torch.float32
    tol = sdpa.family.tolerance(params, torch.float32)
    assert _max_norm_err(out, ref) < tol
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    out.backward(grad)
    ref.backward(grad.double())
    for key in ("q", "k", "v"):
        assert _max_norm_err(inputs[key].grad, ref_inputs[key].grad) < tol, key


def test_sdpa_numerics_detect_a_missing_causal_mask():
    sdpa = get_backend("sdpa")
    causal, full = sdpa.parse_params({"impl": "math"}), sdpa.parse_params({"impl": "math", "causal": False})
    inputs = sdpa.family.make_inputs(causal, Shape(1, 32, 2, 8, 8), torch.float32, "cpu", seed=2)
    ref = sdpa.family.reference(causal, {k: v.double() for k, v in inputs.items()})
    assert _max_norm_err(sdpa.forward(full, inputs), ref) > 0.1
    assert _max_norm_err(sdpa.forward(causal, inputs), ref) < 1e-5


def test_flash_attn_reference_is_attention_in_the_bshd_layout():
    fa3, sdpa = get_backend("fa3"), get_backend("sdpa")
    shape = Shape(1, 40, 2, 8, 8)
    bshd = fa3.family.make_inputs(fa3.parse_params({}), shape, torch.float64, "cpu", seed=4)
    bhsd = {k: v.transpose(1, 2).contiguous() for k, v in bshd.items()}
    ref_bshd = fa3.family.reference(fa3.parse_params({}), bshd)
    out = sdpa.forward(sdpa.parse_params({"impl": "math"}), bhsd)
    assert ref_bshd.shape == (1, 40, 2, 8)
    assert _max_norm_err(ref_bshd.transpose(1, 2), out) < 1e-12


# ------------------------------------------------------------------------ float64 references


def _ssd_inputs(seed, b=2, S=45, H=4, P=5, G=2, N=6):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    return dict(x=r(b, S, H, P), dt=r(b, S, H), A=-(1 + 15 * torch.rand(H, generator=gen, dtype=torch.float64)),
                B=r(b, S, G, N), C=r(b, S, G, N), D=r(H), dt_bias=r(H) - 3)


def test_ssd_chunked_reference_equals_the_step_by_step_recurrence():
    inp = _ssd_inputs(0)
    rec = mamba_mod.ssd_recurrent_reference(**inp)
    for chunk in (1, 8, 16, 64):
        assert _max_norm_err(mamba_mod.ssd_reference(**inp, chunk_size=chunk), rec) < 1e-12
    inp["D"] = torch.randn(4, 5, dtype=torch.float64)  # per-channel skip (H, P)
    assert _max_norm_err(mamba_mod.ssd_reference(**inp, chunk_size=16), mamba_mod.ssd_recurrent_reference(**inp)) < 1e-12


def test_ssd_reference_matches_the_quadratic_matrix_form_of_ssd():
    # y = (L ∘ C Bᵀ) (Δ x) + D x with L_tj = exp(sum_{j<s<=t} Δ_s A) (Dao & Gu 2024, "SSD as a
    # matrix transformation"), per head, built densely here.
    inp = _ssd_inputs(1, b=1, S=30, H=2, P=3, G=1, N=4)
    dt = F.softplus(inp["dt"] + inp["dt_bias"])
    out = torch.empty_like(inp["x"])
    for h in range(2):
        a = dt[0, :, h] * inp["A"][h]
        cum = torch.cumsum(a, 0)
        L = torch.exp(cum[:, None] - cum[None, :]).tril()
        M = L * (inp["C"][0, :, 0] @ inp["B"][0, :, 0].T)
        out[0, :, h] = M @ (dt[0, :, h, None] * inp["x"][0, :, h]) + inp["D"][h] * inp["x"][0, :, h]
    assert _max_norm_err(mamba_mod.ssd_reference(**inp), out) < 1e-12


def test_mamba2_backend_reference_applies_bias_and_softplus_like_the_module():
    m2 = get_backend("mamba2")
    params = m2.parse_params({})
    inputs = m2.family.make_inputs(params, Shape(1, 40, 2, 4, 3), torch.float64, "cpu", seed=6)
    ref = m2.family.reference(params, inputs)
    manual = mamba_mod.ssd_recurrent_reference(inputs["x"], F.softplus(inputs["dt"] + inputs["dt_bias"]),
                                               inputs["A"], inputs["B"], inputs["C"], D=inputs["D"],
                                               dt_softplus=False)
    assert ref.shape == (1, 40, 2, 3)
    assert _max_norm_err(ref, manual) < 1e-12


def test_selective_scan_reference_matches_a_dense_per_channel_form():
    gen = torch.Generator().manual_seed(2)
    b, Dm, S, N = 2, 3, 17, 4
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    u, delta, z, B, C = r(b, Dm, S), r(b, Dm, S), r(b, Dm, S), r(b, N, S), r(b, N, S)
    A, D, bias = -torch.rand(Dm, N, generator=gen, dtype=torch.float64) * 4, r(Dm), r(Dm)
    y = mamba_mod.selective_scan_reference(u, delta, A, B, C, D=D, z=z, delta_bias=bias)
    dl = F.softplus(delta + bias[:, None])
    dense = torch.empty_like(y)
    for bi in range(b):
        for d in range(Dm):
            for t in range(S):
                # y_t = sum_{j<=t} sum_n C_tn exp(A_n sum_{j<s<=t} Δ_s) Δ_j B_jn u_j
                acc = 0.0
                for j in range(t + 1):
                    decay = torch.exp(A[d] * dl[bi, d, j + 1:t + 1].sum())
                    acc = acc + (C[bi, :, t] * decay * B[bi, :, j]).sum() * dl[bi, d, j] * u[bi, d, j]
                dense[bi, d, t] = (acc + D[d] * u[bi, d, t]) * F.silu(z[bi, d, t])
    assert _max_norm_err(y, dense) < 1e-12


@pytest.mark.parametrize("gate", ["per_key", "scalar", "gamma"])
def test_gla_chunked_reference_equals_the_recurrence(gate):
    gen = torch.Generator().manual_seed(7)
    B, T, H, K, V = 2, 37, 3, 4, 5
    q, k, v = (torch.randn(B, T, H, d, generator=gen, dtype=torch.float64) for d in (K, K, V))
    kwargs = {
        "per_key": {"g": F.logsigmoid(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64) + 3)},
        "scalar": {"g": F.logsigmoid(torch.randn(B, T, H, generator=gen, dtype=torch.float64) + 3)},
        "gamma": {"g_gamma": fla_mod.lightning_log_decay(H, 0, 32)},
    }[gate]
    rec = fla_mod.gla_recurrent_reference(q, k, v, **kwargs)
    for chunk in (1, 8, 64):
        assert _max_norm_err(fla_mod.gla_reference(q, k, v, chunk_size=chunk, **kwargs), rec) < 1e-12


def test_gla_reference_matches_the_parallel_masked_form():
    # o = (Q Kᵀ ∘ M) V with M_tj = exp(G_t - G_j) for j <= t, scalar gates (simple GLA;
    # Yang et al. 2024, parallel form), scale d_k^-1/2.
    gen = torch.Generator().manual_seed(8)
    B, T, H, K, V = 1, 29, 2, 6, 4
    q, k, v = (torch.randn(B, T, H, d, generator=gen, dtype=torch.float64) for d in (K, K, V))
    g = F.logsigmoid(torch.randn(B, T, H, generator=gen, dtype=torch.float64) + 3)
    G = g.cumsum(1)
    out = torch.empty(B, T, H, V, dtype=torch.float64)
    for h in range(H):
        M = torch.exp(G[0, :, h, None] - G[0, None, :, h]).tril()
        out[0, :, h] = ((q[0, :, h] @ k[0, :, h].T) * K ** -0.5 * M) @ v[0, :, h]
    assert _max_norm_err(fla_mod.gla_reference(q, k, v, g=g, chunk_size=8), out) < 1e-12


def test_lightning_decay_follows_the_layer_formula():
    # chunk_lightning_attn (fla-core 0.6.0): g_gamma = -(8 / H * (1 - layer_idx / num_layers)) * arange(H)
    gamma = fla_mod.lightning_log_decay(4, 1, 4)
    assert torch.allclose(gamma, torch.tensor([0.0, -1.5, -3.0, -4.5], dtype=torch.float64))
    fla = get_backend("fla")
    params = fla.parse_params({"op": "lightning_attn", "layer_idx": 1, "num_layers": 4})
    inputs = fla.family.make_inputs(params, Shape(1, 20, 4, 4, 4), torch.float64, "cpu", seed=0)
    expected = fla_mod.gla_recurrent_reference(inputs["q"], inputs["k"], inputs["v"], g_gamma=gamma)
    assert _max_norm_err(fla.family.reference(params, inputs), expected) < 1e-12


def test_fla_reference_gradients_flow_to_every_input():
    fla = get_backend("fla")
    for op in ("chunk_simple_gla", "chunk_gla"):
        params = fla.parse_params({"op": op})
        inputs = fla.family.make_inputs(params, Shape(1, 70, 2, 4, 4), torch.float64, "cpu", seed=0, requires_grad=True)
        fla.family.reference(params, inputs).sum().backward()
        assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in inputs.values())


def test_mlstm_kernels_reference_is_the_tfla_reference_of_the_chosen_variant():
    from tfla.reference import mlstm_recurrent

    mk = get_backend("mlstm_kernels")
    shape = Shape(1, 64, 2, 8, 16)
    for raw, variant, normalize in (({}, "sig", False), ({"normalize": True}, "sig", True),
                                    ({"variant": "exp"}, "exp", True)):
        params = mk.parse_params(raw)
        inputs = {k: v.double() for k, v in mk.family.make_inputs(params, shape, torch.float32, "cpu", seed=0).items()}
        ref = mk.family.reference(params, inputs)
        rec = mlstm_recurrent(*(inputs[n] for n in "qkvif"), variant=variant, normalize=normalize)
        assert ref.shape == (1, 2, 64, 16)
        assert _max_norm_err(ref, rec) < 1e-10, raw
    sig_plain = mk.family.reference(mk.parse_params({}), inputs)
    sig_norm = mk.family.reference(mk.parse_params({"normalize": True}), inputs)
    assert _max_norm_err(sig_plain, sig_norm) > 1e-3  # the flag reaches the reference


# ------------------------------------------------------------------------ model counts, notes


def test_model_counts_use_the_familys_model_kind():
    from tflabench.model import counts_for_case

    shape = Shape(batch=8, seq_len=8192, heads=16, d_qk=128, d_hv=256)
    kw = dict(B=8, NH=16, S=8192, d_qk=128, d_hv=256, bytes_qkv=2)
    cases = [
        ("mlstm_kernels", {}, "mlstm_sig", {"L": 128}),
        ("mlstm_kernels", {"variant": "exp", "algorithm": "limit_chunk"}, "mlstm_exp_limit", {"L": 64}),
        ("mlstm_kernels", {"variant": "exp"}, "mlstm_exp", {"L": 128}),
        ("fla", {}, "simple_gla", {"L": 64}),
        ("fla", {"op": "lightning_attn", "chunk_size": 128}, "simple_gla", {"L": 128}),
        ("fla", {"op": "chunk_gla"}, "gla", {"L": 64}),
        ("fla", {"op": "fused_chunk_simple_gla"}, "simple_gla_fused", {"L": 64}),
        ("fla", {"op": "fused_chunk_gla"}, "gla_fused", {"L": 64}),
        ("lightning_attn", {"heads": 16, "d_hv": 128}, "simple_gla_fused", {"L": 64}),
        ("sdpa", {}, "attention_causal", {}),
        ("fa3", {}, "attention_causal", {}),
        ("mamba2", {}, "mamba2_ssd", {"L": 256, "d_state": 128}),
    ]
    for name, raw, kind, extra in cases:
        for mode in ("fwd", "fwdbw"):
            backend = get_backend(name)
            got = backend.family.model_counts(backend.parse_params(raw), shape, mode)
            want = counts_for_case(kind, mode, **kw, **extra)
            assert got == (float(want.flops), float(want.bytes)), (name, raw, mode)
    sdpa = get_backend("sdpa")
    assert sdpa.family.model_counts(sdpa.parse_params({"causal": False}), shape, "fwd") is None
    mamba = get_backend("mamba")
    assert mamba.family.model_counts(mamba.parse_params({}), shape, "fwd") is None


def test_mlstm_kernels_note_names_the_peer_kernel_and_normaliser():
    mk = get_backend("mlstm_kernels")
    assert mk.note(mk.parse_params({}), "cuda") == "chunkwise--triton_xl_chunk_siging, normalize=False"
    assert mk.note(mk.parse_params({"variant": "exp", "algorithm": "limit_chunk"}), "cuda") == \
        "chunkwise--triton_limit_chunk, normalize=True"
    assert mk_mod.effective_chunk_size(mk.parse_params({}), 64) == 64  # peer: L = S below 128
    assert mk_mod.effective_chunk_size(mk.parse_params({}), 4096) == 128
    assert math.isclose(mk.parse_params({}).eps, 1e-6)
    assert dataclasses.is_dataclass(Shape)


# ------------------------------------------------------------------------ Lightning Attention 2, fused GLA


def test_lightning_attn_refuses_head_dimensions_its_kernel_cannot_load():
    la = get_backend("lightning_attn")
    with pytest.raises(UserError, match="lightning_attn takes head dimensions .*got 256"):
        la.layout(la.parse_params({"heads": 16}), 4096)                 # 256 per head
    with pytest.raises(UserError, match="d_qk"):
        la.layout(la.parse_params({"heads": 32, "d_qk": 96}), 4096)
    with pytest.raises(ValidationError, match="layer_idx"):
        la.parse_params({"layer_idx": 32})
    with pytest.raises(ValidationError, match="chunk_size"):
        get_backend("fla").parse_params({"op": "fused_chunk_simple_gla", "chunk_size": 128})


def test_lightning_attn_inputs_are_its_kernels_layout_with_the_layer_decay():
    la = get_backend("lightning_attn")
    params = la.parse_params({"layer_idx": 1, "num_layers": 4})
    shape = Shape(batch=2, seq_len=64, heads=4, d_qk=16, d_hv=32)
    inputs = la.family.make_inputs(params, shape, torch.bfloat16, "cpu", seed=3, requires_grad=True)
    assert {k: tuple(v.shape) for k, v in inputs.items()} == {
        "q": (2, 4, 64, 16), "k": (2, 4, 64, 16), "v": (2, 4, 64, 32), "s": (4,)}
    for key in "qkv":
        assert inputs[key].is_leaf and inputs[key].requires_grad and inputs[key].dtype == torch.bfloat16
    assert not inputs["s"].requires_grad and inputs["s"].dtype == torch.float32
    assert torch.allclose(inputs["s"].double(), -fla_mod.lightning_log_decay(4, 1, 4))   # s_h = 1.5 h
    # q carries fla's default scale d_qk^-1/2: its spread is a quarter of k's at d_qk 16
    assert 0.2 < inputs["q"].float().std().item() / inputs["k"].float().std().item() < 0.3


def test_lightning_attn_reference_is_decayed_linear_attention_without_scale():
    # o_t = sum_{j<=t} exp(-s_h (t - j)) (q_t . k_j) v_j  (lightning-attn 0.0.5, lightning_attn2)
    la = get_backend("lightning_attn")
    params = la.parse_params({})
    inputs = la.family.make_inputs(params, Shape(1, 23, 3, 16, 16), torch.float64, "cpu", seed=5)
    q, k, v, s = inputs["q"], inputs["k"], inputs["v"], inputs["s"]
    t = torch.arange(23, dtype=torch.float64)
    out = torch.empty_like(v)
    for h in range(3):
        decay = torch.exp(-s[h] * (t[:, None] - t[None, :])).tril()
        out[0, h] = ((q[0, h] @ k[0, h].T) * decay) @ v[0, h]
    assert _max_norm_err(la.family.reference(params, inputs), out) < 1e-12


def test_fla_fused_gla_stub_is_reported_unavailable():
    def stub(**kwargs):
        raise NotImplementedError("`fused_chunk_gla` is deprecated. Please use `chunk_gla` instead.")

    def kernel(q, k, v, g):
        return q

    reason = fla_mod._stub_reason(stub)
    assert "stub" in reason and "deprecated" in reason and "fused_chunk_simple_gla" in reason
    assert fla_mod._stub_reason(kernel) is None


def test_fused_model_counts_drop_the_chunk_states_only():
    from tflabench.model import counts_for_case

    kw = dict(B=2, NH=8, S=4096, d_qk=256, d_hv=512, L=64)
    for mode in ("fwd", "fwdbw"):
        fused, chunk = counts_for_case("simple_gla_fused", mode, **kw), counts_for_case("simple_gla", mode, **kw)
        assert fused.flops == chunk.flops and fused.bytes < chunk.bytes
    # forward: q, k, v read and o written once, the gate read once; no state (2 bytes each)
    n_chunks = 4096 // 64
    io = 64 * (2 * 256 + 2 * 512) * 2 + 64 * 2
    assert counts_for_case("simple_gla_fused", "fwd", **kw).bytes == 2 * 8 * n_chunks * io
    assert counts_for_case("gla_fused", "fwd", **kw).bytes > counts_for_case("simple_gla_fused", "fwd", **kw).bytes
