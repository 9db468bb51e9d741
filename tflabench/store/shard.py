"""Deterministic split of a suite's cases into N shards, and merging shard results.

``tflabench run SUITE --shard K/N`` runs :func:`select_shard` of the expanded cases, so a
SLURM job array or a CI matrix runs N shards in parallel (docs/ci.md), and
``tflabench merge DIR... --out DIR`` joins their result sets with :func:`merge_results`.

The split is balanced by the model's predicted cost, not by count: greedy
longest-processing-time scheduling (Graham, 1969: sort jobs by cost descending, give each
to the least-loaded shard; the makespan is at most 4/3 of the optimum). Ties are broken by
the case key and the shard index, so the split depends only on the cases and their costs:
the same on every machine, whatever the order the cases arrive in.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from tflabench.store import files, results, schema
from tflabench.bounds import MAX_SHARDS
from tflabench.store.conditions import TIMING_FIELD_NAMES, join_differences
from tflabench.errors import UserError, io_reason

_SHARD_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")

#: Metadata keys that must agree between shards of one run (beyond the suite itself).
MERGE_ENVIRONMENT_KEYS = (
    "gpu_name", "driver", "cuda", "torch", "triton", "python", "peers", "tflabench", "git_revision",
    "sources_sha256",
)


def parse_shard(text: str) -> tuple[int, int]:
    """Parse ``"K/N"`` (1-based: K in 1..N) into ``(k, n)``.

    Raises:
        UserError: not of the form K/N with integers 1 <= K <= N <= :data:`MAX_SHARDS`.
    """
    match = _SHARD_RE.match(str(text)[:100])
    if not match:
        raise UserError(f"--shard: {str(text)[:40]!r} is not of the form K/N (e.g. 2/4: the second of four shards)")
    if len(match.group(2)) > 6:
        n = MAX_SHARDS + 1
    else:
        n = int(match.group(2))
    if n > MAX_SHARDS:
        raise UserError(f"--shard: {str(text)[:40]!r} splits into more than {MAX_SHARDS} shards; use N <= {MAX_SHARDS}")
    k = int(match.group(1)) if len(match.group(1)) <= 6 else n + 1
    if n < 1 or not 1 <= k <= n:
        raise UserError(f"--shard: {text!r} needs 1 <= K <= N (K counts from 1)")
    return k, n


def format_shard(k: int, n: int) -> str:
    """``"K/N"``, the form stored in the metadata ``shard`` field."""
    return f"{k}/{n}"


def _default_key(case: Any) -> str:
    for attribute in ("case_id", "id", "name"):
        value = getattr(case, attribute, None)
        if value is not None and not callable(value):
            return str(value)
    if isinstance(case, Mapping) and "case_id" in case:
        return str(case["case_id"])
    return repr(case)


def shard_assignment(
    cases: Sequence[Any],
    n: int,
    cost: Callable[[Any], float] | Sequence[float],
    key: Callable[[Any], str] | None = None,
) -> list[int]:
    """The 1-based shard of every case (same order as ``cases``), by greedy LPT.

    Args:
        cases: the expanded cases of a suite (any objects).
        n: number of shards (>= 1).
        cost: predicted cost of each case (a callable on a case, or one number per case),
            in any unit proportional to run time (e.g. the model's roofline ms or FLOPs).
            Costs that are missing, non-finite or negative are replaced by the mean of
            the valid ones (1.0 when none is valid), so such cases still spread out.
        key: a stable, unique text per case (default: its ``case_id``, ``id`` or ``name``
            attribute, else ``repr``); the tie-breaker that makes the split deterministic.

    Raises:
        ValueError: ``n < 1`` or ``cost`` has the wrong length.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    key = key or _default_key
    costs = [cost(c) for c in cases] if callable(cost) else list(cost)
    if len(costs) != len(cases):
        raise ValueError(f"cost has {len(costs)} entries for {len(cases)} cases")
    valid = [float(c) for c in costs if c is not None and math.isfinite(float(c)) and float(c) >= 0]
    fill = sum(valid) / len(valid) if valid else 1.0
    clean = [
        float(c) if (c is not None and math.isfinite(float(c)) and float(c) >= 0) else fill for c in costs
    ]
    keys = [key(c) for c in cases]
    order = sorted(range(len(cases)), key=lambda i: (-clean[i], keys[i]))
    loads = [0.0] * n
    shard_of = [0] * len(cases)
    for i in order:
        target = min(range(n), key=lambda s: (loads[s], s))
        loads[target] += clean[i]
        shard_of[i] = target + 1
    return shard_of


def select_shard(
    cases: Sequence[Any],
    k: int,
    n: int,
    cost: Callable[[Any], float] | Sequence[float],
    key: Callable[[Any], str] | None = None,
) -> list:
    """The cases of shard ``k`` of ``n`` (1-based), in their original order.

    Balanced by predicted cost with greedy longest-processing-time scheduling (see
    :func:`shard_assignment` for ``cost`` and ``key``); deterministic: the N shards
    partition ``cases`` identically on every machine.

    Raises:
        UserError: ``k`` outside ``1..n``.
    """
    if not (n >= 1 and 1 <= k <= n):
        raise UserError(f"--shard: {k}/{n} needs 1 <= K <= N (K counts from 1)")
    assignment = shard_assignment(cases, n, cost, key)
    return [case for case, shard in zip(cases, assignment) if shard == k]


# ----------------------------------------------------------------------------- merging


def incomplete_shards(shards: list[tuple[int, int, Any]], n: int, present: set[str],
                      all_present: bool) -> list[dict]:
    """The shards that hold fewer cases than they were to measure, worst first.

    A run records the cases it is to measure in its metadata (``case_ids``: after ``--only``
    and ``--shard``); a shard lacking rows of some of them was interrupted. For shards of
    an earlier tflabench, which recorded only the whole suite's cases
    (``measurement.case_ids``), the check is made on the union when every shard is there
    and none ran with ``--only``.

    Returns dicts ``{"shard": "K/N" or None, "path", "cases_expected", "cases_missing",
    "what"}`` (``what``: one line for messages)."""
    out = []
    for k, _, rs in shards:
        expected = rs.metadata.get("case_ids")
        if not isinstance(expected, list):
            continue
        held = {str(c) for c in rs.rows["case_id"].dropna()} if "case_id" in rs.rows else set()
        lacking = [i for i in expected if i not in held]
        if lacking:
            out.append({"shard": format_shard(k, n), "path": str(rs.path), "cases_expected": len(expected),
                        "cases_missing": len(lacking),
                        "what": f"shard {format_shard(k, n)} ({str(rs.path)!r}) holds {len(expected) - len(lacking)} "
                                f"of its {len(expected)} cases"})
    if out or not all_present or any(isinstance(rs.metadata.get("case_ids"), list) for _, _, rs in shards):
        return sorted(out, key=lambda item: -item["cases_missing"])
    whole = [(rs.metadata.get("measurement") or {}).get("case_ids") for _, _, rs in shards]
    if any(rs.metadata.get("only") for _, _, rs in shards) or not all(isinstance(w, list) for w in whole):
        return []
    expected = set(whole[0])
    lacking = expected - present
    if lacking:
        out.append({"shard": None, "path": None, "cases_expected": len(expected), "cases_missing": len(lacking),
                    "what": f"the shards hold {len(expected) - len(lacking)} of the suite's {len(expected)} cases "
                            f"({len(lacking)} in no shard)"})
    return out


def merge_results(
    dirs: Iterable[str | os.PathLike],
    out_dir: str | os.PathLike,
    allow_missing: bool = False,
    warnings: list[str] | None = None,
) -> Path:
    """Join the result sets of the shards of one run into one result set in ``out_dir``.

    Every input must be a shard (metadata ``shard`` ``"K/N"``) of the same suite (name
    and ``suite_sha256``), the same N, the same environment
    (:data:`MERGE_ENVIRONMENT_KEYS`) and timing method
    (:func:`tflabench.store.conditions.join_differences`: on the CPU the timer, threads per
    worker, CPU model and host); no shard may appear twice and no case may be in two
    shards. The merged metadata is the first shard's with ``shard`` null, ``merged_from``
    (each shard's ``shard``, ``path``, ``hostname``, ``date``), ``shards_missing`` (list of
    K), ``gpus_used`` every shard's GPUs and ``date`` the earliest shard's.

    Args:
        dirs: result-set directories (or files in them) of the shards.
        out_dir: where to write the merged set (created; must not hold a result set).
        allow_missing: write the merge even when some of the N shards are absent
            (recorded in ``shards_missing``) or hold fewer cases than they were to measure
            (:func:`incomplete_shards`, recorded in ``shards_incomplete``); ``compare``
            warns about both.
        warnings: when given, receives one line per line skipped while loading a shard
            (the torn last line of a shard whose run was killed).

    Returns:
        ``out_dir`` as a Path.

    Raises:
        UserError: no input; an input that is missing, corrupt or not a shard; shards of
            different suites, environments, timing methods or N; a repeated shard or case; missing or
            incomplete shards (without ``allow_missing``); an ``out_dir`` that already
            holds results.
    """
    paths = [Path(d) for d in dirs]
    if not paths:
        raise UserError("merge: give at least one shard result directory")
    sets = [results.load_results(p) for p in paths]
    if warnings is not None:  # torn last lines of killed shards: their whole rows merge
        warnings.extend(line for rs in sets for line in rs.warnings)
    shards = _shards_in_order(sets)
    _check_one_run(shards)
    n = shards[0][1]
    missing = _missing_shards(shards, allow_missing)
    rows, owner = _merged_rows(shards, n)
    incomplete = incomplete_shards(shards, n, set(owner), all_present=not missing)
    if incomplete and not allow_missing:
        _refuse_incomplete(incomplete)
    out = Path(out_dir)
    _check_merge_target(out)
    return _write_whole(out, rows, _merged_metadata(shards, missing, incomplete))


def _shards_in_order(sets: list) -> list[tuple[int, int, Any]]:
    """``(K, N, result set)`` of each set, by K; UserError for a set that is not a shard."""
    shards: list[tuple[int, int, Any]] = []
    for rs in sets:
        text = rs.metadata.get("shard")
        if not text:
            raise UserError(f"merge: {str(rs.path)!r} is not a shard (its metadata 'shard' is empty)")
        try:
            k, n = parse_shard(text)
        except UserError:
            raise UserError(f"merge: {str(rs.path)!r} has metadata shard={text!r}, not K/N") from None
        shards.append((k, n, rs))
    shards.sort(key=lambda item: item[0])
    return shards


def _check_one_run(shards: list[tuple[int, int, Any]]) -> None:
    """UserError unless every shard has the first's suite, N, environment
    (:data:`MERGE_ENVIRONMENT_KEYS`) and timing method."""
    first_k, first_n, first = shards[0]
    ref = first.metadata
    for k, n, rs in shards[1:]:
        meta = rs.metadata
        for key in ("suite", "suite_sha256"):
            if meta.get(key) != ref.get(key):
                raise UserError(
                    f"merge: {str(rs.path)!r} is a shard of another suite ({key} {meta.get(key)!r}, "
                    f"{str(first.path)!r} has {ref.get(key)!r}); merge shards of one run only"
                )
        if n != first_n:
            raise UserError(
                f"merge: {str(rs.path)!r} is shard {k}/{n} but {str(first.path)!r} is {first_k}/{first_n}; "
                "all shards must split into the same N"
            )
        for key in MERGE_ENVIRONMENT_KEYS:
            if meta.get(key) != ref.get(key):
                raise UserError(
                    f"merge: {str(rs.path)!r} ran in another environment ({key} {meta.get(key)!r}, "
                    f"{str(first.path)!r} has {ref.get(key)!r}); rerun the shards with one setup"
                )
        timing = join_differences(ref, meta)  # on the CPU: timer, threads per worker, CPU model, host
        if timing:
            key, a, b = timing[0]
            more = f" (also different: {', '.join(TIMING_FIELD_NAMES[d[0]] for d in timing[1:])})" if timing[1:] else ""
            raise UserError(
                f"merge: {str(rs.path)!r} was timed another way ({TIMING_FIELD_NAMES[key]} {b!r}, "
                f"{str(first.path)!r} has {a!r}){more}; rows timed differently cannot share a result set: "
                "rerun that shard with the others' threads per worker on their machine, or keep the shards "
                "as separate result sets"
            )


def _missing_shards(shards: list[tuple[int, int, Any]], allow_missing: bool) -> list[int]:
    """The K of the N shards that are absent; UserError for a shard given twice, and for
    absent ones unless ``allow_missing``."""
    first_n, first = shards[0][1], shards[0][2]
    seen: dict[int, Any] = {}
    for k, _, rs in shards:
        if k in seen:
            raise UserError(f"merge: shard {k}/{first_n} given twice: {str(seen[k].path)!r} and {str(rs.path)!r}")
        seen[k] = rs
    missing = [k for k in range(1, first_n + 1) if k not in seen]
    if missing and not allow_missing:
        listed = ", ".join(format_shard(k, first_n) for k in missing)
        raise UserError(
            f"merge: missing shard(s) {listed} of {first.metadata.get('suite')!r}; "
            "run them, or pass --allow-missing to merge the rest"
        )
    return missing


def _merged_rows(shards: list[tuple[int, int, Any]], n: int) -> tuple[list[dict], dict[str, str]]:
    """Every shard's rows in shard order, and each case's shard (``"K/N"``); UserError for a
    case in two shards."""
    rows: list[dict] = []
    owner: dict[str, str] = {}
    for k, _, rs in shards:
        for row in rs.rows.to_dict("records"):
            cid = row.get("case_id") or schema.case_id(row)
            if cid in owner:
                raise UserError(
                    f"merge: case {cid} is in shard {owner[cid]} and {format_shard(k, n)}; "
                    "shards of one run never overlap"
                )
            owner[cid] = format_shard(k, n)
            rows.append(row)
    return rows, owner


def _refuse_incomplete(incomplete: list[dict]) -> None:
    """The UserError for shards that hold fewer cases than they were to measure: the worst
    one, and the command that finishes it."""
    worst = incomplete[0]
    more = f" (and {len(incomplete) - 1} more shard(s))" if len(incomplete) > 1 else ""
    how = (f"tflabench run SUITE --shard {worst['shard']} --resume {worst['path']}" if worst["shard"]
           else "tflabench run SUITE --shard K/N --resume DIR")
    raise UserError(f"merge: {worst['what']}{more}; its run was interrupted: finish it with `{how}`, "
                    "or pass --allow-missing to merge what the shards hold (recorded as incomplete)")


def _check_merge_target(out: Path) -> None:
    """UserError unless ``out`` is absent or an empty directory (not a link)."""
    if out.exists() and any((out / f).exists() for f in (results.ROWS_FILE, results.PARQUET_FILE, results.CSV_FILE)):
        raise UserError(f"merge: --out {str(out)!r} already holds a result set; choose a new directory")
    if os.path.lexists(out) and (out.is_symlink() or not out.is_dir() or any(out.iterdir())):
        raise UserError(f"merge: --out {str(out)!r} exists and is not an empty directory; the merge is written "
                        "whole into a new directory: choose one that does not exist yet")


def _merged_metadata(shards: list[tuple[int, int, Any]], missing: list[int], incomplete: list[dict]) -> dict:
    """The first shard's metadata with ``shard`` null, ``merged_from``, ``shards_missing``,
    ``shards_incomplete``, the union of ``case_ids`` (where every shard is there and recorded
    them), every shard's ``gpus_used`` and ``hostname``, and the earliest ``date``."""
    metadata = dict(shards[0][2].metadata)
    metadata["shard"] = None
    metadata["merged_from"] = [
        {"shard": format_shard(k, n), "path": str(rs.path), "hostname": rs.metadata.get("hostname"),
         "date": rs.metadata.get("date")}
        for k, n, rs in shards
    ]
    metadata["shards_missing"] = missing
    metadata["shards_incomplete"] = [{k: v for k, v in item.items() if k != "what"} for item in incomplete]
    expected = [rs.metadata.get("case_ids") for _, _, rs in shards]
    metadata["case_ids"] = (sorted({i for ids in expected for i in ids})
                            if not missing and all(isinstance(ids, list) for ids in expected) else None)
    used: list = []  # every GPU of every shard (shards of one host run on different GPUs)
    for _, _, rs in shards:
        for gpu in rs.metadata.get("gpus_used") or []:
            if gpu not in used:
                used.append(gpu)
    metadata["gpus_used"] = used
    hostnames = sorted({str(rs.metadata.get("hostname")) for _, _, rs in shards if rs.metadata.get("hostname")})
    if hostnames:
        metadata["hostname"] = ",".join(hostnames)
    dates = sorted(str(rs.metadata["date"]) for _, _, rs in shards if rs.metadata.get("date"))
    metadata["date"] = dates[0] if dates else _dt.datetime.now().isoformat(timespec="seconds")
    return metadata


def _write_whole(out: Path, rows: list, metadata: dict) -> Path:
    """Write the merged set into a temporary directory beside ``out``
    (``.<name>.merge-<pid>-<random>``) and rename it to ``out`` once every file is
    written: a merge killed midway leaves no ``out`` (only its temporary directory, which
    the next merge into the same place removes when its process is gone), so a half-made
    set is never read as a result set and a second merge works. Raises
    :class:`~tflabench.store.files.ResultWriteError`."""
    import shutil
    import uuid

    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise files.ResultWriteError(f"merge: cannot create {str(parent)!r}: {io_reason(exc)}; "
                                       "choose a writable --out") from None
    for stale in parent.glob(f".{out.name}.merge-*"):  # left by a merge that was killed
        pid = stale.name.rsplit(".merge-", 1)[1].split("-")[0]
        if pid.isdigit() and not _process_exists(int(pid)) and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
    tmp = parent / f".{out.name}.merge-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        results.write_results(tmp, rows, metadata)
        os.rename(tmp, out)  # onto nothing or an empty directory: atomic
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise files.ResultWriteError(f"merge: cannot write {str(out)!r}: {io_reason(exc)}; "
                                       "choose a new, writable --out") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    files.fsync_dir(parent)
    return out


def _process_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists (a temporary merge directory of a live merge stays)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
