"""Reading the YAML files a user writes (suites, compare thresholds, hardware files), strictly.

PyYAML's ``safe_load`` accepts two things that silently change what a file says:

- a mapping that names a key twice keeps the last value (two ``kernels:`` blocks run only
  the second);
- aliases (``*name``) are shared, not copied, so a few lines of anchors that refer to each
  other ten times per level ("billion laughs") load fast and then grow to gigabytes when
  any consumer copies or serialises the value.

:func:`load_yaml` refuses both with one line naming the file, line and column. YAML merge
keys (``<<: *defaults``) stay allowed, and an explicit key beside a merge overrides the
merged one, as YAML specifies. Import-light: only PyYAML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tflabench.errors import UserError, read_text

#: Most values (scalars, lists, mappings) a document may hold once every alias is expanded.
#: A hand-written suite holds a few hundred; 100,000 leaves room for generated ones.
MAX_VALUES = 100_000
#: Largest YAML file read (bytes).
MAX_FILE_BYTES = 16 * 2**20


def _strict_loader():
    import yaml

    class StrictLoader(yaml.SafeLoader):
        """SafeLoader that refuses a key repeated within one mapping."""

        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, Any] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                        continue
                    key = self.construct_object(key_node)
                    try:
                        first = seen.get(key)
                    except TypeError:  # an unhashable key: the constructor reports it
                        continue
                    if first is not None:
                        mark = key_node.start_mark
                        raise yaml.constructor.ConstructorError(
                            None, None,
                            f"key {key!r} appears twice in one mapping (first at line {first.line + 1}); "
                            "YAML keeps only the last, so give each key once", mark)
                    seen[key] = key_node.start_mark
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


def _expanded_values(root) -> int:
    """How many values the node graph holds with every alias expanded (each use of an
    anchor counts its whole subtree again). Raises ValueError for an alias that contains
    itself, stops counting above :data:`MAX_VALUES`."""
    import yaml

    memo: dict[int, int] = {}
    # iterative post-order walk (a deeply nested document must not exhaust the stack)
    stack: list[tuple[Any, bool]] = [(root, False)]
    on_path: set[int] = set()
    while stack:
        node, children_done = stack.pop()
        nid = id(node)
        if children_done:
            on_path.discard(nid)
            if isinstance(node, yaml.SequenceNode):
                size = 1 + sum(memo[id(c)] for c in node.value)
            elif isinstance(node, yaml.MappingNode):
                size = 1 + sum(memo[id(k)] + memo[id(v)] for k, v in node.value)
            else:
                size = 1
            memo[nid] = min(size, MAX_VALUES + 1)
            continue
        if nid in memo:
            continue
        if nid in on_path:
            mark = node.start_mark
            raise ValueError(f"line {mark.line + 1}: an alias refers to a value that contains it")
        on_path.add(nid)
        stack.append((node, True))
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [c for pair in node.value for c in pair]
        else:
            children = []
        for child in children:
            if id(child) in on_path:
                mark = child.start_mark
                raise ValueError(f"line {mark.line + 1}: an alias refers to a value that contains it")
            if id(child) not in memo:
                stack.append((child, False))
    return memo[id(root)]


def load_yaml(path: str | Path, what: str = "") -> Any:
    """The parsed content of the YAML file ``path`` (None for an empty file).

    Args:
        what: prefix of every error message (default: the path), e.g. ``--thresholds x.yaml``.

    Raises UserError (one line: where, what, how to fix) for a missing, unreadable, too large
    (> :data:`MAX_FILE_BYTES`) or non-UTF-8 file, YAML syntax (with line:column), a key
    repeated in one mapping, more than one document, an alias that contains itself, or
    aliases that expand the document beyond :data:`MAX_VALUES` values.
    """
    import yaml

    p = Path(path)
    where = what or str(p)
    text = read_text(p, where, what="a YAML file", limit=MAX_FILE_BYTES)
    try:
        loader = _strict_loader()(text)  # the reader refuses control characters here
    except yaml.YAMLError as exc:
        raise UserError(f"{where}: {_yaml_problem(exc)}") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            size = _expanded_values(node)
        except ValueError as exc:
            raise UserError(f"{where}: {exc}; YAML aliases (*name) may only refer to finished values") from None
        if size > MAX_VALUES:
            raise UserError(f"{where}: the document expands to more than {MAX_VALUES:,} values through its "
                            "aliases (*name); write the values out, or reuse fewer of them")
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        kind = "" if isinstance(exc, yaml.constructor.ConstructorError) else "YAML syntax error: "
        raise UserError(f"{where}{at}: {kind}{_yaml_problem(exc)}") from None
    except RecursionError:
        raise UserError(f"{where}: nested too deeply to read") from None
    finally:
        loader.dispose()


def _yaml_problem(exc) -> str:
    """One line of a PyYAML error: its problem, or the first line of its text (a reader
    error: a character YAML does not allow, with its position)."""
    problem = getattr(exc, "problem", None)
    if problem:
        return problem
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return "; ".join(lines[:2]) if lines else type(exc).__name__
