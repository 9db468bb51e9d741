"""Fixtures shared by several test modules, and the markers the slow tests carry.

The markers are declared in ``pyproject.toml`` (``[tool.pytest.ini_options]``, strict):

- ``slow``: whole runs in the Triton interpreter or through the command line, minutes each
  on 2 cores (the files and tests of :data:`SLOW` are marked here, in one place);
- ``compile``: every kernel specialisation compiled for sm_90 (:data:`COMPILE`);
- ``browser``: needs Debian's ``chromium`` (any test using the :func:`chromium` fixture;
  skipped with the reason where it is missing);
- ``gpu``: needs a CUDA GPU (skipped with the reason without one).

The README's test command deselects ``slow``, ``compile`` and ``browser``; CI runs it and
then ``-m "slow or compile or browser"``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

#: node-id prefixes of the tests marked ``slow``: the interpreter's gate-regime matrices and
#: largest tiles, the kernel matrix in the interpreter, whole runs killed or starved mid-run,
#: the CPU default run through the CLI (each a minute or more on 2 busy cores), SLURM arrays
#: and the longest whole runs (10 s or more each); then cells of the interpreter's kernel
#: matrices, of the registered-operator checks and of seeded statistics whose other cells
#: stay in the fast tier (each group says why).
SLOW = (
    "tests/test_kernels_gate_regimes.py",
    "tests/test_kernel_matrix.py",
    "tests/test_kernels_sig.py::test_segmented_walk_matches_float64_in_every_gate_regime",
    "tests/test_kernels_sig.py::test_training_walk_matches_float64_in_every_gate_regime",
    "tests/test_kernels_sig.py::test_tiled_sig_tile_configs_in_half_precision[128-140-160-256]",
    "tests/test_kernels_sig.py::test_tiled_sig_tile_configs_in_half_precision[128-140-96-256]",
    "tests/test_cli_run.py::test_default_cpu_suite_runs_end_to_end",
    "tests/test_fault_injection.py::test_sigkill_mid_run_keeps_every_whole_row_and_resume_takes_over_the_lock",
    "tests/test_fault_injection.py::test_sigkill_mid_write_leaves_a_torn_line_that_resume_sets_aside",
    "tests/test_fault_injection.py::test_full_disk_stops_the_run_keeps_whole_rows_and_says_how_to_finish",
    # SLURM arrays on one node, and runs at scale (10 s or more each on 2 cores)
    "tests/test_slurm_sbatch.py::test_scancel_of_one_array_task_is_refused_by_merge_and_resubmitted_to_completion",
    "tests/test_slurm_sbatch.py::test_sbatch_job_array_merges_to_what_one_process_measures",
    "tests/test_shard.py::test_slurm_array_recipe_runs_the_cpu_default_suite_in_three_shards_and_merges_to_one_run",
    "tests/test_presentation.py::test_report_of_100000_rows_shows_a_capped_table_and_says_how_to_see_all",
    "tests/test_properties.py::test_any_damaged_result_set_is_read_or_refused_in_one_line_and_never_mixed",
    "tests/test_verify.py::test_unstable_kernel_fails_only_where_forget_gates_are_strongly_closed",
    "tests/test_compare_gate.py::test_two_runs_of_the_cpu_demo_pass_the_default_gate",
    "tests/test_runner.py::test_kernel_that_keeps_crashing_has_its_remaining_cases_recorded_not_run",
    "tests/test_runner.py::test_crashing_worker_becomes_crash_row",
    "tests/test_runner.py::test_resume_without_only_finishes_the_runs_selection",
    "tests/test_compare.py::test_cli_exit_status_follows_fail_on",
    "tests/test_history.py::test_a_30_percent_step_at_commit_6_of_10_is_found_there_with_its_size",
    "tests/test_result_io.py::test_a_process_a_case_started_dies_with_the_case_at_its_timeout",
    "tests/test_result_io.py::test_a_sweep_of_a_billion_cases_is_refused_before_any_list_is_built",
    # interpreter matrices whose other cells stay in the fast tier, which still runs every
    # kernel (mLSTMsig, mLSTMexp, limit_chunk; forward and backward) at small shapes, in
    # saturated gates and on partial chunks (tests/test_kernels_{sig,exp,limit}.py):
    # mLSTMsig in the four extreme regimes: each regime once, normalize False and True twice
    "tests/test_kernels_sig.py::test_kernels_match_reference_in_extreme_gate_regimes[True-regime0]",
    "tests/test_kernels_sig.py::test_kernels_match_reference_in_extreme_gate_regimes[True-regime1]",
    "tests/test_kernels_sig.py::test_kernels_match_reference_in_extreme_gate_regimes[False-regime2]",
    "tests/test_kernels_sig.py::test_kernels_match_reference_in_extreme_gate_regimes[False-regime3]",
    # rule B6 stays checked for the fused dK/dV kernel at S 45 and the per-block one at S 10
    "tests/test_kernels_sig.py::test_backward_skips_zero_and_unneeded_states[16-45-False]",
    "tests/test_kernels_sig.py::test_backward_skips_zero_and_unneeded_states[16-10-True]",
    # the 16-bit tiles at L 128 (L 64's stay, and test_half_precision_inputs)
    "tests/test_kernels_sig.py::test_tiled_sig_tile_configs_in_half_precision[128-200-32-128]",
    # the training walk's register-capped d_qk 96 (d_qk 48 stays; the forward walk at d_qk 96
    # is test_forward_walk_at_wide_heads_matches_float64)
    "tests/test_kernels_sig.py::test_training_walk_without_the_last_state_matches_float64[96]",
    # mLSTMexp xl_chunk: every regime at chunk 16 stays; chunk 32 repeats it
    "tests/test_kernels_exp.py::test_xl_chunk_matches_float64_reference_in_each_gate_regime[32-",
    # float16 gates' overflow rule at one large shape (S 200, d_qk 48, d_hv 96); float16
    # through the kernels stays (test_float16_inputs_give_float16_outputs_and_gradients)
    "tests/test_kernels_exp.py::test_float16_gates_with_open_input_gates_overflow_only_where_the_true_value_does",
    # limit_chunk: each variant in two regimes (every regime at least once) and chunks 16, 128
    "tests/test_kernels_limit.py::test_limit_chunk_matches_float64_reference[exp-True-large_positive_input_gate]",
    "tests/test_kernels_limit.py::test_limit_chunk_matches_float64_reference[exp-True-strong_forgetting]",
    "tests/test_kernels_limit.py::test_limit_chunk_matches_float64_reference[sig-False-std]",
    "tests/test_kernels_limit.py::test_limit_chunk_matches_float64_reference[sig-False-strongly_negative_input_gate]",
    "tests/test_kernels_limit.py::test_limit_chunk_matches_float64_reference[sig-True-large_positive_input_gate]",
    "tests/test_kernels_limit.py::test_limit_chunk_matches_float64_reference[sig-True-strong_forgetting]",
    "tests/test_kernels_limit.py::test_limit_chunk_every_chunk_size_on_a_ragged_sequence[exp-True-32]",
    "tests/test_kernels_limit.py::test_limit_chunk_every_chunk_size_on_a_ragged_sequence[exp-True-64]",
    "tests/test_kernels_limit.py::test_limit_chunk_every_chunk_size_on_a_ragged_sequence[sig-False-32]",
    "tests/test_kernels_limit.py::test_limit_chunk_every_chunk_size_on_a_ragged_sequence[sig-False-64]",
    # the registered operators: opcheck of each operator once (mlstm_fwd: exp with states;
    # mlstm_bwd: sig with states), aot_eager training steps of the walk (sig) and exp with
    # states, and Dynamo's one graph stay; the other opcheck cells, the eager backend
    # (aot_eager runs Dynamo too) and inductor move
    "tests/test_kernels_compile_op.py::test_compiled_training_step_equals_eager[eager-",
    "tests/test_kernels_compile_op.py::test_compiled_training_step_equals_eager[aot_eager-sig-True-dtype0-kw0]",
    "tests/test_kernels_compile_op.py::test_compiled_training_step_equals_eager[aot_eager-exp-False-dtype3-kw3]",
    "tests/test_kernels_compile_op.py::test_inductor_training_step_equals_eager",
    "tests/test_kernels_compile_op.py::test_opcheck_forward_operator[sig-",
    "tests/test_kernels_compile_op.py::test_opcheck_forward_operator[exp-False-kw2]",
    "tests/test_kernels_compile_op.py::test_opcheck_forward_operator[exp-True-kw6]",
    "tests/test_kernels_compile_op.py::test_opcheck_backward_operator[exp-False]",
    # our kernels through `tflabench verify` at closed forget gates in the interpreter (CI's
    # last step verifies the whole grid; df against its summand scale stays in
    # test_verify_a_kernel_with_df_noise_at_closed_forget_gates)
    "tests/test_numerics_df_scale.py::test_our_kernels_pass_verify_at_closed_forget_gates",
    # hypothesis over damaged sets (as test_properties'), and the same statistics on more
    # seeds: run_seeds0 stays
    "tests/test_history.py::test_damaged_metadata_and_rows_end_in_0_1_or_2_without_a_traceback",
    "tests/test_compare.py::test_same_noise_without_slowdown_is_not_flagged[run_seeds1]",
    "tests/test_compare.py::test_same_noise_without_slowdown_is_not_flagged[run_seeds2]",
    "tests/test_compare.py::test_noisy_slowdown_is_flagged_and_only_that_case[run_seeds1-",
    "tests/test_compare.py::test_noisy_slowdown_is_flagged_and_only_that_case[run_seeds2-",
    "tests/test_properties.py::test_any_suite_file_runs_or_is_refused_in_one_line",
    "tests/test_properties.py::test_any_thresholds_file_or_option_decides_or_is_refused_in_one_line",
    # whole runs whose workers are killed, beside test_fault_injection's (SIGTERM before any
    # case, the SIGKILL of a run and the failing_run fixture's crash rows stay)
    "tests/test_hostile_inputs.py::test_sigterm_says_what_is_kept_at_that_moment[32-1-",
    "tests/test_gpus.py::test_a_worker_killed_on_one_gpu_loses_only_its_case_and_the_other_gpu_goes_on",
    "tests/test_result_io.py::test_a_process_a_case_started_dies_with_a_crashed_worker",
)
#: node-id prefixes of the tests marked ``compile``: sm_90 compilation of every kernel.
COMPILE = ("tests/test_kernels_compile.py",)


def pytest_collection_modifyitems(config, items):
    """Mark :data:`SLOW` and :data:`COMPILE` tests, mark the users of :func:`chromium`
    ``browser``, and skip ``gpu`` tests where torch sees no CUDA GPU."""
    no_gpu = None
    for item in items:
        if item.nodeid.startswith(COMPILE):
            item.add_marker(pytest.mark.compile)
        elif item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
        if "chromium" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)
        if item.get_closest_marker("gpu"):
            if no_gpu is None:
                import torch

                no_gpu = not torch.cuda.is_available()
            if no_gpu:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)"))


@pytest.fixture
def chromium() -> str:
    """The path of a headless-capable Chromium; skips the test (with how to install it)
    where none is on PATH."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("needs Debian's chromium on PATH: apt-get install -y chromium")
    return found


