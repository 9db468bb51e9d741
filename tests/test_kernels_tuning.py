"""The tuning overrides (tfla/triton/tuning.py): one frozen Tuning, carried by the kernel
configuration from the public functions to every launch, forward and backward.

The defaults themselves (which tiles, warps and options each rule picks) are asserted by the
rule tests of test_kernels_exp, test_kernels_sig and test_kernels_gate_regimes; here: the
default Tuning changes none of them, and an override reaches the kernel it names."""

from __future__ import annotations

import itertools
import os

import pytest
import torch

os.environ["TRITON_INTERPRET"] = "1"   # read by triton when the kernel modules are imported

import tfla  # noqa: E402
from tfla.triton.chunkwise import Config, kernels  # noqa: E402
from tfla.triton.tuning import DEFAULT, Tuning, active_tuning, use_tuning  # noqa: E402

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
CHUNKS = (16, 64, 128, 256, 1024)
HEADS = (16, 48, 64, 128, 160, 256, 512)


def test_every_named_benchmark_variant_is_a_valid_tuning():
    """The benchmarks' named variants (``bench_sig_tfla.VARIANTS``, ``bench_exp.variants()``)
    are Tunings the kernels accept: a key the Tuning does not know would fail only on the
    GPU node, after the job had started."""
    import importlib.util
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks"

    def load(name):
        spec = importlib.util.spec_from_file_location(name, bench / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    sig = load("bench_sig_tfla").VARIANTS
    exp = {n: fn.fields for n, fn in load("bench_exp").variants().items()}
    assert len(sig) > 50 and len(exp) > 5
    for name, fields in {**sig, **exp}.items():
        Tuning(**fields)                 # raises ValueError naming an unknown key
    with pytest.raises(ValueError, match="SEGMENT0"):
        Tuning(walk={"SEGMENT0": True})


def test_tuning_is_frozen_hashable_and_validates_its_keys():
    t = Tuning(fw={"B_DHV": 64, "num_warps": 8}, walk={"enabled": False})
    assert t == Tuning(fw={"num_warps": 8, "B_DHV": 64}, walk={"enabled": False})
    assert hash(t) == hash(Tuning(fw={"num_warps": 8, "B_DHV": 64}, walk={"enabled": False}))
    assert t != DEFAULT and DEFAULT == Tuning() and len(DEFAULT.fw) == 0
    assert dict(t.fw) == {"B_DHV": 64, "num_warps": 8} and t.fw.get("B_LQ", 7) == 7
    with pytest.raises(AttributeError):
        t.fw = {}
    with pytest.raises(TypeError):
        t.fw["B_DHV"] = 32
    with pytest.raises(ValueError, match=r"Tuning\.state: got key\(s\) 'bw_USE_TMA'; allowed: "):
        Tuning(state={"bw_USE_TMA": True})


def test_use_tuning_nests_and_restores():
    inner = Tuning(recompute_states=True)
    outer = Tuning(state={"PIECE": 32})
    assert active_tuning() is DEFAULT
    with use_tuning(outer):
        with use_tuning(inner):
            assert active_tuning() is inner
            assert Config.make(variant="exp", normalize=True, eps=1e-6, L=64,
                               limit=False).recompute_states
        assert active_tuning() is outer
    assert active_tuning() is DEFAULT
    assert not Config.make(variant="exp", normalize=True, eps=1e-6, L=64, limit=False).recompute_states
    with pytest.raises(TypeError, match="expected tfla.triton.tuning.Tuning"):
        with use_tuning({"fw": {}}):
            pass


def test_the_default_tuning_is_every_rule_unchanged():
    """Tuning() overrides nothing: each configuration function returns what its rule gives
    without the argument, over a grid of chunks, head sizes and dtypes."""
    mods = kernels()
    rec, pfw, pbw = mods.recurrent, mods.parallel_fw, mods.parallel_bw
    lbw, walk = mods.limit_bw, mods.sig_walk_fw
    t = Tuning()
    for L, d_qk, d_hv, dt in itertools.product(CHUNKS, HEADS, HEADS, DTYPES):
        for limit, is_exp in itertools.product((False, True), repeat=2):
            assert pfw.fw_config(L, d_qk, d_hv, dt, limit, is_exp, t) == \
                pfw.fw_config(L, d_qk, d_hv, dt, limit, is_exp)
        assert pbw.bw_config(L, d_qk, d_hv, dt, t) == pbw.bw_config(L, d_qk, d_hv, dt)
        assert not pbw.fused_bw(L, d_qk, d_hv, dt, t)
        assert lbw.limit_bw_config(L, d_qk, d_hv, dt, t) == lbw.limit_bw_config(L, d_qk, d_hv, dt)
        for bnh, n_sms, last in itertools.product((1, 128, 512), (0, 132), (False, True)):
            assert walk.walk_config(L, d_qk, d_hv, bnh, dt, n_sms, last, t) == \
                walk.walk_config(L, d_qk, d_hv, bnh, dt, n_sms, last)
        for bnh, n_sms, sig in itertools.product((2, 32, 1 << 30), (0, 132), (False, True)):
            step = rec.piece(L, t)
            assert step == rec.piece(L) == min(L, 128)
            assert rec.state_blocks(d_qk, d_hv, bnh, n_sms, dt, step, sig, t) == \
                rec.state_blocks(d_qk, d_hv, bnh, n_sms, dt, step, sig)


def test_each_family_overrides_its_configuration():
    mods = kernels()
    rec, pfw, pbw = mods.recurrent, mods.parallel_fw, mods.parallel_bw
    lbw, walk = mods.limit_bw, mods.sig_walk_fw
    bf16 = torch.bfloat16
    t = Tuning(state={"B_DQK": 32, "num_stages": 2, "PIECE": 64}, fw={"B_DHV": 32},
               fw_limit={"num_warps": 2}, bw={"B_LKV": 16, "FUSED": True},
               limit_bw={"B_DQK": 16}, walk={"B_DHV": 32, "maxnreg": None})
    assert rec.state_blocks(128, 256, 128, 132, bf16, 128, tuning=t)[0::3] == (32, 2)
    # a block override turns off the sig-forward rule (S4) too
    assert rec.state_blocks(64, 128, 512, 132, bf16, 128, True, t)[:2] == (32, 128)
    assert rec.piece(256, t) == 64 and rec.piece(32, t) == 32
    assert pfw.fw_config(128, 128, 256, bf16, False, True, t)["B_DHV"] == 32
    assert pfw.fw_config(128, 128, 256, bf16, True, True, t)["num_warps"] == 2
    assert pfw.fw_config(128, 128, 256, bf16, True, True, t)["B_DHV"] == 64      # fw: xl only
    cfg = pbw.bw_config(128, 128, 256, bf16, t)
    assert cfg["B_LKV"] == 16 and "FUSED" not in cfg
    assert pbw.fused_bw(128, 128, 256, bf16, t) and not pbw.fused_bw(256, 128, 256, bf16, t)
    assert lbw.limit_bw_config(64, 128, 256, bf16, t)["B_DQK"] == 16
    w = walk.walk_config(64, 128, 256, 512, bf16, 132, False, t)
    assert w["B_DHV"] == 32 and w["maxnreg"] is None          # None: uncapped (the rule: 240)
    assert walk.walk_config(64, 128, 256, 512, bf16, 132, False, Tuning(walk={"enabled": False})) \
        is None


class _Spy:
    """Stands in for a @triton.jit kernel: records the keyword arguments of each launch."""

    def __init__(self, kernel, log):
        self.kernel, self.log = kernel, log
        self.__name__ = kernel.__name__

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.log.append((self.__name__, kw))
            return self.kernel[grid](*args, **kw)
        return run


def test_an_override_reaches_the_launches_of_forward_and_backward(monkeypatch):
    """Under use_tuning, a call's launches take the overrides, and so does its backward when
    it runs after the block has closed (the kernel configuration carries the Tuning)."""
    mods = kernels()
    rec, pfw, pbw = mods.recurrent, mods.parallel_fw, mods.parallel_bw
    log = []
    for mod, name in ((rec, "_recurrent_fw_kernel"), (rec, "_recurrent_bw_kernel"),
                      (pfw, "_parallel_fw_kernel"), (pbw, "_dq_kernel"), (pbw, "_dkv_kernel")):
        monkeypatch.setattr(mod, name, _Spy(getattr(mod, name), log))
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 2, 40, 32, generator=g)
    v = torch.randn(1, 2, 40, 32, generator=g)
    i, f = torch.randn(2, 1, 2, 40, generator=g)

    def launches(tuning):
        log.clear()
        xs = [x.clone().requires_grad_(True) for x in (q, k, v, i, f)]
        with use_tuning(tuning):
            h = tfla.mlstm_exp(*xs, chunk_size=32)
        h.sum().backward()
        return {name: kw for name, kw in log}, h.detach(), [x.grad for x in xs]

    base, h0, g0 = launches(Tuning())
    assert base["_parallel_fw_kernel"]["B_DHV"] == 32 and base["_recurrent_bw_kernel"]["B_DHV"] == 32
    t = Tuning(state={"B_DHV": 16}, state_bw={"B_DQK": 16}, fw={"B_DHV": 16},
               bw={"B_LQ": 16, "B_LKV": 16, "B_DQK": 16})
    got, h1, g1 = launches(t)
    assert got["_recurrent_fw_kernel"]["B_DHV"] == 16
    assert got["_recurrent_bw_kernel"]["B_DHV"] == 16 and got["_recurrent_bw_kernel"]["B_DQK"] == 16
    assert got["_parallel_fw_kernel"]["B_DHV"] == 16
    assert got["_dq_kernel"]["B_LKV"] == 16 and got["_dq_kernel"]["B_DQK"] == 16
    assert got["_dkv_kernel"]["B_LQ"] == 16
    # other tiles, the same function: h and the gradients agree to float32 round-off
    assert torch.allclose(h1, h0, rtol=1e-4, atol=1e-5)
    for a, b in zip(g1, g0):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-4)


