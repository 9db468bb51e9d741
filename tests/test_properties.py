"""Property-based tests (hypothesis): whatever suite file or damaged result set a user
brings, every command ends with an exit status of its documented meaning (docs/harness.md,
"Exit status"), never a traceback, one ``error:`` line when it refuses, and no resume leaves
a result set that mixes conditions.

The worker pool is replaced by an in-process stand-in that writes one plausible row per
case (the pool itself is tested in test_runner.py and test_fault_injection.py): what is
under test here is everything around it, from reading the suite to writing the set. The
examples are bounded (a few dozen per property, no deadline) and derandomised, so CI runs
the same examples every time.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tflabench.store import results as R
from tflabench.store.schema import new_row
from tflabench.run import suite_run
from tflabench.cli import app

cli = CliRunner()

#: Examples per property: 40 in CI (the same ones every run); TFLABENCH_PROPERTY_EXAMPLES=N
#: explores N random ones.
_EXPLORE = int(os.environ.get("TFLABENCH_PROPERTY_EXAMPLES", "0"))
EXAMPLES = settings(max_examples=_EXPLORE or 40, deadline=None, derandomize=not _EXPLORE, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

BASE = {"name": "prop", "device": "cpu", "dtype": "float32", "modes": ["fwd"], "seed": 0,
        "timing": {"warmup": 1, "iterations": 3, "timeout_s": 60}, "numerics": {"max_seq_len": 32},
        "model": {"embedding_dim": 32}, "sweep": {"batch": 1, "seq_len": [16, 32]},
        "kernels": [{"backend": "sdpa", "label": "sdpa math", "params": {"impl": "math", "heads": 2}}]}


def fake_run_cases(cases, directory, *, on_start=None, on_done=None, **_):
    """The worker pool's contract without workers: one ``ok`` row per case, appended."""
    rows = []
    with R.RowWriter(directory) as writer:
        for n, case in enumerate(cases):
            if on_start is not None:
                on_start(0, case)
            row = new_row(**case.identity())
            samples = [1.0 + 0.01 * ((n + i) % 3) for i in range(case.iterations)]
            row.update(status="ok", ms_median=sorted(samples)[len(samples) // 2], ms_mean=sum(samples) / len(samples),
                       ms_min=min(samples), ms_max=max(samples), ms_q25=min(samples), ms_q75=max(samples),
                       ms_samples=samples, n_iter=case.iterations, first_call_s=0.01)
            rows.append(writer.append(row))
            if on_done is not None:
                on_done(rows[-1])
    return rows


def _invoke(args: list[str]):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(suite_run, "run_cases", fake_run_cases)
        return cli.invoke(app, args, env={"COLUMNS": "250"})


def _check_outcome(result, allowed: set[int]) -> None:
    """An exit status of the documented set, no traceback, one error line when refusing."""
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"uncaught {type(result.exception).__name__}: {result.exception}\n{result.output}")
    assert result.exit_code in allowed, (result.exit_code, result.output)
    assert "Traceback" not in result.output, result.output
    if result.exit_code == 2:
        errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, result.stderr


def _assert_one_condition(directory: Path, suite: dict) -> None:
    """Every row of the set: this suite, its device and dtypes, its iteration count."""
    rows = R.load_results(directory).rows
    dtypes = suite["dtype"] if isinstance(suite["dtype"], list) else [suite["dtype"]]
    assert set(rows["suite"]) <= {suite["name"]}
    assert set(rows["device"]) <= {"cpu"}
    assert set(rows["dtype"]) <= set(dtypes)
    ok = rows[rows["status"] == "ok"]
    assert set(ok["n_iter"]) <= {float(suite["timing"]["iterations"])}, sorted(set(ok["n_iter"]))


# --------------------------------------------------------------------------- generated suites

