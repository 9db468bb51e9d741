"""The thresholds of ``tflabench compare``'s gate and where they come from: the defaults of
:class:`Thresholds`, the base set's ``compare:`` section (the suite YAML's, written into its
metadata), a ``--thresholds`` file, then the options (:func:`resolve_thresholds`); the
``--fail-on`` policy (:func:`parse_fail_on`, :data:`UNDECIDED_SHARE`); and the warning
about what the candidate set asked for and may not set (:func:`candidate_warnings`).
``alpha`` here is the significance level of the gate's tests.

Source: docs/ci.md, "How compare decides"; docs/compare-gate.md, "Who sets the gate".
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from tflabench.errors import UserError

FAIL_ON_CHOICES = ("regression", "failure", "undecided", "any", "none")

#: The share of the cases compared (ok on both sides) that may be undecided because their
#: samples cannot resolve the threshold before the default gate fails (docs/compare-gate.md, "Who sets the gate").
UNDECIDED_SHARE = 0.25


def parse_fail_on(text: str) -> frozenset[str]:
    """The outcome groups a ``--fail-on`` value fails on: a comma list of
    :data:`FAIL_ON_CHOICES` (``any`` = ``regression,failure`` and the undecided share of
    :data:`UNDECIDED_SHARE`, group ``share``; ``none``: nothing).

    Raises:
        UserError: an empty list or an unknown choice.
    """
    items = [item.strip().lower() for item in str(text).split(",") if item.strip()]
    if not items:
        raise UserError(f"--fail-on: empty; give one or more of {', '.join(FAIL_ON_CHOICES)}")
    groups: set[str] = set()
    for item in items:
        if item not in FAIL_ON_CHOICES:
            raise UserError(f"--fail-on: {item!r} is not one of {', '.join(FAIL_ON_CHOICES)} "
                            "(a comma list, e.g. regression,undecided)")
        groups |= {"any": {"regression", "failure", "share"}, "none": set()}.get(item, {item})
    return frozenset(groups)


@dataclass(frozen=True)
class Thresholds:
    """Decision thresholds of :func:`tflabench.compare.gate.compare_results` (docs/ci.md, "How compare decides").

    Attributes:
        time_threshold: smallest relative change of the median time that is reported
            (0.03 = 3 %); a slowdown must reach ``1 + t``, a speed-up ``1 / (1 + t)``.
        alpha: significance level of the two-sided Mann-Whitney U test on the
            per-iteration samples.
        min_samples: fewest samples per side for the test; below it the
            inter-quartile-range rule is used.
        mem_threshold: smallest relative change of ``peak_mem_bytes`` that is reported.
        mem_floor_bytes: smallest absolute change of ``peak_mem_bytes`` (bytes) that is
            reported (allocator rounding stays quiet).
    """

    time_threshold: float = 0.03
    alpha: float = 0.01
    min_samples: int = 5
    mem_threshold: float = 0.05
    mem_floor_bytes: int = 1 << 20

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


def _check_threshold(name: str, value: Any, where: str) -> float | int:
    """Validate one threshold value against :data:`tflabench.bounds.THRESHOLD_RANGES`
    (finite, in range, an integer where one is meant); UserError naming ``where``, the
    value and the allowed range."""
    from tflabench.bounds import THRESHOLD_RANGES, check_number

    lo, hi, lo_open, hi_open, integer = THRESHOLD_RANGES[name]
    reason = check_number(value, lo, hi, lo_open=lo_open, hi_open=hi_open, integer=integer)
    if reason:
        raise UserError(f"{where}: {name} {reason}")
    return int(value) if integer else float(value)


def _threshold_mapping(mapping: Any, where: str, check: bool = True) -> dict[str, Any]:
    if mapping is None:
        return {}
    if not isinstance(mapping, Mapping):
        raise UserError(f"{where}: expected a mapping of thresholds, got {type(mapping).__name__}")
    out = {}
    for name, value in mapping.items():
        if name not in Thresholds.names():
            allowed = ", ".join(Thresholds.names())
            raise UserError(f"{where}: unknown threshold {name!r}; allowed: {allowed}")
        if value is not None:
            out[name] = _check_threshold(name, value, where) if check else value
    return out


def load_thresholds_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML thresholds file: a mapping of :class:`Thresholds` field names to values.

    A top-level ``compare:`` key is accepted too, so a suite YAML's section can be reused.

    Raises:
        UserError: the file is missing, not YAML, or names an unknown/invalid threshold.
    """
    from tflabench.yaml_load import load_yaml

    path = Path(path)
    data = load_yaml(path, f"--thresholds {path}")
    if isinstance(data, Mapping) and "compare" in data:
        data = data["compare"]
    return _threshold_mapping(data, f"--thresholds {path}")


