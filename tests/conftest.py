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

import pytest

#: node-id prefixes of the tests marked ``slow``: the interpreter's gate-regime matrices and
#: largest tiles, the kernel matrix in the interpreter, whole runs killed or starved mid-run
#: and the CPU default run through the CLI (each a minute or more on 2 busy cores).
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
