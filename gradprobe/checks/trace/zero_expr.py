"""What a zeroing op's zero operand is in the user's source (GP318): the expression, the line that made it, and, for a
zero scale, whether it stays 0 or rises when the numbers it is computed from grow (a ramp from 0).

Read back after the step from the op's line and the names its user frame held when it ran (checks/trace/zero_ops.py):
the side of the multiply (or the `where` condition) that evaluates to the zero operand; for a name, its last
assignment in the enclosing function (the line that made it). A zero scale is re-evaluated with each number it is
computed from (a step counter, an epoch) raised by 1, 10, 100 and 1000: a nonzero value means a schedule that starts
at 0, a value that stays 0 means a weight that is 0 for good.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import textwrap
from dataclasses import dataclass, field
from typing import Any

import torch

from gradprobe.checks.core.torchcompat import untraced
from gradprobe.checks.trace.zero_ops import ZeroOp
from gradprobe.userframes import UserCode, location, statement_start

Loc = dict[str, Any]
PROBE = (1, 10, 100, 1000)
PLACEHOLDER = "__gradprobe_probe__"
INDEX_CALLS = frozenset({"index_select", "gather", "masked_select", "take", "take_along_dim"})


@dataclass
class ZeroSource:
    """The zero operand as the user wrote it."""

    expr: str | None = None  # its source text
    made_at: Loc | None = None  # the assignment of the name it reads (the line that made it)
    made_name: str | None = None
    rises: tuple[str, list[tuple[int, float]]] | None = None  # (the number that moves it, [(raised by, value)])
    inputs: list[str] = field(default_factory=list)  # the numbers the scale is computed from, as written


def _tree(filename: str) -> ast.Module | None:
    try:
        return ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return None


def _eval(node: ast.expr, env: tuple[dict[str, Any], dict[str, Any]], extra: dict[str, Any] | None = None) -> Any:
    local = dict(env[0], **(extra or {}))
    try:
        with untraced(), torch.no_grad():
            return eval(compile(ast.Expression(body=node), "<gradprobe>", "eval"), env[1], local)
    except Exception:  # an expression that needs more than the frame's names: not read
        return None


def _calls(node: ast.AST) -> int:
    return sum(isinstance(n, ast.Call) for n in ast.walk(node))


def _matches(value: Any, rec: ZeroOp) -> bool:
    if value is rec.zero:
        return True
    if rec.kind == "scale":
        if isinstance(value, torch.Tensor):
            return value.dim() == 0 and not bool(value.any())
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0
    return isinstance(value, torch.Tensor) and list(value.shape) == rec.shape and not bool(value.any())


def _indices(n: ast.AST) -> list[ast.expr]:
    """The index expressions of a subscript (`x[mask]`, `x[:, idx]`) or of an index call's arguments."""
    if isinstance(n, ast.Subscript):
        return list(n.slice.elts) if isinstance(n.slice, ast.Tuple) else [n.slice]
    if isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", None)) in INDEX_CALLS:
        return [*n.args, *(k.value for k in n.keywords)]
    return []


def _sides(stmt: ast.AST, rec: ZeroOp) -> list[ast.expr]:
    """The candidate zero operands in the statement: both sides of each multiply, each `where`'s condition, or each
    index of a selection."""
    out: list[ast.expr] = []
    for n in ast.walk(stmt):
        if rec.kind == "index":
            out += [i for i in _indices(n) if not isinstance(i, (ast.Slice, ast.Constant))]
        elif rec.kind == "where" and isinstance(n, ast.Call) and n.args and \
                getattr(n.func, "attr", getattr(n.func, "id", None)) == "where":
            out.append(n.args[0])
        elif rec.kind != "where" and isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult):
            out += sorted((n.left, n.right), key=_calls)
    return out


