"""Checks of the analytic commands' options (``flops``, ``roofline``, ``intensity``,
``optimal-chunk``, ``gpus``): each bad value becomes one :class:`~tflabench.errors.UserError`
line that names the option, says what is wrong and what is allowed.
"""

from __future__ import annotations

import math

from tflabench.errors import UserError
from tflabench.hardware import get_gpu


#: An example value of each list option, for its error message.
EXAMPLES = {"--state-bytes": "4,2", "--causal-factor": "0.5,0.66,1", "--dhv": "256,512", "--chunk-size": "64,128,256"}


def parse_list(name: str, text, kind=float) -> list:
    """``'64,128,256'`` (or a list of such strings) -> ``[64, 128, 256]``; ``kind`` int
    refuses non-integers. Raises UserError naming option ``name`` for a bad item or an
    empty list."""
    if isinstance(text, (list, tuple)):
        items = [str(t) for t in text]
        items = [p for t in items for p in t.split(",")]
    else:
        items = str(text).split(",")
    out = []
    for raw in items:
        raw = raw.strip()
        if not raw:
            continue
        try:
            v = float(raw)
            if kind is int:
                if not v.is_integer():
                    raise ValueError
                v = int(v)
        except ValueError:
            what = "integers" if kind is int else "numbers"
            raise UserError(f"{name}={text!r} is not valid; give comma-separated {what}, "
                            f"e.g. {EXAMPLES.get(name, '64,128,256')}") from None
        out.append(v)
    if not out:
        raise UserError(f"{name}={text!r} is empty; give at least one value")
    return out


def positive(name: str, value):
    """``value`` when it is a positive finite number; else UserError naming ``name``."""
    if value is None or not (value > 0) or (isinstance(value, float) and not math.isfinite(value)):
        raise UserError(f"{name}={value!r} is not valid; it must be a positive number")
    return value


def one_of(name: str, value: str, allowed) -> str:
    """``value`` lower-cased when it is one of ``allowed``; else UserError listing them."""
    v = str(value).lower()
    if v not in allowed:
        raise UserError(f"{name}={value!r} is not valid; allowed: {'|'.join(allowed)}")
    return v


def dqk_pqk(d_hv, dqk, pqk) -> tuple[float, float]:
    """``(d_qk, p_qk)`` from ``--dqk`` or ``--pqk`` (p_qk = d_qk / d_hv, default 0.5, the
    paper's). Raises UserError for both given, or a non-positive value."""
    if dqk is not None and pqk is not None:
        raise UserError("--dqk and --pqk given together; give one (p_qk = d_qk / d_hv)")
    if dqk is not None:
        positive("--dqk", dqk)
        return dqk, dqk / d_hv
    p = 0.5 if pqk is None else pqk
    if not (p > 0):
        raise UserError(f"--pqk={pqk!r} is not valid; p_qk must be > 0")
    return p * d_hv, p


def causal(value) -> float:
    """``--causal-factor``: F_causal in [0.5, 1] (the fraction of each L x L matrix computed)."""
    if not (0.5 <= value <= 1.0):
        raise UserError(f"--causal-factor={value!r} is not valid; F_causal must lie in [0.5, 1]")
    return value


def chunk_at_most(L, S) -> None:
    """UserError unless the chunk size ``L`` satisfies ``1 <= L <= S``."""
    if L > S:
        raise UserError(f"--chunk-size={L} is not valid; it must satisfy 1 <= L <= S (S={S})")


def counted_shape(formulation: str, mode: str, L: int, S: int, pad: bool) -> None:
    """``flops``: UserError unless chunk size ``L`` fits the sequence ``S`` (chunkwise: L <= S,
    and L divides S unless ``pad``) and ``mode`` fwdbw comes with the chunkwise formulation."""
    if formulation == "chunkwise":
        chunk_at_most(L, S)
        if S % L and not pad:
            raise UserError(f"--chunk-size={L} does not divide --seq-len={S}; choose L dividing S or pass --pad")
    if mode == "fwdbw" and formulation != "chunkwise":
        raise UserError(f"--mode=fwdbw is modelled for --formulation chunkwise only (got {formulation})")


def gpus(names, ceilings: str, hardware):
    """The catalogue GPUs named (``--gpu``'s items) with ``--ceilings`` auto, datasheet or
    measured (:func:`tflabench.hardware.get_gpu`; ``hardware``: a user YAML or None).

    One ceilings source for all of them: ``auto`` takes the measured ceilings only where
    every GPU named has them, else every GPU's datasheet ceilings, so that two GPUs in one
    figure or table are compared like for like (a measured roof is lower than a datasheet
    one: mixing them would draw the H200 below the H100).

    Raises:
        UserError: an unknown GPU, bad ``ceilings``, a GPU without the ceilings asked for.
    """
    one_of("--ceilings", ceilings, ("auto", "datasheet", "measured"))
    chosen = [get_gpu(n, ceilings=ceilings, hardware_file=hardware) for n in names]
    if ceilings == "auto" and len({g.ceilings for g in chosen}) > 1:
        chosen = [get_gpu(n, ceilings="datasheet", hardware_file=hardware) for n in names]
    return chosen


def ceilings_text(gpus) -> str:
    """What a title or legend says of the ceilings of ``gpus``: ``datasheet ceilings``,
    ``measured ceilings``, or each GPU's where they differ (``--ceilings`` measured with a
    GPU that has none is refused before)."""
    sources = list(dict.fromkeys(g.ceilings for g in gpus))
    if len(sources) == 1:
        return f"{sources[0]} ceilings"
    return "ceilings " + ", ".join(f"{g.key} {g.ceilings}" for g in gpus)


def state_bytes(value) -> float:
    """``--state-bytes``: 4 (fp32 states) or 2 (bf16 states), the two the kernels store
    (paper App. F, bytes_Cmn). Raises UserError for any other value."""
    if value not in (2, 4):
        raise UserError(f"--state-bytes={value:g} is not valid; allowed: 4 (fp32 states) or 2 (bf16 states)")
    return value


__all__ = ["causal", "ceilings_text", "chunk_at_most", "counted_shape", "dqk_pqk", "gpus", "one_of", "parse_list", "positive", "state_bytes"]
