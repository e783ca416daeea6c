"""The product's Python files parsed once per test process: the structure checks (tests/unit/test_architecture.py,
tests/unit/test_facts_once.py) and the config walk (tests/unit/test_config_walk.py) walk the same few hundred files
in many tests. The trees are read-only."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


@functools.cache
def _nodes(path: Path) -> tuple[ast.AST, ...]:
    return tuple(ast.walk(_tree(path)))


def parsed(path: Path, source: str | None = None) -> ast.Module:
    """The syntax tree of ``path`` (read and parsed once), or of ``source`` when given (a planted file)."""
    return _tree(path) if source is None else ast.parse(source, filename=str(path))


def walked(path: Path, source: str | None = None) -> tuple[ast.AST, ...]:
    """Every node of ``parsed(path, source)``, in ``ast.walk``'s order (walked once per file)."""
    return _nodes(path) if source is None else tuple(ast.walk(parsed(path, source)))
