"""doctor's peer-mode diagnosis and the Triton autotune cache reuse (no GPU needed).

The environments are made up; the expected verdicts follow the facts in
tflabench/backends/status.py's docstring (fla-core 0.6.0's #640 guard: Hopper and
3.4.0 <= triton < 3.7.1; the fa3_fwd wheel is forward only; mamba_ssm without
selective_scan_cuda has no Mamba v1).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tflabench.run import triton_cache
from tflabench.backends import fla as fla_mod
from tflabench.backends import get_backend
from tflabench.cli import app
from tflabench.backends.status import peer_modes

H200_ENV = {"gpu_name": "NVIDIA H200", "triton": "3.6.0",
            "peers": {"fla-core": "0.6.0", "mamba_ssm": "2.3.2.post1", "fa3_fwd": "0.0.3", "mlstm_kernels": "2.0.6"}}


#: The modules the reference H200 environment has installed besides the FlashAttention
#: builds and Lightning Attention (whether a peer is installed is its backend's
#: ``installed``, by find_spec).
H200_MODULES = ("fla", "einops", "triton", "mamba_ssm", "mlstm_kernels")


def _only(*present):
    """A find_spec finding ``present`` and :data:`H200_MODULES`, nothing else."""
    return lambda name: object() if name in present + H200_MODULES else None


def _nothing(name):
    return None


def _verdicts(env, find_spec):
    return {(m.peer, m.mode): m for m in peer_modes(env, find_spec=find_spec)}


def test_the_reference_h200_environment_names_each_blocked_mode_and_its_fix():
    v = _verdicts(H200_ENV, _only("fa3_fwd_interface"))
    fla = v[("FLA chunk_simple_gla", "fwdbw")]
    assert fla.runs is False and "#640" in fla.why and "triton 3.6.0" in fla.why and "3.7.1" in fla.fix
    assert v[("FLA chunk_simple_gla", "fwd")].runs is True
    assert v[("FLA chunk_gla", "fwd, fwdbw")].runs is True and "--triton-cache" in v[("FLA chunk_gla", "fwd, fwdbw")].fix
    fa3 = v[("FlashAttention 3", "fwdbw")]
    assert fa3.runs is False and "FLASHATTENTION_DISABLE_BACKWARD" in fa3.why and "hopper/" in fa3.fix
    assert v[("FlashAttention 3", "fwd")].runs is True
    mamba = v[("Mamba (v1)", "fwd, fwdbw")]
    assert mamba.runs is False and "selective_scan_cuda" in mamba.why and "nvcc" in mamba.fix
    # measured ok in every H200 reference run with triton 3.6 (912a5aa, 6039bb3): not listed
    assert ("mlstm_kernels mLSTMexp xl_chunk", "fwd, fwdbw") not in v


@pytest.mark.parametrize("env_change, runs", [
    ({"triton": "3.7.1"}, True),                  # fixed Triton
    ({"triton": "3.3.1"}, True),                  # before the miscompile
    ({"gpu_name": "NVIDIA A100-SXM4-80GB"}, True),   # not Hopper
    ({"triton": "3.7.0"}, False),                 # still in the guarded range
])
def test_fla_gated_backward_verdict_follows_the_guard(env_change, runs):
    v = _verdicts({**H200_ENV, **env_change}, _only())
    assert v[("FLA chunk_simple_gla", "fwdbw")].runs is runs


def test_installed_fwdbw_builds_are_reported_as_running():
    v = _verdicts({**H200_ENV, "triton": "3.5.1"},
                  _only("flash_attn_interface", "flash_attn_3", "selective_scan_cuda"))
    assert v[("FlashAttention 3", "fwd, fwdbw")].runs is True
    assert v[("Mamba (v1)", "fwd, fwdbw")].runs is True
    assert ("mlstm_kernels mLSTMexp xl_chunk", "fwd, fwdbw") not in v


def test_missing_peers_say_what_to_install():
    v = _verdicts({"gpu_name": None, "triton": "3.6.0", "peers": {}}, _nothing)
    assert v[("FLA chunk_gla", "fwd, fwdbw")].fix.startswith("pip install fla-core")
    for peer, backend in (("Mamba 2 (SSD)", "mamba2"), ("Mamba (v1)", "mamba"), ("Mamba-3 (SISO)", "mamba3"),
                          ("FLA chunk_gated_delta_rule (gated DeltaNet)", "fla_delta")):
        row = v[(peer, "fwd, fwdbw")]
        # the fix is the backend's own install hint (one home)
        assert row.runs is False and row.backend == backend and row.fix == get_backend(backend).install_hint


def test_doctor_prints_the_peer_mode_table_and_the_triton_cache():
    result = CliRunner().invoke(app, ["doctor"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "the peers (the paper's and beyond), mode by mode" in result.output and "triton cache" in result.output
    assert "FlashQLA" in result.output and "fla_delta" in result.output and "mamba3" in result.output


def _fake_cache(root, n):
    for k in range(n):
        d = root / f"{k:064x}"
        d.mkdir(parents=True)
        (d / "chunk_gla_fwd_kernel.autotune.json").write_text(json.dumps({"key": [k], "configs_timings": []}))
        (d / "chunk_gla_fwd_kernel.cubin").write_bytes(b"\0" * 4096)   # compiled kernel: not packed


def test_pack_keeps_only_autotune_results_and_unpack_restores_them(tmp_path):
    _fake_cache(tmp_path / "cache", 3)
    assert triton_cache.pack(tmp_path / "cache", tmp_path / "packed") == 3
    assert not list((tmp_path / "packed").rglob("*.cubin"))
    assert triton_cache.unpack(tmp_path / "packed", tmp_path / "new") == 3
    assert len(triton_cache.autotune_entries(tmp_path / "new")) == 3
    assert triton_cache.unpack(tmp_path / "packed", tmp_path / "new") == 0     # existing files kept


def test_configure_sets_the_environment_the_workers_inherit(tmp_path):
    env = {}
    path = triton_cache.configure(tmp_path / "tc", environ=env)
    assert env == {"TRITON_CACHE_DIR": str(path), "TRITON_CACHE_AUTOTUNING": "1",
                   triton_cache.SCOPE_ENV: "run"} and path.is_dir()
    assert triton_cache.default_cache_dir(env) == path
    assert "every autotuner cached: yes" in triton_cache.status(env)
    assert triton_cache.prepare_worker(env) == "run" and "FLA_CACHE_RESULTS" not in env


def test_workers_tune_per_case_unless_the_run_keeps_a_cache():
    env = {}
    assert triton_cache.prepare_worker(env) == "case" and env["FLA_CACHE_RESULTS"] == "0"
    env = {"FLA_CACHE_RESULTS": "1"}                   # the user's own setting stays
    assert triton_cache.prepare_worker(env) == "case" and env["FLA_CACHE_RESULTS"] == "1"
    assert "autotuning scope in `run`: case" in triton_cache.status({})


def test_forget_autotuning_resets_autotuners_also_behind_heuristics():
    import types

    import triton

    @triton.jit
    def _k(X, N):
        pass

    mod = types.ModuleType("fake_peer")
    mod.plain = triton.autotune(configs=[triton.Config({})], key=["N"], cache_results=True)(_k)
    mod.wrapped = triton.heuristics({"B": lambda a: 1})(
        triton.autotune(configs=[triton.Config({})], key=["N"], cache_results=True)(_k))
    mod.not_a_kernel = types.SimpleNamespace(fn=types.SimpleNamespace(cache={"x": 1}))
    inner = mod.wrapped.fn
    for tuner in (mod.plain, inner):
        tuner.cache[(512,)] = "config tuned at another shape"
    assert triton_cache.forget_autotuning([mod]) == 2
    for tuner in (mod.plain, inner):
        assert tuner.cache == {} and tuner.cache_results is False
    assert mod.not_a_kernel.fn.cache == {"x": 1}


def test_forget_autotuning_keeps_foreign_deprecation_warnings_out_of_the_case():
    """torch.distributed's deprecated ``reduce_op`` warns when isinstance looks at it; a
    case's log must not carry that warning from the scan of every module."""
    import types
    import warnings

    class Deprecated:
        @property
        def __class__(self):
            warnings.warn("`reduce_op` is deprecated", FutureWarning)
            return object

    mod = types.ModuleType("fake_torch_distributed")
    mod.reduce_op = Deprecated()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        isinstance(mod.reduce_op, types.ModuleType)            # the attribute does warn
        assert seen, "the fake attribute must warn for this test to mean anything"
        seen.clear()
        assert triton_cache.forget_autotuning([mod]) == 0
        assert not seen


