"""The documentation stays readable and self-contained (CPU, no GPU, a fraction of a second).

- every ``docs/*.md`` is at most 400 lines (a reference a reader can finish);
- no file of the repository cites a path outside it: none of the development machine's
  shared directories (docs, wheels, seeds) or absolute paths of its work tree (``OUTSIDE``);
- every ``docs/<file>.md`` that code, tests, suites or docs cite exists, and every section
  number cited right after it (``docs/tfla-kernels.md 2.4``, ``docs/model-counts.md §6.2``,
  ``... Section 1``, ``docs/tfla-verification.md pitfall 17``) is a heading (or a numbered
  pitfall) of that file;
- every tuning rule a file cites beside ``docs/kernels.md`` ("rule S1", "rules H2-H4") is a
  row of that document's "Tuning rules" table.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400
TEXT_SUFFIXES = {".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".cfg", ".txt"}
# assembled so that this file does not match itself
OUTSIDE = [b"shared" + b"/" + name for name in (b"docs", b"wheels", b"seeds")] + [b"/" + b"work/"]

CITE = re.compile(r"(?<![\w/.-])docs/([\w.-]+\.md)")
SEC = r"§?\d+(?:\.\d+)?"
CITE_SECTIONS = re.compile(
    rf"(?<![\w/.-])docs/([\w.-]+\.md),?\s+(?:Section\s+)?({SEC}(?:\s*(?:-|,|/|and)\s*{SEC})*)")
CITE_PITFALL = re.compile(r"(?<![\w/.-])docs/([\w.-]+\.md),?\s+[Pp]itfalls?\s+(\d+)")
RULE_CITE = re.compile(r"\b[Rr](?:ules?|ows?)\s+([SHBWC])(\d+)(?:\s*-\s*[SHBWC]?(\d+))?")
RULE_ROW = re.compile(r"^\|\s*([SHBWC]\d+)\s*\|", re.M)
HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)?)[.\s]", re.M)
PITFALL = re.compile(r"^(\d+)\.\s+\*\*", re.M)


def tracked_files() -> list[Path]:
    """The files of the repository: git's tracked files, or (outside a git checkout) every
    file but hidden directories, caches and the results of runs."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode()
        return [ROOT / p for p in out.split("\0") if p and (ROOT / p).is_file()]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for p in ROOT.rglob("*"):
            rel = p.relative_to(ROOT).parts
            if (p.is_file() and not any(part.startswith(".") or part == "__pycache__"
                                        or part.endswith(".egg-info") for part in rel)
                    and not (rel[0] == "results" and rel[1:2] != ("reference",))):
                files.append(p)
        return files


def citing_files() -> list[Path]:
    """Code, tests, suites, scripts and docs, and the READMEs of the result sets."""
    out = []
    for p in tracked_files():
        rel = p.relative_to(ROOT).as_posix()
        if p.suffix not in TEXT_SUFFIXES:
            continue
        if rel.startswith("results/") and p.name != "README.md":
            continue
        out.append(p)
    return out


def sections_of(doc: Path) -> tuple[set[str], set[str]]:
    text = doc.read_text(encoding="utf-8")
    return set(HEADING.findall(text)), set(PITFALL.findall(text))


def test_every_doc_is_at_most_400_lines():
    docs = sorted((ROOT / "docs").glob("*.md"))
    assert docs, "docs/*.md not found"
    long = {d.name: n for d in docs if (n := len(d.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"docs longer than {MAX_LINES} lines: {long}"


def test_no_file_cites_a_path_outside_the_repository():
    hits = []
    for p in tracked_files():
        data = p.read_bytes()
        for pattern in OUTSIDE:
            if pattern in data:
                line = data[:data.index(pattern)].count(b"\n") + 1
                hits.append(f"{p.relative_to(ROOT)}:{line}: {pattern.decode()}")
    assert not hits, "paths outside the repository:\n" + "\n".join(hits)


def test_cited_docs_exist_and_their_sections_are_headings():
    missing_files, missing_sections = [], []
    cache: dict[str, tuple[set[str], set[str]]] = {}
    for p in citing_files():
        text = p.read_text(encoding="utf-8", errors="replace")
        where = p.relative_to(ROOT)
        for m in CITE.finditer(text):
            if not (ROOT / "docs" / m.group(1)).is_file():
                missing_files.append(f"{where}: docs/{m.group(1)}")
        for m in CITE_SECTIONS.finditer(text):
            doc = ROOT / "docs" / m.group(1)
            if not doc.is_file():
                continue
            heads, _ = cache.setdefault(m.group(1), sections_of(doc))
            for sec in re.findall(r"\d+(?:\.\d+)?", m.group(2)):
                if sec not in heads:
                    missing_sections.append(f"{where}: docs/{m.group(1)} {sec}")
        for m in CITE_PITFALL.finditer(text):
            doc = ROOT / "docs" / m.group(1)
            if doc.is_file() and m.group(2) not in cache.setdefault(m.group(1), sections_of(doc))[1]:
                missing_sections.append(f"{where}: docs/{m.group(1)} pitfall {m.group(2)}")
    assert not missing_files, "cited docs that do not exist:\n" + "\n".join(missing_files)
    assert not missing_sections, "cited sections that are not headings:\n" + "\n".join(missing_sections)


@pytest.mark.parametrize("doc,sections", [
    ("tfla-kernels.md", {"1", "1.5", "2.4", "3.4"}),
    ("tfla-tiling.md", {"4", "4.2", "4.10"}),
    ("tfla-verification.md", {"5", "5.1", "5.2", "6"}),
    ("model-counts.md", {"2.1", "3", "4.7", "6.9", "9"}),
])
def test_the_section_check_sees_the_reference_headings(doc, sections):
    """A negative control for the check above: it reads headings where the docs have them."""
    heads, _ = sections_of(ROOT / "docs" / doc)
    assert sections <= heads
    assert "9.9" not in heads


def test_cited_tuning_rules_are_rows_of_the_table():
    rows = set(RULE_ROW.findall((ROOT / "docs" / "kernels.md").read_text(encoding="utf-8")))
    assert {"S1", "H1", "B1", "W1", "C1"} <= rows   # the check reads the table
    missing = []
    for p in citing_files():
        text = p.read_text(encoding="utf-8", errors="replace")
        if "docs/kernels.md" not in text and p.name != "kernels.md":
            continue
        for group, first, last in RULE_CITE.findall(text):
            for n in range(int(first), int(last or first) + 1):
                if f"{group}{n}" not in rows:
                    missing.append(f"{p.relative_to(ROOT)}: rule {group}{n}")
    assert not missing, "cited tuning rules missing from docs/kernels.md:\n" + "\n".join(missing)


#: the longest line of README.md and docs/*.md (characters): a long table row is folded
MAX_LINE_CHARS = 300
#: the most lines of README.md
README_MAX_LINES = 220


def test_no_line_of_readme_or_docs_is_over_300_characters():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    long = {f"{p.relative_to(ROOT)}:{n}": len(line) for p in files
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if len(line) > MAX_LINE_CHARS}
    assert not long, f"lines over {MAX_LINE_CHARS} characters (fold them): {long}"


def test_readme_is_at_most_220_lines_and_cites_no_commit():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    assert not re.findall(r"(?<![\w/.-])[0-9a-f]{7,40}(?![\w/.-])", prose)
