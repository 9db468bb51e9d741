"""Resuming a result set: does the suite still describe the same measurement?

``tflabench run SUITE --resume DIR`` appends to a result set. Every row in it must have
been measured under the same conditions, or one result set would hold rows that are not
comparable (a different iteration count, dtype, GPU, seed or kernel parameters under the
same label). A run records its conditions in ``metadata.json`` under ``measurement``
(:func:`measurement`); a resume compares them with the suite it is given
(:func:`differences`) and refuses any difference with one line naming the field.

What may change between the start and a resume: the cases. Sweep values
(``sweep.*``), ``modes``, ``model.embedding_dim``, kernels added or removed, values of a
kernel parameter given as a list: the new cases run, the removed ones keep their rows,
and both are listed (:class:`ResumePlan`). ``timing.timeout_s`` and a kernel's
``timeout_s`` may change too: a limit, not a condition of a measured value. Everything
else is a condition: the device and GPU, ``dtype``, ``seed``, every other ``timing`` and
``numerics`` field, each kernel's backend and its parameters given as single values, the
software the rows are measured with (driver, CUDA, torch, triton, python, peers,
tflabench), ``--shard``, the roofline ceilings, and the timing method
(:func:`tflabench.store.conditions.join_differences`: on the CPU the timer, the threads per
worker, the CPU model and the host; on a GPU the timer). ``metadata.json`` then keeps
saying what every row was measured with. A change of git revision (a suite edited
in the checkout makes it ``+dirty``) is recorded in ``metadata.json`` under ``resumed``.

The rows are checked too (:func:`row_differences`): each row's suite, device, dtype, the
iteration count of its timings and its kernel's backend and single-valued parameters must
be this run's, so that a damaged or hand-edited ``metadata.json`` cannot let rows of two
conditions meet. A set without readable metadata is refused: its rows do not record the
GPU, the software, the seed, the warm-up or the numerics settings they were measured with.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from pathlib import Path
from typing import Any

from tflabench.store import results as R
from tflabench.store.conditions import TIMING_FIELD_NAMES, join_differences, timing_method
from tflabench.errors import UserError
from tflabench.store import schema
from tflabench.store.schema import LIMIT_FIELDS, TIMING_DEFAULTS, metadata_problem
from tflabench.store.suite import Case, LoadedSuite
from tflabench.text_safety import case_label

#: Environment keys of ``metadata.json`` that must match for a resume (as for merging
#: shards, ``tflabench.store.shard.MERGE_ENVIRONMENT_KEYS``, less the git revision).
ENVIRONMENT_KEYS: tuple[str, ...] = ("gpu_name", "driver", "cuda", "torch", "triton", "python", "peers",
                                     "tflabench")
#: Cases listed by name in a resume's report (the rest are counted).
LIST_LIMIT = 20


def stored_only(directory: str | Path) -> list[str] | None:
    """The ``--only`` globs that the run of result set ``directory`` was given (its
    metadata's ``only``), so that a resume without ``--only`` finishes that selection, not
    the whole suite; None where there were none or the metadata cannot be read (the resume's
    own checks then report a damaged set)."""
    try:
        only = R.read_metadata(directory).get("only")
    except UserError:
        return None
    if isinstance(only, list) and only and all(isinstance(x, str) for x in only):
        return only
    return None


def measurement(loaded: LoadedSuite, device: str, cases: list[Case]) -> dict:
    """The conditions of a run, JSON-able, for ``metadata.json`` (key ``measurement``).

    Args:
        loaded: the validated suite.
        device: the resolved device (``cpu`` / ``cuda``).
        cases: every case of the suite on that device (before ``--only`` and ``--shard``).

    Returns ``{"device", "dtype", "seed", "timing", "numerics", "kernels", "case_ids"}``;
    ``kernels`` maps each label to its ``backend`` and ``params`` (key -> list of the JSON
    texts of its values) and ``swept`` (the keys given as lists in the suite).
    """
    suite = loaded.suite
    swept: dict[str, set[str]] = collections.defaultdict(set)
    for spec in suite.kernels:
        if spec.label:
            swept[spec.label] |= {k for k, v in spec.params.items() if isinstance(v, (list, tuple))}
    kernels: dict[str, dict] = {}
    for case in cases:
        entry = kernels.setdefault(case.kernel, {"backend": set(), "params": collections.defaultdict(set)})
        entry["backend"].add(case.backend)
        for key, value in case.params.model_dump(mode="json").items():
            entry["params"][key].add(json.dumps(value, sort_keys=True))
    return {
        "device": device,
        "dtype": list(suite.dtype) if isinstance(suite.dtype, (list, tuple)) else [suite.dtype],
        "seed": suite.seed,
        "timing": suite.timing.model_dump(mode="json"),
        "numerics": suite.numerics.model_dump(mode="json"),
        "kernels": {label: {"backend": sorted(entry["backend"]),
                            "params": {k: sorted(v) for k, v in sorted(entry["params"].items())},
                            "swept": sorted(swept.get(label, ()))}
                    for label, entry in kernels.items()},
        "case_ids": sorted({c.case_id for c in cases}),
    }


def differences(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """(field, value in the result set, value now) for every condition that differs
    between two :func:`measurement` records, in the order: device, dtype, seed, timing,
    numerics, kernels. Fields that only one side knows (a field added by a newer
    tflabench) are not compared, but a timing field the result set predates counts with
    the value it was timed with (:data:`tflabench.store.schema.TIMING_DEFAULTS`); neither are
    :data:`tflabench.store.schema.LIMIT_FIELDS` nor swept parameters."""
    out: list[tuple[str, Any, Any]] = []
    for key in ("device", "dtype", "seed"):
        if key in old and key in new and old[key] != new[key]:
            out.append((key, _one(old[key]) if isinstance(old[key], list) else old[key],
                        _one(new[key]) if isinstance(new[key], list) else new[key]))
    for group in ("timing", "numerics"):
        a, b = old.get(group) or {}, new.get(group) or {}
        if group == "timing" and a:
            a = {**TIMING_DEFAULTS, **a}
        for key in a:
            if key in b and key not in LIMIT_FIELDS and a[key] != b[key]:
                out.append((f"{group}.{key}", a[key], b[key]))
    old_k, new_k = old.get("kernels") or {}, new.get("kernels") or {}
    for label in old_k:
        if label not in new_k:
            continue
        a, b = old_k[label], new_k[label]
        if a.get("backend") != b.get("backend"):
            out.append((f"kernels[{label!r}].backend", _one(a.get("backend")), _one(b.get("backend"))))
        swept = set(a.get("swept") or ()) | set(b.get("swept") or ())
        pa, pb = a.get("params") or {}, b.get("params") or {}
        for key in pa:
            if key in pb and key not in swept and pa[key] != pb[key]:
                out.append((f"kernels[{label!r}].params.{key}", _values(pa[key]), _values(pb[key])))
    return out


def _one(values: list | None) -> Any:
    return values[0] if values and len(values) == 1 else values


def _values(texts: list[str]) -> Any:
    return _one([json.loads(t) for t in texts])


@dataclasses.dataclass
class ResumePlan:
    """What a resume found: the cases measured already (skipped), and how the suite's
    cases changed since the result set began (descriptions, for the report)."""

    done: set[str]
    added: list[str] = dataclasses.field(default_factory=list)
    removed: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def report_lines(self) -> list[str]:
        """Lines for the console: the new and the removed cases, each listed (up to
        :data:`LIST_LIMIT`), and the notes."""
        lines = list(self.notes)
        for names, what in ((self.added, "new in the suite since the result set began (they run now)"),
                            (self.removed, "no longer in the suite (rows already measured stay in the result set)")):
            if not names:
                continue
            lines.append(f"resume: {len(names)} case{'s' if len(names) != 1 else ''} {what}:")
            lines += [f"  {name}" for name in names[:LIST_LIMIT]]
            if len(names) > LIST_LIMIT:
                lines.append(f"  ... and {len(names) - LIST_LIMIT} more")
        return lines


def measurement_problem(old: Any) -> str | None:
    """Why a recorded ``measurement`` (of ``metadata.json``) cannot be compared, or None:
    the field (``measurement.kernels['x'].params``...) that has the wrong JSON type."""
    if not isinstance(old, dict):
        return "measurement is not an object"
    kinds = {"device": str, "dtype": list, "seed": int, "timing": dict, "numerics": dict, "kernels": dict,
             "case_ids": list}
    for key, kind in kinds.items():
        if key in old and not isinstance(old[key], kind):
            return f"measurement.{key} is not a JSON {kind.__name__.replace('dict', 'object').replace('list', 'array')}"
    if not all(isinstance(i, str) for i in old.get("case_ids") or ()):
        return "measurement.case_ids holds something else than case ids"
    for label, entry in (old.get("kernels") or {}).items():
        where = f"measurement.kernels[{label!r}]"
        if not isinstance(entry, dict):
            return f"{where} is not a JSON object"
        if not isinstance(entry.get("backend", []), list) or not isinstance(entry.get("swept", []), list):
            return f"{where}.backend / .swept is not a JSON array"
        params = entry.get("params", {})
        if not isinstance(params, dict) or not all(
                isinstance(v, list) and all(isinstance(t, str) for t in v) for v in params.values()):
            return f"{where}.params is not an object of arrays of JSON texts"
    return None


def row_differences(rows: list[dict], linenos: list[int], suite_name: str, new: dict) -> list[tuple[str, Any, Any]]:
    """(field, value in a row, value now) for the first row that contradicts this run's
    conditions ``new`` (:func:`measurement`): its ``suite``, ``device``, ``dtype``, the
    ``n_iter`` of a timed row (``timing.iterations``), its kernel's backend and each
    parameter the suite gives as a single value. A label the suite no longer has is not
    compared (a removed kernel keeps its rows). Each field once, in row order."""
    out: list[tuple[str, Any, Any]] = []
    seen: set[str] = set()

    def differ(field: str, old: Any, now: Any, lineno: int) -> None:
        if field not in seen:
            seen.add(field)
            out.append((f"{field} (rows.jsonl line {lineno})", old, now))

    iterations = (new.get("timing") or {}).get("iterations")
    kernels = new.get("kernels") or {}
    for lineno, row in zip(linenos, rows):
        if row.get("suite") is not None and row["suite"] != suite_name:
            differ("suite", row["suite"], suite_name, lineno)
        if row.get("device") is not None and row["device"] != new.get("device"):
            differ("device", row["device"], new.get("device"), lineno)
        if row.get("dtype") is not None and row["dtype"] not in (new.get("dtype") or [row["dtype"]]):
            differ("dtype", row["dtype"], _one(new.get("dtype")), lineno)
        n_iter = row.get("n_iter")  # a timed row without it: its iteration count is unknown
        if iterations is not None and row.get("status") == "ok" and n_iter != iterations:
            differ("timing.iterations", n_iter, iterations, lineno)
        entry = kernels.get(row.get("kernel"))
        if not isinstance(entry, dict):
            continue
        label = row.get("kernel")
        if row.get("backend") is not None and row["backend"] not in entry.get("backend", [row["backend"]]):
            differ(f"kernels[{label!r}].backend", row["backend"], _one(entry.get("backend")), lineno)
        params = schema.row_params(row)
        swept = set(entry.get("swept") or ())
        for key, texts in (entry.get("params") or {}).items():
            if key in swept or key not in params:
                continue
            if json.dumps(params[key], sort_keys=True) not in texts:
                differ(f"kernels[{label!r}].params.{key}", params[key], _values(texts), lineno)
    return out


def timing_method_differences(old_meta: dict, new_measurement: dict, env: dict,
                              cpu_threads: dict | None) -> list[tuple[str, Any, Any, str]]:
    """``(field, value in the result set, value now, how to match it)`` for each timing
    method field (:func:`tflabench.store.conditions.join_differences`) in which this run (its
    :func:`measurement`, environment and ``cpu_threads`` record) differs from the result
    set's ``metadata.json``; empty where they agree or a side does not record it."""
    now = {"measurement": new_measurement, "cpu_threads": cpu_threads,
           "cpu": env.get("cpu"), "hostname": env.get("hostname")}
    threads = timing_method(old_meta)["threads"]
    same_threads = (f"run with the threads per worker it began with (OMP_NUM_THREADS={threads})"
                    if threads is not None else "run with the threads per worker it began with")
    hints = {"timer": same_threads, "threads": same_threads,
             "cpu": "resume on the machine it began on", "hostname": "resume on the machine it began on"}
    if new_measurement.get("device") != "cpu":
        hints["timer"] = "set timing.cuda_graph back to what the result set was timed with"
    return [(TIMING_FIELD_NAMES[f], a, b, hints[f]) for f, a, b in join_differences(old_meta, now)]


def plan_resume(directory: str | Path, loaded: LoadedSuite, old_meta: dict, new_measurement: dict,
                env: dict, cases: list[Case], *, shard: str | None, ceilings: dict | None,
                cpu_threads: dict | None = None) -> ResumePlan:
    """Check that ``loaded`` may be resumed into ``directory`` and say what runs.

    Args:
        old_meta: the result set's ``metadata.json`` (``{}`` when the file is absent).
        new_measurement: :func:`measurement` of this run.
        env: this run's environment (``tflabench.environment.collect``).
        cases: every case of the suite (before ``--only`` and ``--shard``).
        shard: this run's ``--shard`` (``K/N`` text, normalised) or None.
        ceilings: this run's roofline ceilings (as recorded in the metadata) or None.
        cpu_threads: this run's ``cpu_threads`` record (``tflabench.run.pool.cpu_threads``)
            or None (then the thread count and the CPU timer are not compared).

    Raises UserError with one line: the first field that differs (and how many more), its
    value in the result set and now, and how to start a fresh run; or what makes the set
    unusable (metadata missing, damaged or of the wrong type; a line of ``rows.jsonl``
    that is not a result row). Reads only: nothing on disk changes.
    """
    directory = Path(directory)
    where = f"--resume {directory}"
    fresh = "start a fresh run (the same command without --resume)"
    suite = loaded.suite
    R.check_set_files(directory)  # links, FIFOs, devices: refused before anything is read or appended
    problem = metadata_problem(old_meta)
    if problem:
        raise UserError(f"{where}: {R.METADATA_FILE}: {problem}; the file was edited or damaged, so the "
                        f"conditions of its rows are unknown: {fresh}")
    old = old_meta.get("measurement")
    if old is not None:
        problem = measurement_problem(old)
        if problem:
            raise UserError(f"{where}: {R.METADATA_FILE}: {problem}; the file was edited or damaged, so the "
                            f"conditions of its rows are unknown: {fresh}")
    rows_path = directory / R.ROWS_FILE
    scan = R._scan_rows(rows_path)
    R.check_rows(rows_path, scan)
    rows = scan.rows
    if old_meta.get("suite") not in (None, suite.name):
        raise UserError(f"{where}: holds suite {old_meta.get('suite')!r}, not {suite.name!r}; {fresh}")
    diffs: list[tuple[str, Any, Any, str]] = []
    if isinstance(old, dict):
        diffs += [(f, a, b, f"set {f} back to {json.dumps(a)} in the suite") for f, a, b in differences(old, new_measurement)]
    elif old_meta.get("suite_sha256") and old_meta["suite_sha256"] != loaded.sha256:
        raise UserError(
            f"{where}: the result set does not record its measurement conditions (an earlier tflabench "
            f"wrote it) and the suite file changed since (sha256 {str(old_meta['suite_sha256'])[:12]}..., "
            f"now {loaded.sha256[:12]}...); resume with the suite file it began with, or {fresh}")
    for key in ENVIRONMENT_KEYS:  # the CPU model and host of CPU timings: the timing method below
        if key in old_meta and old_meta.get(key) != env.get(key):
            hint = "resume where it began (the same GPU and software)"
            if key == "peers":   # a peer installed since: its cases can still stand beside the set
                hint = ("resume with the peers it began with; to add a peer installed since, run its kernels "
                        "alone (--only LABEL) as a new result set beside this one")
            diffs.append((key, old_meta.get(key), env.get(key), hint))
    diffs += timing_method_differences(old_meta, new_measurement, env, cpu_threads)
    if "shard" in old_meta and old_meta.get("shard") != shard:
        diffs.append(("--shard", old_meta.get("shard"), shard, "give the --shard it began with"))
    if "ceilings" in old_meta and old_meta.get("ceilings") != ceilings:
        diffs.append(("--ceilings", old_meta.get("ceilings"), ceilings, "give the --ceilings it began with"))
    diffs += [(f, a, b, "resume with the suite the result set began with")
              for f, a, b in row_differences(rows, scan.linenos, suite.name, new_measurement)]
    if diffs:
        field, a, b, hint = diffs[0]
        more = f" (also different: {', '.join(d[0] for d in diffs[1:])})" if len(diffs) > 1 else ""
        raise UserError(
            f"{where}: {field} is {json.dumps(b, default=str)} in this run but {json.dumps(a, default=str)} in "
            f"the result set{more}; rows measured under different conditions cannot share a result set: "
            f"{fresh}, or {hint}")
    if rows and not isinstance(old, dict) and not old_meta.get("suite_sha256"):
        raise UserError(
            f"{where}: {R.METADATA_FILE} is missing or records no measurement conditions; its {len(rows)} row(s) "
            "agree with this suite where rows can tell (suite, device, dtype, iterations, kernels), but the "
            "GPU, software versions, seed, warm-up and numerics settings they were measured with are unknown, "
            f"and rows measured under different conditions cannot share a result set: {fresh}")

    done = R.attempted_case_ids(rows)  # not_run rows run again
    plan = ResumePlan(done=done)
    if isinstance(old, dict) and "case_ids" in old:
        old_ids = set(old["case_ids"])
        new_ids = set(new_measurement["case_ids"])
        plan.added = [c.describe() for c in cases if c.case_id not in old_ids]
        by_id = {row.get("case_id"): row for row in rows}  # in the order measured
        gone = [i for i in by_id if i in old_ids - new_ids] + sorted(old_ids - new_ids - set(by_id))
        plan.removed = [case_label(by_id[i]) if i in by_id else f"case {i} (not measured)" for i in gone]
    revision = old_meta.get("git_revision")
    if revision and revision != env.get("git_revision"):
        plan.notes.append(f"resume: the result set began at git revision {revision}, this run is at "
                          f"{env.get('git_revision')} (recorded in metadata.json under 'resumed')")
    return plan
