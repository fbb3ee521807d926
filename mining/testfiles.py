"""Grading copies of a project's test files: selected tests only, opaque names, sentinels mixed in.

A grading copy is the pristine test module with

- every test function or method renamed to an opaque name (`test_` + 8 hex digits), so agent
  code that runs in the test process cannot pick tests by the names it saw in its workspace;
- every test that is not selected removed (the run stays short);
- sentinels added: copies of selected tests with one expected value changed, placed beside
  their originals under names of the same shape. Correct code fails them; a run whose sentinel
  passes forged its results;
- the whole module re-rendered with `ast.unparse`, so real tests and sentinels share one layout.

Tests are keyed as in pytest's node ids after the file: `Class::test_name[param]`.

AST work is serialised by `AST_LOCK`: CPython 3.11's AST constructor is not safe to use from
several threads at once ("AST constructor recursion depth mismatch"), and the miner has workers.
"""

from __future__ import annotations

import ast
import copy
import threading
from dataclasses import dataclass

import numpy as np

AST_LOCK = threading.RLock()


@dataclass
class GradingCopy:
    """One grading copy: its text, the opaque name of each kept test, and the sentinels' names."""

    text: str
    renamed: dict[str, str]
    #: sentinel name -> the name of the test it copies
    sentinels: dict[str, str]


def test_key(nodeid: str) -> str:
    """The part of a node id after the file (`Class::test_x[1]`)."""
    return nodeid.split("::", 1)[1] if "::" in nodeid else nodeid


def base_name(key: str) -> str:
    """The test function's own name in a node id or test key (no class, no parameters)."""
    return key.split("::")[-1].split("[")[0]


def _is_test(node: ast.AST) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")


def _assert_constants(fn: ast.AST) -> list[ast.Constant]:
    """Constants inside the function's last assertion that holds any (`assert` or `self.assert*`)."""
    found: list[ast.Constant] = []
    for node in ast.walk(fn):
        is_assert = isinstance(node, ast.Assert) or (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr.startswith("assert")
        )
        if not is_assert:
            continue
        consts = [
            c
            for c in ast.walk(node)
            if isinstance(c, ast.Constant) and type(c.value) in (int, float, str) and not isinstance(c.value, bool)
        ]
        if consts:
            found = consts  # ast.walk is breadth-first: keep the last assertion seen
    return found


def _changed(value):
    if isinstance(value, str):
        return value + "!" if value else "?"
    return value + 1


class _Builder(ast.NodeTransformer):
    def __init__(self, keep: set[str], sentinel_from: set[str], rng: np.random.Generator) -> None:
        self.keep = keep
        self.sentinel_from = sentinel_from
        self.rng = rng
        self.renamed: dict[str, str] = {}
        self.sentinels: dict[str, str] = {}

    def opaque(self) -> str:
        while True:
            name = "test_" + "".join(f"{int(b):02x}" for b in self.rng.integers(0, 256, size=4))
            if name not in self.renamed.values() and name not in self.sentinels:
                return name

    def _body(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for stmt in body:
            if isinstance(stmt, ast.ClassDef):
                stmt.body = self._body(stmt.body) or [ast.Pass()]
                out.append(stmt)
            elif _is_test(stmt):
                if stmt.name not in self.keep:
                    continue
                original = stmt.name
                stmt.name = self.renamed.setdefault(original, self.opaque())
                out.append(stmt)
                # a sentinel sits just before or just after its twin, at random: code that reads the
                # tests at run time and answers with "the" expected value for an input picks wrong
                if original in self.sentinel_from:
                    sentinel = copy.deepcopy(stmt)
                    consts = _assert_constants(sentinel)
                    if consts:
                        target = consts[int(self.rng.integers(0, len(consts)))]
                        target.value = _changed(target.value)
                        sentinel.name = self.opaque()
                        self.sentinels[sentinel.name] = original
                        out.insert(len(out) - int(self.rng.integers(0, 2)), sentinel)
            else:
                out.append(stmt)
        return out

    def build(self, tree: ast.Module) -> ast.Module:
        tree.body = self._body(tree.body)
        return tree


def grading_copy(source: str, keep: set[str], sentinel_from: set[str], seed: int) -> GradingCopy:
    """The grading copy of a test module (see the module docstring). `keep` and `sentinel_from`
    hold test keys or plain function names; names are what the copy filters by."""
    rng = np.random.default_rng(seed)
    builder = _Builder({base_name(k) for k in keep}, {base_name(k) for k in sentinel_from}, rng)
    with AST_LOCK:
        tree = builder.build(ast.parse(source))
        text = ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    return GradingCopy(text, builder.renamed, builder.sentinels)


def without_tests(source: str, names: set[str]) -> str:
    """`source` with the test functions or methods called `names` cut out (decorators included),
    the rest of the text untouched: what the workspace shows when some tests are withheld."""
    lines = source.splitlines(keepends=True)
    cut: list[tuple[int, int]] = []
    with AST_LOCK:
        tree = ast.parse(source)
    for node in ast.walk(tree):
        if _is_test(node) and node.name in names:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            cut.append((first, node.end_lineno))
    drop = {ln for a, b in cut for ln in range(a, b + 1)}
    return "".join(line for i, line in enumerate(lines, 1) if i not in drop)


def sentinel_sources(source: str) -> set[str]:
    """Names of the module's tests that can be copied into sentinels: their last assertion holds a
    constant to change, and they are not parametrized (a changed constant must break every case)."""
    with AST_LOCK:
        tree = ast.parse(source)
    return {node.name for node in ast.walk(tree) if _is_test(node) and not node.decorator_list and _assert_constants(node)}


def rename_key(key: str, renamed: dict[str, str]) -> str:
    """A test key of the pristine module as it reads in the grading copy."""
    head, _, last = key.rpartition("::")
    name, bracket, param = last.partition("[")
    new = renamed.get(name, name) + bracket + param
    return f"{head}::{new}" if head else new
