"""The limits of every number a user gives (suite fields, thresholds, options), the
validator that enforces them, and the rule for lists that sweep (:func:`axis_problem`).

A number outside its range fails when the file or option is read, with one line naming
the field, the value and the range, instead of later: a ``timeout_s`` of ``.inf`` or
``1e12`` overflowed the worker's deadline at the first case, a ``seed`` of 2**64 + 1 failed
every case, a ``tolerance`` of ``.inf`` passed every output, a ``min_samples`` of ``.nan``
crashed ``compare``. Floats must be finite everywhere. The limits are generous: they stop
typos and values that would switch a check off, not unusual measurements.

Import-light: pydantic only.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator

#: Wall-clock limit of one case (seconds): at most a week.
MAX_TIMEOUT_S = 7 * 24 * 3600.0
#: Seeds of ``torch.Generator``: 0 .. 2**63 - 1 (the harness adds small offsets).
MAX_SEED = 2**63 - 1
#: Timed and warm-up calls per case.
MAX_ITERATIONS = 100_000
#: Sweep axes: sequence length, batch, tokens, embedding dimension.
MAX_SEQ_LEN = 2**24
MAX_BATCH = 2**20
MAX_TOKENS = 2**40
MAX_EMBEDDING_DIM = 2**20
#: Any number among a kernel's ``params`` (head counts, head dimensions, chunk sizes, eps).
MAX_KERNEL_PARAM = 2**24
#: Largest accepted max-normalised error (``numerics.tolerance``, ``numerics.budgets``):
#: an error half as large as the reference's largest value. More would pass outputs that
#: are plainly wrong (an output of zeros has error 1); ``numerics.check: false`` skips the
#: gate on purpose.
MAX_BUDGET = 0.5
#: Default and largest ``max_cases`` of a suite (how many cases it may expand to).
DEFAULT_MAX_CASES = 10_000
MAX_MAX_CASES = 10_000_000
#: Number of shards of ``--shard K/N``.
MAX_SHARDS = 10_000

#: ``tflabench compare`` thresholds: name -> (lowest, highest, lowest excluded, highest
#: excluded, integer). Shared by a suite's ``compare:`` section, a thresholds file and the
#: options.
THRESHOLD_RANGES: dict[str, tuple[float, float, bool, bool, bool]] = {
    "time_threshold": (0.0, 10.0, False, True, False),
    "alpha": (0.0, 1.0, True, True, False),
    "min_samples": (2, 1_000_000, False, False, True),
    "mem_threshold": (0.0, 10.0, False, True, False),
    "mem_floor_bytes": (0, 2**50, False, False, True),
}


def range_text(lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> str:
    """``[lo, hi]`` with ``(`` / ``)`` for an excluded end."""

    def show(x: float) -> str:
        return f"{x:g}" if isinstance(x, float) else str(x)

    return f"{'(' if lo_open else '['}{show(lo)}, {show(hi)}{')' if hi_open else ']'}"


def check_number(value: Any, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False,
                 integer: bool = False) -> str | None:
    """None when ``value`` is a number (an integer when ``integer``; never a bool) that is
    finite and inside the range, else the reason, naming the range, e.g.
    ``must be a finite number in (0, 604800] (got inf)``."""
    kind = "an integer" if integer else "a finite number"
    what = f"must be {kind} in {range_text(lo, hi, lo_open, hi_open)} (got {value!r})"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return what
    if integer and not isinstance(value, int):
        if not (isinstance(value, float) and math.isfinite(value) and value.is_integer()):
            return what
        value = int(value)
    if isinstance(value, float) and not math.isfinite(value):
        return what
    if value < lo or value > hi or (lo_open and value == lo) or (hi_open and value == hi):
        return what
    return None


def in_range(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False,
             integer: bool = False) -> AfterValidator:
    """A pydantic validator (``Annotated[float, in_range(0, 10)]``) raising ValueError with
    :func:`check_number`'s reason; None passes (optional fields)."""

    def check(value):
        if value is None:
            return value
        reason = check_number(value, lo, hi, lo_open=lo_open, hi_open=hi_open, integer=integer)
        if reason:
            raise ValueError(reason)
        return value

    return AfterValidator(check)


def Int(lo: int, hi: int) -> Any:
    """``int`` limited to ``[lo, hi]``."""
    return Annotated[int, in_range(lo, hi, integer=True)]


def Float(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> Any:
    """A finite ``float`` limited to the range."""
    return Annotated[float, in_range(lo, hi, lo_open=lo_open, hi_open=hi_open)]


def axis_problem(values: list) -> str | None:
    """Why a list of sweep values cannot be an axis, or None: an empty list gives no case,
    a value given twice would measure one case twice."""
    if not values:
        return "an empty list gives no case; give at least one value"
    first: dict = {}  # (type, value) -> its first index: linear in the list's length
    for n, value in enumerate(values):
        try:
            m = first.setdefault((type(value), value), n)
        except TypeError:  # an unhashable value (a list, a mapping): compared one by one
            m = next((m for m in range(n) if values[m] == value and type(values[m]) is type(value)), n)
        if m != n:
            return f"{value!r} is given twice (at [{m}] and [{n}]); each value is one case, give it once"
    return None
