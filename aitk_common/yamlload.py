"""YAML (and JSON) read in bounded time and memory: the one loader for job configs,
whether they come from a file (`run.py`) or from the web UI's form.

A config is a few KB; the limits only stop a hostile or broken document: a 1 KB YAML
"billion laughs" expands to 10**9 nodes through its aliases, and a deeply nested one
overflows the recursive steps after parsing. The node count is taken on PyYAML's node
graph before anything is constructed, with every alias counted where it is used (a
self-referencing alias counts without end, so it stops too), iteratively. With
`aliases=False` a document that uses an alias at all is refused (the web form's rule).

PyYAML is imported inside the functions: importing this module costs nothing, as for
the rest of aitk_common. Errors are DocumentError: one line, the line and column
(1-based) where parsing failed when there is one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 1 << 20
    max_nodes: int = 100_000
    max_depth: int = 64
    aliases: bool = True  # False: refuse any `*alias`


DEFAULT = Limits()


class DocumentError(ValueError):
    """A document not read. `limit`: it broke one of the Limits (rather than the
    syntax); `line`/`column`: where its syntax broke, 1-based, when known."""

    def __init__(self, message: str, *, limit: bool = False, line: int | None = None,
                 column: int | None = None) -> None:
        super().__init__(message)
        self.limit = limit
        self.line = line
        self.column = column


def _check_size(text: str, limits: Limits) -> None:
    if len(text.encode("utf-8")) > limits.max_bytes:
        raise DocumentError(f"larger than {limits.max_bytes // 1024} KiB", limit=True)


def _check_shape(root: Any, children: Callable[[Any], list[Any]], limits: Limits) -> None:
    seen, stack = 0, [(root, 1)]
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > limits.max_nodes:
            raise DocumentError(f"too large once its aliases are expanded (more than "
                                f"{limits.max_nodes} values)", limit=True)
        if depth > limits.max_depth:
            raise DocumentError(f"nested more than {limits.max_depth} levels deep",
                                limit=True)
        stack += [(child, depth + 1) for child in children(node)]


def _data_children(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [*value.keys(), *value.values()]
    return list(value) if isinstance(value, list) else []


def check_data(value: Any, limits: Limits = DEFAULT) -> None:
    """The same node and depth limits over data already parsed (a JSON document)."""
    _check_shape(value, _data_children, limits)


def _yaml_error(exc: Exception) -> DocumentError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
    if mark is None:
        return DocumentError(f"not valid YAML: {problem}")
    line, column = mark.line + 1, mark.column + 1
    return DocumentError(f"not valid YAML at line {line}, column {column}: {problem}",
                         line=line, column=column)


def load_yaml(text: str, limits: Limits = DEFAULT) -> Any:
    """`yaml.safe_load(text)` within `limits` (None for an empty document)."""
    import yaml

    def children(node: Any) -> list[Any]:
        if isinstance(node, yaml.MappingNode):
            return [n for pair in node.value for n in pair]
        return list(node.value) if isinstance(node, yaml.SequenceNode) else []

    _check_size(text, limits)
    try:
        if not limits.aliases and any(isinstance(t, yaml.AliasToken)
                                      for t in yaml.scan(text, Loader=yaml.SafeLoader)):
            raise DocumentError("YAML aliases (*name) are not accepted here; write the "
                                "values out", limit=True)
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _check_shape(node, children, limits)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except RecursionError:
        raise DocumentError("nested too deeply", limit=True) from None
    except yaml.YAMLError as exc:
        raise _yaml_error(exc) from None


def load_json(text: str, limits: Limits = DEFAULT) -> Any:
    """`json.loads(text)` within `limits`."""
    _check_size(text, limits)
    try:
        data = json.loads(text)
    except RecursionError:
        raise DocumentError("nested too deeply", limit=True) from None
    except json.JSONDecodeError as exc:
        raise DocumentError(f"not valid JSON at line {exc.lineno}, column {exc.colno}: "
                            f"{exc.msg}", line=exc.lineno, column=exc.colno) from None
    check_data(data, limits)
    return data
