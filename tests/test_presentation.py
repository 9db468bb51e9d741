"""What reaches the terminal, Markdown and HTML from a result set (docs/harness.md, "What
reaches the terminal"): text from a set is neutralised, labels normalised and refused when
they collide, long labels shortened, tables read at 80 columns with every number whole,
100,000 rows go through, the HTML report carries the terminal's warnings, and `report`
writes its figures outside the set."""

from __future__ import annotations

import re
import subprocess
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tflabench.cli import app
from tflabench.errors import UserError
from tflabench.store.results import write_results
from tflabench.text_safety import (LABEL_WIDTH, distinct_labels, markdown_text, normalise_label, shorten,
                                   terminal_text)

runner = CliRunner()

META = dict(suite="demo", date="2026-01-01T00:00:00", git_revision="0" * 40, hostname="bench-host",
            gpu_name=None, gpu_count=0, torch="2.13.0+cpu", triton="3.6.0", python="3.11.7", peers={},
            tflabench="0.1.0", shard=None, cpu="Example CPU 9000",
            cpu_threads={"per_worker": 1, "cores": 2, "workers": 1, "set_by": "tflabench"})

LONG = ("mLSTMsig TFLA xl_chunk (ours)", "mLSTMsig TFLA xl_chunk (mlstm_kernels)",
        "mLSTMexp TFLA limit_chunk (mlstm_kernels)")


def _row(kernel, seq_len=128, mode="fwd", ms=1.2345, **over):
    return dict(dict(suite="demo", kernel=kernel, backend="tfla", family="mlstm", params={"variant": "sig"},
                     mode=mode, dtype="float32", device="cpu", batch=2, seq_len=seq_len, heads=4, d_qk=64, d_hv=128,
                     chunk_size=64, embedding_dim=512, status="ok", ms_median=ms, ms_q25=ms * 0.9, ms_q75=ms * 1.1,
                     ms_samples=[ms] * 5, n_iter=5, first_call_s=0.4321, numerics_err=3.2e-7, numerics_worst="h",
                     peak_mem_bytes=3 * 2**30, flops=1.5e10, bytes=2.0e8, tflops_per_s=12.345,
                     reason="impl=reference"), **over)


# ------------------------------------------------------------------ text_safety


@pytest.mark.parametrize("raw", ["\x1b]0;owned\x07", "\x1b[2J", "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\",
                                 "\x9b31m", "\x1bP+q\x1b\\", "a\rb\nc\td", "\u202eevil"])
def test_terminal_text_drops_every_escape_sequence_and_control_character(raw):
    out = terminal_text(f"k {raw} end")
    assert not re.search(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e]", out), repr(out)
    assert out.startswith("k ") and out.endswith(" end")


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_terminal_text_never_leaves_a_control_character(text):
    out = terminal_text(text)
    assert not re.search(r"[\x00-\x1f\x7f-\x9f]", out)
    assert len(out) <= 400


@pytest.mark.parametrize("raw, gone", [("<!-- hide", "<!--"), ("</details>", "</details>"), ("@octocat", "@octocat"),
                                       ("<img src=x onerror=alert(1)>", "<img"), ("a|b", "|"), ("a\nb", "\n")])
def test_markdown_text_leaves_no_tag_comment_mention_or_cell_break(raw, gone):
    out = markdown_text(raw)
    assert gone not in out
    assert "<" not in out and ">" not in out and "|" not in out


def test_labels_are_normalised_and_collisions_named():
    assert normalise_label("cafe\u0301") == unicodedata.normalize("NFC", "caf\u00e9")
    assert normalise_label("mLSTM\u200bsig") == "mLSTMsig"
    assert distinct_labels(["a", "b", "a"], "set") == {"a": "a", "b": "b"}
    with pytest.raises(UserError) as exc:
        distinct_labels(["mLSTMsig", "mLSTM\u200bsig"], "set")
    assert "'mLSTMsig'" in str(exc.value) and "mLSTM" in str(exc.value).split("and", 1)[1]


def test_shorten_cuts_with_an_ellipsis_only_where_needed():
    assert shorten("short", 10) == "short"
    cut = shorten("x" * 100, LABEL_WIDTH)
    assert len(cut) == LABEL_WIDTH and cut.endswith("…")


# ------------------------------------------------------------------ report


