"""Sharding (``--shard K/N``) and merging shard result sets (``tflabench merge``)."""

from __future__ import annotations

import dataclasses
import random

import pytest
from typer.testing import CliRunner

from tflabench.cli import app
from tflabench.errors import UserError
from tflabench.store.results import load_results, write_results
from tflabench.store.shard import merge_results, parse_shard, select_shard, shard_assignment


@dataclasses.dataclass(frozen=True)
class FakeCase:
    case_id: str
    cost: float


def fake_cases(n: int, seed: int = 0) -> list[FakeCase]:
    rng = random.Random(seed)
    # costs spread over three orders of magnitude, like seq_len sweeps do
    return [FakeCase(f"case{i:03d}", rng.choice([1, 2, 4, 8, 16, 64, 256, 1024]) * rng.uniform(0.9, 1.1))
            for i in range(n)]


# ----------------------------------------------------------------------------- parse_shard


@pytest.mark.parametrize("text, expected", [("1/1", (1, 1)), ("2/3", (2, 3)), (" 10 / 12 ", (10, 12))])
def test_parse_shard_reads_k_of_n(text, expected):
    assert parse_shard(text) == expected


@pytest.mark.parametrize("text", ["0/3", "4/3", "3", "a/b", "1/0", "-1/3", "1/3/4", ""])
def test_parse_shard_rejects_bad_input_with_user_error(text):
    with pytest.raises(UserError, match="--shard"):
        parse_shard(text)


# ----------------------------------------------------------------------------- select_shard


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_shards_partition_the_cases(n):
    cases = fake_cases(40)
    shards = [select_shard(cases, k, n, cost=lambda c: c.cost) for k in range(1, n + 1)]
    ids = [c.case_id for shard in shards for c in shard]
    assert sorted(ids) == sorted(c.case_id for c in cases)  # every case exactly once
    for shard in shards:  # original order kept inside a shard
        positions = [cases.index(c) for c in shard]
        assert positions == sorted(positions)


def test_split_does_not_depend_on_case_order():
    cases = fake_cases(40)
    shuffled = list(cases)
    random.Random(7).shuffle(shuffled)
    for k in (1, 2, 3):
        a = {c.case_id for c in select_shard(cases, k, 3, cost=lambda c: c.cost)}
        b = {c.case_id for c in select_shard(shuffled, k, 3, cost=lambda c: c.cost)}
        assert a == b


def test_split_balances_predicted_cost_not_count():
    # one case as costly as ten others together: by count 6/5, by cost 1/10
    cases = [FakeCase("big", 10.0)] + [FakeCase(f"small{i}", 1.0) for i in range(10)]
    first, second = (select_shard(cases, k, 2, cost=lambda c: c.cost) for k in (1, 2))
    assert [c.case_id for c in first] == ["big"]
    assert len(second) == 10
    # LPT bound on a random mix: the loads differ by at most the largest single cost
    cases = fake_cases(60, seed=3)
    loads = [sum(c.cost for c in select_shard(cases, k, 4, cost=lambda c: c.cost)) for k in range(1, 5)]
    assert max(loads) - min(loads) <= max(c.cost for c in cases)


def test_missing_costs_are_spread_out():
    cases = [FakeCase(f"c{i}", float("nan")) for i in range(9)]
    assignment = shard_assignment(cases, 3, cost=[c.cost for c in cases])
    assert sorted(assignment) == [1, 1, 1, 2, 2, 2, 3, 3, 3]


def test_select_shard_rejects_k_outside_n():
    with pytest.raises(UserError):
        select_shard(fake_cases(3), 4, 3, cost=lambda c: c.cost)


# ----------------------------------------------------------------------------- merge

METADATA = dict(
    suite="merge_demo", suite_path="suites/merge_demo.yaml", suite_sha256="cd" * 32,
    date="2025-01-01T00:00:00", git_revision="1" * 40, hostname="node-1", gpu_name="NVIDIA H200", gpu_count=1,
    driver="570.86", cuda="12.8", torch="2.13.0", triton="3.6.0", python="3.12.3", peers={}, tflabench="0.1.0",
    shard=None, ceilings=None,
)


def rows_for(seq_lens, suite="merge_demo"):
    return [dict(suite=suite, kernel="tfla", backend="tfla", family="mlstm", params={}, mode="fwd",
                 dtype="float32", device="cpu", batch=1, seq_len=s, heads=2, d_qk=16, d_hv=16, chunk_size=16,
                 embedding_dim=32, status="ok", ms_median=float(s) / 100, ms_samples=[float(s) / 100] * 3)
            for s in seq_lens]