def test_plan_follows_the_active_walk_override():
    q = torch.empty(16, 32, 4096, 64, dtype=torch.bfloat16, device="meta")
    v = torch.empty(16, 32, 4096, 128, dtype=torch.bfloat16, device="meta")
    assert tfla.plan("sig", q, v, grad=False, device="cpu").algorithm == "walk"
    with use_tuning(Tuning(walk={"enabled": False})):
        assert tfla.plan("sig", q, v, grad=False, device="cpu").algorithm == "two_level"


def test_h_kernel_tiles_at_figure5_heads_where_measured():
    """Rules H4 and H7 (docs/kernels.md): mLSTMsig's H kernel in 16-bit at d_qk 256 / d_hv
    512 takes the whole chunk as one 128 x 128 tile at L 128, and 128-row query against
    64-row key tiles at L 256 (what "auto" takes there, C2), the whole d_qk, d_hv blocks of
    256 and 8 warps (one pipeline stage at L 256, where two do not fit); mLSTMexp, float32
    and L 512 keep the defaults; overrides win."""
    from tfla.triton import chunkwise_parallel_fw as pfw
    bf16 = torch.bfloat16
    keys = ("B_LQ", "B_LKV", "B_DQK", "B_DHV", "num_warps", "num_stages")
    cfg = lambda *a: tuple(pfw.fw_config(*a)[k] for k in keys)  # noqa: E731
    assert cfg(128, 256, 512, bf16, False, False) == (128, 128, 256, 256, 8, 2)
    assert cfg(256, 256, 512, torch.float16, False, False) == (128, 64, 256, 256, 8, 1)
    assert cfg(256, 160, 320, bf16, False, False) == (128, 64, 256, 256, 8, 1)
    for args in [(256, 256, 512, bf16, False, True), (256, 256, 512, torch.float32, False, False),
                 (512, 256, 512, bf16, False, False), (256, 256, 256, bf16, False, False)]:
        assert cfg(*args)[:2] == (64, 64), args
    t = Tuning(fw={"B_LKV": 32})
    assert pfw.fw_config(256, 256, 512, bf16, False, False, t)["B_LKV"] == 32