@pytest.fixture
def interpret(monkeypatch):
    """Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``) on CPU tensors."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def isolated_user_files(tmp_path, monkeypatch):
    """No test reads the real ~/.config/tflabench/gpus.yaml (measured ceilings) or
    $TFLABENCH_HARDWARE: HOME points into tmp_path."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TFLABENCH_HARDWARE", raising=False)


@pytest.fixture
def isolated_cwd(tmp_path, monkeypatch, isolated_user_files):
    """The test runs in tmp_path (figures land in tmp_path/results/plots) and reads no user
    hardware file (:func:`isolated_user_files`)."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _no_inherited_columns(monkeypatch):
    """pytest-xdist's workers set COLUMNS=80, which the console honours (tflabench.console):
    without this the same test would print 80 or 250 columns wide depending on ``-n``. A test
    that wants a width sets COLUMNS itself."""
    monkeypatch.delenv("COLUMNS", raising=False)


def write_custom_suite(tmp_path: Path, kernels: str, module: str, *, name: str, fn: str = "good",
                       seq_len=(16, 32), label: str = "k", timeout_s: float = 60.0, **over) -> Path:
    """A CPU suite file ``<tmp_path>/<name>.yaml`` of one ``custom`` kernel, ``fn`` of the
    source ``kernels`` written to ``<tmp_path>/<module>.py`` (attention layout, 2 heads,
    float32, fwd, batch 1 over ``seq_len``); ``over`` replaces top-level fields. Shared by
    the tests that run whole suites (test_fault_injection, test_result_io)."""
    import yaml

    kfile = tmp_path / f"{module}.py"
    kfile.write_text(kernels)
    data = {"name": name, "device": "cpu", "dtype": "float32", "modes": ["fwd"], "seed": 0,
            "timing": {"warmup": 1, "iterations": 2, "timeout_s": timeout_s},
            "numerics": {"max_seq_len": 32}, "model": {"embedding_dim": 32},
            "sweep": {"batch": 1, "seq_len": list(seq_len)},
            "kernels": [{"backend": "custom", "label": label,
                         "params": {"function": f"{kfile}:{fn}", "layout": "attention", "heads": 2}}]}
    data.update(over)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


#: The kernel of :func:`measured`: causal attention through torch.
GOOD_KERNEL = """import torch

