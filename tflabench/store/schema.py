"""The result schema: what a row and ``metadata.json`` of a result set hold.

The columns of a row (:data:`COLUMNS`, their groups, which hold text and which numbers),
the row statuses and modes, the case identity and its stable hash (:func:`case_id`), a
complete row (:func:`new_row`, :func:`complete_row`), its derived model columns
(:func:`fill_model_columns`), the one parser of numeric cells (:func:`number`), rows as a
typed pandas table (:func:`rows_frame`), and the checks a row or the metadata read back must
pass (:func:`row_problem`, :data:`METADATA_TYPES`, :func:`metadata_problem`).

Source: ``docs/ARCHITECTURE.md``, "Contract: result sets". The files of a set are
:mod:`tflabench.store.results`'s; how they are written, :mod:`tflabench.store.files`'.

Import-light: pandas is imported inside the functions that need it.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Iterable, Mapping

from tflabench.model.analysis import place_on_roofline

#: Identity columns: what a case *is*. ``case_id`` is a hash of all the others.
IDENTITY_COLUMNS: tuple[str, ...] = (
    "case_id",
    "suite",
    "kernel",
    "backend",
    "family",
    "params",
    "mode",
    "dtype",
    "device",
    "batch",
    "seq_len",
    "heads",
    "d_qk",
    "d_hv",
    "chunk_size",
    "embedding_dim",
    "numerics_case",
)
#: Identity columns added after result sets existed: left out of :func:`case_id` when None,
#: so that the ids of earlier rows do not change. ``numerics_case``: the verify case
#: (gate regime, length, initial state) of a ``tflabench verify`` row; None for ``run`` rows.
OPTIONAL_IDENTITY_COLUMNS: tuple[str, ...] = ("numerics_case",)
#: ``algorithm``: what the kernel actually ran where the backend says (``tfla``: one of
#: ``tfla.plan.ALGORITHMS``); None for other backends. ``chunk_size_run``: the chunk size
#: (tokens) that ran, from the backend's plan (``chunk_size: auto`` resolved), never written
#: into the identity column ``chunk_size``; None without chunks, and in sets that predate it
#: (read through :func:`chunk_size_ran`).
OUTCOME_COLUMNS: tuple[str, ...] = ("status", "reason", "algorithm", "chunk_size_run")
TIMING_COLUMNS: tuple[str, ...] = (
    "ms_median",
    "ms_mean",
    "ms_min",
    "ms_max",
    "ms_q25",
    "ms_q75",
    "ms_samples",
    "n_iter",
    "first_call_s",
    "host_ms",
)
#: ``host_ms``: on a GPU, the host's time to issue one call (ms, median; measure.host_ms_per_call),
#: beside the GPU's ``ms_median``; None on the CPU and in sets that predate it.
MEMORY_COLUMNS: tuple[str, ...] = ("peak_mem_bytes",)
#: Where the case ran: ``gpu_index`` the GPU as ``CUDA_VISIBLE_DEVICES`` names it on the
#: host (``"1"``, or a UUID where the run was pinned by UUID), ``gpu_name`` its model as
#: the driver reports it (``NVIDIA H200``); both None on the CPU. Per row, so that a run
#: over several GPUs (``--gpus``, shards) or a host with mixed models says which row ran
#: where, and ``compare`` can warn when it would compare rows across GPU models.
DEVICE_COLUMNS: tuple[str, ...] = ("gpu_index", "gpu_name")
#: ``run --gpu-trace`` (:mod:`tflabench.run.gpu_trace`): over the case's timed calls, the lowest
#: SM clock while busy (MHz), the highest power draw (W) and the slowdown reasons the driver
#: reported (comma-separated, ``""`` none); None without ``--gpu-trace`` or ``nvidia-smi``.
GPU_TRACE_COLUMNS: tuple[str, ...] = ("gpu_sm_mhz_min", "gpu_power_w_max", "gpu_slowdowns")
#: Numerics (tflabench.numerics): ``numerics_err`` the max-normalised error of the tensor
#: that decides the verdict (largest error / budget), ``numerics_worst`` its name,
#: ``numerics_budget`` its budget, ``numerics_relf`` its relative Frobenius error,
#: ``numerics_nonfinite`` NaN/inf count where the reference is finite (all tensors),
#: ``numerics_detail`` JSON tensor -> [max_norm, rel_fro, budget, nonfinite] (plus the
#: normaliser, e.g. ``vs summand scale ...``, for a tensor not judged against its own max:
#: the mLSTM df), ``numerics_ref`` the reference and shape (``; df vs summand scale`` where
#: that applies), ``tf32`` (float32 rows) yes / no / unknown:
#: whether the kernel's dots used TF32.
NUMERICS_COLUMNS: tuple[str, ...] = (
    "numerics_err", "numerics_ref", "numerics_worst", "numerics_budget", "numerics_relf",
    "numerics_nonfinite", "numerics_detail", "tf32",
)
#: ``run --profile``: ``kernel_profile``, JSON text (None without ``--profile``): the time
#: of every kernel the case launched, per step, from torch's profiler; its form is
#: :func:`tflabench.run.kernel_profile.parse_profile`'s (``docs/ARCHITECTURE.md``).
PROFILE_COLUMNS: tuple[str, ...] = ("kernel_profile",)
MODEL_COLUMNS: tuple[str, ...] = (
    "flops",
    "bytes",
    "intensity_flop_per_byte",
    "tflops_per_s",
    "roofline_ms",
    "roofline_fraction",
)
#: Columns every row written by tflabench holds (identity columns added later excepted).
REQUIRED_COLUMNS: tuple[str, ...] = tuple(
    c for c in IDENTITY_COLUMNS if c not in OPTIONAL_IDENTITY_COLUMNS) + ("status",)
#: Columns that are never null in a row (what a resume and compare match and check on).
NON_NULL_COLUMNS: tuple[str, ...] = ("case_id", "suite", "kernel", "backend", "mode", "dtype", "device", "status")
#: Every column of a row, in the order they are written.
COLUMNS: tuple[str, ...] = (
    IDENTITY_COLUMNS
    + OUTCOME_COLUMNS
    + TIMING_COLUMNS
    + MEMORY_COLUMNS
    + NUMERICS_COLUMNS
    + MODEL_COLUMNS
    + DEVICE_COLUMNS
    + GPU_TRACE_COLUMNS
    + PROFILE_COLUMNS
)
#: Columns that hold text (or JSON text) once loaded into a DataFrame.
TEXT_COLUMNS: tuple[str, ...] = (
    "case_id", "suite", "kernel", "backend", "family", "params", "mode", "dtype", "device",
    "status", "reason", "algorithm", "ms_samples", "numerics_ref", "numerics_case", "numerics_worst",
    "numerics_detail", "tf32", "gpu_index", "gpu_name", "gpu_slowdowns", "kernel_profile",
)
#: Columns that are numbers (NaN where not applicable): every other column, in order.
NUMERIC_COLUMNS: tuple[str, ...] = tuple(c for c in COLUMNS if c not in TEXT_COLUMNS)
#: Row statuses. ``ok``: measured; ``wrong``: the numerics gate failed (no timings);
#: ``crash``: the worker process died (segfault, abort); ``timeout``: past the case's
#: timeout; ``oom``: out of device memory; ``error``: the kernel raised; ``unavailable``:
#: the backend or the mode cannot run here (reason says why and what to install);
#: ``not_run``: not attempted, because the run gave its kernel up after consecutive crashes
#: or timeouts (``--max-kernel-failures``); a ``--resume`` runs it.
STATUSES: tuple[str, ...] = ("ok", "wrong", "crash", "timeout", "oom", "error", "unavailable", "not_run")
#: The modes a row may hold (a suite's ``modes``: forward, forward and backward).
ROW_MODES: tuple[str, ...] = ("fwd", "fwdbw")
#: The status of a case recorded but never attempted (a resume runs it).
NOT_RUN = "not_run"
#: Keys of ``metadata.json``.
METADATA_KEYS: tuple[str, ...] = (
    "suite",
    "suite_path",
    "suite_sha256",
    "date",
    "git_revision",
    "sources_sha256",
    "hostname",
    "gpu_name",
    "gpu_count",
    "driver",
    "cuda",
    "torch",
    "triton",
    "python",
    "peers",
    "tflabench",
    "shard",
    "ceilings",
    "gpus_used",
)

#: The type of each ``metadata.json`` key that tflabench reads (None is allowed for all): a
#: value of another type means the file was edited or damaged, and :func:`tflabench.store.results.read_metadata`
#: refuses it rather than let a reader trip over it later.
METADATA_TYPES: dict[str, type | tuple[type, ...]] = {
    "suite": str, "suite_path": str, "suite_sha256": str, "date": str, "git_revision": str, "sources_sha256": str,
    "hostname": str, "gpu_name": str, "gpu_count": int, "driver": str, "cuda": str, "torch": str,
    "triton": str, "python": str, "cpu": str, "peers": dict, "tflabench": str, "shard": str,
    "ceilings": dict, "device": str, "gpus": list, "compare": dict, "only": list, "measurement": dict,
    "resumed": list, "merged_from": list, "shards_missing": list, "shards_incomplete": list,
    "case_ids": list, "git_commit_date": str,
}

#: Fields of a ``measurement``'s ``timing`` / ``numerics`` (``metadata.json``) that do not
#: change what ``run`` measures: the time limit of a case, and the grid of ``tflabench
#: verify`` (``numerics.verify``), which ``run`` does not use. ``--resume`` lets them change;
#: ``compare`` does not call two runs timed differently for them.
LIMIT_FIELDS: frozenset[str] = frozenset({"timeout_s", "verify"})

#: fields of a suite's ``timing`` added after result sets were first written, with the value
#: a set that does not record one was timed with (read so by :func:`recorded_timing` and
#: ``resume.differences``)
TIMING_DEFAULTS: dict = {"warmup_s": 0.0, "cuda_graph": False}
#: The JSON type of each field of ``measurement.timing`` that tflabench reads (the suite's
#: ``timing``, ``tflabench.store.suite.Timing``): :func:`metadata_problem` refuses another.
TIMING_FIELD_TYPES: dict[str, type] = {
    "warmup": float, "iterations": float, "timeout_s": float, "warmup_s": float,
    "flush_l2": bool, "sync_each": bool, "cuda_graph": bool,
}


def recorded_timing(metadata: Mapping[str, Any]) -> dict:
    """``metadata.json``'s ``measurement.timing`` (the suite's ``timing`` a set was measured
    with), a field the set predates read as :data:`TIMING_DEFAULTS`; {} where the set has
    no timing record."""
    measurement = metadata.get("measurement") if isinstance(metadata, Mapping) else None
    timing = measurement.get("timing") if isinstance(measurement, Mapping) else None
    return {**TIMING_DEFAULTS, **timing} if isinstance(timing, Mapping) else {}



# --------------------------------------------------------------------------- rows


def params_json(params: Mapping[str, Any]) -> str:
    """The canonical JSON text of a parameter dict (sorted keys, compact): the ``params`` column."""
    return json.dumps(dict(params), sort_keys=True, separators=(",", ":"), default=str)


def case_id(identity: Mapping[str, Any]) -> str:
    """Stable 16-hex-digit hash of a case's identity columns (all of
    :data:`IDENTITY_COLUMNS` except ``case_id``; ``params`` may be a dict or its JSON text).

    The same case in two runs (or two shards) has the same id; ``--resume``, ``compare``
    and ``merge`` match rows by it. Missing identity keys count as None.
    """
    parts = {}
    for col in IDENTITY_COLUMNS[1:]:
        value = identity.get(col)
        if col == "params" and isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                pass
        if col == "params" and isinstance(value, Mapping):
            value = params_json(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, float) and math.isnan(value):
            value = None
        if value is None and col in OPTIONAL_IDENTITY_COLUMNS:
            continue
        parts[col] = value
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def new_row(**identity: Any) -> dict:
    """A complete row: the identity columns given (``params`` as dict or JSON text), every
    other column None, ``case_id`` computed. Unknown keys raise ValueError.
    """
    unknown = set(identity) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown result columns: {sorted(unknown)}")
    row = {col: None for col in COLUMNS}
    row.update(identity)
    if isinstance(row["params"], Mapping):
        row["params"] = params_json(row["params"])
    row["case_id"] = case_id(row)
    return row


def complete_row(row: Mapping[str, Any]) -> dict:
    """``row`` with every column of :data:`COLUMNS` present (missing ones None), in order;
    ``case_id`` filled when absent. Extra keys raise ValueError."""
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown result columns: {sorted(unknown)}")
    out = {col: row.get(col) for col in COLUMNS}
    if isinstance(out["params"], Mapping):
        out["params"] = params_json(out["params"])
    if isinstance(out["ms_samples"], (list, tuple)):
        out["ms_samples"] = json.dumps([float(x) for x in out["ms_samples"]])
    if isinstance(out["kernel_profile"], Mapping):
        out["kernel_profile"] = json.dumps(out["kernel_profile"], sort_keys=True)
    if isinstance(out["gpu_index"], float) and math.isnan(out["gpu_index"]):
        out["gpu_index"] = None
    elif out["gpu_index"] is not None and not isinstance(out["gpu_index"], str):
        out["gpu_index"] = str(out["gpu_index"])  # an index given as a number
    if not out["case_id"]:
        out["case_id"] = case_id(out)
    return out


def fill_model_columns(
    row: dict, flops_per_s: float | None = None, bytes_per_s: float | None = None
) -> dict:
    """Fill the derived model columns of ``row`` in place (and return it).

    From ``flops`` and ``bytes`` (analytic counts, set by the backend):
    ``intensity_flop_per_byte = flops / bytes``; with ``ms_median``:
    ``tflops_per_s = flops / (ms_median * 1e-3) / 1e12``; with the ceilings
    ``flops_per_s`` (FLOP/s) and ``bytes_per_s`` (byte/s): the roofline bound
    ``roofline_ms = max(flops / flops_per_s, bytes / bytes_per_s) * 1e3`` (the paper's
    runtime model, App. G eq. 112) and ``roofline_fraction = roofline_ms / ms_median``.
    Columns whose inputs are missing stay None. The arithmetic is
    :func:`tflabench.model.place_on_roofline`'s.
    """
    flops, nbytes, ms = number(row.get("flops")), number(row.get("bytes")), number(row.get("ms_median"))
    if flops is None:
        return row
    placed = place_on_roofline(flops, nbytes, ms, peak_flops_per_s=flops_per_s, beta=bytes_per_s)
    for column, key, scale in (("intensity_flop_per_byte", "intensity_flop_per_byte", 1.0),
                               ("tflops_per_s", "achieved_flops_per_s", 1e-12),
                               ("roofline_ms", "roofline_ms", 1.0), ("roofline_fraction", "fraction", 1.0)):
        if key in placed:
            row[column] = placed[key] * scale
    return row


def number(value: Any) -> float | None:
    """A cell of a result row as a float; None when it is missing, not a number, NaN or
    +-inf. The one parser of numeric cells (rows come from JSON, pandas or CSV): a
    non-finite value is never a measurement or a count (rows store NaN and inf as null),
    so a quantity derived from one stays empty rather than becoming inf or NaN."""
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def chunk_size_ran(row: Mapping[str, Any]) -> float | None:
    """The chunk size (tokens) a row ran: its ``chunk_size_run``; in a set that predates that
    column, its ``chunk_size`` (where those sets wrote the size an ``auto`` case ran); None
    for a kernel without chunks. The one reader of the size that ran (tables, figures, the
    model's counts of a row)."""
    ran = number(row.get("chunk_size_run"))
    return ran if ran is not None else number(row.get("chunk_size"))


def row_params(row: Mapping[str, Any]) -> dict:
    """A row's ``params`` column as a dict (JSON text or a dict); {} where it is missing or
    not a JSON object. The raw values as written (:func:`params_json`), not validated: a
    backend's typed ``Params`` of a row are :func:`tflabench.backends.params_of_row`'s."""
    value = row.get("params")
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return {}
    return dict(value) if isinstance(value, Mapping) else {}



def rows_frame(rows: Iterable[Mapping[str, Any]]):
    """A pandas DataFrame of ``rows`` with exactly :data:`COLUMNS` and numeric columns as
    float64 (NaN where not applicable)."""
    import pandas as pd

    frame = pd.DataFrame([complete_row(r) for r in rows], columns=list(COLUMNS))
    return normalise_frame(frame)


def normalise_frame(frame):
    """``frame`` (rows read from a table or built from dicts) with exactly :data:`COLUMNS`, in
    order (missing ones None), numeric columns as float64 (NaN where not applicable) and text
    columns as objects (None where empty)."""
    import pandas as pd

    for col in COLUMNS:
        if col not in frame.columns:
            frame[col] = None
    frame = frame[list(COLUMNS)].copy()
    for col in NUMERIC_COLUMNS:
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
    for col in TEXT_COLUMNS:
        frame[col] = frame[col].astype(object).where(frame[col].notna(), None)
    return frame.reset_index(drop=True)



# --------------------------------------------------------------------------- checks


def row_problem(row: Mapping[str, Any]) -> str | None:
    """Why ``row`` (one parsed line of ``rows.jsonl``) is not a result row, or None: a key
    that is not a column, an identity column or ``status`` missing (every row is written
    whole), one of :data:`NON_NULL_COLUMNS` null, a text column holding something else than text, a numeric column holding
    something else than a (finite) number, an unknown ``status`` or ``mode`` (:data:`ROW_MODES`)."""
    for key in REQUIRED_COLUMNS:
        if key not in row:
            return f"lacks the field {key!r}, which every result row has"
        if row[key] is None and key in NON_NULL_COLUMNS:
            return f"has no value for {key!r}, which every result row has"
    for key, value in row.items():
        if key not in COLUMNS:
            return f"has the field {str(key)[:60]!r}, which is not a result column"
        if value is None:
            continue
        if key == "ms_samples" and isinstance(value, list):
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) or x is None for x in value):
                return "has ms_samples that are not all numbers"
            if not all(x is None or math.isfinite(x) for x in value):
                return "has ms_samples that are not all finite numbers"
        elif key == "params" and isinstance(value, dict):
            continue
        elif key in TEXT_COLUMNS:
            if not isinstance(value, str):
                return f"has {key} = {str(value)[:40]!r}, not text"
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"has {key} = {str(value)[:40]!r}, not a number"
        elif isinstance(value, int) and abs(value) > 2**63:
            return f"has {key} = {str(value)[:40]}, out of range"
        elif isinstance(value, float) and not math.isfinite(value):
            return f"has {key} = {value}, not a finite number (tflabench writes null where there is none)"
    status = row.get("status")
    if status is not None and status not in STATUSES:
        return f"has status {str(status)[:40]!r}, not one of {', '.join(STATUSES)}"
    mode = row.get("mode")
    if mode is not None and mode not in ROW_MODES:
        return f"has mode {str(mode)[:40]!r}, not one of {', '.join(ROW_MODES)}"
    return None