def _compiling_for_sm(monkeypatch):
    """Triton compiling (not interpreting) for a compile-only driver's target, sm_90 until
    the returned class's ``arch`` is changed."""
    import triton
    from triton.backends.compiler import GPUTarget

    monkeypatch.setattr(triton.knobs.runtime, "interpret", False)

    class Target:
        arch = 90

        def get_current_target(self):
            return GPUTarget("cuda", self.arch, 32)

    monkeypatch.setattr(triton.runtime.driver, "_active", Target())
    return Target


def _takes_exactly(monkeypatch, case, takes, other_archs, refused):
    """A Gluon rule's calls: ``case(**kw)`` says whether the Gluon kernel runs a call. None
    in Triton's interpreter; for an sm_90 target with Triton compiling each of ``takes``;
    none for ``other_archs``; none of ``refused`` (each kwargs of ``case``)."""
    import triton

    assert triton.knobs.runtime.interpret and not case()
    Target = _compiling_for_sm(monkeypatch)
    for kw in takes:
        assert case(**kw), kw
    for arch in other_archs:
        Target.arch = arch
        assert not case(), arch
    Target.arch = 90
    for kw in refused:
        assert not case(**kw), kw


def test_gluon_h_kernel_takes_exactly_rule_h8s_calls(monkeypatch):
    """Rule H8 (docs/kernels.md): mLSTMsig's H kernel in Gluon runs where H7's tiles do
    (16-bit, L 256, d_hv > 256) at d_qk 256 without the normaliser, for an sm_90 target with
    Triton compiling; every other call (the interpreter, another GPU, mLSTMexp, the
    normaliser, fp32, L 128, d_qk 160, rows TMA cannot take, other tiles, ``GLUON`` off)
    keeps ``_parallel_fw_kernel``."""
    from tfla.triton import chunkwise_parallel_fw as pfw
    from tfla.triton import chunkwise_parallel_fw_gluon as gfw

    def case(L=256, d_qk=256, d_hv=512, dtype=torch.bfloat16, is_exp=False, normalize=False,
             tuning=Tuning(), S=300, row_pad=0):
        q = torch.empty(2, S, d_qk + row_pad, dtype=dtype)[..., :d_qk]
        k = torch.empty(2, S, d_qk, dtype=dtype)
        v = torch.empty(2, S, d_hv, dtype=dtype)
        C = torch.empty(2, 3, d_qk, d_hv, dtype=dtype)
        cfg = pfw.fw_config(L, d_qk, d_hv, dtype, False, is_exp, tuning)
        return gfw.applies(cfg, q, k, v, C, L=L, is_exp=is_exp, normalize=normalize,
                           limit=False)

    _takes_exactly(monkeypatch, case, [{}, dict(dtype=torch.float16), dict(d_hv=320), dict(S=1000)],
                   (80, 100),
                   [dict(is_exp=True), dict(normalize=True), dict(dtype=torch.float32), dict(L=128),
                    dict(L=512), dict(d_qk=160, d_hv=320), dict(d_hv=256),
                    dict(row_pad=4),              # a row stride of 260 elements: not 16-byte aligned
                    dict(tuning=Tuning(fw={"B_LKV": 32})), dict(tuning=Tuning(fw={"GLUON": False}))])