def test_triton_reads_the_autotuning_knob_from_the_environment(monkeypatch, tmp_path):
    """The knob triton_cache sets is the one Triton's autotuner reads (checked on the installed triton)."""
    knobs = pytest.importorskip("triton.knobs")
    monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", "1")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    assert knobs.autotuning.cache is True
    assert knobs.cache.dir == str(tmp_path)


# ------------------------------------------------------------------ fla's #640 guard, narrowed on request


def test_fla_key_block_width_on_hopper_follows_fla_0_6_0():
    from tflabench.backends.fla import hopper_key_block

    # min(max(next_power_of_2(K), 16), 128): fla-core 0.6.0 chunk_o.chunk_bwd_dqkwg, CONST_TILING 128
    assert [hopper_key_block(k) for k in (8, 32, 48, 64, 100, 128, 256)] == [16, 32, 64, 64, 128, 128, 128]


def test_narrowed_guard_lifts_only_away_from_key_block_64_and_names_the_path(monkeypatch):
    import sys
    import types

    from tflabench.backends import fla as fla_mod

    fake = types.SimpleNamespace(TRITON_ABOVE_3_7_1=False)
    monkeypatch.setitem(sys.modules, "fla.ops.common.chunk_o", fake)
    monkeypatch.setattr(fla_mod, "fla_backward_refused", lambda: (True, "Hopper GPU=True, triton 3.6.0"))
    monkeypatch.delenv(fla_mod.GUARD_ENV, raising=False)
    assert fla_mod._narrow_guard_for(128) is None and fake.TRITON_ABOVE_3_7_1 is False   # default: fla's guard
    monkeypatch.setenv(fla_mod.GUARD_ENV, "narrow")
    path = fla_mod._narrow_guard_for(128)                                                # BK 128: lifted
    assert fake.TRITON_ABOVE_3_7_1 is True
    assert "guard narrowed" in path and "key block width 128" in path and "dq, dk, dv, dg" in path
    assert fla_mod._narrow_guard_for(64) is None and fake.TRITON_ABOVE_3_7_1 is False    # BK 64: guard back
    monkeypatch.setattr(fla_mod, "fla_backward_refused", lambda: (False, "Hopper GPU=True, triton 3.7.1"))
    assert "fla's own path" in fla_mod._narrow_guard_for(64) and "3.7.1" in fla_mod._narrow_guard_for(64)


