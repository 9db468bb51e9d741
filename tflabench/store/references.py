"""The reference result sets: one current set per suite and GPU model, found without a path.

``results/reference/<gpu>/<suite>/`` holds the newest whole run of ``suites/<suite>.yaml``
on that GPU model (``h100``, ``h200``): its ``rows.jsonl`` and ``metadata.json`` and a
``README.md`` saying how it was run. :func:`reference_sets` lists them,
:func:`index_markdown` writes the index committed as ``results/reference/README.md``
(``tflabench references --markdown``), and :func:`reference_for` gives the set that
``tflabench compare --reference GPU NEW`` judges NEW against (docs/ci.md).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from tflabench.errors import UserError

#: The directory of the reference sets in a checkout of the project.
DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "results" / "reference"
#: A GPU or suite name that names a directory below the root (no path, no "..").
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
#: The software named beside the peers in the index, in this order.
PLATFORM_KEYS = ("torch", "triton")


@dataclass(frozen=True)
class ReferenceSet:
    """One reference set: ``path`` is ``<root>/<gpu>/<suite>``; ``metadata`` its parsed
    ``metadata.json``; ``statuses`` the count of its cases by status (last row per case)."""

    gpu: str
    suite: str
    path: Path
    metadata: Mapping
    statuses: Mapping[str, int]

    @property
    def commit(self) -> str:
        """The first 7 hex digits of the recorded ``git_revision`` ("" where none)."""
        return str(self.metadata.get("git_revision") or "")[:7]

    @property
    def date(self) -> str:
        """The run's start, ``YYYY-MM-DD HH:MM`` as recorded (UTC)."""
        return str(self.metadata.get("date") or "")[:16].replace("T", " ")

    @property
    def software(self) -> str:
        """torch, triton and each peer with its version, comma-separated."""
        items = [(k, self.metadata.get(k)) for k in PLATFORM_KEYS]
        items += sorted((self.metadata.get("peers") or {}).items())
        return ", ".join(f"{name} {version}" for name, version in items if version)

    @property
    def cases(self) -> str:
        """``<ok> of <cases> ok`` and the other statuses in brackets; for a run not yet
        finished (fewer cases measured than its ``case_ids`` name), ``<ok> of <cases> ok,
        <n> of <planned> measured (in progress)``."""
        total = sum(self.statuses.values())
        others = ", ".join(f"{n} {s}" for s, n in sorted(self.statuses.items()) if s != "ok")
        text = f"{self.statuses.get('ok', 0)} of {total} ok" + (f" ({others})" if others else "")
        planned = self.metadata.get("case_ids")
        if isinstance(planned, list) and len(planned) > total:
            text += f", {total} of {len(planned)} measured (in progress)"
        return text


def reference_root(root: str | os.PathLike | None = None) -> Path:
    """``root`` as a Path, or :data:`DEFAULT_ROOT` when None."""
    return DEFAULT_ROOT if root is None else Path(root)


def reference_sets(root: str | os.PathLike | None = None) -> list[ReferenceSet]:
    """Every set ``<root>/<gpu>/<suite>/`` holding a ``rows.jsonl``, sorted by GPU and suite.

    Raises UserError when a set's rows or metadata cannot be read (results.load_results)
    or its directory is not named after the suite its metadata records."""
    from tflabench.store.results import ROWS_FILE, load_results

    found = []
    base = reference_root(root)
    for rows in sorted(base.glob(f"*/*/{ROWS_FILE}")):
        directory = rows.parent
        result = load_results(directory)
        suite = result.metadata.get("suite")
        if suite != directory.name:
            raise UserError(f"{directory}: its metadata names suite {suite!r}; a reference set "
                            f"is named after its suite (results/reference/<gpu>/<suite>/)")
        statuses = result.rows["status"].value_counts().to_dict() if len(result.rows) else {}
        found.append(ReferenceSet(gpu=directory.parent.name, suite=directory.name, path=directory,
                                  metadata=result.metadata,
                                  statuses={str(k): int(v) for k, v in statuses.items()}))
    return found


def reference_for(gpu: str, suite: str, root: str | os.PathLike | None = None) -> Path:
    """The directory of the reference set of ``suite`` on ``gpu`` (``h100``, ``h200``).

    Raises UserError naming the GPUs that have a set of ``suite`` (or saying none has) when
    ``<root>/<gpu>/<suite>/rows.jsonl`` does not exist."""
    from tflabench.store.results import ROWS_FILE

    base = reference_root(root)
    gpu = gpu.strip().lower()
    directory = base / gpu / suite
    if _PLAIN.fullmatch(gpu) and _PLAIN.fullmatch(suite) and (directory / ROWS_FILE).is_file():
        return directory
    have = sorted(p.parent.parent.name for p in base.glob(f"*/{suite}/{ROWS_FILE}")) if suite else []
    fix = (f"reference sets of suite {suite!r} exist for: {', '.join(have)}" if have else
           f"no GPU has a reference set of suite {suite!r}")
    raise UserError(f"no reference set of suite {suite!r} on {gpu!r} ({base / gpu / suite}); {fix} "
                    f"(`tflabench references` lists them)")


def suite_of(new: str | os.PathLike) -> str:
    """The suite a result set ran: its metadata's ``suite``, else the rows' one ``suite``.

    Raises UserError when neither names exactly one suite."""
    from tflabench.store.results import load_results

    result = load_results(new)
    suite = result.metadata.get("suite")
    if not suite and len(result.rows):
        names = sorted(set(result.rows["suite"].dropna()))
        suite = names[0] if len(names) == 1 else None
    if not suite:
        raise UserError(f"{new}: the set names no one suite, so --reference cannot find its base; "
                        f"give the base set's directory: tflabench compare BASE {new}")
    return str(suite)


INDEX_HEADER = """# Reference result sets

One current set per suite and GPU model: `results/reference/<gpu>/<suite>/` is the newest
whole run of `suites/<suite>.yaml` on that GPU, its `rows.jsonl` and `metadata.json`, with a
`README.md` saying how it was run. Older runs and experiments are in git history: a set that
docs/ cites but the tree lacks was removed by the commit that `git log --diff-filter=D -- DIR`
names, and its parent holds it.
`tflabench report DIR` redraws a set's tables and figures; `tflabench compare --reference
<gpu> NEW` judges a new run of the suite against its set.

This index is generated by `tflabench references --markdown > results/reference/README.md`.
"""


def index_markdown(sets: list[ReferenceSet]) -> str:
    """The Markdown index of ``sets``: :data:`INDEX_HEADER` and one table row per set
    (directory, commit, date, GPU name, software with versions, cases ok)."""
    lines = [INDEX_HEADER, "| set | commit | date (UTC) | GPU | software | cases |",
             "|---|---|---|---|---|---|"]
    for s in sets:
        lines.append(f"| `{s.gpu}/{s.suite}/` | {s.commit} | {s.date} | "
                     f"{s.metadata.get('gpu_name') or ''} | {s.software} | {s.cases} |")
    return "\n".join(lines) + "\n"
