"""AST mutation operators: one small, plausible bug in one function, applied to the source text.

Each operator finds sites inside a function and rewrites only the text of the node it changes
(the rest of the file keeps its formatting and comments, so the bug does not stand out). A
mutant is kept by the miner only if the project's passing tests catch it.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field

OPERATORS = (
    "flip_comparison",
    "off_by_one",
    "swap_arguments",
    "negate_condition",
    "drop_statement",
    "drop_branch",
    "change_constant",
    "wrong_default",
    "swap_operator",
)
_FLIP = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_SWAP = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Div: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
    ast.And: ast.Or,
    ast.Or: ast.And,
}


@dataclass(frozen=True)
class Mutant:
    """One bug: where it is, which operator made it; `text` builds the file's new text on demand
    (a big module has thousands of candidates: only the ones tried are ever rendered)."""

    path: str
    function: str
    operator: str
    line: int
    function_lines: int
    source: str = field(repr=False, compare=False)
    edit: _Edit = field(repr=False, compare=False)

    @property
    def text(self) -> str:
        """The whole file with this mutation applied."""
        return _apply(self.source.splitlines(keepends=True), self.edit)


@dataclass(frozen=True)
class _Edit:
    start: tuple[int, int]  # (line, col), 1-based line, 0-based col
    end: tuple[int, int]
    new: str


def functions(source: str) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(qualname, node) of every function in a module, qualnames as Python computes them."""

    def walk(node: ast.AST, prefix: str) -> Iterator:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                yield name, child
                yield from walk(child, name + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, prefix + child.name + ".")
            else:
                yield from walk(child, prefix)

    yield from walk(ast.parse(source), "")


