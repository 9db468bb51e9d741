"""Shared pieces of the analytic model: the result type, F_OP factors, input checks.

Import-light on purpose (no torch, numpy or matplotlib): the analytic CLI starts cold in < 2 s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from tflabench.errors import UserError

VARIANTS = ("sig", "exp")
FORMULATIONS = ("chunkwise", "parallel", "recurrent")
COUNT_MODES = ("rows", "paper")
MODES = ("fwd", "fwdbw")


@dataclass(frozen=True)
class FOps:
    """FLOPs per elementwise exp, log, sigmoid, max, mask and abs (paper App. F, "F_OP").

    All 1 by default and in every figure of the paper. ``paper`` count mode requires all 1.
    """

    exp: float = 1.0
    log: float = 1.0
    sig: float = 1.0
    max: float = 1.0
    mask: float = 1.0
    abs: float = 1.0

    def all_one(self) -> bool:
        return all(getattr(self, f.name) == 1 for f in fields(self))

    def first_not_one(self) -> str | None:
        for f in fields(self):
            if getattr(self, f.name) != 1:
                return f"F_{f.name}={getattr(self, f.name)!r}"
        return None


@dataclass(frozen=True)
class Counts:
    """FLOP and byte counts of one kernel call (all heads and batch entries).

    Attributes:
        flops: total FLOPs of the call (a multiply-add is 2 FLOPs; paper App. F convention).
        bytes: total HBM bytes loaded + stored by the call.
        flop_rows: the FLOPs broken down by part (row names of the paper's tables where they
            apply), per call; their sum is ``flops``.
        byte_rows: the bytes broken down by kernel and direction, per call; sum is ``bytes``.
        matmul_flops: the part of ``flops`` done by matrix-matrix products (tensor cores), or
            None where the formulation has none (recurrent).
        notes: human-readable assumptions behind the numbers.
    """

    flops: float
    bytes: float
    flop_rows: dict = field(default_factory=dict)
    byte_rows: dict = field(default_factory=dict)
    matmul_flops: float | None = None
    notes: tuple = ()

    @property
    def intensity_flop_per_byte(self) -> float:
        """Arithmetic intensity FLOPs / bytes (paper eq. 117), FLOP/byte."""
        return self.flops / self.bytes if self.bytes else math.inf

    def __add__(self, other: "Counts") -> "Counts":
        rows = dict(self.flop_rows)
        for k, v in other.flop_rows.items():
            rows[k] = rows.get(k, 0.0) + v
        brows = dict(self.byte_rows)
        for k, v in other.byte_rows.items():
            brows[k] = brows.get(k, 0.0) + v
        if self.matmul_flops is None and other.matmul_flops is None:
            mm = None
        else:
            mm = (self.matmul_flops or 0.0) + (other.matmul_flops or 0.0)
        return Counts(
            flops=self.flops + other.flops,
            bytes=self.bytes + other.bytes,
            flop_rows=rows,
            byte_rows=brows,
            matmul_flops=mm,
            notes=tuple(self.notes) + tuple(n for n in other.notes if n not in self.notes),
        )

    def scaled(self, factor: float) -> "Counts":
        """All counts multiplied by ``factor`` (e.g. batch * heads)."""
        return Counts(
            flops=self.flops * factor,
            bytes=self.bytes * factor,
            flop_rows={k: v * factor for k, v in self.flop_rows.items()},
            byte_rows={k: v * factor for k, v in self.byte_rows.items()},
            matmul_flops=None if self.matmul_flops is None else self.matmul_flops * factor,
            notes=self.notes,
        )

    def as_dict(self) -> dict:
        """JSON-ready dict (flops, bytes, intensity_flop_per_byte, matmul_flops, rows, notes)."""
        return {
            "flops": self.flops,
            "bytes": self.bytes,
            "intensity_flop_per_byte": self.intensity_flop_per_byte,
            "matmul_flops": self.matmul_flops,
            "flop_rows": dict(self.flop_rows),
            "byte_rows": dict(self.byte_rows),
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------- checks (UserError, one line)


def check_choice(name: str, value, allowed) -> str:
    if value not in allowed:
        raise UserError(f"{name}={value!r} is not valid; allowed: {', '.join(map(str, allowed))}")
    return value


def check_positive(name: str, value) -> float:
    try:
        ok = value is not None and float(value) > 0 and math.isfinite(float(value))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise UserError(f"{name}={value!r} is not valid; it must be a positive finite number")
    return value


def check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        # accept integral floats (e.g. 8192.0)
        if isinstance(value, float) and value.is_integer() and value > 0:
            return int(value)
        raise UserError(f"{name}={value!r} is not valid; it must be a positive integer")
    return value


def check_causal(F_causal) -> float:
    try:
        ok = 0.5 <= float(F_causal) <= 1.0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise UserError(f"F_causal={F_causal!r} is not valid; it must lie in [0.5, 1]")
    return float(F_causal)


def resolve_d_qk(d_hv, d_qk=None, p_qk=None) -> float:
    """Return d_qk from exactly one of ``d_qk`` or ``p_qk`` (= d_qk / d_hv); default p_qk = 0.5.

    Raises:
        UserError: both given, or a non-positive value.
    """
    check_positive("d_hv", d_hv)
    if d_qk is not None and p_qk is not None:
        raise UserError("give d_qk or p_qk, not both (p_qk = d_qk / d_hv)")
    if d_qk is not None:
        check_positive("d_qk", d_qk)
        return d_qk
    if p_qk is None:
        p_qk = 0.5
    check_positive("p_qk", p_qk)
    return p_qk * d_hv


def n_chunks(S, L, chunks: str) -> float:
    """Number of chunks N_c for sequence length S and chunk size L.

    ``chunks``: ``"divide"`` (S % L == 0 required, N_c = S/L), ``"pad"`` (N_c = ceil(S/L), the
    padded chunks a kernel executes) or ``"real"`` (N_c = S/L as a real number, App. F/G).
    Source: docs/model-counts.md §2.1 (decision on N_c); paper Sec. 2.2 vs App. F (I8).

    Raises:
        UserError: L outside [1, S], or L not dividing S with ``chunks="divide"``.
    """
    check_positive("S", S)
    check_positive("L", L)
    if L < 1 or L > S:
        raise UserError(f"L={L!r} is not valid; the chunk size must satisfy 1 <= L <= S (S={S!r})")
    if chunks == "real":
        return S / L
    if chunks == "pad":
        return float(math.ceil(S / L - 1e-12))
    if chunks == "divide":
        q = S / L
        if abs(q - round(q)) > 1e-9:
            raise UserError(
                f"L={L!r} does not divide S={S!r}; choose L that divides S (or pad the sequence)"
            )
        return float(round(q))
    raise UserError(f"chunks={chunks!r} is not valid; allowed: divide, pad, real")
