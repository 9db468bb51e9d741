"""Overrides of the kernels' tuning rules (docs/kernels.md, "Tuning rules"), for benchmarks
and tests: one frozen :class:`Tuning`.

The default, ``Tuning()``, overrides nothing: every configuration function then applies its
measured rule. A call takes the tuning active when the public function runs
(:func:`use_tuning`, default ``Tuning()``) into its kernel configuration
(``chunkwise.Config.tuning``), which carries it to every launch of the forward and of the
backward; the configuration functions (``state_blocks``, ``fw_config``, ``bw_config``,
``limit_bw_config``, ``walk_config``) take it as their ``tuning`` argument. Being frozen and
hashable, a Tuning can key a cache.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["Tuning", "Overrides", "DEFAULT", "active_tuning", "use_tuning", "tuning_key",
           "tuning_of"]


class Overrides(Mapping):
    """A read-only, hashable mapping of a kernel family's configuration keys to the values
    that replace its rule's (any mapping converts)."""

    __slots__ = ("_items", "_dict")

    def __init__(self, items: Mapping[str, Any] | None = None):
        self._items = tuple(sorted(dict(items or {}).items()))
        self._dict = dict(self._items)

    def __getitem__(self, key: str) -> Any:
        return self._dict[key]

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` or ``default`` (a dictionary look-up: the launchers ask on
        every call, docs/kernels.md "Host time")."""
        return self._dict.get(key, default)

    def __contains__(self, key) -> bool:
        return key in self._dict

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return repr(dict(self._items))


#: the keys each family takes (the names of its configuration's entries); docs/kernels.md,
#: "Overriding the rules", says what each replaces
KEYS = {
    # both state kernels (forward and backward): blocks, warps, stages, the SM bound of the
    # block halving, positions per tl.dot; forward only: ACC_IN_C, USE_TMA, SCALE_V
    "state": ("B_DQK", "B_DHV", "num_warps", "num_stages", "MIN_PROGRAMS", "PIECE", "ACC_IN_C",
              "USE_TMA", "SCALE_V"),
    # the state-gradient kernel only (win over "state")
    "state_bw": ("B_DQK", "B_DHV", "num_warps", "num_stages", "USE_TMA", "SCALE_DH"),
    # the H kernel of xl_chunk / of limit_chunk (whose query and key tiles stay the chunk);
    # GLUON: xl_chunk's in Gluon where rule H8 holds
    "fw": ("B_LQ", "B_LKV", "B_DQK", "B_DHV", "num_warps", "num_stages", "USE_TMA",
           "INTER_IN_LOOP", "GLUON"),
    "fw_limit": ("B_DQK", "B_DHV", "num_warps", "num_stages", "USE_TMA", "INTER_IN_LOOP"),
    # xl_chunk's dQ / dK / dV kernels; FUSED_DKV: dK and dV in one launch, its tiles DKV_*;
    # ONCE_DKV: one dK and one dV program per key/value tile (its tiles DKV_*, head blocks
    # DKV_B_DQK / DKV_B_DHV); ONCE_DQ: one dQ program per query tile; GLUON: that dQ program
    # and the one-launch dK/dV in Gluon where rules B12, B13 hold;
    # FUSED: limit_chunk's one-program-per-chunk kernel instead
    "bw": ("B_LQ", "B_LKV", "B_DQK", "B_DHV", "num_warps", "num_stages", "USE_TMA", "FUSED_DKV",
           "DKV_B_LQ", "DKV_B_LKV", "DKV_B_DQK", "DKV_B_DHV", "DKV_num_warps", "DKV_num_stages",
           "FUSED", "ONCE_DKV", "ONCE_DQ", "GLUON"),
    # limit_chunk's backward kernel (also xl_chunk's with bw FUSED)
    "limit_bw": ("B_DQK", "B_DHV", "num_warps", "num_stages"),
    # mLSTMsig's forward walk; enabled False: never walk; train False: not as the forward of
    # calls with gradients (where it stores the chunk states for the backward); SEGMENTS: the
    # number of sequence segments (1: none), whatever the grid; MIN_PROGRAMS_PER_SM: the grid
    # from which the whole sequence is one segment; SEGMENT_TARGET_PER_SM: the grid segments
    # aim at; SEGMENT_SPLIT, SEGMENT_B_DHV, SEGMENT_STAGES, SEGMENT_PROGRAMS_PER_SM: the
    # segment-state pass's sub-segments, d_hv block, pipeline stages and grid bound
    "walk": ("enabled", "train", "B_DHV", "num_warps", "num_stages", "maxnreg",
             "MIN_PROGRAMS_PER_SM", "SEGMENT_TARGET_PER_SM", "SEGMENTS", "SEGMENT_SPLIT",
             "SEGMENT_B_DHV", "SEGMENT_STAGES", "SEGMENT_PROGRAMS_PER_SM"),
}


@dataclass(frozen=True)
class Tuning:
    """Overrides of the tuning rules, one field per kernel family (a mapping of configuration
    keys to values, :data:`KEYS`); an empty field keeps that family's rule.

    ``recompute_states``: the backward reruns the gate and state kernels (as the peer does)
    instead of keeping the chunk states and gate vectors from the forward (rule B1: keeping
    them is the default).

    Raises:
        ValueError: a key that its family does not take (names the family and the keys it
            takes).
    """

    state: Mapping[str, Any] = field(default_factory=Overrides)
    state_bw: Mapping[str, Any] = field(default_factory=Overrides)
    fw: Mapping[str, Any] = field(default_factory=Overrides)
    fw_limit: Mapping[str, Any] = field(default_factory=Overrides)
    bw: Mapping[str, Any] = field(default_factory=Overrides)
    limit_bw: Mapping[str, Any] = field(default_factory=Overrides)
    walk: Mapping[str, Any] = field(default_factory=Overrides)
    recompute_states: bool = False

    def __post_init__(self):
        for f in fields(self):
            if f.name not in KEYS:
                continue
            over = Overrides(getattr(self, f.name))
            unknown = sorted(set(over) - set(KEYS[f.name]))
            if unknown:
                raise ValueError(f"Tuning.{f.name}: got key(s) {', '.join(map(repr, unknown))}; "
                                 f"allowed: {', '.join(KEYS[f.name])}")
            object.__setattr__(self, f.name, over)
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f.name) for f in fields(self))))

    def __hash__(self) -> int:
        # worked out once: a Tuning keys the launchers' caches on every call
        return self._hash


#: no overrides: every rule as documented
DEFAULT = Tuning()

_ACTIVE: contextvars.ContextVar[Tuning] = contextvars.ContextVar("tfla_tuning", default=DEFAULT)


def active_tuning() -> Tuning:
    """The Tuning that calls of the public functions take now (``DEFAULT`` outside
    :func:`use_tuning`)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def use_tuning(tuning: Tuning) -> Iterator[Tuning]:
    """Calls of ``tfla.mlstm_sig`` / ``tfla.mlstm_exp`` (and ``tfla.plan``) inside the block
    run with ``tuning``; their backward keeps it, wherever it runs. Nests; restores the
    previous Tuning on exit.

    Raises:
        TypeError: ``tuning`` is not a :class:`Tuning`.
    """
    if not isinstance(tuning, Tuning):
        raise TypeError(f"use_tuning: got {type(tuning).__name__}; expected tfla.triton.tuning.Tuning")
    token = _ACTIVE.set(tuning)
    try:
        yield tuning
    finally:
        _ACTIVE.reset(token)


#: every Tuning a call has taken, by its key (:func:`tuning_key`); DEFAULT is key 0
_BY_KEY: list[Tuning] = [DEFAULT]
_KEYS: dict[Tuning, int] = {DEFAULT: 0}


def tuning_key() -> int:
    """The active Tuning as a plain int (0: ``DEFAULT``), the form in which the registered
    operators (``tfla.ops``) carry it from a call to its backward: an operator's arguments
    are tensors and plain scalars. The same Tuning always has the same key.
    """
    tuning = _ACTIVE.get()
    key = _KEYS.get(tuning)
    if key is None:
        key = _KEYS[tuning] = len(_BY_KEY)
        _BY_KEY.append(tuning)
    return key


def tuning_of(key: int) -> Tuning:
    """The Tuning of a :func:`tuning_key` key.

    Raises:
        IndexError: a key that :func:`tuning_key` never gave.
    """
    return _BY_KEY[key]