def _own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """Nodes of `fn`'s body, not of functions or classes nested in it."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _expr_edit(node: ast.expr, new: ast.expr) -> _Edit:
    return _Edit((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset), ast.unparse(new))


def _is_docstring(node: ast.AST, fn: ast.AST) -> bool:
    body = getattr(fn, "body", [])
    return bool(body) and body[0] is node and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)


def _sites(fn: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> Iterator[tuple[str, _Edit]]:
    import copy

    for node in _own_nodes(fn):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIP:
            new = copy.deepcopy(node)
            new.ops = [_FLIP[type(node.ops[0])]()]
            yield "flip_comparison", _expr_edit(node, new)
        if isinstance(node, ast.BinOp) and type(node.op) in _SWAP:
            new = copy.deepcopy(node)
            new.op = _SWAP[type(node.op)]()
            yield "swap_operator", _expr_edit(node, new)
        if isinstance(node, ast.BoolOp) and type(node.op) in _SWAP:
            new = copy.deepcopy(node)
            new.op = _SWAP[type(node.op)]()
            yield "swap_operator", _expr_edit(node, new)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "range"
            and node.args
            and not any(isinstance(a, ast.Starred) for a in node.args)
        ):
            stop = node.args[1] if len(node.args) > 1 else node.args[0]
            for delta in (ast.Add(), ast.Sub()):
                yield ("off_by_one", _expr_edit(stop, ast.BinOp(left=copy.deepcopy(stop), op=delta, right=ast.Constant(1))))
        if isinstance(node, ast.Slice):
            for bound in (node.lower, node.upper):
                if bound is not None:
                    yield ("off_by_one", _expr_edit(bound, ast.BinOp(left=copy.deepcopy(bound), op=ast.Add(), right=ast.Constant(1))))
        if (
            isinstance(node, ast.Call)
            and len(node.args) >= 2
            and not node.keywords
            and not any(isinstance(a, ast.Starred) for a in node.args[:2])
            and ast.dump(node.args[0]) != ast.dump(node.args[1])
        ):
            new = copy.deepcopy(node)
            new.args[0], new.args[1] = new.args[1], new.args[0]
            yield "swap_arguments", _expr_edit(node, new)
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            test = node.test
            new = (
                test.operand
                if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
                else ast.UnaryOp(op=ast.Not(), operand=copy.deepcopy(test))
            )
            yield "negate_condition", _expr_edit(test, new)
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value in range(0, 1000):
            yield "change_constant", _expr_edit(node, ast.Constant(node.value + 1 if node.value != 1 else 0))
        for block in ("body", "orelse"):
            stmts = getattr(node, block, None)
            if not isinstance(stmts, list) or not stmts or not isinstance(stmts[0], ast.stmt):
                continue
            for i, stmt in enumerate(stmts):
                if isinstance(stmt, (ast.Expr, ast.Assign, ast.AugAssign)) and not _is_docstring(stmt, node):
                    if all(lines[ln - 1].strip() for ln in range(stmt.lineno, stmt.end_lineno + 1)):
                        yield (
                            "drop_statement",
                            _drop_lines(stmt.lineno, stmt.end_lineno, lines, only=len(stmts) == 1, col=stmt.col_offset),
                        )
        if isinstance(node, ast.If) and node.orelse:
            first = node.orelse[0]
            kw = (
                first.lineno
                if isinstance(first, ast.If) and lines[first.lineno - 1].lstrip().startswith("elif")
                else next(
                    (ln for ln in range(first.lineno - 1, node.body[-1].end_lineno, -1) if lines[ln - 1].strip().startswith("else")), None
                )
            )
            if kw is not None and kw > node.body[-1].end_lineno:
                yield "drop_branch", _Edit((kw, 0), (node.orelse[-1].end_lineno + 1, 0), "")
    args = fn.args
    for default in list(args.defaults) + [d for d in args.kw_defaults if d is not None]:
        if isinstance(default, ast.Constant) and type(default.value) in (int, bool):
            value = (not default.value) if isinstance(default.value, bool) else default.value + 1
            yield "wrong_default", _expr_edit(default, ast.Constant(value))


def _drop_lines(first: int, last: int, lines: list[str], only: bool, col: int) -> _Edit:
    """Remove whole lines; a block left empty gets `pass` so the file still parses."""
    return _Edit((first, 0), (last + 1, 0), " " * col + "pass\n" if only else "")


def _apply(lines: list[str], edit: _Edit) -> str:
    (l1, c1), (l2, c2) = edit.start, edit.end
    head = "".join(lines[: l1 - 1]) + lines[l1 - 1][:c1] if l1 - 1 < len(lines) else "".join(lines)
    if l2 - 1 < len(lines):
        tail = lines[l2 - 1][c2:] + "".join(lines[l2:])
    else:
        tail = ""
    new = edit.new
    if "\n" not in new and edit.start[0] != edit.end[0] and new:  # a multi-line expression became one line
        new = "(" + new + ")"
    return head + new + tail


def _function_region(lines: list[str], fn: ast.AST, edit: _Edit) -> str:
    """The function's lines after `edit`, dedented: enough to check that a mutant parses and
    changes the program without re-parsing the whole module."""
    first = min([fn.lineno] + [d.lineno for d in getattr(fn, "decorator_list", [])])
    text = _apply(
        lines[first - 1 : fn.end_lineno],
        _Edit((edit.start[0] - first + 1, edit.start[1]), (edit.end[0] - first + 1, edit.end[1]), edit.new),
    )
    return textwrap.dedent(text)


def mutants(path: str, source: str, wanted: set[str] | None = None) -> Iterator[Mutant]:
    """Every mutant of the functions of `source` (those named in `wanted` if given), in order.

    Mutants that do not parse or do not change the program are skipped (checked on the function's
    own lines)."""
    lines = source.splitlines(keepends=True)
    for qualname, fn in functions(source):
        if wanted is not None and qualname not in wanted:
            continue
        size = fn.end_lineno - fn.lineno + 1
        try:
            original = ast.dump(ast.parse(_function_region(lines, fn, _Edit((fn.lineno, 0), (fn.lineno, 0), ""))))
        except SyntaxError:
            continue
        for operator, edit in _sites(fn, lines):
            try:
                if ast.dump(ast.parse(_function_region(lines, fn, edit))) == original:
                    continue
            except (SyntaxError, ValueError):
                continue
            yield Mutant(path, qualname, operator, edit.start[0], size, source, edit)