def test_gluon_dq_kernel_takes_exactly_rule_b12s_calls(monkeypatch):
    """Rule B12 (docs/kernels.md): dQ in Gluon where B11 runs at L 256 (mLSTMsig, 16-bit,
    d_qk 256, 256 < d_hv <= 512) without the normaliser, for an sm_90 target with Triton
    compiling; every other call keeps the Triton kernels."""
    from tfla.triton import chunkwise_parallel_bw as pbw
    from tfla.triton import chunkwise_parallel_bw_gluon as gbw

    def case(L=256, d_qk=256, d_hv=512, dtype=torch.bfloat16, is_exp=False, normalize=False,
             tuning=Tuning(), dh_dtype=None):
        q, k = torch.empty(2, 2, 300, d_qk, dtype=dtype)
        v = torch.empty(2, 300, d_hv, dtype=dtype)
        dh = torch.empty(2, 300, d_hv, dtype=dh_dtype or dtype)
        C = torch.empty(2, 3, d_qk, d_hv, dtype=dtype)
        cfg = pbw.bw_config(L, d_qk, d_hv, dtype, tuning)
        applies = gbw.applies_dq(cfg, q, k, v, C, dh, L=L, is_exp=is_exp, normalize=normalize)
        # the backward's launch order (rule B7) asks the same question of the same tensors
        assert pbw.dq_in_gluon(q, k, v, C, dh, L=L, is_exp=is_exp, normalize=normalize,
                               tuning=tuning) == applies
        return applies

    _takes_exactly(monkeypatch, case, [{}, dict(dtype=torch.float16), dict(d_hv=480)], (100,),
                   [dict(is_exp=True), dict(normalize=True), dict(dtype=torch.float32),
                    dict(dh_dtype=torch.float32), dict(L=128), dict(d_qk=160, d_hv=320),
                    dict(d_hv=1024), dict(tuning=Tuning(bw={"B_LKV": 64})),
                    dict(tuning=Tuning(bw={"ONCE_DQ": False})), dict(tuning=Tuning(bw={"GLUON": False}))])