def test_narrowed_guard_lets_the_case_run_and_the_row_says_which_path_ran(monkeypatch):
    import sys
    import types

    import torch

    from tflabench.backends import fla as fla_mod
    from tflabench.backends import get_backend
    from tflabench.backends.base import Shape

    monkeypatch.setattr(fla_mod, "fla_backward_refused", lambda: (True, "Hopper GPU=True, triton 3.6.0"))
    monkeypatch.setitem(sys.modules, "fla.ops.common.chunk_o", types.SimpleNamespace(TRITON_ABOVE_3_7_1=False))
    fla = get_backend("fla")
    params = fla.parse_params({"op": "chunk_simple_gla"})
    monkeypatch.delenv(fla_mod.GUARD_ENV, raising=False)
    reason = fla.unsupported_mode(params, "fwdbw")
    assert "#640" in reason and f"{fla_mod.GUARD_ENV}=narrow" in reason
    monkeypatch.setenv(fla_mod.GUARD_ENV, "narrow")
    assert fla.unsupported_mode(params, "fwdbw") is None
    # the worker's forward records the path; the ok row's reason (note) carries it
    calls = []
    monkeypatch.setattr(fla_mod, "_fla_op", lambda op: lambda q, k, v, g: calls.append(op) or q.sum(-1, keepdim=True))
    shape = Shape(1, 64, 2, 128, 16)
    inputs = fla.family.make_inputs(params, shape, torch.float32, "cpu", seed=0, requires_grad=True)
    fla.forward(params, inputs)
    assert "guard narrowed" in fla.note(params, "cuda") and calls == ["chunk_simple_gla"]
    fla.forward(params, fla.family.make_inputs(params, shape, torch.float32, "cpu", seed=0))   # fwd: no backward path
    assert fla.note(params, "cuda") is None
    exc = RuntimeError("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for gated "
                       "chunk_bwd_dqkwg (see #640).")
    assert "key block width 64" in fla.classify_error(params, "fwdbw", exc)


