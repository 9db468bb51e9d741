"""The import graph of `tflabench` and `tfla` keeps the layers of docs/ARCHITECTURE.md.

Every module is parsed with `ast`, every import statement counted (inside functions,
methods and `if TYPE_CHECKING:` blocks too), and each import resolved to the
package-internal module it names. The graph must have no cycle, and each module may
import only from its own layer or from the layers the table in docs/ARCHITECTURE.md
("Layers") lets it import from. The table is read from that document, so the picture a
reader sees is the rule the code keeps; a module missing from it fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"tflabench": ROOT / "tflabench", "tfla": ROOT / "kernels" / "tfla"}
DOC = ROOT / "docs" / "ARCHITECTURE.md"


# --------------------------------------------------------------------------- reading


def package_modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's ``__init__``) for every module."""
    modules = {}
    for package, root in PACKAGES.items():
        for path in sorted(root.rglob("*.py")):
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            modules[".".join(parts)] = (path, is_package)
    return modules


def _owner(name: str, modules) -> str | None:
    """The longest known module that ``name`` (a module or a name inside one) lies in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imported_modules(module: str, path: Path, is_package: bool, modules) -> set[str]:
    """The package-internal modules ``module`` imports, anywhere in its file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - (0 if is_package else 1)]
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # `from pkg import sub` names the submodule where one exists, else pkg itself
            names = [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in modules else stem
                     for alias in node.names]
        for name in names:
            owner = _owner(name, modules)
            if owner is not None and owner != module:
                found.add(owner)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {m: imported_modules(m, path, is_pkg, modules) for m, (path, is_pkg) in modules.items()}


def layer_table() -> list[dict]:
    """The "Layers" table of docs/ARCHITECTURE.md, lowest layer first: rows of
    ``{"name", "modules": [patterns], "imports": [layer names]}``."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].isdigit():
            continue
        rank, name, modules, imports = cells
        assert int(rank) == len(rows), f"docs/ARCHITECTURE.md, Layers: row {name!r} is numbered {rank}"
        allowed = [n.strip() for n in imports.split(",")] if imports not in ("", "-", "nothing") else []
        if allowed == ["every layer below"]:
            allowed = [r["name"] for r in rows]
        rows.append({"name": name, "modules": re.findall(r"`([^`]+)`", modules), "imports": allowed})
    return rows


def layer_of(module: str, table) -> str | None:
    """The layer whose patterns (``a.b`` exactly, ``a.b.*`` everything under it) match."""
    hits = [row["name"] for row in table for p in row["modules"]
            if module == p or (p.endswith(".*") and module.startswith(p[:-1]))]
    return hits[0] if len(hits) == 1 else None if not hits else "ambiguous: " + ", ".join(hits)


# --------------------------------------------------------------------------- the checks


def test_the_reader_resolves_imports_inside_functions_and_relative_ones():
    """The graph is only as good as its reader: an import hidden in a function body and a
    relative import must both count (the checks below would pass vacuously otherwise)."""
    graph = import_graph()
    assert "tflabench.run.measure" in graph["tflabench.run.pool"]        # imported in the worker function
    assert "tfla.reference" in graph["tflabench.backends.mlstm_family"]  # imported in a function
    assert "tfla.triton.common" in graph["tfla.triton.chunkwise"]       # a relative import
    assert len(graph) > 60


def test_the_layer_table_is_well_formed():
    table = layer_table()
    names = [row["name"] for row in table]
    assert names[0] == "kernels" and names[-1] == "cli" and len(set(names)) == len(names)
    for rank, row in enumerate(table):
        for allowed in row["imports"]:
            assert allowed in names[:rank], (f"docs/ARCHITECTURE.md, Layers: {row['name']!r} may import "
                                             f"{allowed!r}, which is not a layer below it")


def test_every_module_has_exactly_one_layer():
    table = layer_table()
    placed = {m: layer_of(m, table) for m in package_modules()}
    missing = sorted(m for m, layer in placed.items() if layer is None or layer.startswith("ambiguous"))
    assert not missing, ("docs/ARCHITECTURE.md, Layers: give each of these modules one layer: "
                         + ", ".join(f"{m} ({placed[m] or 'none'})" for m in missing))


def test_no_module_imports_from_a_layer_it_may_not():
    table = layer_table()
    allowed = {row["name"]: set(row["imports"]) | {row["name"]} for row in table}
    wrong = []
    for module, targets in sorted(import_graph().items()):
        mine = layer_of(module, table)
        for target in sorted(targets):
            theirs = layer_of(target, table)
            if mine in allowed and theirs not in allowed[mine]:
                wrong.append(f"{module} ({mine}) -> {target} ({theirs})")
    assert not wrong, "imports across the layers of docs/ARCHITECTURE.md:\n" + "\n".join(wrong)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as ``[a, b, ..., a]``, or None (depth-first search)."""
    state: dict[str, int] = {}   # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
