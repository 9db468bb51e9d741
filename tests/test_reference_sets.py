"""The reference sets (tflabench.store.references): one current set per suite and GPU, each a
whole run of its suite, indexed in results/reference/README.md, found by `compare --reference`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tflabench.store import references as refs
from tflabench.cli import app
from tflabench.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results" / "reference"
#: the files a reference set holds (one storage format; no logs, scripts or figures)
SET_FILES = {"rows.jsonl", "metadata.json", "README.md"}
#: the most bytes tracked under results/
MAX_RESULTS_BYTES = 8 * 1024 * 1024


def tracked(prefix: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", prefix], cwd=ROOT, capture_output=True, check=True)
    return [ROOT / p for p in out.stdout.decode().split("\0") if p]


def test_the_committed_index_is_the_generated_one():
    committed = (REFERENCE / "README.md").read_text(encoding="utf-8")
    assert committed == refs.index_markdown(refs.reference_sets()), (
        "regenerate it: tflabench references --markdown > results/reference/README.md")


def test_each_set_is_one_whole_run_of_a_suite_file():
    sets = refs.reference_sets()
    assert {s.gpu for s in sets} >= {"h100", "h200"}
    for s in sets:
        assert (ROOT / "suites" / f"{s.suite}.yaml").is_file(), s.path
        assert s.metadata.get("only") is None and s.metadata.get("shard") is None, s.path
        assert s.gpu.upper() in s.metadata["gpu_name"], s.path
        assert s.commit and s.date, s.path


def test_results_hold_only_reference_sets_and_their_index():
    files = tracked("results")
    assert sum(p.stat().st_size for p in files) <= MAX_RESULTS_BYTES
    for p in files:
        rel = p.relative_to(REFERENCE)
        assert rel.as_posix() == "README.md" or (len(rel.parts) == 3 and rel.name in SET_FILES), rel


def _copy_set(tmp_path: Path, gpu: str, suite: str) -> Path:
    target = tmp_path / "root" / gpu / suite
    target.mkdir(parents=True)
    for name in ("rows.jsonl", "metadata.json"):
        shutil.copy(REFERENCE / "h200" / "tfla_ci" / name, target / name)
    return target


def test_reference_for_names_the_gpus_that_have_the_suite(tmp_path):
    _copy_set(tmp_path, "h200", "tfla_ci")
    root = tmp_path / "root"
    assert refs.reference_for("H200", "tfla_ci", root) == root / "h200" / "tfla_ci"
    with pytest.raises(UserError, match="exist for: h200"):
        refs.reference_for("h100", "tfla_ci", root)
    with pytest.raises(UserError, match="no GPU has a reference set of suite 'head_dim'"):
        refs.reference_for("h200", "head_dim", root)
    (root / "tfla_ci").mkdir()
    shutil.copy(root / "h200" / "tfla_ci" / "rows.jsonl", root / "tfla_ci" / "rows.jsonl")
    with pytest.raises(UserError, match="on '..'"):   # no way out of <root>/<gpu>/
        refs.reference_for("..", "tfla_ci", root / "h200")


def test_a_set_named_after_another_suite_is_refused(tmp_path):
    _copy_set(tmp_path, "h200", "chunk_tradeoff")
    with pytest.raises(UserError, match="names suite 'tfla_ci'"):
        refs.reference_sets(tmp_path / "root")


def test_cases_count_each_status():
    s = refs.ReferenceSet("h100", "x", Path("x"), {"torch": "2", "peers": {"b": "1", "a": None}},
                          {"ok": 3, "wrong": 1})
    assert s.cases == "3 of 4 ok (1 wrong)"
    assert s.software == "torch 2, b 1"


def test_compare_reference_resolves_the_base_by_gpu_and_suite(tmp_path):
    new = tmp_path / "new"
    shutil.copytree(REFERENCE / "h200" / "tfla_ci", new)
    result = CliRunner().invoke(app, ["compare", "--reference", "h200", str(new), "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["counts"]["unchanged"] == 16


def test_compare_reference_without_a_set_is_one_error_line(tmp_path):
    new = tmp_path / "new"
    shutil.copytree(REFERENCE / "h200" / "chunk_tradeoff", new)
    result = CliRunner().invoke(app, ["compare", "--reference", "h100", str(new)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "exist for: h200" in lines[0]
    two = CliRunner().invoke(app, ["compare", "--reference", "h200", str(new), str(new)])
    assert two.exit_code == 2 and "not two" in two.stderr
    none = CliRunner().invoke(app, ["compare", str(new)])
    assert none.exit_code == 2 and "--reference GPU" in none.stderr


def test_references_command_prints_the_index_as_markdown():
    result = CliRunner().invoke(app, ["references", "--markdown"])
    assert result.exit_code == 0
    assert result.stdout == (REFERENCE / "README.md").read_text(encoding="utf-8")
    table = CliRunner().invoke(app, ["references"])
    assert table.exit_code == 0 and "h100/tfla_ci/" in table.stdout


def test_cases_of_a_run_in_progress_say_how_many_of_its_cases_are_measured():
    s = refs.ReferenceSet("h100", "x", Path("x"), {"case_ids": [f"c{i}" for i in range(10)]}, {"ok": 3, "crash": 1})
    assert s.cases == "3 of 4 ok (1 crash), 4 of 10 measured (in progress)"
    whole = refs.ReferenceSet("h100", "x", Path("x"), {"case_ids": ["a", "b"]}, {"ok": 2})
    assert whole.cases == "2 of 2 ok"