def test_gluon_dkv_kernel_takes_exactly_rule_b13s_calls(monkeypatch):
    """Rule B13 (docs/kernels.md): dK and dV in Gluon where B4 runs them as one launch
    (mLSTMsig, 16-bit, heads exactly 128 / 256 or 64 / 128) without the normaliser, for an
    sm_90 target with Triton compiling; every other call keeps the Triton kernels."""
    from tfla.triton import chunkwise_parallel_bw as pbw
    from tfla.triton import chunkwise_parallel_bw_gluon as gbw

    def case(L=128, d_qk=128, d_hv=256, dtype=torch.bfloat16, is_exp=False, normalize=False,
             tuning=Tuning(), dc_dtype=None):
        q, k = torch.empty(2, 2, 300, d_qk, dtype=dtype)
        v, dh = torch.empty(2, 2, 300, d_hv, dtype=dtype)
        dC = torch.empty(2, 4, d_qk, d_hv, dtype=dc_dtype or dtype)
        cfg = pbw.bw_config(L, d_qk, d_hv, dtype, tuning)
        return gbw.applies_dkv(cfg, q, k, v, dC, dh, L=L, is_exp=is_exp, normalize=normalize)

    _takes_exactly(monkeypatch, case, [{}, dict(L=256), dict(dtype=torch.float16), dict(d_qk=64, d_hv=128),
                                       dict(d_qk=64, d_hv=128, L=64)], (80,),
                   [dict(is_exp=True), dict(normalize=True), dict(dtype=torch.float32),
                    dict(dc_dtype=torch.float32),
                    dict(L=64),                   # B4 runs 128 / 256 at L 128 and 256 only
                    dict(d_qk=96, d_hv=192),      # rounded up to B4's heads, not exactly them
                    dict(d_qk=256, d_hv=512), dict(tuning=Tuning(bw={"DKV_B_LQ": 32})),
                    dict(tuning=Tuning(bw={"FUSED_DKV": False})), dict(tuning=Tuning(bw={"GLUON": False}))])