def resolve_thresholds(
    base_metadata: Mapping[str, Any] | None = None,
    file_values: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> tuple[Thresholds, dict[str, str]]:
    """Combine the threshold sources, later ones winning.

    Order: :class:`Thresholds` defaults < base metadata ``compare`` (the reference's suite)
    < ``file_values`` (``--thresholds FILE``) < ``overrides`` (CLI options; ``None``
    values are ignored). The candidate's metadata is no source: a set under judgement
    does not set its own gate (:func:`candidate_warnings` names what it asked for).

    Returns:
        (thresholds, source) where ``source`` maps each field to where its value came from.

    Raises:
        UserError: an unknown threshold name or an out-of-range value.
    """
    values: dict[str, Any] = {}
    source = {name: "default" for name in Thresholds.names()}
    layers = (
        ("base suite", _threshold_mapping((base_metadata or {}).get("compare"), "base metadata 'compare'")),
        ("thresholds file", _threshold_mapping(file_values, "thresholds file")),
        ("option", {k: _check_threshold(k, v, f"--{k.replace('_', '-')}")
                    for k, v in _threshold_mapping(overrides, "option", check=False).items()}),
    )
    for name, layer in layers:
        for key, value in layer.items():
            values[key] = value
            source[key] = name
    return Thresholds(**values), source


def numerics_checked(metadata: Mapping[str, Any]) -> bool | None:
    """Whether a result set was measured behind the numerics gate
    (``measurement.numerics.check`` of its metadata); None where the set does not say."""
    measurement = metadata.get("measurement") if isinstance(metadata, Mapping) else None
    numerics = measurement.get("numerics") if isinstance(measurement, Mapping) else None
    check = numerics.get("check") if isinstance(numerics, Mapping) else None
    return check if isinstance(check, bool) else None


#: The fields of a suite's ``numerics`` that decide whether a row is ``ok``: a candidate
#: whose differ from the base's is judged as one measured without the gate.
NUMERICS_GATE_FIELDS = ("check", "tolerance", "budgets")


def numerics_loosened(base_metadata: Mapping[str, Any], new_metadata: Mapping[str, Any]) -> list[str]:
    """The :data:`NUMERICS_GATE_FIELDS` of ``measurement.numerics`` on which the candidate
    may be laxer than the base: ``check`` off, or a ``tolerance`` or ``budgets`` that
    differs from the base's (where both record the field); empty when none."""
    def numerics(metadata: Mapping[str, Any]) -> Mapping[str, Any]:
        measurement = metadata.get("measurement") if isinstance(metadata, Mapping) else None
        value = measurement.get("numerics") if isinstance(measurement, Mapping) else None
        return value if isinstance(value, Mapping) else {}

    base, new = numerics(base_metadata), numerics(new_metadata)
    out = ["check"] if numerics_checked(new_metadata) is False else []
    return out + [key for key in NUMERICS_GATE_FIELDS[1:] if key in base and key in new and base[key] != new[key]]


def candidate_warnings(new_metadata: Mapping[str, Any], thresholds: Thresholds,
                       base_metadata: Mapping[str, Any] | None = None) -> list[str]:
    """What the candidate set asked for that does not loosen the gate: one warning naming
    its own ``compare:`` thresholds (ignored: the gate is the base's and the command
    line's) and one when it was measured without the numerics gate or with other
    numerics settings than the base (:func:`numerics_loosened`: its faster cases do not
    count as improvements)."""
    out = []
    asked = new_metadata.get("compare") if isinstance(new_metadata, Mapping) else None
    if isinstance(asked, Mapping):
        differing = [f"{name} {repr(asked[name])[:40]}" for name in sorted(map(str, asked))
                     if name in Thresholds.names() and asked[name] is not None
                     and asked[name] != getattr(thresholds, name)]
        unknown = sorted(str(name)[:40] for name in asked if name not in Thresholds.names())
        if differing or unknown:
            text = ", ".join(differing + [f"{name!r} (unknown)" for name in unknown])
            out.append(f"new asks for {text} in its compare section; ignored: the gate's thresholds come from "
                       "the base set, --thresholds and the options")
    elif asked is not None:
        out.append("new holds a compare section that is not a mapping; ignored")
    loosened = numerics_loosened(base_metadata or {}, new_metadata)
    if "check" in loosened:
        out.append("new was measured without the numerics gate (numerics.check off): its cases are marked "
                   "'unchecked' and a faster one does not count as an improvement")
    elif loosened:
        out.append(f"new was measured with other numerics.{' and numerics.'.join(loosened)} than the base: its "
                   "cases are marked 'unchecked' and a faster one does not count as an improvement")
    return out
