"""``benchmarks/kernel_matrix.py``, the GPU matrix against float64, in its ``--smoke`` mode:
the same code on a few tiny cases in Triton's CPU interpreter, so that the script runs
wherever the suite does. It runs in a child process (the kernel modules decide between
compiled and interpreted kernels when first imported)."""
from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MATRIX = ROOT / "benchmarks" / "kernel_matrix.py"


def _run(*args, out=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), str(ROOT / "kernels"), os.environ.get("PYTHONPATH", "")]))
    extra = ["--out", str(out)] if out else []
    return subprocess.run([sys.executable, str(MATRIX), *args, *extra], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_smoke_mode_judges_every_path_against_float64_in_the_interpreter(tmp_path):
    proc = _run("--smoke", out=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(tmp_path / "kernel_matrix.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["mode"] == "smoke" and summary["failed"] == 0
    assert len(rows) == summary["rows"] == 15
    assert {r["path"].split()[0] for r in rows} == {"two_level", "walk", "limit_chunk"}
    assert {r["regime"] for r in rows} == {"f_closed", "i_open", "wide"}
    for r in rows:
        assert r["status"] == "ok", r
        want = ["out"] + (["dq", "dk", "dv", "di", "df"] if r["grad"] == "True" else []) \
            + (["last_C", "last_n"] if r["last_state"] == "True" else [])
        for name in want:      # every compared tensor has its error, finite and small
            err = float(r[f"err_{name}"])
            assert math.isfinite(err) and err < 0.1, (r["config"], name, err)
    assert "15/15 rows passed" in proc.stdout


def test_bad_options_exit_2_with_one_line():
    for args in (["--shard", "3/2"], ["--jobs", "0"]):
        proc = _run("--smoke", *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert proc.stderr.strip().count("\n") == 0 and "error:" in proc.stderr, proc.stderr
