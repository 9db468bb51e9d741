"""Suites: validation errors (file, field path, reason) and sweep expansion."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from tflabench.errors import UserError
from tflabench.store.suite import expand_cases, load_suite

SUITES = Path(__file__).resolve().parent.parent / "suites"

BASE = {
    "name": "t",
    "device": "cpu",
    "dtype": "float32",
    "modes": ["fwd", "fwdbw"],
    "timing": {"warmup": 1, "iterations": 2, "timeout_s": 30},
    "model": {"embedding_dim": 128},
    "sweep": {"tokens": 1024, "seq_len": [128, 256, 512]},
    "kernels": [
        {"backend": "tfla", "label": "sig", "params": {"variant": "sig", "chunk_size": 64,
                                                       "heads": 2, "d_qk": 32, "d_hv": 64}},
    ],
}


def _write(tmp_path, data=None, text=None):
    path = tmp_path / "suite.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(data))
    return path


def _modified(change):
    data = copy.deepcopy(BASE)
    change(data)
    return data


BAD_SUITES = {
    "yaml_syntax": (None, "name: t\nkernels: [\n", ":3:1: YAML syntax error"),
    "unknown_top_field": (lambda d: d.update(iterations=3), None, "iterations: unknown field (allowed: name"),
    "unknown_nested_field": (lambda d: d["timing"].update(warmpu=3), None,
                             "timing.warmpu: unknown field; did you mean 'warmup'? (allowed: warmup, iterations"),
    "warmup_s_not_below_timeout": (lambda d: d["timing"].update(warmup_s=30), None,
                                   "timing.warmup_s: 30 s is not below timing.timeout_s (30 s)"),
    # a misspelled required field: the misspelling is named, not only the field it hides
    "misspelled_required_field": (lambda d: d.update(kernals=d.pop("kernels")), None,
                                  "kernals: unknown field; did you mean 'kernels'?"),
    "wrong_type": (lambda d: d["timing"].update(iterations="thirty"), None,
                   "timing.iterations: Input should be a valid integer (got 'thirty')"),
    "wrong_type_in_list": (lambda d: d.update(dtype=["float32", "int8"]), None, "dtype[1]: Input should be"),
    "unknown_backend": (lambda d: d["kernels"].append({"backend": "flashy"}), None,
                        "kernels[1].backend: unknown backend 'flashy'; known: custom, fa2"),
    "tokens_not_divisible": (lambda d: d["sweep"].update(seq_len=[128, 384]), None,
                             "sweep.seq_len[1]: tokens 1024 is not divisible by seq_len 384"),
    "param_not_taken": (lambda d: d["kernels"][0]["params"].update(impl_name="x"), None,
                        "kernels[0].params.impl_name: not a parameter of backend 'tfla'; it takes:"),
    "bad_param_value_in_list": (lambda d: d["kernels"][0]["params"].update(variant=["sig", "tanh"]), None,
                                "kernels[0].params.variant[1]: Input should be 'sig' or 'exp'"),
    "missing_required_field": (lambda d: d.pop("sweep"), None, "sweep: required field is missing"),
    "unresolvable_layout": (lambda d: d["kernels"][0]["params"].update(heads=3, d_hv=None), None,
                            "kernels[0].params: heads: 3 does not divide embedding_dim 128"),
    # a suite read loosely used to run something else than it says
    "duplicate_key": (None, "name: t\nsweep: {batch: 1, seq_len: 64}\nkernels: [{backend: sdpa}]\n"
                      "kernels: [{backend: tfla}]\n", ":4:1: key 'kernels' appears twice in one mapping "
                      "(first at line 3)"),
    "duplicate_nested_key": (None, "name: t\nsweep: {batch: 1, seq_len: 64, batch: 2}\nkernels: [{backend: sdpa}]\n",
                             "key 'batch' appears twice"),
    "empty_batch_axis": (lambda d: d.update(sweep={"batch": [], "seq_len": [64]}), None,
                         "sweep.batch: an empty list gives no case"),
    "empty_param_axis": (lambda d: d["kernels"][0]["params"].update(chunk_size=[]), None,
                         "kernels[0].params.chunk_size: an empty list gives no case"),
    "empty_dtype_axis": (lambda d: d.update(dtype=[]), None, "dtype: an empty list gives no case"),
    "repeated_seq_len": (lambda d: d["sweep"].update(seq_len=[128, 128, 128]), None,
                         "sweep.seq_len: 128 is given twice (at [0] and [1])"),
    "repeated_param": (lambda d: d["kernels"][0]["params"].update(chunk_size=[64, 32, 64]), None,
                       "kernels[0].params.chunk_size: 64 is given twice (at [0] and [2])"),
    "repeated_mode": (lambda d: d.update(modes=["fwd", "fwd"]), None, "modes: 'fwd' is given twice"),
    "duplicate_label": (lambda d: d["kernels"].append(dict(d["kernels"][0], params={"variant": "exp", "heads": 2})),
                        None, "kernels[1].label: 'sig' is also the label of kernels[0]"),
    "same_default_label": (lambda d: d.update(kernels=[{"backend": "sdpa", "params": {"heads": 2}}] * 2), None,
                           "kernels[1].label: 'sdpa heads=2' is also the label of kernels[0]"),
    "too_many_cases": (lambda d: d.update(sweep={"batch": list(range(1, 101)), "seq_len": list(range(1, 101))}),
                       None, "max_cases: the suite expands to 20,000 cases, more than max_cases 10,000"),
    # numbers: finite, in range, the range in the message
    "timeout_inf": (lambda d: d["timing"].update(timeout_s=float("inf")), None,
                    "timing.timeout_s: must be a finite number in (0, 604800] (got inf)"),
    "timeout_huge": (lambda d: d["timing"].update(timeout_s=1e12), None,
                     "timing.timeout_s: must be a finite number in (0, 604800]"),
    "kernel_timeout_nan": (lambda d: d["kernels"][0].update(timeout_s=float("nan")), None,
                           "kernels[0].timeout_s: must be a finite number in (0, 604800] (got nan)"),
    "seed_above_64_bits": (lambda d: d.update(seed=2**64 + 1), None,
                           "seed: must be an integer in [0, 9223372036854775807] (got 18446744073709551617)"),
    "tolerance_inf": (lambda d: d.update(numerics={"tolerance": float("inf")}), None,
                      "numerics.tolerance: must be a finite number in (0, 0.5] (got inf)"),
    "tolerance_one": (lambda d: d.update(numerics={"tolerance": 1.0}), None,
                      "numerics.tolerance: must be a finite number in (0, 0.5]"),
    "budget_nan": (lambda d: d.update(numerics={"budgets": {"float32": {"out": float("nan")}}}), None,
                   "numerics.budgets.float32.out: must be a finite number in (0, 0.5] (got nan)"),
    "iterations_huge": (lambda d: d["timing"].update(iterations=10**9), None,
                        "timing.iterations: must be an integer in [1, 100000]"),
    "seq_len_huge": (lambda d: d.update(sweep={"batch": 1, "seq_len": [64, 2**40]}), None,
                     "sweep.seq_len[1]: must be an integer in [1, 16777216]"),
    "kernel_param_huge": (lambda d: d["kernels"][0]["params"].update(chunk_size=10**12), None,
                          "kernels[0].params.chunk_size: must be an integer in [-16777216, 16777216]"),
    "kernel_param_inf": (lambda d: d["kernels"][0]["params"].update(eps=float("inf")), None,
                         "kernels[0].params.eps: must be a finite number"),
    "compare_min_samples_nan": (lambda d: d.update(compare={"min_samples": float("nan")}), None,
                                "compare.min_samples: Input should be a valid integer"),
    "compare_floor_huge": (lambda d: d.update(compare={"mem_floor_bytes": 2**60}), None,
                           "compare.mem_floor_bytes: must be an integer in [0, 1125899906842624]"),
}


@pytest.mark.parametrize("kind", sorted(BAD_SUITES))
def test_bad_suite_is_refused_with_file_field_and_reason(tmp_path, kind):
    change, text, expected = BAD_SUITES[kind]
    path = _write(tmp_path, _modified(change) if change else None, text)
    with pytest.raises(UserError) as info:
        load_suite(path)
    message = str(info.value)
    assert message.startswith(str(path)), message
    assert expected in message, message
    assert len(message.splitlines()) <= 2, message


def test_billion_laughs_is_refused_at_once(tmp_path):
    # ten aliases per level, six levels: 10**6 values from 60 lines; loading used to grow
    # without bound once pydantic and json copied the shared lists
    lines = ["name: t", "sweep: {batch: 1, seq_len: 64}", "l0: &l0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"l{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * 10) + "]" for n in range(1, 7)]
    lines += ["kernels:", "  - backend: custom", "    params: {function: 'm:f', kwargs: {x: *l6}}"]
    path = _write(tmp_path, text="\n".join(lines) + "\n")
    with pytest.raises(UserError, match="expands to more than 100,000 values through its aliases"):
        load_suite(path)


def test_self_referring_alias_is_refused(tmp_path):
    path = _write(tmp_path, text="name: t\nx: &a [1, *a]\n")
    with pytest.raises(UserError, match="an alias refers to a value that contains it"):
        load_suite(path)


def test_aliases_and_merge_keys_stay_allowed(tmp_path):
    text = ("name: t\ndevice: cpu\ndtype: float32\nmodes: [fwd]\nmodel: {embedding_dim: 128}\n"
            "sweep: {batch: 1, seq_len: [64, 128]}\n"
            "kernels:\n"
            "  - backend: tfla\n    label: sig\n    params: &p {variant: sig, heads: 2, d_qk: 32, d_hv: 64, chunk_size: 64}\n"
            "  - backend: tfla\n    label: exp\n    params: {<<: *p, variant: exp}\n")
    cases = expand_cases(load_suite(_write(tmp_path, text=text)))
    assert [(c.kernel, c.params.variant) for c in cases] == [("sig", "sig")] * 2 + [("exp", "exp")] * 2


def test_max_cases_raises_the_limit_on_purpose(tmp_path):
    data = _modified(lambda d: d.update(sweep={"batch": list(range(1, 51)), "seq_len": list(range(1, 101))},
                                        max_cases=20_000, modes=["fwd"]))
    assert len(expand_cases(load_suite(_write(tmp_path, data)))) == 5000


def test_missing_suite_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_suite(tmp_path / "absent.yaml")


def test_fixed_token_sweep_gives_batch_tokens_over_seq_len(tmp_path):
    cases = expand_cases(load_suite(_write(tmp_path, BASE)))
    # 3 lengths x 2 modes; batch = 1024 / S (paper App. E.3: fixed tokens, B = tokens / T)
    assert [(c.batch, c.seq_len, c.mode) for c in cases] == [
        (8, 128, "fwd"), (8, 128, "fwdbw"), (4, 256, "fwd"), (4, 256, "fwdbw"),
        (2, 512, "fwd"), (2, 512, "fwdbw")]
    assert {(c.heads, c.d_qk, c.d_hv, c.chunk_size) for c in cases} == {(2, 32, 64, 64)}
    assert {c.warmup for c in cases} == {1} and {c.iterations for c in cases} == {2}


def test_batch_by_length_sweep_is_the_cross_product(tmp_path):
    data = _modified(lambda d: d.update(sweep={"batch": [1, 3], "seq_len": [64, 128]}, modes=["fwd"]))
    cases = expand_cases(load_suite(_write(tmp_path, data)))
    assert [(c.batch, c.seq_len) for c in cases] == [(1, 64), (1, 128), (3, 64), (3, 128)]


def test_every_list_field_expands(tmp_path):
    def change(d):
        d["dtype"] = ["float32", "float64"]
        d["model"]["embedding_dim"] = [128, 256]
        d["sweep"] = {"batch": 1, "seq_len": 256}
        d["kernels"][0].pop("label")
        d["kernels"][0]["params"] = {"variant": ["sig", "exp"], "chunk_size": [32, 64, 128], "d_hv": 64,
                                     "heads": None, "p_qk": 0.5}

    cases = expand_cases(load_suite(_write(tmp_path, _modified(change))))
    # 2 variants x 3 chunk sizes x 2 embeddings x 2 dtypes x 1 shape x 2 modes
    assert len(cases) == 2 * 3 * 2 * 2 * 2
    assert {c.chunk_size for c in cases} == {32, 64, 128}
    # without a label, each combination is named by its values
    assert len({c.kernel for c in cases}) == 2 * 3
    assert "tfla chunk_size=128 d_hv=64 heads=None p_qk=0.5 variant=exp" in {c.kernel for c in cases}  # keys as in the file (sorted by safe_dump)
    assert {c.dtype for c in cases} == {"float32", "float64"}
    # heads = embedding_dim / d_hv; d_qk = p_qk * d_hv
    assert {(c.embedding_dim, c.heads, c.d_qk) for c in cases} == {(128, 2, 32), (256, 4, 32)}
    assert len({c.case_id for c in cases}) == len(cases)


def test_kernel_modes_and_timeout_override_the_suite(tmp_path):
    def change(d):
        d["kernels"][0].update(modes=["fwd"], timeout_s=7.5)
        d["kernels"].append({"backend": "sdpa", "params": {"impl": "math", "heads": 2}})

    cases = expand_cases(load_suite(_write(tmp_path, _modified(change))))
    tfla = [c for c in cases if c.backend == "tfla"]
    sdpa = [c for c in cases if c.backend == "sdpa"]
    assert {c.mode for c in tfla} == {"fwd"} and {c.timeout_s for c in tfla} == {7.5}
    assert {c.mode for c in sdpa} == {"fwd", "fwdbw"} and {c.timeout_s for c in sdpa} == {30}
    # default label: backend + fixed params in file order (yaml.safe_dump sorts the keys)
    assert sdpa[0].kernel == "sdpa heads=2 impl=math"


def test_case_ids_are_stable_across_loads(tmp_path):
    path = _write(tmp_path, BASE)
    first = [c.case_id for c in expand_cases(load_suite(path))]
    second = [c.case_id for c in expand_cases(load_suite(path))]
    assert first == second and len(set(first)) == len(first)


@pytest.mark.parametrize("field, value, default", [("sync_each", True, False), ("warmup_s", 0.2, 0.0)])
def test_a_timing_method_field_reaches_the_timing_and_keeps_the_case_ids(tmp_path, monkeypatch, field,
                                                                        value, default):
    """timing.sync_each and timing.warmup_s are how a case is timed, not what it is: the case
    ids (compare's key) stay those of the default suite, and measure_case hands the value to
    time_callable."""
    import tflabench.run.measure as measure

    base = expand_cases(load_suite(_write(tmp_path, BASE)))
    timed = expand_cases(load_suite(_write(tmp_path, _modified(lambda d: d["timing"].update({field: value})))))
    assert [c.case_id for c in timed] == [c.case_id for c in base]
    assert {getattr(c, field) for c in timed} == {value} and {getattr(c, field) for c in base} == {default}
    seen = []
    original = measure.time_callable

    def spy(fn, **kw):
        seen.append(kw.get(field))
        return original(fn, **kw)

    monkeypatch.setattr(measure, "time_callable", spy)
    row = measure.measure_case(timed[0])
    assert row["status"] == "ok" and seen == [value]


def test_cuda_graph_reaches_the_cases_keeps_their_ids_and_is_refused_on_the_cpu(tmp_path):
    """timing.cuda_graph is how a case is timed (its ids stay the default suite's); a run
    on the CPU, where there is no graph to replay, is refused before anything is written."""
    from tflabench.run.suite_run import run_suite

    base = expand_cases(load_suite(_write(tmp_path, BASE)))
    loaded = load_suite(_write(tmp_path, _modified(lambda d: d["timing"].update(cuda_graph=True))))
    timed = expand_cases(loaded)
    assert [c.case_id for c in timed] == [c.case_id for c in base]
    assert {c.cuda_graph for c in timed} == {True} and {c.cuda_graph for c in base} == {False}
    with pytest.raises(UserError, match=r"timing.cuda_graph replays CUDA graphs, but this run is on the CPU"):
        run_suite(loaded, out_root=tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("rows.jsonl"))


def test_warmup_s_must_stay_below_a_kernels_own_timeout(tmp_path):
    with pytest.raises(UserError, match=r"timing.warmup_s: 10 s is not below kernels\[0\].timeout_s \(5 s\)"):
        expand_cases(load_suite(_write(tmp_path, _modified(lambda d: (
            d["timing"].update(warmup_s=10), d["kernels"][0].update(timeout_s=5))))))


@pytest.mark.parametrize("path", sorted(SUITES.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_suites_validate(path):
    loaded = load_suite(path)
    assert expand_cases(loaded, device="cuda")


def test_h100_7b_suite_has_the_paper_protocol_and_layouts():
    # Paper Sec. 5.2 / App. E.3: embedding 4096, 65,536 tokens, T = 512 .. 65,536,
    # median of 30 after 10 warm-ups, bf16; mLSTM and FLA 16 heads d_qk 128 d_hv 256,
    # attention 32 heads of 128, Mamba 2 64 heads of 64 with state 128.
    loaded = load_suite(SUITES / "h100_7b.yaml")
    s = loaded.suite
    assert (s.timing.warmup, s.timing.iterations, s.dtype) == (10, 30, "bfloat16")
    cases = expand_cases(loaded, device="cuda")
    assert {c.batch * c.seq_len for c in cases} == {65536}
    assert sorted({c.seq_len for c in cases}) == [2**k for k in range(9, 17)]
    layouts = {}
    for c in cases:
        layouts.setdefault(c.backend, set()).add((c.heads, c.d_qk, c.d_hv))
    for backend in ("tfla", "mlstm_kernels", "fla", "fla_delta", "mamba3"):  # beyond the paper: the mLSTM's
        assert layouts[backend] == {(16, 128, 256)}, backend
    for backend in ("sdpa", "fa3"):
        assert layouts[backend] == {(32, 128, 128)}, backend
    assert {(h, d_hv) for h, _, d_hv in layouts["mamba2"]} == {(64, 64)}
    assert next(c.params for c in cases if c.backend == "mamba2").d_state == 128
    impls = {c.params.impl for c in cases if c.backend == "sdpa"}
    assert {"flash", "cudnn"} <= impls