def good(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
"""


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A finished run of a two-case CPU suite (:func:`write_custom_suite`, kernel label
    ``sdpa``, S 16 and 32):
    (suite path, result-set directory); one run per test module."""
    from io import StringIO

    from rich.console import Console

    from tflabench.run.suite_run import run_suite
    from tflabench.store.suite import load_suite

    tmp_path = tmp_path_factory.mktemp("measured")
    suite = write_custom_suite(tmp_path, GOOD_KERNEL, "measured_kernels", name="measured", label="sdpa")
    result = run_suite(load_suite(suite), out_root=tmp_path / "out", progress=False,
                       console=Console(file=StringIO()))
    return suite, result.directory


@pytest.fixture
def runtime_figure(tmp_path, monkeypatch):
    """Draw ``plot_runtime`` for ``kernels`` ((label, backend, params) each, three sequence
    lengths 512-2048, fwd, ok rows) into tmp_path/r.png; returns the matplotlib figure drawn
    (kept from ``save_figure``, which still writes the file). Shared by the legend tests."""
    import json

    import pandas as pd

    from tflabench.report.plots import benchmark

    drawn = {}
    original = benchmark.save_figure

    def keep(fig, path):
        drawn["fig"] = fig
        return original(fig, path)

    monkeypatch.setattr(benchmark, "save_figure", keep)

    def draw(kernels):
        rows = [dict(kernel=label, backend=backend, params=json.dumps(params), mode="fwd", status="ok",
                     ms_median=1.0 + s / 4096, seq_len=s, batch=8, d_hv=512, chunk_size=64)
                for label, backend, params in kernels for s in (512, 1024, 2048)]
        assert benchmark.plot_runtime(pd.DataFrame(rows), tmp_path / "r.png").exists()
        return drawn["fig"]

    return draw


#: The ``kernels:`` block of the tiny CPU suites whole runs use (torch SDPA math and TFLA's
#: PyTorch reference, 2 heads, d_hv 32): a suite's YAML text ends with it.
TINY_CPU_KERNELS = """\
kernels:
  - backend: sdpa
    label: torch SDPA math
    params: {impl: math, heads: 2, d_hv: 32}
  - backend: tfla
    label: mLSTMsig TFLA (reference)
    params: {variant: sig, algorithm: xl_chunk, chunk_size: 16, heads: 2, d_qk: 16, d_hv: 32, impl: reference}
"""


def one_error_line(result) -> str:
    """The one ``error: ...`` line of a CLI result that exited 2 without a traceback (the
    house rule for user errors); asserts each of those."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    return errors[0]