def test_doctor_reports_the_narrowed_guard_as_running(monkeypatch):
    from tflabench.backends import fla as fla_mod

    monkeypatch.setenv(fla_mod.GUARD_ENV, "narrow")
    v = _verdicts(H200_ENV, _only())
    row = v[("FLA chunk_simple_gla", "fwdbw")]
    assert row.runs is True and "narrow" in row.why and "dq, dk, dv, dg" in row.why


# ------------------------------------------------------------------ FlashAttention 4


def test_fa4_backend_has_the_attention_layout_and_names_what_is_missing(monkeypatch):
    import torch

    from tflabench.backends import flash_attn as fa_mod
    from tflabench.backends import get_backend

    fa4 = get_backend("fa4")
    params = fa4.parse_params({})
    assert fa4.layout(params, 4096) == (32, 128, 128)           # paper App. E.3: 32 heads of 128
    monkeypatch.setattr(fa_mod, "_find_spec", lambda name: None)
    assert "flash-attn-4 (flash_attn.cute) is not installed" in fa4.available(params)
    monkeypatch.setattr(fa_mod, "_find_spec", lambda name: object())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def no_cutlass(self, params):
        raise ModuleNotFoundError("No module named 'cutlass'")

    monkeypatch.setattr(fa_mod.Fa4Backend, "_load", no_cutlass)
    reason = fa4.available(params)
    assert "dsl_packages" in reason and ".pth" in reason


def test_doctor_says_how_each_flashattention_is_found_or_why_not():
    v = _verdicts(H200_ENV, _only("fa3_fwd_interface"))
    fa4 = v[("FlashAttention 4 (CuTe DSL)", "fwd, fwdbw")]
    assert fa4.runs is False and "flash-attn-4 (flash_attn.cute) is not installed" in fa4.why
    assert "offline-peers.md" in fa4.fix and fa4.fix == get_backend("fa4").install_hint
    assert "found fa3_fwd_interface" in v[("FlashAttention 3", "fwd")].why
    fa3 = v[("FlashAttention 3", "fwdbw")]
    assert "fwd+bwd needs flash_attn_interface" in fa3.why and "fa4" in fa3.fix
    v = _verdicts(H200_ENV, _only("flash_attn.cute"))                   # FA4 without nvidia-cutlass-dsl
    fa4 = v[("FlashAttention 4 (CuTe DSL)", "fwd, fwdbw")]
    assert fa4.runs is False and "not cutlass" in fa4.why and "dsl_packages" in fa4.fix
    assert "neither flash_attn_interface" in v[("FlashAttention 3", "fwd, fwdbw")].why
    v = _verdicts({**H200_ENV, "peers": {**H200_ENV["peers"], "flash-attn-4": "4.0.0b36"}},
                  _only("flash_attn.cute", "cutlass", "flash_attn_interface", "flash_attn_3"))
    fa4 = v[("FlashAttention 4 (CuTe DSL)", "fwd, fwdbw")]
    assert fa4.runs is True and "flash-attn-4 4.0.0b36" in fa4.why
    assert "found flash_attn_interface" in v[("FlashAttention 3", "fwd, fwdbw")].why
    assert "(fwd+bwd)" in v[("FlashAttention 3", "fwd, fwdbw")].why
    for row in peer_modes(H200_ENV, find_spec=_only()):
        assert "\n" not in row.why + row.fix                             # one line each