ODD_TEXT = st.sampled_from(["[/]", "$a^$", "[batch, seq]", ":smile:", "../../x", "", " ", "a\nb", "\x00", "é"])
NUMBERS = st.one_of(
    st.integers(min_value=-2**70, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 2**63, 2**64 + 1, 1e12, 1e400, 0.5, 1.0]),
)
VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), NUMBERS, ODD_TEXT, st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)
#: Where a generated value may land (dotted paths; ``kernels.0.`` is the first kernel).
PATHS = ["name", "device", "dtype", "modes", "seed", "timing.warmup", "timing.iterations", "timing.timeout_s",
         "timing.flush_l2", "numerics.check", "numerics.max_seq_len", "numerics.tolerance", "numerics.budgets",
         "model.embedding_dim", "sweep.tokens", "sweep.batch", "sweep.seq_len", "kernels", "kernels.0.backend",
         "kernels.0.label", "kernels.0.params", "kernels.0.params.heads", "kernels.0.params.d_hv",
         "kernels.0.params.impl", "kernels.0.modes", "kernels.0.timeout_s", "compare.alpha",
         "compare.min_samples", "max_cases", "unknown_field"]
SAMPLE_VALUES = {
    "dtype": st.sampled_from(["float32", ["float32", "float64"], [], ["float32", "float32"], "int8"]),
    "modes": st.sampled_from([["fwd"], [], ["fwd", "fwd"], ["fwdbw"], "fwd"]),
    "sweep.seq_len": st.one_of(st.lists(st.integers(-2, 64), max_size=4), st.integers(-2, 2**40)),
    "sweep.batch": st.one_of(st.lists(st.integers(0, 3), max_size=3), st.integers(0, 2**30)),
    "kernels": st.sampled_from([[], [BASE["kernels"][0]] * 2,
                                [BASE["kernels"][0], {**BASE["kernels"][0], "label": "other"}]]),
}


def _set(data: dict, path: str, value) -> None:
    parts = path.split(".")
    node = data
    for part in parts[:-1]:
        key = int(part) if part.isdigit() else part
        if isinstance(node, list):
            if not isinstance(key, int) or key >= len(node):
                return
        elif not isinstance(node, dict):
            return
        elif key not in node or not isinstance(node[key], (dict, list)):
            node[key] = {}
        node = node[key]
    last = int(parts[-1]) if parts[-1].isdigit() else parts[-1]
    if isinstance(node, dict):
        node[last] = value
    elif isinstance(node, list) and isinstance(last, int) and last < len(node):
        node[last] = value


@st.composite
def suites(draw) -> tuple[dict, str]:
    """A suite (as data) and its YAML text: the base with a few fields replaced, sometimes
    with a repeated key or an alias chain added to the text."""
    data = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(PATHS))
        value = copy.deepcopy(draw(SAMPLE_VALUES.get(path, VALUES)))  # never edit BASE through a share
        _set(data, path, value)
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    extra = draw(st.sampled_from(["", "", "", "dup", "laughs", "tab"]))
    if extra == "dup":
        text += "timing: {iterations: 7}\n"
    elif extra == "laughs":
        text += "x0: &x0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
            f"x{n}: &x{n} [{', '.join([f'*x{n - 1}'] * 10)}]\n" for n in range(1, 6))
    elif extra == "tab":
        text = text.replace("  ", "\t", 1)
    return data, text


@EXAMPLES
@given(suites())
def test_any_suite_file_runs_or_is_refused_in_one_line(generated):
    data, text = generated
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "suite.yaml"
        path.write_text(text, encoding="utf-8")
        result = _invoke(["run", str(path), "--out", str(Path(tmp) / "out"), "--no-progress", "--no-plots"])
        _check_outcome(result, {0, 2})
        event(f"run: exit {result.exit_code}")
        sets = list((Path(tmp) / "out").glob("*/*/"))
        if result.exit_code == 2:
            assert sets == [], "a refused suite left a result set"
        else:
            (directory,) = sets
            _assert_one_condition(directory, yaml.safe_load(text))


