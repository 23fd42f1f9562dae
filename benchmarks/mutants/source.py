"""The parsed source the mutation operators work on (libcst positions, text splices that keep every other line), and
the `Mutant` each operator yields: the mutated file text, the codes a right diagnosis may carry, how the plain-PyTorch
oracle decides the bug is real (`oracle`), and the line a right finding names (`line`, in `file`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

DRIVER_FUNCS = {"build_model", "make_inputs", "loss_fn", "make_optimizer", "train_step", "gradcheck_cases"}


@dataclass(frozen=True)
class Mutant:
    op: str
    file: str  # the mutated file
    text: str  # its mutated text
    line: int  # the line a right finding names
    codes: tuple[str, ...]
    oracle: str  # stale | trained | raises | stale_or_raises | gradcheck | stale_or_gradcheck
    site: int  # the line of the unmutated file this mutant changes (for coverage)
    phase: str  # build | step: when the site must run in the unmutated source
    desc: str
    expected_file: str | None = None  # where `line` is, when not `file`
    function: str | None = None  # the autograd.Function a right finding names


@dataclass
class Site:
    node: cst.CSTNode
    rng: CodeRange
    func: str | None  # enclosing function name
    cls: str | None  # enclosing class name
    stmt: cst.SimpleStatementLine | None = None  # enclosing simple statement
    stmt_rng: CodeRange | None = None
    extra: dict = field(default_factory=dict)


class _Collector(cst.CSTVisitor):
    def __init__(self, positions: dict) -> None:
        self.positions = positions
        self.funcs: list[str] = []
        self.classes: list[tuple[str, list[str]]] = []  # (name, base names)
        self.stmts: list[tuple[cst.SimpleStatementLine, CodeRange]] = []
        self.assigns: list[Site] = []  # single-target assignments and returns with a value
        self.calls: list[Site] = []
        self.binops: list[Site] = []
        self.function_classes: set[str] = set()
        self.funcdefs: list[Site] = []
        self.fors: list[Site] = []

    def pos(self, node: cst.CSTNode) -> CodeRange:
        return self.positions[node]

    def _site(self, node: cst.CSTNode) -> Site:
        stmt, srng = (self.stmts[-1] if self.stmts else (None, None))
        return Site(node, self.pos(node), self.funcs[-1] if self.funcs else None,
                    self.classes[-1][0] if self.classes else None, stmt, srng)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        bases = [cst.Module([]).code_for_node(b.value) for b in node.bases]
        self.classes.append((node.name.value, bases))
        if any(b.endswith("Function") for b in bases):
            self.function_classes.add(node.name.value)

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.funcs.append(node.name.value)
        self.funcdefs.append(Site(node, self.pos(node), node.name.value, self.classes[-1][0] if self.classes else None))

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.funcs.pop()

    def visit_For(self, node: cst.For) -> None:
        self.fors.append(self._site(node))

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self.stmts.append((node, self.pos(node)))
        if len(node.body) == 1:
            inner = node.body[0]
            if isinstance(inner, cst.Assign) and len(inner.targets) == 1:
                self.assigns.append(self._site(inner))
            elif isinstance(inner, cst.Return) and inner.value is not None:
                self.assigns.append(self._site(inner))

    def leave_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self.stmts.pop()

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(self._site(node))

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        self.binops.append(self._site(node))


@dataclass
class Parsed:
    file: str
    text: str
    module: cst.Module
    col: _Collector
    offsets: list[int]
    pos: dict

    def off(self, line: int, column: int) -> int:
        return self.offsets[line - 1] + column

    def src(self, rng: CodeRange) -> str:
        return self.text[self.off(rng.start.line, rng.start.column): self.off(rng.end.line, rng.end.column)]

    def splice(self, rng: CodeRange, new: str) -> str:
        a, b = self.off(rng.start.line, rng.start.column), self.off(rng.end.line, rng.end.column)
        return self.text[:a] + new + self.text[b:]

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def lines(self) -> list[str]:
        return self.text.splitlines(keepends=True)


def parse(file: str, text: str) -> Parsed:
    module = cst.parse_module(text)
    positions = dict(MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider))
    col = _Collector(positions)
    module.visit(col)
    offsets, acc = [], 0
    for ln in text.splitlines(keepends=True):
        offsets.append(acc)
        acc += len(ln)
    offsets.append(acc)
    return Parsed(file, text, module, col, offsets, positions)


def _dotted(p: Parsed, node: cst.BaseExpression) -> str:
    return p.code(node).replace(" ", "")


def _is_atom(node: cst.BaseExpression) -> bool:
    return isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not node.lpar


def _wrap(p: Parsed, node: cst.BaseExpression, rng: CodeRange) -> str:
    s = p.src(rng)
    return s if _is_atom(node) else f"({s})"


def _insert_line(text: str, before_line: int, new_line: str) -> str:
    lines = text.splitlines(keepends=True)
    lines.insert(before_line - 1, new_line if new_line.endswith("\n") else new_line + "\n")
    return "".join(lines)


def _indent_of(p: Parsed, line: int) -> str:
    ln = p.lines()[line - 1]
    return ln[: len(ln) - len(ln.lstrip())]


def _positions(p: Parsed) -> dict:
    return p.pos


def _call_name(p: Parsed, call: cst.Call) -> str:
    return _dotted(p, call.func)
