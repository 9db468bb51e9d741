"""GPU catalogue: dense bf16 FLOP/s and HBM bandwidth (datasheet and measured ceilings).

The paper's Table 18 (V100, A100, H100, B200; values without sparsity, "if only the sparse value
is known, divide by 2") plus H100 PCIe, H200, GB200 and AMD MI300X from vendor datasheets. A GPU
may also carry measured ceilings (``tflabench calibrate`` writes them; the H200 of this project
ships with its measured values). The roofline can use either: ``ceilings="datasheet"|"measured"``.

Users add or override GPUs in a YAML file, read from (first found): the ``hardware_file`` argument
(CLI ``--hardware FILE``), the environment variable ``TFLABENCH_HARDWARE``, or
``~/.config/tflabench/gpus.yaml`` if present. Format (docs/hardware.md; numbers may be
written ``989e12``)::

    gpus:
      h200:                       # a catalogue key overrides the given fields only
        measured: {flops_per_s: 7.8e14, bytes_per_s: 4.3e12, note: "my run"}
      l40s:                       # a new GPU needs both datasheet ceilings
        name: NVIDIA L40S
        flops_per_s: 362e12
        bytes_per_s: 864e9
        source: NVIDIA L40S datasheet
        match: ["L40S"]           # substrings of torch.cuda.get_device_name() for detect_gpu

Import-light (PyYAML only when a file is read).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from tflabench.errors import UserError
from tflabench.yaml_load import load_yaml
from tflabench.store.files import check_plain_name

#: Which ceilings: auto (measured where recorded, else datasheet), datasheet, measured.
CEILINGS = ("auto", "datasheet", "measured")
ENV_VAR = "TFLABENCH_HARDWARE"
DEFAULT_FILE = Path("~/.config/tflabench/gpus.yaml")


#: ``GPU.as_dict`` keys and the attribute each is read from, in output order.
_AS_DICT = tuple((name, name) for name in (
    "key", "name", "year", "ceilings", "flops_per_s", "bytes_per_s", "intensity_flop_per_byte")) + (
    ("source", "ceilings_source"),
    ("datasheet_flops_per_s", "datasheet_flops_per_s"),
    ("datasheet_bytes_per_s", "datasheet_bytes_per_s"),
    ("datasheet_source", "source"),
    ("measured_flops_per_s", "measured_flops_per_s"),
    ("measured_bytes_per_s", "measured_bytes_per_s"),
    ("measured_note", "measured_note"),
)


@dataclass(frozen=True)
class GPU:
    """One accelerator's ceilings.

    Attributes:
        key: catalogue key (``h100``). name: marketing name. year: release year or None.
        datasheet_flops_per_s: dense bf16 FLOP/s (the peak, the paper's α; no sparsity). datasheet_bytes_per_s: HBM
            bandwidth in byte/s (beta). source: where the datasheet figures come from.
        measured_flops_per_s, measured_bytes_per_s, measured_note: measured ceilings (or None).
        ceilings: which pair :attr:`flops_per_s` / :attr:`bytes_per_s` return.
        match: lower-case substrings of a torch device name that identify this GPU.
    """

    key: str
    name: str
    datasheet_flops_per_s: float | None
    datasheet_bytes_per_s: float | None
    source: str
    year: int | None = None
    measured_flops_per_s: float | None = None
    measured_bytes_per_s: float | None = None
    measured_note: str | None = None
    ceilings: str = "datasheet"
    match: tuple = ()

    @property
    def flops_per_s(self) -> float:
        """Peak FLOP/s (the paper's α) of the selected ceilings."""
        return self.measured_flops_per_s if self.ceilings == "measured" else self.datasheet_flops_per_s

    @property
    def bytes_per_s(self) -> float:
        """beta (byte/s) of the selected ceilings."""
        return self.measured_bytes_per_s if self.ceilings == "measured" else self.datasheet_bytes_per_s

    @property
    def intensity_flop_per_byte(self) -> float:
        """Accelerator intensity I_acc = alpha / beta (paper eq. 117; exact, not Table 18's rounding)."""
        return self.flops_per_s / self.bytes_per_s

    @property
    def ceilings_source(self) -> str:
        return (self.measured_note or "measured") if self.ceilings == "measured" else self.source

    @property
    def has_measured(self) -> bool:
        return self.measured_flops_per_s is not None and self.measured_bytes_per_s is not None

    @property
    def label(self) -> str:
        return f"{self.name} ({self.ceilings})"

    def as_dict(self) -> dict:
        """JSON-ready dict: the selected ceilings (alpha ``flops_per_s``, beta ``bytes_per_s``,
        I_acc, their ``source``), then both sets with their sources."""
        return {key: getattr(self, attribute) for key, attribute in _AS_DICT}


_T18 = "paper Table 18 (Beck et al., TFLA, NeurIPS 2025)"
H200_MEASURED_NOTE = (
    "measured on an H200 for this project: bf16 8192^3 matmul 772 TFLOP/s, device-to-device "
    "copy 4.24 TB/s counting read+write, 2026-11-22, torch 2.11"
)

CATALOGUE: dict[str, GPU] = {
    g.key: g
    for g in (
        GPU("v100", "V100 SXM2", 120e12, 0.9e12, _T18, 2017, match=("v100",)),
        GPU("a100", "A100 SXM", 312e12, 1.935e12, _T18, 2020, match=("a100",)),
        GPU("h100", "H100 SXM", 989e12, 3.35e12, _T18, 2022, match=("h100 80gb hbm3", "h100 sxm")),
        GPU("b200", "B200 HGX", 2250e12, 7.7e12, _T18, 2025, match=("b200",)),
        GPU(
            "h100_pcie", "H100 PCIe", 756e12, 2.0e12,
            "NVIDIA H100 datasheet: bf16 1,513 TFLOP/s with sparsity (halved), 2.0 TB/s HBM2e",
            2022, match=("h100 pcie",),
        ),
        GPU(
            "h200", "H200 SXM", 989e12, 4.8e12,
            "NVIDIA H200 datasheet: bf16 1,979 TFLOP/s with sparsity (halved), 4.8 TB/s HBM3e",
            2024, 772e12, 4.24e12, H200_MEASURED_NOTE, match=("h200",),
        ),
        GPU(
            "gb200", "GB200 (per Blackwell GPU)", 2500e12, 8.0e12,
            "NVIDIA GB200 NVL72 datasheet: bf16 360 PFLOP/s with sparsity and 576 TB/s per 72 GPUs "
            "(per GPU, sparsity halved)",
            2025, match=("gb200",),
        ),
        GPU(
            "mi300x", "AMD Instinct MI300X", 1307.4e12, 5.3e12,
            "AMD Instinct MI300X datasheet: bf16 1,307.4 TFLOP/s dense, 5.3 TB/s HBM3",
            2023, match=("mi300x",),
        ),
    )
}


# ------------------------------------------------------------------ user YAML


def _normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


def hardware_file_path(hardware_file: str | os.PathLike | None = None) -> tuple[Path | None, bool]:
    """(path, explicit): the user hardware file in effect, and whether it was asked for explicitly.

    Explicit (argument or TFLABENCH_HARDWARE) files must exist; the default one is optional.
    """
    if hardware_file:
        return Path(hardware_file).expanduser(), True
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser(), True
    return DEFAULT_FILE.expanduser(), False


def _number(path, field_path, value, *, required=True):
    if value is None and not required:
        return None
    try:
        x = float(value)
        ok = math.isfinite(x) and x > 0 and not isinstance(value, bool)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise UserError(f"hardware file {path}: {field_path}={value!r} is not valid; it must be a positive number")
    return x


def _read_yaml(path: Path) -> dict:
    """The parsed hardware file: through the strict reader of every user YAML file
    (:func:`tflabench.yaml_load.load_yaml`: a key given twice, alias bombs, a file too
    large, YAML syntax refused with line and column). Raises UserError."""
    data = load_yaml(path, f"hardware file {path}")
    if data is None:
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("gpus", {}), dict):
        raise UserError(f"hardware file {path}: expected a mapping 'gpus: {{<key>: {{...}}}}' "
                        "(the format: docs/hardware.md)")
    unknown = sorted(str(k) for k in data if k != "gpus")
    if unknown:
        hint = (f"; its GPUs go under a top-level 'gpus:' key, e.g. 'gpus: {{{unknown[0]}: {{...}}}}'"
                if "gpus" not in data else "")
        raise UserError(f"hardware file {path}: {unknown[0]!r} is not a known top-level key (allowed: gpus){hint}; "
                        "the format: docs/hardware.md")
    return data


_ENTRY_FIELDS = {"name", "flops_per_s", "bytes_per_s", "source", "year", "measured", "match"}


def _apply_entry(path, key, entry, base: GPU | None) -> GPU:
    fp = f"gpus.{key}"
    if not isinstance(entry, dict):
        raise UserError(f"hardware file {path}: {fp} must be a mapping")
    unknown = set(entry) - _ENTRY_FIELDS
    if unknown:
        raise UserError(
            f"hardware file {path}: {fp}.{sorted(unknown)[0]} is not a known field; "
            f"allowed: {', '.join(sorted(_ENTRY_FIELDS))}"
        )
    meas = entry.get("measured")
    if meas is not None and not isinstance(meas, dict):
        raise UserError(f"hardware file {path}: {fp}.measured must be a mapping with flops_per_s, bytes_per_s, note")
    if base is None:
        has_ds = "flops_per_s" in entry or "bytes_per_s" in entry
        if has_ds or meas is None:
            _number(path, f"{fp}.flops_per_s", entry.get("flops_per_s"))
            _number(path, f"{fp}.bytes_per_s", entry.get("bytes_per_s"))
        base = GPU(key, str(entry.get("name", key)), None, None, str(entry.get("source", f"user file {path}")))
    g = base
    if "name" in entry:
        g = replace(g, name=str(entry["name"]))
    if "flops_per_s" in entry:
        g = replace(g, datasheet_flops_per_s=_number(path, f"{fp}.flops_per_s", entry["flops_per_s"]),
                    source=str(entry.get("source", f"user file {path}")))
    if "bytes_per_s" in entry:
        g = replace(g, datasheet_bytes_per_s=_number(path, f"{fp}.bytes_per_s", entry["bytes_per_s"]),
                    source=str(entry.get("source", f"user file {path}")))
    if "source" in entry:
        g = replace(g, source=str(entry["source"]))
    if "year" in entry:
        g = replace(g, year=entry["year"])
    if "match" in entry:
        m = entry["match"]
        if isinstance(m, str):
            m = [m]
        if not isinstance(m, list) or not all(isinstance(s, str) for s in m):
            raise UserError(f"hardware file {path}: {fp}.match must be a list of strings")
        g = replace(g, match=tuple(s.lower() for s in m) + tuple(g.match))
    if meas is not None:
        g = replace(
            g,
            measured_flops_per_s=_number(path, f"{fp}.measured.flops_per_s", meas.get("flops_per_s")),
            measured_bytes_per_s=_number(path, f"{fp}.measured.bytes_per_s", meas.get("bytes_per_s")),
            measured_note=str(meas.get("note", f"measured (user file {path})")),
        )
    return g


def catalogue(hardware_file: str | os.PathLike | None = None) -> dict[str, GPU]:
    """The built-in catalogue merged with the user hardware file (see module docstring).

    Raises:
        UserError: an explicit file that is missing or unreadable, invalid YAML, a bad entry.
    """
    gpus = dict(CATALOGUE)
    path, explicit = hardware_file_path(hardware_file)
    if path is None or (not explicit and not path.exists()):
        return gpus
    if not path.exists():
        raise UserError(f"hardware file {path}: does not exist (from --hardware or {ENV_VAR})")
    data = _read_yaml(path)
    for raw_key, entry in (data.get("gpus") or {}).items():
        key = str(raw_key).lower()
        check_plain_name(key, f"hardware file {path}: gpus: key", becomes="part of plot file names")
        base = gpus.get(key) or gpus.get(_lookup_key(key, gpus) or "")
        g = _apply_entry(path, key, entry, base)
        gpus[g.key] = g
    return gpus


_ALIASES = {"h100sxm": "h100", "h100sxm5": "h100", "v100sxm2": "v100", "a100sxm": "a100",
            "b200hgx": "b200", "h200sxm": "h200", "h100pcie": "h100_pcie", "amdmi300x": "mi300x",
            "instinctmi300x": "mi300x"}


def _lookup_key(name: str, gpus: dict) -> str | None:
    n = _normalise(name)
    for key in gpus:
        if _normalise(key) == n:
            return key
    if n in _ALIASES and _ALIASES[n] in gpus:
        return _ALIASES[n]
    for key, g in gpus.items():
        if _normalise(g.name) == n:
            return key
    return None


def get_gpu(name: str, ceilings: str = "datasheet", hardware_file=None) -> GPU:
    """Look up a GPU by key or name (case and punctuation ignored: ``h100``, ``H100 SXM``, ``h100-pcie``).

    Args:
        name: catalogue key, alias or name.
        ceilings: ``"datasheet"``, ``"measured"``, or ``"auto"`` (measured where the GPU has
            measured ceilings, else datasheet).
        hardware_file: user YAML (else TFLABENCH_HARDWARE or ~/.config/tflabench/gpus.yaml).

    Returns:
        :class:`GPU` whose ``flops_per_s``/``bytes_per_s`` are the chosen ceilings.

    Raises:
        UserError: unknown name (the message lists the known keys); ``measured`` asked but none
            recorded (run ``tflabench calibrate``); bad ``ceilings``; a bad hardware file.
    """
    if ceilings not in CEILINGS:
        raise UserError(f"--ceilings={ceilings!r} is not valid; allowed: {', '.join(CEILINGS)}")
    gpus = catalogue(hardware_file)
    key = _lookup_key(name, gpus)
    if key is None:
        raise UserError(f"--gpu={name!r} is not a known GPU; known: {', '.join(gpus)} "
                        "(add one in a hardware YAML file: --hardware FILE)")
    g = gpus[key]
    if ceilings == "auto":
        ceilings = "measured" if g.has_measured else "datasheet"
    if ceilings == "measured" and not g.has_measured:
        raise UserError(f"GPU {key!r} has no measured ceilings; run `tflabench calibrate` on it "
                        "(or use --ceilings datasheet)")
    if ceilings == "datasheet" and (g.datasheet_flops_per_s is None or g.datasheet_bytes_per_s is None):
        raise UserError(f"GPU {key!r} has no datasheet ceilings; add flops_per_s and bytes_per_s "
                        "to the hardware file (or use --ceilings measured)")
    return replace(g, ceilings=ceilings)


#: Device-name substrings of GPUs that resemble a catalogued one but have other ceilings.
NOT_CATALOGUED = ("h100 nvl", "gh200")


def detect_gpu(torch_device_name: str, hardware_file=None) -> str | None:
    """Catalogue key for a ``torch.cuda.get_device_name()`` string, or None if not catalogued.

    Examples: ``"NVIDIA H200"`` → ``h200``; ``"NVIDIA H100 80GB HBM3"`` → ``h100``;
    ``"NVIDIA H100 PCIe"`` → ``h100_pcie``; ``"NVIDIA H100 NVL"`` → None (not catalogued).
    """
    if not torch_device_name:
        return None
    s = str(torch_device_name).lower()
    gpus = catalogue(hardware_file)
    best, best_len = None, 0
    for m in NOT_CATALOGUED:  # similar names with other ceilings: better unknown than wrong
        if m in s and len(m) > best_len:
            best, best_len = None, len(m)
    for key, g in gpus.items():
        for m in g.match:
            if m and m in s and len(m) > best_len:
                best, best_len = key, len(m)
    return best


def save_measured(key: str, flops_per_s: float, bytes_per_s: float, note: str,
                  path: str | os.PathLike | None = None) -> Path:
    """Record measured ceilings for ``key`` in the user hardware YAML; returns the file's path.

    The file is ``path``, else TFLABENCH_HARDWARE, else ~/.config/tflabench/gpus.yaml; other
    entries are kept. Used by ``tflabench calibrate``.

    Raises:
        UserError: non-positive values, an unreadable or invalid existing file, or a write error.
    """
    fp = _number("(measured)", "flops_per_s", flops_per_s)
    bp = _number("(measured)", "bytes_per_s", bytes_per_s)
    target, _ = hardware_file_path(path)
    data = _read_yaml(target) if target.exists() else {}
    gpus = data.setdefault("gpus", {}) or {}
    data["gpus"] = gpus
    entry = gpus.setdefault(str(key).lower(), {}) or {}
    gpus[str(key).lower()] = entry
    entry["measured"] = {"flops_per_s": fp, "bytes_per_s": bp, "note": str(note)}
    import yaml

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(data, sort_keys=True))
    except OSError as exc:
        raise UserError(f"hardware file {target}: cannot be written ({exc.strerror or exc})") from None
    return target


def list_gpus(ceilings: str = "datasheet", hardware_file=None) -> list[GPU]:
    """All GPUs of the merged catalogue; with ``ceilings="measured"`` or ``"auto"`` those
    without measured ceilings keep their datasheet values (their ``ceilings`` field says
    which)."""
    if ceilings not in CEILINGS:
        raise UserError(f"--ceilings={ceilings!r} is not valid; allowed: {', '.join(CEILINGS)}")
    out = []
    for g in catalogue(hardware_file).values():
        want = "measured" if (ceilings != "datasheet" and g.has_measured) else "datasheet"
        if want == "datasheet" and g.datasheet_flops_per_s is None:
            want = "measured"
        out.append(replace(g, ceilings=want))
    return out
