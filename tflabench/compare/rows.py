"""The rows of two result sets as ``compare`` reads them: cells, statuses, samples, and the
key that matches a case of one set to the same case of the other.

Rows come from any result set, also one written by another tool or edited: every cell is
read through :func:`plain` (NaN and None alike, numpy scalars as Python's), a number that
is not one raises UserError naming the column (:func:`cell_number`, :func:`parse_samples`).
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

import numpy as np
import pandas as pd

from tflabench.errors import UserError

#: Statuses that mean the case ran and produced a timing.
OK = "ok"
#: Statuses that mean the case was attempted and failed (a *failure* when it was ``ok``).
FAILING = ("wrong", "crash", "timeout", "oom", "error")
#: The case could not be attempted here (backend not installed, mode unsupported).
UNAVAILABLE = "unavailable"
#: The run gave the case's kernel up before it (``--max-kernel-failures``): coverage lost.
NOT_RUN = "not_run"

#: Identity columns (docs/ARCHITECTURE.md); used to match when ``case_id`` is absent
#: and to describe a case.
IDENTITY_COLUMNS = (
    "kernel", "backend", "family", "params", "mode", "dtype", "device", "batch",
    "seq_len", "heads", "d_qk", "d_hv", "chunk_size", "embedding_dim", "numerics_case",
)


def parse_samples(value: Any) -> np.ndarray:
    """Per-iteration times (ms) of one row as a float array; empty when absent.

    Accepts the stored JSON list (``ms_samples`` column), a list/array, or None/NaN.
    Non-finite entries are dropped.
    """
    if value is None:
        return np.empty(0)
    if isinstance(value, float) and math.isnan(value):
        return np.empty(0)
    if isinstance(value, (bytes, str)):
        text = value.decode() if isinstance(value, bytes) else value
        if not text.strip():
            return np.empty(0)
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            raise UserError(f"corrupt table: ms_samples is not a JSON list: {text[:40]!r}") from None
    try:
        array = np.asarray(value, dtype=float).ravel()
    except (TypeError, ValueError):
        raise UserError(f"corrupt table: ms_samples is not a list of numbers: {str(value)[:40]!r}") from None
    return array[np.isfinite(array)]


def _key_series(rows: pd.DataFrame, label: str) -> pd.Series:
    """One matching key per row: ``case_id`` and ``mode`` where present, else the
    identity columns as canonical JSON."""
    if "case_id" in rows.columns and rows["case_id"].notna().all():
        mode = rows["mode"].astype(str) if "mode" in rows.columns else ""
        return rows["case_id"].astype(str) + "|" + mode
    present = [c for c in IDENTITY_COLUMNS if c in rows.columns]
    if "backend" not in present:
        raise UserError(f"corrupt table: {label} has neither a case_id nor a backend column")

    def encode(record: Mapping[str, Any]) -> str:
        return json.dumps({k: plain(record[k]) for k in present}, sort_keys=True, default=str)

    return pd.Series([encode(r) for r in rows[present].to_dict("records")], index=rows.index)


def plain(value: Any) -> Any:
    """A JSON-friendly scalar (NaN/None -> None, numpy -> python)."""
    if value is None:
        return None
    if isinstance(value, (float, np.floating)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    try:
        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    return value


def prepare(rows: pd.DataFrame, label: str, warnings: list[str]) -> pd.DataFrame:
    """``rows`` (a set's DataFrame) indexed by their matching key (``case_id`` and ``mode``,
    else the identity columns), the key also in column ``_key``; of a case held twice the
    last row is kept and ``warnings`` gets one line saying so (``label`` names the set).

    Raises:
        UserError: not a table, no ``status`` column, or no way to match.
    """
    if not isinstance(rows, pd.DataFrame):
        raise UserError(f"corrupt table: {label} rows are not a table")
    if "status" not in rows.columns:
        raise UserError(f"corrupt table: {label} has no 'status' column")
    rows = rows.copy()
    rows["_key"] = _key_series(rows, label)
    duplicated = rows["_key"].duplicated(keep="last")
    if duplicated.any():
        warnings.append(
            f"{label} holds {int(duplicated.sum())} repeated case row(s); the last of each is used "
            "(was the run resumed into the same directory?)"
        )
        rows = rows[~duplicated]
    return rows.set_index("_key", drop=False)


def cell_number(record: Mapping[str, Any], column: str) -> float:
    """``record[column]`` as a float, NaN where empty. Raises UserError where it holds
    something that is not a number (a corrupt table)."""
    value = plain(record.get(column))
    try:
        return float(value) if value is not None else float("nan")
    except (TypeError, ValueError):
        raise UserError(f"corrupt table: column {column!r} holds {value!r}, not a number") from None


def row_status(record: Mapping[str, Any] | None) -> str | None:
    """A row's ``status`` as text; None for no row or an empty status."""
    if record is None:
        return None
    value = plain(record.get("status"))
    return None if value is None else str(value)


def suite_name(metadata: Mapping[str, Any], rows: pd.DataFrame) -> str | None:
    """The suite a set ran: its metadata's ``suite``, else the one ``suite`` of its rows;
    None where neither says."""
    name = metadata.get("suite")
    if name:
        return str(name)
    if "suite" in rows.columns:
        names = rows["suite"].dropna().astype(str).unique()
        if len(names) == 1:
            return str(names[0])
    return None