SHARDS = {1: [64, 512], 2: [128, 1024], 3: [256]}


def write_shards(tmp_path, which=(1, 2, 3), n=3, **meta):
    out = []
    for k in which:
        out.append(write_results(tmp_path / f"shard{k}", rows_for(SHARDS[k]),
                                 dict(METADATA, shard=f"{k}/{n}", hostname=f"node-{k}", **meta)))
    return out


def test_merge_joins_all_shards_into_one_result_set(tmp_path):
    merged = load_results(merge_results(write_shards(tmp_path), tmp_path / "merged"))
    assert sorted(merged.rows["seq_len"]) == [64, 128, 256, 512, 1024]
    assert merged.metadata["shard"] is None
    assert merged.metadata["shards_missing"] == []
    assert [m["shard"] for m in merged.metadata["merged_from"]] == ["1/3", "2/3", "3/3"]
    assert merged.metadata["suite"] == "merge_demo"


def test_missing_shard_is_reported(tmp_path):
    dirs = write_shards(tmp_path, which=(1, 3))
    with pytest.raises(UserError, match=r"missing shard\(s\) 2/3"):
        merge_results(dirs, tmp_path / "merged")
    merged = load_results(merge_results(dirs, tmp_path / "merged", allow_missing=True))
    assert merged.metadata["shards_missing"] == [2]
    assert sorted(merged.rows["seq_len"]) == [64, 256, 512]


def test_foreign_shard_is_refused(tmp_path):
    dirs = write_shards(tmp_path, which=(1, 2))
    foreign = write_results(tmp_path / "foreign", rows_for([256], suite="other"),
                            dict(METADATA, suite="other", shard="3/3"))
    with pytest.raises(UserError, match="another suite"):
        merge_results(dirs + [foreign], tmp_path / "merged")


@pytest.mark.parametrize("key, value", [("torch", "2.14.0"), ("gpu_name", "NVIDIA H100"), ("git_revision", "2" * 40)])
def test_shard_from_another_environment_is_refused(tmp_path, key, value):
    dirs = write_shards(tmp_path, which=(1, 2))
    other = write_results(tmp_path / "other", rows_for(SHARDS[3]), dict(METADATA, shard="3/3", **{key: value}))
    with pytest.raises(UserError, match=f"another environment \\({key}"):
        merge_results(dirs + [other], tmp_path / "merged")


def test_repeated_or_unsharded_or_overlapping_inputs_are_refused(tmp_path):
    dirs = write_shards(tmp_path)
    with pytest.raises(UserError, match="given twice"):
        merge_results(dirs + [dirs[0]], tmp_path / "m1")
    whole = write_results(tmp_path / "whole", rows_for([64]), METADATA)
    with pytest.raises(UserError, match="not a shard"):
        merge_results(dirs + [whole], tmp_path / "m2")
    overlap = write_results(tmp_path / "overlap", rows_for([64]), dict(METADATA, shard="3/3"))
    with pytest.raises(UserError, match="is in shard 1/3 and 3/3"):
        merge_results(dirs[:2] + [overlap], tmp_path / "m3")
    with pytest.raises(UserError, match="same N"):
        merge_results(dirs[:2] + write_shards(tmp_path / "n4", which=(3,), n=4), tmp_path / "m4")


def test_merge_refuses_to_overwrite_a_result_set(tmp_path):
    dirs = write_shards(tmp_path)
    merge_results(dirs, tmp_path / "merged")
    with pytest.raises(UserError, match="already holds a result set"):
        merge_results(dirs, tmp_path / "merged")


def test_merge_command_reports_missing_and_foreign_shards_in_one_line(tmp_path):
    dirs = [str(d) for d in write_shards(tmp_path, which=(1, 2))]
    runner = CliRunner()
    result = runner.invoke(app, ["merge", *dirs, "--out", str(tmp_path / "m")])
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0 and "missing shard(s) 3/3" in result.stderr
    foreign = write_results(tmp_path / "f", rows_for([256], suite="x"), dict(METADATA, suite="x", shard="3/3"))
    result = runner.invoke(app, ["merge", *dirs, str(foreign), "--out", str(tmp_path / "m")])
    assert result.exit_code == 2 and "another suite" in result.stderr
    result = runner.invoke(app, ["merge", *dirs, "--allow-missing", "--out", str(tmp_path / "m")])
    assert result.exit_code == 0 and "missing" in result.stderr
    assert len(load_results(tmp_path / "m").rows) == 4


