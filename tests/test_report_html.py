"""`tflabench report --html` on every kind of result set (a run on a CPU, a verify run,
merged shards): what the terminal report says is in the page, nothing reads "None", empty
columns are explained, and a real headless browser (Debian's chromium) loads each page and
shows every image."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tflabench.cli import app
from tflabench.store.results import write_results

CPU_META = dict(suite="cpu_demo", suite_path="suites/cpu_demo.yaml", date="2026-01-01T00:00:00",
                git_revision="0" * 40, hostname="laptop", gpu_name=None, gpu_count=0, driver=None, cuda=None,
                torch="2.13.0+cpu", triton="3.6.0", python="3.11.7", peers={}, tflabench="0.1.0", shard=None)


def _run_rows():
    rows = []
    for seq_len, ms in ((128, 2.1), (256, 4.3)):
        for mode in ("fwd", "fwdbw"):
            rows.append(dict(suite="cpu_demo", kernel="mLSTMsig TFLA (reference)", backend="tfla", family="mlstm",
                             params={"variant": "sig"}, mode=mode, dtype="float32", device="cpu", batch=1024 // seq_len,
                             seq_len=seq_len, heads=2, d_qk=32, d_hv=64, chunk_size=64, embedding_dim=128,
                             status="ok", ms_median=ms * (3 if mode == "fwdbw" else 1), ms_q25=ms, ms_q75=ms,
                             ms_samples=[ms] * 5, n_iter=5, first_call_s=0.4, numerics_err=3.2e-7,
                             numerics_worst="h" if mode == "fwd" else "dq", flops=1e9, bytes=1e7,
                             tflops_per_s=0.5, reason="impl=reference"))
    rows.append(dict(rows[0], kernel="torch SDPA math", backend="sdpa", family="attention", status="crash",
                     ms_median=None, numerics_err=None, numerics_worst=None, reason="worker died <SIGSEGV>"))
    return rows


def _verify_rows():
    rows = []
    for regime in ("standard", "f_closed", "f_closed+init"):
        rows.append(dict(suite="verify_cpu-verify", kernel="mLSTMsig TFLA xl_chunk (ours)", backend="tfla",
                         family="mlstm", params={"variant": "sig"}, mode="fwdbw", dtype="float32", device="cpu",
                         batch=1, seq_len=64, heads=1, d_qk=16, d_hv=16, chunk_size=16, numerics_case=regime,
                         status="ok", numerics_err=2e-7, numerics_budget=1e-3, numerics_worst="df",
                         numerics_nonfinite=0, reason=None))
    return rows


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """The HTML report of a CPU run, a verify run and two merged shards, and each command's output."""
    tmp = tmp_path_factory.mktemp("html")
    run_set = write_results(tmp / "run", _run_rows(), CPU_META)
    verify_set = write_results(tmp / "verify", _verify_rows(), dict(CPU_META, suite="verify_cpu-verify"))
    merged_set = write_results(tmp / "merged", _run_rows(), dict(CPU_META, merged_from=["a", "b"], shards_missing=[]))
    out = {}
    for name, directory in (("run", run_set), ("verify", verify_set), ("merged", merged_set)):
        page = tmp / f"{name}.html"
        result = CliRunner().invoke(app, ["report", str(directory), "--html", str(page), "--out", str(tmp / f"{name}-plots")])
        assert result.exit_code == 0, result.output
        out[name] = (page, page.read_text(encoding="utf-8"), result.output)
    return out


@pytest.mark.parametrize("kind", ["run", "verify", "merged"])
def test_every_kind_of_result_set_gets_a_page_without_none(reports, kind):
    page, text, output = reports[kind]
    assert f"html: {page}" in output
    assert not re.search(r">\s*None\s*<|driver None|CUDA None", text)
    assert "driver not recorded" not in text  # a CPU set: no GPU line to qualify
    assert "none (CPU)" in text and "<td>torch 2.13.0+cpu, triton 3.6.0, python 3.11.7</td>" in text


def test_the_run_page_carries_the_terminal_reports_columns_and_notes(reports):
    _, text, output = reports["run"]
    assert "timed: not recorded" in output and "<td>timed</td><td>not recorded</td>" in text   # no record
    assert "timed" not in reports["verify"][2] and "<td>timed</td>" not in reports["verify"][1]
    assert "no model comparison" in output and "no model comparison" in text
    assert "<th>numerics err</th>" in text and "3.2e-07 dq" in text
    assert "No &quot;of bound&quot; column: no roofline comparison" in text  # empty, and said why
    assert "No &quot;peak GiB&quot; column: peak memory is measured on CUDA devices only" in text
    assert "worker died &lt;SIGSEGV&gt;" in text


def test_the_verify_page_has_its_verdicts_and_heat_map(reports):
    _, text, _ = reports["verify"]
    assert "Verdict per kernel and regime" in text and "<th>regime</th>" in text
    assert "ms median" not in text and "No &quot;" not in text  # no timing columns to explain
    assert "tflabench numerics verification: verify_cpu on CPU" in text
    assert text.count("<img ") == 1


def test_the_merged_page_says_it_joins_shards(reports):
    _, text, _ = reports["merged"]
    assert "2 shard(s)" in text


def test_a_headless_browser_loads_every_page_and_shows_every_image(reports, tmp_path, chromium):
    """Each page in an iframe of a small harness page whose script reports, per page, its
    title, tables and images and how many images decoded (naturalWidth > 0); chromium's
    --dump-dom prints the harness page after the script ran."""
    names = list(reports)
    frames = "".join(f'<iframe id="{n}" src="{reports[n][0].as_uri()}"></iframe>' for n in names)
    harness = tmp_path / "harness.html"
    harness.write_text(
        "<!DOCTYPE html><html><body>" + frames + "<script>\n"
        "var names = " + json.dumps(names) + ", done = {};\n"
        "names.forEach(function (n) { document.getElementById(n).addEventListener('load', function () {\n"
        "  var d = this.contentDocument, imgs = Array.prototype.slice.call(d.images);\n"
        "  done[n] = {title: d.title, tables: d.querySelectorAll('table').length, images: imgs.length,\n"
        "    shown: imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length};\n"
        "  document.body.setAttribute('data-check', JSON.stringify(done));\n"
        "}); });\n</script></body></html>", encoding="utf-8")
    done = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--allow-file-access-from-files",
         "--virtual-time-budget=15000", "--dump-dom", harness.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    match = re.search(r'data-check="([^"]*)"', done.stdout)
    assert match, done.stdout[-2000:]
    check = json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    print(json.dumps(check, indent=1))  # the browser's view of each page (pytest -s shows it)
    assert set(check) == set(names)
    for name in names:
        page = check[name]
        assert page["title"].startswith("tflabench ") and page["tables"] >= 2, (name, page)
        assert page["images"] >= 1 and page["shown"] == page["images"], (name, page)