# --------------------------------------------------------------------------- damaged result sets


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """(suite path, a finished result set of :data:`BASE`)."""
    tmp = tmp_path_factory.mktemp("prop")
    suite = tmp / "prop.yaml"
    suite.write_text(yaml.safe_dump(BASE, sort_keys=False))
    result = _invoke(["run", str(suite), "--out", str(tmp / "out"), "--no-progress", "--no-plots"])
    assert result.exit_code == 0, result.output
    (directory,) = (tmp / "out").glob("prop/*/")
    return suite, directory


JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False), ODD_TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6,
)
METADATA_KEYS = ["suite", "measurement", "peers", "shard", "date", "gpu_name", "torch", "case_ids", "compare",
                 "shards_missing", "resumed", "hostname", "cpu"]
ROW_KEYS = ["suite", "kernel", "status", "n_iter", "ms_samples", "ms_median", "params", "case_id", "dtype", "device",
            "seq_len", "reason", "extra_field"]


@st.composite
def damage(draw):
    """One or two changes to a result set's files, as (description, function(directory))."""
    changes = []
    for _ in range(draw(st.integers(1, 2))):
        kind = draw(st.sampled_from(["meta_value", "meta_delete", "meta_bytes", "meta_json", "row_value",
                                     "row_delete_key", "row_append", "rows_truncate", "rows_garbage",
                                     "rows_directory", "meta_missing", "measurement_value"]))
        if kind == "meta_value":
            key, value = draw(st.sampled_from(METADATA_KEYS)), draw(JSON)
            changes.append((kind, lambda d, k=key, v=value: _edit_meta(d, lambda m: m.__setitem__(k, v))))
        elif kind == "measurement_value":
            key = draw(st.sampled_from(["timing", "dtype", "seed", "kernels", "case_ids", "device"]))
            value = draw(JSON)
            changes.append((kind, lambda d, k=key, v=value: _edit_meta(
                d, lambda m: m["measurement"].__setitem__(k, v) if isinstance(m.get("measurement"), dict) else None)))
        elif kind == "meta_delete":
            key = draw(st.sampled_from(METADATA_KEYS))
            changes.append((kind, lambda d, k=key: _edit_meta(d, lambda m: m.pop(k, None))))
        elif kind == "meta_bytes":
            blob = draw(st.binary(max_size=64))
            changes.append((kind, lambda d, b=blob: _write(d / R.METADATA_FILE, b)))
        elif kind == "meta_json":
            value = draw(JSON)
            changes.append((kind, lambda d, v=value: _write(d / R.METADATA_FILE, json.dumps(v).encode())))
        elif kind == "meta_missing":
            changes.append((kind, lambda d: (d / R.METADATA_FILE).unlink(missing_ok=True)))
        elif kind == "row_value":
            key, value, line = draw(st.sampled_from(ROW_KEYS)), draw(JSON), draw(st.integers(0, 1))
            changes.append((kind, lambda d, k=key, v=value, n=line: _edit_row(d, n, lambda r: r.__setitem__(k, v))))
        elif kind == "row_delete_key":
            key, line = draw(st.sampled_from(ROW_KEYS)), draw(st.integers(0, 1))
            changes.append((kind, lambda d, k=key, n=line: _edit_row(d, n, lambda r: r.pop(k, None))))
        elif kind == "row_append":
            value = draw(JSON)
            changes.append((kind, lambda d, v=value: _append(d / R.ROWS_FILE, (json.dumps(v) + "\n").encode())))
        elif kind == "rows_truncate":
            fraction = draw(st.floats(0.0, 1.0))
            changes.append((kind, lambda d, f=fraction: _truncate(d / R.ROWS_FILE, f)))
        elif kind == "rows_garbage":
            blob = draw(st.binary(min_size=1, max_size=40))
            changes.append((kind, lambda d, b=blob: _append(d / R.ROWS_FILE, b)))
        else:
            changes.append((kind, _rows_directory))
    return changes


