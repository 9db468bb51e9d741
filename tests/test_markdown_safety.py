"""Markdown from `compare` and `history` (a PR comment, a CI job summary) carries no tag,
comment, mention or cell break from a result set (issue 47.10; docs/harness.md, "What
reaches the terminal"): a hostile label prints as written and the tables still follow it."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from tflabench.compare import history as H
from tflabench.cli import app
from tflabench.store.results import load_results, write_results

HOSTILE = ("<!-- x", "</details>", "@user", "<img src=x>", "a|b")
LABEL = "k " + " ".join(HOSTILE)

META = dict(suite="md_demo", date="2026-01-01T00:00:00", git_revision="0" * 40, hostname="bench-host",
            gpu_name="NVIDIA H100 80GB HBM3", gpu_count=1, torch="2.13.0", triton="3.6.0", python="3.11.7",
            peers={}, tflabench="0.1.0", shard=None)


def _row(label: str, seq_len: int, median_ms: float, seed: int, spread: float = 0.01) -> dict:
    rng = np.random.default_rng(seed)
    samples = median_ms * (1.0 + spread * rng.standard_normal(50))
    return dict(suite="md_demo", kernel=label, backend="tfla", family="mlstm", params={"chunk_size": 64},
                mode="fwd", dtype="bfloat16", device="cuda", batch=1, seq_len=seq_len, heads=8, d_qk=256, d_hv=512,
                chunk_size=64, embedding_dim=4096, status="ok", reason=None, ms_median=float(np.median(samples)),
                ms_mean=float(samples.mean()), ms_min=float(samples.min()), ms_max=float(samples.max()),
                ms_q25=float(np.quantile(samples, 0.25)), ms_q75=float(np.quantile(samples, 0.75)),
                ms_samples=[float(x) for x in samples], n_iter=50, peak_mem_bytes=64 * 2**20)


def _set(root, name: str, factor: float, seed: int, **meta):
    # the hostile case spreads most: it is the worst case the line above the tables names
    rows = [_row(LABEL, 512, 1.0 * factor, seed, spread=0.04), _row("plain", 512, 2.0, seed + 1)]
    return write_results(root / name, rows, dict(META, **meta))


def _assert_neutral(text: str) -> None:
    own = text.count("<details>")  # the report's own collapsed table closes once per opening
    assert text.count("</details>") == own
    for raw in HOSTILE:
        assert raw == "</details>" or raw not in text, (raw, text)
    # the label reaches the reader, escaped, and a pipe of a label splits no cell
    assert "&lt;\\!-- x" in text and "&#64;user" in text and "a&#124;b" in text


def test_compare_markdown_neutralises_a_hostile_label_and_keeps_its_tables(tmp_path):
    base, new = _set(tmp_path, "base", 1.0, 1), _set(tmp_path, "new", 3.0, 11)
    result = CliRunner().invoke(app, ["compare", str(base), str(new), "--format", "markdown",
                                      "--markdown", str(tmp_path / "r.md")])
    assert result.exit_code == 1, result.output  # the hostile case is 3x slower: a regression
    text = (tmp_path / "r.md").read_text()
    _assert_neutral(text)
    # the worst case's label stands above the tables; both tables come after it, whole
    resolution = next(i for i, line in enumerate(text.splitlines()) if line.startswith("resolution:"))
    assert "&lt;\\!-- x" in text.splitlines()[resolution]
    after = "\n".join(text.splitlines()[resolution:])
    assert "### Geometric-mean speed-up per backend" in after and "### Changed cases, worst first" in after
    changed = [line for line in after.split("### Changed cases")[1].splitlines() if line.startswith("| ")]
    header_cells = changed[0].count(" | ")
    assert len(changed) >= 3 and all(line.count(" | ") == header_cells for line in changed)
    assert any("regression" in line and "&lt;img src=x&gt;" in line for line in changed)
    assert text.count("<details>") == text.count("</details>") == 1  # only the report's own


def test_history_markdown_neutralises_a_hostile_label_suite_and_revision(tmp_path):
    sets = [load_results(_set(tmp_path, f"c{c}", 1.0 if c < 3 else 1.5, 100 + c,
                              git_revision=f"{c:02d}" + "ab" * 19, suite="md_demo",
                              git_commit_date=f"2026-01-01T{c:02d}:00:00+00:00", date=f"2026-01-01T{c:02d}:30:00"))
            for c in range(6)]
    text = H.to_markdown(H.analyse(sets, lookup=lambda revision: None))
    _assert_neutral(text)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) >= 2 and all(line.count(" | ") == rows[0].count(" | ") for line in rows)


@pytest.mark.parametrize("suite", ["<!-- s", "@team"])
def test_history_markdown_escapes_the_suite_name(tmp_path, suite):
    sets = [load_results(write_results(tmp_path / f"c{c}", [dict(_row("plain", 512, 1.0, c), suite=suite)],
                                       dict(META, suite=suite, git_revision=f"{c:02d}" + "ab" * 19,
                                            git_commit_date=f"2026-01-01T{c:02d}:00:00+00:00")))
            for c in range(3)]
    text = H.to_markdown(H.analyse(sets, lookup=lambda revision: None))
    assert suite not in text and text.startswith("### tflabench history: ")