# ----------------------------------------------------------------------------- end to end


def _result_dir(root):
    """The one result set ``tflabench run --out ROOT`` wrote (ROOT/<suite>/<timestamp>/)."""
    found = [p.parent for p in root.glob("*/*/metadata.json")]
    assert len(found) == 1, found
    return found[0]


def test_slurm_array_recipe_runs_the_cpu_default_suite_in_three_shards_and_merges_to_one_run(tmp_path):
    """benchmarks/slurm_array.sh (docs/ci.md's SLURM recipe) as three array tasks at once,
    as SLURM would start them (SLURM_ARRAY_TASK_ID / _COUNT / SLURM_ARRAY_JOB_ID set, no
    SLURM needed), then its merge step: the merged set holds exactly the cases of one run
    of the CPU default suite, each once (a full extra run would double this test's time)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tflabench.store.suite import default_suite_path, expand_cases, load_suite

    root = Path(__file__).resolve().parent.parent
    script = root / "benchmarks" / "slurm_array.sh"
    suite = default_suite_path()
    env = dict(os.environ, TFLABENCH=f"{sys.executable} -m tflabench", TFLABENCH_RESULTS=str(tmp_path),
               TFLABENCH_VENV=str(tmp_path / "no-venv"), SLURM_ARRAY_JOB_ID="4242", SLURM_ARRAY_TASK_COUNT="3",
               # other commits may land in a shared checkout between the tasks; one run = one revision
               TFLABENCH_GIT_REVISION="f" * 40,
               PYTHONPATH=os.pathsep.join([str(root), str(root / "kernels"), os.environ.get("PYTHONPATH", "")]))
    tasks = [subprocess.Popen(["bash", str(script), str(suite), "--no-plots"], cwd=tmp_path,
                              env=dict(env, SLURM_ARRAY_TASK_ID=str(k)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for k in (1, 2, 3)]
    for task in tasks:
        output = task.communicate(timeout=600)[0]
        assert task.returncode == 0, output
    shard_dirs = [_result_dir(tmp_path / "shards" / "4242" / str(k)) for k in (1, 2, 3)]
    merged_dir = tmp_path / "merged-4242"
    done = subprocess.run(["bash", str(script), "--merge", "4242"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    outside = subprocess.run(["bash", str(script), str(suite)], cwd=tmp_path, capture_output=True, text=True,
                             env={k: v for k, v in env.items() if not k.startswith("SLURM_")}, timeout=60)
    assert outside.returncode != 0 and "sbatch --array" in outside.stderr  # not an array task: refused
    runner = CliRunner()

    shard_sets = [load_results(d) for d in shard_dirs]
    assert [s.metadata["shard"] for s in shard_sets] == ["1/3", "2/3", "3/3"]
    assert all(len(s.rows) > 0 for s in shard_sets)  # the split leaves no shard empty here

    merged = load_results(merged_dir)
    one_run = {c.case_id for c in expand_cases(load_suite(suite), device="cpu")}
    assert merged.rows["case_id"].is_unique
    assert set(merged.rows["case_id"]) == one_run
    assert merged.metadata["shard"] is None and merged.metadata["suite"] == "cpu_demo"

    # compare sees the merged set as one run of the suite: nothing lost, nothing added
    from tflabench.compare.gate import compare_results

    comparison = compare_results(merged, merged)
    # (five CPU samples a case may not resolve the 3 % threshold: undecided, never changed)
    assert set(comparison.cases["outcome"]) <= {"unchanged", "undecided", "still_failing"}
    assert len(comparison.cases) == len(one_run)

    # a missing shard and a foreign shard are reported by the command (exit 2, one line)
    result = runner.invoke(app, ["merge", str(shard_dirs[0]), str(shard_dirs[2]), "--out", str(tmp_path / "m2")])
    assert result.exit_code == 2 and "missing shard(s) 2/3" in result.stderr
    foreign = write_results(tmp_path / "foreign", rows_for([64]), dict(METADATA, shard="2/3"))
    result = runner.invoke(app, ["merge", str(shard_dirs[0]), str(foreign), str(shard_dirs[2]),
                                 "--out", str(tmp_path / "m3")])
    assert result.exit_code == 2 and "another suite" in result.stderr