def _write(path: Path, data: bytes) -> None:
    if path.is_dir():
        return
    path.write_bytes(data)


def _append(path: Path, data: bytes) -> None:
    if path.is_file():
        with open(path, "ab") as handle:
            handle.write(data)


def _truncate(path: Path, fraction: float) -> None:
    if path.is_file():
        data = path.read_bytes()
        path.write_bytes(data[: int(len(data) * fraction)])


def _rows_directory(d: Path) -> None:
    path = d / R.ROWS_FILE
    if path.is_file():
        path.unlink()
        path.mkdir()


def _edit_meta(d: Path, edit) -> None:
    path = d / R.METADATA_FILE
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(meta, dict):
        edit(meta)
        path.write_text(json.dumps(meta))


def _edit_row(d: Path, n: int, edit) -> None:
    path = d / R.ROWS_FILE
    if not path.is_file():
        return
    lines = path.read_text(errors="replace").splitlines()
    if n >= len(lines):
        return
    try:
        row = json.loads(lines[n])
    except ValueError:
        return
    if isinstance(row, dict):
        edit(row)
        lines[n] = json.dumps(row)
        path.write_text("\n".join(lines) + "\n")


def _snapshot(directory: Path) -> dict:
    return {p.relative_to(directory): (p.read_bytes() if p.is_file() else None)
            for p in sorted(directory.rglob("*")) if ".lock" not in p.name}


@EXAMPLES
@given(damage())
def test_any_damaged_result_set_is_read_or_refused_in_one_line_and_never_mixed(measured, changes):
    suite, original = measured
    with tempfile.TemporaryDirectory() as tmp:
        import shutil

        directory = Path(tmp) / "set"
        shutil.copytree(original, directory)
        for _, change in changes:
            change(directory)
        before = _snapshot(directory)
        for args, allowed in (
                (["report", str(directory), "--no-plots"], {0, 2}),
                (["compare", str(original), str(directory), "--fail-on", "none", "--format", "json"], {0, 2}),
                (["compare", str(directory), str(original), "--fail-on", "none"], {0, 2}),
                (["compare", str(original), str(directory)], {0, 1, 2}),
                (["merge", str(directory), "--out", str(Path(tmp) / "merged")], {0, 2})):
            outcome = _invoke(args)
            _check_outcome(outcome, allowed)
            event(f"{args[0]}: exit {outcome.exit_code}")
            assert _snapshot(directory) == before, (args, [c[0] for c in changes])  # readers change nothing
        result = _invoke(["run", str(suite), "--resume", str(directory), "--no-progress", "--no-plots"])
        _check_outcome(result, {0, 2})
        event(f"resume: exit {result.exit_code}")
        if result.exit_code == 2:
            assert _snapshot(directory) == before, [c[0] for c in changes]  # refused before any change
        else:
            _assert_one_condition(directory, BASE)


# --------------------------------------------------------------------------- compare's thresholds and options

THRESHOLD_NAMES = ["time_threshold", "alpha", "min_samples", "mem_threshold", "mem_floor_bytes", "typo"]


@EXAMPLES
@given(st.dictionaries(st.sampled_from(THRESHOLD_NAMES), VALUES, max_size=3),
       st.sampled_from(["--time-threshold", "--alpha", "--min-samples", "--mem-threshold", "--mem-floor-bytes"]),
       st.one_of(st.none(), st.sampled_from(["0", "-1", "nan", "inf", "1e400", "0.5", "2", "x", "1e30"])))
def test_any_thresholds_file_or_option_decides_or_is_refused_in_one_line(measured, values, option, text):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "thresholds.yaml"
        path.write_text(yaml.safe_dump(values, allow_unicode=True))
        args = ["compare", str(measured[1]), str(measured[1]), "--thresholds", str(path), "--fail-on", "none"]
        result = _invoke(args + ([option, text] if text is not None else []))
        _check_outcome(result, {0, 2})
        event(f"compare: exit {result.exit_code}")