def metadata_problem(metadata: Any) -> str | None:
    """Why ``metadata`` (parsed ``metadata.json``) cannot be read as a result set's
    metadata, or None: not a JSON object, or a key of :data:`METADATA_TYPES` holding a
    value of another type."""
    if not isinstance(metadata, dict):
        return f"{_json_type(metadata)}, not an object"
    for key, kind in METADATA_TYPES.items():
        value = metadata.get(key)
        if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            return f"{key!r} is {_json_type(value)}, not {_json_type(kind)}"
    timing = (metadata.get("measurement") or {}).get("timing")  # not an object: resume.measurement_problem
    for field, value in (timing if isinstance(timing, dict) else {}).items():
        kind = TIMING_FIELD_TYPES.get(field)
        if kind is bool and value is not None and not isinstance(value, bool):
            return f"'measurement.timing.{field}' is {_json_type(value)}, not a boolean"
        if kind is float and value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                                    or not math.isfinite(value)):
            return f"'measurement.timing.{field}' is {_json_type(value)}, not a finite number"
    for key in ("shards_incomplete",):  # read field by field by compare (merged_from, resumed: as given)
        for n, item in enumerate(metadata.get(key) or ()):
            if not isinstance(item, dict):
                return f"'{key}[{n}]' is {_json_type(item)}, not an object"
            for field in ("cases_missing", "cases_expected"):
                value = item.get(field)
                if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                    return f"'{key}[{n}].{field}' is {_json_type(value)}, not an integer"
    return None


def _json_type(value: Any) -> str:
    """The JSON name of a value's type (or of a Python type) with its article: an object,
    an array, a string..."""
    kind = value if isinstance(value, type) else type(value)
    names = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number",
             bool: "a boolean", type(None): "null"}
    return names.get(kind, f"a {kind.__name__}")

