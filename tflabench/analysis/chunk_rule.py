"""How far ``chunk_size="auto"`` is from the best fixed chunk size, per shape and mode.

A result set whose suite runs one kernel at ``chunk_size: [auto, 64, 128, ...]``
(suites/chunk_rule_fit.yaml, suites/chunk_rule_heldout.yaml) holds, for each shape and
mode, one row that asked for ``auto`` and one row per fixed chunk size. :func:`auto_gaps`
pairs them: the best fixed chunk size (lowest median), auto's median, the chunk size auto
ran, and the gap ``auto / best - 1``. docs/kernels.md, "Chunk size": the rule is fit on one
matrix and checked on the other, and is to stay within :data:`GAP_LIMIT` of the best fixed
chunk size at every shape of both.
"""

from __future__ import annotations

import dataclasses

from tflabench.store.schema import chunk_size_ran, number, row_params

#: auto's allowed distance from the best fixed chunk size (0.05: within 5 %)
GAP_LIMIT = 0.05
#: The columns that name one shape and mode of one kernel (its label carries the head layout)
SHAPE_KEYS = ("kernel", "mode", "dtype", "batch", "seq_len", "heads", "d_qk", "d_hv")


@dataclasses.dataclass(frozen=True)
class AutoGap:
    """auto against the best fixed chunk size at one shape and mode.

    ``best_L`` and ``best_ms``: the fixed chunk size of the lowest median time (ms) and that
    time; ``auto_ms``: auto's median (ms); ``auto_L``: the chunk size auto ran (None where the
    set does not say); ``gap``: ``auto_ms / best_ms - 1`` (negative: auto faster);
    ``fixed``: every fixed chunk size measured with its median (ms), ascending;
    ``same_plan``: auto ran the best fixed chunk size with the same algorithm (the rows'
    ``algorithm``), so that its gap is the spread between two measurements of one
    configuration, not the rule's choice.
    """

    shape: dict
    best_L: int
    best_ms: float
    auto_ms: float
    auto_L: int | None
    gap: float
    fixed: tuple
    same_plan: bool = False

    @property
    def within(self) -> bool:
        """auto within :data:`GAP_LIMIT` of the best fixed chunk size."""
        return self.auto_ms <= self.best_ms * (1 + GAP_LIMIT)


def _positive(value) -> float | None:
    """A positive numeric cell (:func:`tflabench.store.schema.number`), else None."""
    value = number(value)
    return value if value is not None and value > 0 else None


def _shape_key(row) -> tuple:
    """The :data:`SHAPE_KEYS` of a row, sizes as ints (rows read through pandas hold floats)."""
    key = []
    for k in SHAPE_KEYS:
        size = None if k in ("kernel", "mode", "dtype") else number(row.get(k))
        key.append(row.get(k) if size is None else int(size))
    return tuple(key)


def auto_gaps(rows) -> list[AutoGap]:
    """Every shape and mode of ``rows`` (dicts of result rows, status ``ok`` only) measured
    at ``auto`` and at one fixed chunk size or more, ordered by kernel, mode, S and batch."""
    groups: dict[tuple, dict] = {}
    for row in rows:
        ms = _positive(row.get("ms_median"))
        asked = row_params(row).get("chunk_size")
        if row.get("status") != "ok" or ms is None or asked is None:
            continue
        group = groups.setdefault(_shape_key(row), {"auto": None, "fixed": {}, "algorithm": {}})
        if asked == "auto":
            ran = _positive(chunk_size_ran(row))
            group["auto"] = (ms, None if ran is None else int(ran), row.get("algorithm"))
        elif isinstance(asked, int) and not isinstance(asked, bool):
            group["fixed"][asked] = ms
            group["algorithm"][asked] = row.get("algorithm")
    out = []
    for key, group in groups.items():
        if group["auto"] is None or not group["fixed"]:
            continue
        best_L = min(group["fixed"], key=lambda L: (group["fixed"][L], L))
        auto_ms, auto_L, auto_algorithm = group["auto"]
        same_plan = (auto_L == best_L and isinstance(auto_algorithm, str) and bool(auto_algorithm)
                     and auto_algorithm == group["algorithm"].get(best_L))
        out.append(AutoGap(shape=dict(zip(SHAPE_KEYS, key)), best_L=best_L, best_ms=group["fixed"][best_L],
                           auto_ms=auto_ms, auto_L=auto_L, gap=auto_ms / group["fixed"][best_L] - 1,
                           fixed=tuple(sorted(group["fixed"].items())), same_plan=same_plan))
    out.sort(key=lambda g: (str(g.shape["kernel"]), str(g.shape["mode"]), g.shape["seq_len"] or 0,
                            g.shape["batch"] or 0))
    return out


__all__ = ["AutoGap", "GAP_LIMIT", "SHAPE_KEYS", "auto_gaps"]