def _cheap(node: ast.expr, env: tuple[dict[str, Any], dict[str, Any]]) -> bool:
    """Whether evaluating `node` again calls no module (no second forward pass through the model)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            fn = _eval(n.func, env)
            if isinstance(fn, torch.nn.Module) or isinstance(getattr(fn, "__self__", None), torch.nn.Module):
                return False
    return True


def _enclosing(tree: ast.Module, line: int) -> ast.AST:
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
             and n.lineno <= line <= (n.end_lineno or n.lineno)]
    return min(funcs, key=lambda n: (n.end_lineno or n.lineno) - n.lineno) if funcs else tree


def _assignment(scope: ast.AST, name: str, before: int) -> ast.Assign | None:
    hits = [n for n in ast.walk(scope) if isinstance(n, ast.Assign) and n.lineno < before
            and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
    return max(hits, key=lambda n: n.lineno) if hits else None


def _numbers(node: ast.expr, env: tuple[dict[str, Any], dict[str, Any]]) -> list[ast.expr]:
    """The names and attributes inside `node` (not `node` itself) that hold a whole number, a step or epoch counter:
    what a schedule reads. A float that is 0 is a weight (a config value), not a counter: raising it is no ramp."""
    out: list[ast.expr] = []
    for n in ast.walk(node):
        if n is node or not isinstance(n, (ast.Name, ast.Attribute, ast.Subscript)) or not isinstance(n.ctx, ast.Load):
            continue
        if _counter(_eval(n, env)):
            out.append(n)
    return out


def _counter(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        return v.dim() == 0 and not v.is_floating_point() and not v.is_complex() and v.dtype != torch.bool
    if isinstance(v, float):
        return v != 0 and v.is_integer()
    return isinstance(v, int) and not isinstance(v, bool)


class _Swap(ast.NodeTransformer):
    def __init__(self, target: ast.AST) -> None:
        self.target = target

    def visit(self, node: ast.AST) -> ast.AST:
        if node is self.target:
            return ast.copy_location(ast.Name(id=PLACEHOLDER, ctx=ast.Load()), node)
        return super().visit(node)


def _raised(expr: ast.expr, number: ast.expr, env: tuple[dict[str, Any], dict[str, Any]]) -> list[tuple[int, float]]:
    """`expr` evaluated with `number` (a node inside it) raised by each of PROBE."""
    base = _eval(number, env)
    if not _counter(base):
        return []
    swapped = ast.fix_missing_locations(_Swap(number).visit(expr))
    if not isinstance(swapped, ast.expr):
        return []
    probed = []
    for k in PROBE:
        v = _eval(swapped, env, {PLACEHOLDER: base + k})
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = float(v)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            probed.append((k, float(v)))
    return probed


def _ramp(expr: ast.expr, env: tuple[dict[str, Any], dict[str, Any]], src: ZeroSource) -> None:
    numbers = _numbers(expr, env)
    # a swapped copy is made from the source text, so the number is found again by its text
    for number in numbers:
        text = ast.unparse(number)
        src.inputs.append(text)
        copy = ast.parse(ast.unparse(expr), mode="eval").body
        target = next((n for n in ast.walk(copy) if ast.unparse(n) == text
                       and isinstance(n, (ast.Name, ast.Attribute, ast.Subscript))), None)
        probed = _raised(copy, target, env) if target is not None else []
        if any(v != 0 for _, v in probed):
            src.rises = (text, probed)
            return


def read_zero(rec: ZeroOp) -> ZeroSource:
    """The zero operand of `rec` in the user's source, where its value was made, and whether a zero scale rises."""
    src = ZeroSource()
    loc, env = rec.location, rec.env
    tree = _tree(loc["file"]) if loc and rec.kind != "dead" else None  # a dead activation has no zero operand
    if loc is None or env is None or tree is None:
        return src
    start = statement_start(loc["file"], loc["line"])
    stmt = next((n for n in ast.walk(tree) if isinstance(n, ast.stmt) and n.lineno == start
                 and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))), None)
    if stmt is None:
        return src
    side = next((s for s in _sides(stmt, rec) if _cheap(s, env) and _matches(_eval(s, env), rec)), None)
    if side is None:
        return src
    src.expr = ast.unparse(side)
    scope = _enclosing(tree, start)
    read = [n.id for n in ast.walk(side) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    made = next(((name, a) for name in read if (a := _assignment(scope, name, start)) is not None), None)
    if made is not None:
        src.made_name = made[0]
        src.made_at = location(loc["file"], made[1].lineno, getattr(scope, "name", "<module>"))
    if rec.kind == "scale":
        # a name made on an earlier line is read through its assignment (w = min(1.0, step / warmup); loss = w * aux)
        expr = made[1].value if made is not None and isinstance(side, ast.Name) else side
        _ramp(expr, env, src)
    return src



def _path_text(parts: list[str]) -> str:
    return "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in parts)


def _writes(stmt: ast.stmt, suffix: str, root: str | None) -> bool:
    """Whether the simple statement writes the parameter reached by `suffix` (`.fc.bias`, `[0].bias`) from `root`
    (`self`), or from any root when `root` is None: an in-place init (`init.constant_(x, -10)`, `x.data.fill_(-10)`)
    or an assignment to it or its `.data`."""
    def names(t: ast.AST) -> bool:
        text = ast.unparse(t)
        for tail in ("", ".data"):
            head = text[: len(text) - len(suffix + tail)] if text.endswith(suffix + tail) else None
            if head and (head == root if root is not None else head.isidentifier()):
                return True
        return False

    if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return any(names(t.value if isinstance(t, ast.Subscript) else t) for t in targets)
    call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
    if call is None or not ast.unparse(call.func).endswith("_"):  # an in-place op: init.constant_, fill_, uniform_
        return False
    owner = call.func.value if isinstance(call.func, ast.Attribute) else None
    return any(names(a) for a in call.args[:1]) or (owner is not None and names(owner))


def _last_write(filename: str, tree: ast.AST, suffix: str, root: str | None, first: int = 1) -> Loc | None:
    hits = [n for n in ast.walk(tree) if isinstance(n, ast.stmt) and not isinstance(n, (ast.ClassDef, ast.FunctionDef))
            and _writes(n, suffix, root)]
    if not hits:
        return None
    stmt = max(hits, key=lambda n: n.lineno)
    func = next((f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                 and f.lineno <= stmt.lineno <= (f.end_lineno or f.lineno)), "<module>")
    return location(filename, first + stmt.lineno - 1, func)


def set_at(model: torch.nn.Module, name: str, user: UserCode) -> Loc | None:
    """The statement of the user's source that last wrote the parameter `name` (`fc.bias`): in the constructor of the
    outermost user class that holds it (`nn.init.constant_(self.fc.bias, -10.0)`, which runs after the inner ones), else
    anywhere in the user's files by its whole path (`model[0].bias.fill_(-100.0)` in a build function)."""
    parts = name.split(".")
    owner: Any = model
    for i in range(len(parts)):
        found = _written_in(type(owner), _path_text(parts[i:]), user)
        if found is not None:
            return found
        owner = getattr(owner, parts[i], None)
        if not isinstance(owner, torch.nn.Module):
            break
    for filename in user.files():
        tree = _tree(filename)
        found = _last_write(filename, tree, _path_text(parts), None) if tree is not None else None
        if found is not None:
            return found
    return None


def _written_in(cls: type, suffix: str, user: UserCode) -> Loc | None:
    try:
        filename = inspect.getsourcefile(cls)
        lines, start = inspect.getsourcelines(cls)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return None
    if filename is None or not user.is_user_file(filename):  # a library's own default init holds no surprise
        return None
    return _last_write(filename, tree, suffix, "self", start)