def test_doctor_lists_lightning_attention_and_the_fused_gla_forms():
    v = _verdicts(H200_ENV, _only())
    assert v[("Lightning Attention 2 (lightning-attn)", "fwd, fwdbw")].runs is False
    assert v[("Lightning Attention 2 (lightning-attn)", "fwd, fwdbw")].fix.startswith("pip install lightning-attn")
    assert v[("FLA lightning_attn (Lightning Attention 2)", "fwd, fwdbw")].runs is True
    assert v[("FLA fused_chunk_simple_gla (non-materialising)", "fwd, fwdbw")].runs is True
    stub = v[("FLA fused_chunk_gla (non-materialising)", "fwd, fwdbw")]
    assert stub.runs is False and "stub" in stub.why and "fused_chunk_simple_gla" in stub.fix
    env = {**H200_ENV, "peers": {**H200_ENV["peers"], "lightning-attn": "0.0.5"}}
    found = _verdicts(env, _only("lightning_attn"))[("Lightning Attention 2 (lightning-attn)", "fwd, fwdbw")]
    assert found.runs is True and "0.0.5" in found.why


def test_fa2_is_not_fooled_by_flash_attn_4s_namespace_package(monkeypatch):
    from tflabench.backends import flash_attn as fa_mod
    from tflabench.backends import get_backend

    # flash-attn-4 installs flash_attn/cute/ without flash_attn/__init__.py
    monkeypatch.setattr(fa_mod, "_find_spec", lambda name: object() if name in ("flash_attn", "flash_attn.cute") else None)
    fa2 = get_backend("fa2")
    assert "flash_attn is not installed" in fa2.available(fa2.parse_params({}))
    fa4 = get_backend("fa4")
    assert fa4.note(fa4.parse_params({}), "cuda") == "via flash_attn.cute (flash-attn-4, CuTe DSL: fwd+bwd)"


def test_known_problems_say_when_the_guard_is_narrowed(monkeypatch):
    from tflabench.environment import FLA_640_GUARD_ENV, known_problems

    env = {"gpu_name": "NVIDIA H100 80GB HBM3", "triton": "3.6.0", "peers": {"fla-core": "0.6.0"}, "gpu_count": 1}
    monkeypatch.delenv(FLA_640_GUARD_ENV, raising=False)
    assert any("will be unavailable" in p and f"{FLA_640_GUARD_ENV}=narrow" in p for p in known_problems(env))
    monkeypatch.setenv(FLA_640_GUARD_ENV, "narrow")
    (line,) = [p for p in known_problems(env) if "#640" in p]
    assert "guard is narrowed" in line and "unavailable" not in line


def test_an_fa3_interface_without_its_compiled_extension_does_not_run():
    v = _verdicts({**H200_ENV, "peers": {**H200_ENV["peers"], "flash_attn_3": "3.0.0"}}, _only("flash_attn_interface"))
    row = v[("FlashAttention 3", "fwd, fwdbw")]
    assert row.runs is False and "flash_attn_3._C" in row.why and "3.0.0" in row.why
    assert row.fix == get_backend("fa3").install_hint