def test_report_prints_no_escape_sequence_from_a_set(tmp_path):
    evil = "evil\x1b]0;title\x07\x1b[2J<!-- @user"
    directory = write_results(tmp_path / "set", [_row(evil, reason="boom \x1b[31mred\x1b[0m")],
                              dict(META, gpu_name=None, torch="2.13\x1b[5m"))
    result = runner.invoke(app, ["report", str(directory), "--no-plots", "--html", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert "evil<!-- @user" in result.output
    page = (tmp_path / "r.html").read_text()
    assert "\x1b" not in page and "&lt;!-- @user" in page


def test_report_refuses_labels_that_collide_after_normalisation(tmp_path):
    directory = write_results(tmp_path / "set", [_row("caf\u00e9"), _row("cafe\u0301", seq_len=256)], META)
    result = runner.invoke(app, ["report", str(directory), "--no-plots"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "caf" in lines[0] and "Traceback" not in result.output


def test_report_refuses_a_row_of_unknown_mode_in_one_line(tmp_path):
    directory = write_results(tmp_path / "set", [_row("k", mode="sideways", backend="nosuch", family="nofam")], META)
    result = runner.invoke(app, ["report", str(directory), "--out", str(tmp_path / "plots")])
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and "sideways" in result.output and "fwd, fwdbw" in result.output


def _numbers(row):
    """The numbers of a row as the table prints them."""
    return [f"{row['ms_median']:.3f}", f"{row['first_call_s']:.2f}", f"{row['peak_mem_bytes'] / 2**30:.2f}",
            f"{row['numerics_err']:.1e}", f"{row['tflops_per_s']:.3g}", str(row["seq_len"])]


def test_report_tables_read_at_80_columns_with_every_number_whole(tmp_path):
    rows = [_row(label, seq_len=s, ms=ms) for label in LONG for s, ms in ((512, 1234.5678), (4096, 0.0421))]
    directory = write_results(tmp_path / "set", rows, META)
    result = runner.invoke(app, ["report", str(directory), "--no-plots"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert max(len(line) for line in out.splitlines()) <= 80
    assert not re.search(r"\d…|…\d|\d\.…", out)  # no number cut
    for row in rows:
        for number in _numbers(row):
            assert number in out, number
    assert "kernel labels shortened above" in out  # a legend of the short names
    for label in LONG:
        assert label in out
    wide = runner.invoke(app, ["report", str(directory), "--no-plots", "--wide"], env={"COLUMNS": "80"})
    assert wide.exit_code == 0 and "part 2" not in wide.stdout and all(label in wide.stdout for label in LONG)


def test_report_of_100000_rows_shows_a_capped_table_and_says_how_to_see_all(tmp_path):
    rows = [_row(f"k{i % 5}", seq_len=64 * (1 + i // 5), ms=1.0 + i % 7) for i in range(100_000)]
    directory = write_results(tmp_path / "set", rows, META)
    result = runner.invoke(app, ["report", str(directory), "--no-plots"])
    assert result.exit_code == 0, result.output
    assert "99900 of 100000 rows left out" in result.stdout and "--all" in result.stdout
    assert "100000 ok" in result.stdout
    assert result.stdout.count("\n") < 400


def test_report_html_of_a_5_mb_label_is_cut(tmp_path):
    huge = "A" * 5_000_000
    directory = write_results(tmp_path / "set", [_row(huge), _row("B", seq_len=256)], META)
    html = tmp_path / "r.html"
    result = runner.invoke(app, ["report", str(directory), "--out", str(tmp_path / "plots"), "--html", str(html)])
    assert result.exit_code == 0, result.output
    assert len(html.read_bytes()) < 5_000_000 and "A" * 1000 not in html.read_text()
    assert len(result.output) < 100_000


def test_html_report_carries_the_spread_warning_quartiles_host_cpu_threads_and_captions(tmp_path):
    rows = [_row("k", ms=1.0, ms_q25=0.7, ms_q75=1.4), _row("k", seq_len=256, ms=2.0)]
    directory = write_results(tmp_path / "set", rows, META)
    html = tmp_path / "r.html"
    result = runner.invoke(app, ["report", str(directory), "--out", str(tmp_path / "plots"), "--html", str(html)])
    assert result.exit_code == 0, result.output
    page = html.read_text()
    assert "spread more than" in page and "70%" in page  # the terminal's warning, with the case's spread
    assert "spread more than" in result.output
    assert "0.700-1.400" in page  # quartiles
    assert "bench-host" in page and "Example CPU 9000" in page and "1 thread(s) per worker of 2 cores" in page
    assert "timed" in page
    assert "<figcaption>runtime.png</figcaption>" not in page and "median time per call" in page


def test_report_writes_figures_outside_the_set_by_default_and_never_over_a_tracked_file(tmp_path, monkeypatch):
    directory = write_results(tmp_path / "repo" / "set", [_row("k"), _row("k", seq_len=256)], META)
    before = sorted(p.name for p in directory.iterdir())
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    result = runner.invoke(app, ["report", str(directory)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in directory.iterdir()) == before
    assert (tmp_path / "cwd" / "results" / "plots" / "repo-set" / "runtime.png").exists()
    plots = directory / "plots"
    plots.mkdir()
    (plots / "runtime.png").write_bytes(b"committed")
    git = ["git", "-C", str(tmp_path / "repo")]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "set/plots/runtime.png"], check=True)
    refused = runner.invoke(app, ["report", str(directory), "--out", str(plots)])
    assert refused.exit_code == 2 and "tracked by git" in refused.output
    assert (plots / "runtime.png").read_bytes() == b"committed"


def test_a_suite_with_labels_that_collide_after_normalisation_is_refused(tmp_path):
    from tflabench.store.suite import expand_cases, load_suite

    suite = tmp_path / "s.yaml"
    suite.write_text("name: s\ndevice: cpu\nmodel: {embedding_dim: 128}\nsweep: {tokens: 1024, seq_len: [128]}\n"
                     "kernels:\n  - {backend: sdpa, label: \"caf\\u00e9\", params: {impl: math, heads: 2, d_hv: 64}}\n"
                     "  - {backend: sdpa, label: \"cafe\\u0301\", params: {impl: math, heads: 2, d_hv: 64}}\n",
                     encoding="utf-8")
    with pytest.raises(UserError, match="also the label of kernels"):
        expand_cases(load_suite(suite))


def test_model_tables_of_a_gpu_set_read_at_80_columns(tmp_path):
    rows = [_row(label, seq_len=8192, mode=mode, chunk_size=chunk, ms=ms, device="cuda", batch=8, heads=16,
                 d_qk=128, d_hv=256, dtype="bfloat16", embedding_dim=4096, params={"chunk_size": chunk})
            for label in LONG[:2] for mode in ("fwd", "fwdbw") for chunk, ms in ((64, 5.0), (128, 4.3), (256, 4.7))]
    directory = write_results(tmp_path / "set", rows, dict(META, gpu_name="NVIDIA H200", gpu_count=1))
    result = runner.invoke(app, ["report", str(directory), "--no-plots", "--ceilings", "datasheet"],
                           env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "optimal chunk size" in out and "physical floor" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert not re.search(r"\d…|…\d|\d\.…", out)
    for row in rows:
        assert f"{row['ms_median']:.3f}" in out


def test_report_marks_host_bound_cases_and_says_what_helps(tmp_path):
    """A GPU row whose host time per call reaches 80 % of its GPU time is named in a warning
    (terminal and HTML), with the advice; a row well below it is not."""
    rows = [_row("bound kernel", ms=1.0, host_ms=0.95, device="cuda", gpu_index="0", gpu_name="NVIDIA H100"),
            _row("gpu kernel", ms=1.0, host_ms=0.2, device="cuda", gpu_index="0", gpu_name="NVIDIA H100",
                 seq_len=256)]
    directory = write_results(tmp_path / "set", rows, META)
    result = runner.invoke(app, ["report", str(directory), "--no-plots", "--html", str(tmp_path / "r.html")],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    warning = [line for line in result.stderr.splitlines() if "host-bound" in line]
    assert len(warning) == 1 and "bound kernel" in warning[0] and "gpu kernel" not in warning[0]
    assert "cuda_graph" in warning[0] and "95%" in warning[0]
    assert "host" in result.stdout and "0.950" in result.stdout   # the host ms column
    assert "host-bound" in (tmp_path / "r.html").read_text()
    # a set timed as CUDA-graph replays: its times are the GPU's; only an eager call waits
    graphs = write_results(tmp_path / "graphs", rows, {**META, "measurement": {"timing": {"cuda_graph": True}}})
    result = runner.invoke(app, ["report", str(graphs), "--no-plots"], env={"COLUMNS": "200"})
    (warning,) = [line for line in result.stderr.splitlines() if "host-bound" in line]
    assert "when called eagerly" in warning and "CUDA-graph replays" in warning and "timing.cuda_graph" not in warning