def test_doctor_lists_the_peers_beyond_the_paper():
    v = _verdicts(H200_ENV, _only())
    for peer in ("FLA chunk_gated_delta_rule (gated DeltaNet)", "FLA chunk_delta_rule (DeltaNet)", "Mamba-3 (SISO)"):
        assert v[(peer, "fwd, fwdbw")].runs is True and "no model" in v[(peer, "fwd, fwdbw")].why
    flashqla = v[("FlashQLA (TileLang)", "fwd, fwdbw")]
    assert flashqla.runs is False and "package index" in flashqla.why and flashqla.backend is None
    old = _verdicts({**H200_ENV, "peers": {**H200_ENV["peers"], "mamba_ssm": "2.2.4", "fla-core": "0.5.0"}}, _only())
    assert old[("Mamba-3 (SISO)", "fwd, fwdbw")].runs is False and "2.3.2" in old[("Mamba-3 (SISO)", "fwd, fwdbw")].why
    assert "fla-core==0.6.0" in old[("FLA chunk_delta_rule (DeltaNet)", "fwd, fwdbw")].fix


def test_every_row_names_a_registered_backend():
    for row in peer_modes(H200_ENV, find_spec=_only()):
        if row.backend is not None:
            assert get_backend(row.backend).name == row.backend


@pytest.mark.parametrize("gpu, triton", [("NVIDIA H200", (3, 6, 0)), ("NVIDIA H100 80GB HBM3", (3, 7, 0)),
                                         ("NVIDIA H200", (3, 7, 1)), ("NVIDIA H200", (3, 3, 1)),
                                         ("NVIDIA A100-SXM4-80GB", (3, 6, 0))])
def test_doctor_and_the_fla_backend_decide_the_640_guard_alike(monkeypatch, gpu, triton):
    # one rule (tflabench.environment.fla_640_refused): the backend's refusal and doctor's agree
    monkeypatch.delenv("TFLABENCH_FLA_640_GUARD", raising=False)
    monkeypatch.setattr(fla_mod, "gpu_is_hopper", lambda: "H1" in gpu or "H2" in gpu)
    monkeypatch.setattr(fla_mod, "triton_version", lambda: triton)
    monkeypatch.delitem(__import__("sys").modules, "fla.utils", raising=False)
    refused, _ = fla_mod.fla_backward_refused()
    v = _verdicts({**H200_ENV, "gpu_name": gpu, "triton": ".".join(map(str, triton))}, _only())
    assert v[("FLA chunk_simple_gla", "fwdbw")].runs is (not refused)
    assert refused is (gpu != "NVIDIA A100-SXM4-80GB" and (3, 4) <= triton < (3, 7, 1))


@pytest.mark.parametrize("peer, backend, present", [
    ("Mamba (v1)", "mamba", ()),                                   # mamba_ssm without selective_scan_cuda
    ("Lightning Attention 2 (lightning-attn)", "lightning_attn", ()),
    ("FlashAttention 4 (CuTe DSL)", "fa4", ("flash_attn.cute",)),  # without cutlass
])
def test_missing_rows_are_the_backends_own_installed_verdict(peer, backend, present):
    # one home: doctor's row says what the backend's installed() says, by the same find_spec
    find = _only(*present)
    reason = get_backend(backend).installed(find)
    hint = get_backend(backend).install_hint
    assert reason is not None and reason.endswith(f"; {hint}")
    row = _verdicts(H200_ENV, find)[(peer, "fwd, fwdbw")]
    assert row.runs is False and row.backend == backend
    assert (row.why, row.fix) == (reason.removesuffix(f"; {hint}"), hint)
    assert get_backend(backend).installed(lambda name: object()) is None
