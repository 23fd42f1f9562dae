"""Mutation operators over Python source (libcst positions, text splices that keep every other line).

Each operator finds its sites in one file of a source and yields `Mutant`s: the mutated file text, the
codes a right diagnosis may carry, how the plain-PyTorch oracle decides the bug is real (`oracle`),
and the line a right finding names (`line`, in `file`). Culprits are not guessed here: the oracle
measures them (the parameters that trained in the unmutated run and do not in the mutant).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

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


# ---------------------------------------------------------------- model-level operators

ModelOp = Callable[[Parsed, bool], Iterator[Mutant]]


def _path_sites(p: Parsed, is_driver_file: bool) -> Iterator[Site]:
    """Assignments / returns on the forward side: inside a function that is not __init__ or a driver function."""
    for s in p.col.assigns:
        if s.func is None or s.func == "__init__" or s.func.startswith("_init"):
            continue
        if is_driver_file and s.func in DRIVER_FUNCS:
            continue
        if s.cls is not None and s.cls in p.col.function_classes:
            continue  # inside a custom Function: other operators
        node = s.node
        value = node.value if isinstance(node, (cst.Assign, cst.Return)) else None
        if value is None or isinstance(value, (cst.Tuple, cst.Name, cst.SimpleString, cst.Integer, cst.Float,
                                                cst.List, cst.Dict, cst.Lambda, cst.GeneratorExp, cst.ListComp)):
            continue
        if isinstance(node, cst.Assign) and not isinstance(node.targets[0].target, (cst.Name, cst.Attribute)):
            continue
        yield s


def _value(s: Site) -> cst.BaseExpression:
    assert isinstance(s.node, (cst.Assign, cst.Return)) and s.node.value is not None
    return s.node.value


def _expr_op(name: str, codes: tuple[str, ...], oracle: str, fmt: Callable[[str], str], desc: str) -> ModelOp:
    def op(p: Parsed, is_driver_file: bool) -> Iterator[Mutant]:
        for s in _path_sites(p, is_driver_file):
            v = _value(s)
            vr = _value_range(p, s)
            new = fmt(_wrap(p, v, vr))
            text = p.splice(vr, new)
            yield Mutant(name, p.file, text, vr.start.line, codes, oracle, vr.start.line, "step",
                         f"{desc} at {p.file}:{vr.start.line}")
    return op


def _value_range(p: Parsed, s: Site) -> CodeRange:
    rng = s.extra.get("value_rng")
    if rng is None:
        rng = _positions(p)[_value(s)]
        s.extra["value_rng"] = rng
    return rng


def _positions(p: Parsed) -> dict:
    return p.pos


def op_no_grad(p: Parsed, is_driver_file: bool) -> Iterator[Mutant]:
    for s in _path_sites(p, is_driver_file):
        assert s.stmt_rng is not None
        a, b = s.stmt_rng.start.line, s.stmt_rng.end.line
        lines = p.lines()
        indent = _indent_of(p, a)
        body = "".join("    " + ln if ln.strip() else ln for ln in lines[a - 1: b])
        text = "".join(lines[: a - 1]) + f"{indent}with torch.no_grad():\n" + body + "".join(lines[b:])
        yield Mutant("no_grad", p.file, text, a + 1, ("GP303",), "stale", a, "step",
                     f"statement at {p.file}:{a} wrapped in torch.no_grad()")


def op_inplace(p: Parsed, is_driver_file: bool) -> Iterator[Mutant]:
    """`x = x + e` -> `x += e`; `t = a + e` -> `t = a.add_(e)`; F.relu/silu(h) -> inplace=True."""
    methods = {"+": "add_", "-": "sub_", "*": "mul_", "/": "div_"}
    pos = _positions(p)
    for s in _path_sites(p, is_driver_file):
        v = _value(s)
        if isinstance(v, cst.BinaryOperation) and isinstance(v.left, cst.Name) and not v.lpar:
            sym = p.code(v.operator).strip()
            if sym not in methods:
                continue
            right = p.src(pos[v.right])
            node = s.node
            if isinstance(node, cst.Assign) and isinstance(node.targets[0].target, cst.Name) \
                    and node.targets[0].target.value == v.left.value:
                assert s.stmt_rng is not None
                new = f"{v.left.value} {sym}= {right}"
                text = p.splice(pos[node], new)
            else:
                new = f"{v.left.value}.{methods[sym]}({right})"
                text = p.splice(pos[v], new)
            line = pos[v].start.line
            yield Mutant("inplace", p.file, text, line, ("GP308",), "raises", line, "step",
                         f"out-of-place `{sym}` made in-place at {p.file}:{line}")
        elif isinstance(v, cst.Call) and _dotted(p, v.func) in {"F.relu", "F.silu", "F.leaky_relu", "F.elu",
                                                             "nn.functional.relu", "torch.nn.functional.silu"}:
            if any(a.keyword and a.keyword.value == "inplace" for a in v.args):
                continue
            r = pos[v]
            text = p.splice(r, p.src(r)[:-1] + ", inplace=True)")
            yield Mutant("inplace", p.file, text, r.start.line, ("GP308",), "raises", r.start.line, "step",
                         f"activation made in-place at {p.file}:{r.start.line}")


def _call_name(p: Parsed, call: cst.Call) -> str:
    return _dotted(p, call.func)


def _self_assign_target(s: Site) -> str | None:
    st = s.stmt.body[0] if isinstance(s.stmt, cst.SimpleStatementLine) else None
    if isinstance(st, cst.Assign) and isinstance(st.targets[0].target, cst.Attribute):
        t = st.targets[0].target
        if isinstance(t.value, cst.Name) and t.value.value == "self":
            return t.attr.value
    return None


def op_parameter(p: Parsed, is_driver_file: bool) -> Iterator[Mutant]:
    """nn.Parameter(E) -> E (GP101), -> E.requires_grad_() (GP101), self.x = nn.Parameter(E) -> register_buffer (GP104)."""
    pos = _positions(p)
    for s in p.col.calls:
        call = s.node
        assert isinstance(call, cst.Call)
        if not _call_name(p, call).endswith("Parameter") or not call.args or s.func != "__init__":
            continue
        arg = call.args[0].value
        ar = pos[arg]
        r = pos[call]
        inner = _wrap(p, arg, ar)
        line = r.start.line
        yield Mutant("param_to_tensor", p.file, p.splice(r, p.src(ar)), line, ("GP101",), "stale", line, "build",
                     f"nn.Parameter dropped at {p.file}:{line}")
        yield Mutant("param_to_tensor_rg", p.file, p.splice(r, f"{inner}.requires_grad_()"), line, ("GP101",), "stale",
                     line, "build", f"nn.Parameter replaced by a requires_grad tensor at {p.file}:{line}")
        attr = _self_assign_target(s)
        st = s.stmt.body[0] if isinstance(s.stmt, cst.SimpleStatementLine) else None
        if attr and isinstance(st, cst.Assign) and st.value is call:
            text = p.splice(pos[st], f'self.register_buffer("{attr}", {p.src(ar)})')
            yield Mutant("param_as_buffer", p.file, text, line, ("GP104", "GP101"), "stale", line, "build",
                         f"parameter registered as a buffer at {p.file}:{line}")


def op_container(p: Parsed, is_driver_file: bool) -> Iterator[Mutant]:
    table = {"ModuleList": ("list", "GP103"), "ModuleDict": ("dict", "GP103"),
             "ParameterList": ("list", "GP102"), "ParameterDict": ("dict", "GP102")}
    pos = _positions(p)
    for s in p.col.calls:
        call = s.node
        assert isinstance(call, cst.Call)
        last = _call_name(p, call).rsplit(".", 1)[-1]
        if last not in table or s.func != "__init__":
            continue
        plain, code = table[last]
        fr = pos[call.func]
        text = p.splice(fr, plain) if call.args else p.splice(pos[call], f"{plain}()")
        line = fr.start.line
        yield Mutant("container_to_plain", p.file, text, line, (code,), "stale", line, "build",
                     f"nn.{last} made a plain {plain} at {p.file}:{line}")


def op_apply_to_forward(p: Parsed, is_driver_file: bool) -> Iterator[Mutant]:
    pos = _positions(p)
    for s in p.col.calls:
        call = s.node
        assert isinstance(call, cst.Call)
        f = call.func
        if isinstance(f, cst.Attribute) and f.attr.value == "apply" and isinstance(f.value, cst.Name) \
                and f.value.value in p.col.function_classes:
            ar = pos[f.attr]
            text = p.splice(ar, "forward")
            # insert a context as the first argument
            lp = pos[call]
            head = p.src(lp)
            head_new = head.replace(".apply(", ".forward(torch.autograd.function.FunctionCtx(), ", 1)
            text = p.splice(lp, head_new)
            line = lp.start.line
            yield Mutant("apply_to_forward", p.file, text, line, ("GP406",), "stale", line, "step",
                         f"{f.value.value}.apply called as .forward at {p.file}:{line}", function=f.value.value)


def _backward_sites(p: Parsed) -> Iterator[Site]:
    for s in p.col.assigns:
        if s.func == "backward" and s.cls in p.col.function_classes:
            yield s


def op_backward(p: Parsed, is_driver_file: bool) -> Iterator[Mutant]:
    pos = _positions(p)
    for s in _backward_sites(p):
        node = s.node
        if isinstance(node, cst.Assign) and isinstance(node.targets[0].target, cst.Name) \
                and node.targets[0].target.value.startswith("grad"):
            v = node.value
            vr = pos[v]
            w = _wrap(p, v, vr)
            line = vr.start.line
            yield Mutant("backward_factor", p.file, p.splice(vr, f"2 * {w}" if not _is_atom(v) else f"2 * {w}"), line,
                         ("GP401",), "gradcheck", line, "step", f"gradient scaled by 2 at {p.file}:{line}",
                         function=s.cls)
            yield Mutant("backward_sign", p.file, p.splice(vr, f"-{w}"), line, ("GP401",), "gradcheck", line, "step",
                         f"gradient sign flipped at {p.file}:{line}", function=s.cls)
        if isinstance(node, cst.Return) and isinstance(node.value, cst.Tuple) and len(node.value.elements) > 1:
            els = node.value.elements
            line = pos[node].start.line
            for i, el in enumerate(els):
                if isinstance(el.value, cst.Name) and el.value.value == "None":
                    continue
                er = pos[el.value]
                yield Mutant("grad_dropped", p.file, p.splice(er, "None"), line, ("GP404", "GP401"),
                             "stale_or_gradcheck", line, "step", f"gradient {i} replaced by None at {p.file}:{line}",
                             function=s.cls)
            vr = pos[node.value]
            text = p.splice(vr, ", ".join(p.src(pos[e.value]) for e in els[:-1]))
            yield Mutant("grad_count", p.file, text, line, ("GP402",), "raises", line, "step",
                         f"last gradient dropped from the return at {p.file}:{line}", function=s.cls)


def op_prompt(p: Parsed, is_driver_file: bool) -> Iterator[Mutant]:
    """Prompt-tuning forms: inputs_embeds -> input_ids, generate() in the loss, mask/labels over the prompt."""
    pos = _positions(p)
    for s in p.col.calls:
        call = s.node
        assert isinstance(call, cst.Call)
        for a in call.args:
            if a.keyword is not None and a.keyword.value == "inputs_embeds":
                r = pos[a]
                text = p.splice(r, f"input_ids={_wrap(p, a.value, pos[a.value])}.argmax(-1)")
                line = r.start.line
                yield Mutant("embeds_to_ids", p.file, text, line, ("GP502",), "stale", line, "step",
                             f"inputs_embeds passed as input_ids (argmax) at {p.file}:{line}")
        name = _call_name(p, call)
        if name.endswith(".new_ones") and s.stmt is not None:
            st = s.stmt.body[0]
            if isinstance(st, cst.Assign) and "mask" in p.code(st.targets[0].target):
                r = pos[call.func]
                text = p.splice(r, p.src(r)[: -len("new_ones")] + "new_zeros")
                line = r.start.line
                yield Mutant("mask_over_prompt", p.file, text, line, ("GP506",), "stale", line, "step",
                             f"attention mask zero over the prompt at {p.file}:{line}")
    for s in p.col.assigns:
        node = s.node
        if isinstance(node, cst.Assign) and isinstance(node.targets[0].target, cst.Name):
            v = node.value
            tname = node.targets[0].target.value
            if "label" in tname and isinstance(v, cst.Call) and _call_name(p, v) == "torch.cat":
                r = pos[v]
                yield Mutant("labels_unpadded", p.file, p.splice(r, tname), r.start.line, ("GP507",), "raises",
                             r.start.line, "step", f"labels not padded over the prompt at {p.file}:{r.start.line}")
            if isinstance(v, cst.Subscript) and isinstance(v.value, cst.Attribute) and v.value.attr.value == "logits" \
                    and isinstance(v.value.value, cst.Call):
                inner = v.value.value
                if any(a.keyword is not None and a.keyword.value == "inputs_embeds" for a in inner.args):
                    args = ", ".join(p.code(a).rstrip(", ") for a in inner.args)
                    new = (f"{p.code(inner.func)}.generate({args}, max_new_tokens=1, do_sample=False, "
                           "output_scores=True, return_dict_in_generate=True).scores[0]")
                    r = pos[v]
                    yield Mutant("generate_in_loss", p.file, p.splice(r, new), r.start.line, ("GP505", "GP303"),
                                 "stale", r.start.line, "step", f"logits taken from generate() at {p.file}:{r.start.line}")


MODEL_OPS: dict[str, ModelOp] = {
    "detach": _expr_op("detach", ("GP302",), "stale", lambda s: f"{s}.detach()", ".detach() inserted"),
    "data": _expr_op("data", ("GP302",), "stale", lambda s: f"{s}.data", ".data inserted"),
    "tolist": _expr_op("tolist", ("GP304",), "stale", lambda s: f"torch.tensor({s}.tolist())",
                       ".tolist() round trip"),
    "numpy": _expr_op("numpy", ("GP304", "GP302"), "stale",
                      lambda s: f"torch.from_numpy({s}.detach().cpu().numpy())", ".numpy() round trip"),
    "round": _expr_op("round", ("GP305",), "stale", lambda s: f"torch.round({s})", "torch.round on the path"),
    "long": _expr_op("long", ("GP305",), "stale", lambda s: f"{s}.long().float()", ".long() cast on the path"),
    "argmax": _expr_op("argmax", ("GP305",), "stale",
                       lambda s: f"torch.nn.functional.one_hot({s}.argmax(-1), {s}.shape[-1]).float()",
                       "hard one-hot (argmax) on the path"),
    "save_load": _expr_op("save_load", ("GP309",), "stale",
                          lambda s: (f"(torch.save({s}, _buf := __import__('io').BytesIO()), _buf.seek(0), "
                                     "torch.load(_buf))[2]"), "torch.save/torch.load round trip"),
    "mp_queue": _expr_op("mp_queue", ("GP309",), "stale_or_raises",
                         lambda s: (f"(_q := __import__('multiprocessing').SimpleQueue(), _q.put({s}), _q.get())[2]"),
                         "sent through a multiprocessing queue"),
    "no_grad": op_no_grad,
    "inplace": op_inplace,
    "parameter": op_parameter,
    "container_to_plain": op_container,
    "apply_to_forward": op_apply_to_forward,
    "backward": op_backward,
    "prompt": op_prompt,
}


# ---------------------------------------------------------------- driver-level operators (case.py)

@dataclass(frozen=True)
class Baseline:
    """What the unmutated run measured, that driver operators need."""
    children: tuple[str, ...]  # module paths with trainable parameters (1-2 levels deep)
    params: tuple[str, ...]  # trainable parameter names that trained
    optimizer_line: int | None  # the statement in make_optimizer that builds the optimizer


def _func(p: Parsed, name: str) -> Site | None:
    for s in p.col.funcdefs:
        if s.func == name and s.cls is None:
            return s
    return None


def _stmts_in(p: Parsed, fn: Site) -> list[tuple[cst.CSTNode, CodeRange]]:
    pos = _positions(p)
    assert isinstance(fn.node, cst.FunctionDef)
    out: list[tuple[cst.CSTNode, CodeRange]] = []
    for st in fn.node.body.body:
        out.append((st, pos[st]))
    return out


def _return_line(p: Parsed, fn_name: str) -> int | None:
    fn = _func(p, fn_name)
    if fn is None:
        return None
    for st, r in _stmts_in(p, fn):
        if isinstance(st, cst.SimpleStatementLine) and isinstance(st.body[0], cst.Return):
            return r.start.line
    return None


def optimizer_statement_line(p: Parsed) -> int | None:
    fn = _func(p, "make_optimizer")
    if fn is None:
        return None
    for st, r in _stmts_in(p, fn):
        if "optim." in p.code(st) or "Optimizer" in p.code(st):
            return r.start.line
    return None


def driver_mutants(p: Parsed, base: Baseline, rng: random.Random, per_op: int) -> Iterator[Mutant]:
    ret_build = _return_line(p, "build_model")
    ret_opt = _return_line(p, "make_optimizer")
    yield from _zero_grad_moved(p)
    yield from _loss_non_scalar(p)
    if ret_build is not None:
        yield from _build_mutants(p, base, rng, per_op, ret_build, ret_opt)
    if ret_opt is not None:
        yield from _module_replaced(p, base, rng, per_op, ret_opt)
    yield from _optimizer_mutants(p)


def _zero_grad_moved(p: Parsed) -> Iterator[Mutant]:
    # zero_grad() moved between backward() and step()
    ts = _func(p, "train_step")
    if ts is not None:
        body = _stmts_in(p, ts)
        zg = [(st, r) for st, r in body if ".zero_grad(" in p.code(st)]
        bw = [(st, r) for st, r in body if ".backward(" in p.code(st)]
        stp = [(st, r) for st, r in body if ".step(" in p.code(st)]
        if zg and bw and stp and not (bw[0][1].start.line < zg[0][1].start.line < stp[0][1].start.line):
            lines = p.lines()
            zl = zg[0][1].start.line
            zline = lines[zl - 1]
            rest = lines[: zl - 1] + lines[zl:]
            bl = bw[0][1].start.line - (1 if zl < bw[0][1].start.line else 0)
            rest.insert(bl, zline)
            yield Mutant("zero_grad_moved", "case.py", "".join(rest), bl + 1, ("GP207",), "stale", zl, "step",
                         "optimizer.zero_grad() moved between backward() and step()")


def _loss_non_scalar(p: Parsed) -> Iterator[Mutant]:
    pos = _positions(p)
    for fn_name in ("loss_fn", "train_step"):
        fn = _func(p, fn_name)
        if fn is None:
            continue
        for s in p.col.calls:
            call = s.node
            assert isinstance(call, cst.Call)
            if s.func != fn_name:
                continue
            name = _call_name(p, call)
            if name.rsplit(".", 1)[-1] in {"cross_entropy", "mse_loss", "binary_cross_entropy_with_logits", "l1_loss"}:
                red = [a for a in call.args if a.keyword is not None and a.keyword.value == "reduction"]
                r = pos[call]
                if red:
                    text = p.splice(pos[red[0].value], '"none"')
                else:
                    text = p.splice(r, p.src(r)[:-1] + ', reduction="none")')
                yield Mutant("loss_non_scalar", "case.py", text, r.start.line, ("GP310",), "raises", r.start.line,
                             "step", f"loss reduction='none' at case.py:{r.start.line}")
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "mean" and not call.args:
                r = pos[call]
                inner = pos[call.func.value]
                text = p.splice(r, p.src(inner))
                yield Mutant("loss_non_scalar", "case.py", text, r.start.line, ("GP310",), "raises", r.start.line,
                             "step", f".mean() dropped from the loss at case.py:{r.start.line}")


def _build_mutants(p: Parsed, base: Baseline, rng: random.Random, per_op: int, ret_build: int,
                   ret_opt: int | None) -> Iterator[Mutant]:
    ind = "    "
    yield Mutant("freeze_all", "case.py", _insert_line(p.text, ret_build, f"{ind}model.requires_grad_(False)"),
                 ret_build, ("GP110",), "stale_or_raises", ret_build, "build", "whole model frozen in build_model")
    for child in rng.sample(list(base.children), min(per_op, len(base.children))):
        yield Mutant("freeze_submodule", "case.py",
                     _insert_line(p.text, ret_build, f"{ind}model.{_attr_path(child)}.requires_grad_(False)"), ret_build,
                     # GP110 when that child holds every parameter (a wrapper's only child: all is frozen)
                     ("GP203", "GP105", "GP110"), "stale", ret_build, "build", f"submodule {child} frozen in build_model")
    for name in rng.sample(list(base.params), min(per_op, len(base.params))):
        yield Mutant("hook_zero", "case.py",
                     _insert_line(p.text, ret_build, f"{ind}model.{_attr_path(name)}.register_hook(lambda g: g * 0)"),
                     ret_build, ("GP313",), "stale", ret_build, "build", f"a hook zeroes the gradient of {name}")
    # model surgery moved after the optimizer (e.g. a crop_block_size() call)
    bm = _func(p, "build_model")
    if bm is not None and ret_opt is not None:
        for st, r in _stmts_in(p, bm):
            code = p.code(st).strip()
            if code.startswith("model.") and "(" in code and "requires_grad" not in code and "=" not in code:
                lines = p.lines()
                sl = r.start.line
                moved = lines[sl - 1]
                rest = lines[: sl - 1] + lines[sl:]
                at = ret_opt - 1 - 1  # index of the return line after removal
                rest.insert(at, moved)
                yield Mutant("surgery_after_optimizer", "case.py", "".join(rest), at + 1, ("GP202", "GP201"),
                             "stale", sl, "build", f"`{code}` moved after the optimizer was built")


def _module_replaced(p: Parsed, base: Baseline, rng: random.Random, per_op: int, ret_opt: int) -> Iterator[Mutant]:
    ind = "    "
    for child in rng.sample(list(base.children), min(per_op, len(base.children))):
        path = _attr_path(child)
        yield Mutant("module_replaced", "case.py",
                     _insert_line(p.text, ret_opt, f"{ind}model.{path} = copy.deepcopy(model.{path})"),
                     ret_opt, ("GP202", "GP201"), "stale", ret_opt, "build",
                     f"{child} replaced after the optimizer was built")


def _optimizer_mutants(p: Parsed) -> Iterator[Mutant]:
    pos = _positions(p)
    # param group lr 0 / an element dropped from the optimizer's list
    fn = _func(p, "make_optimizer")
    if fn is not None:
        for s in p.col.calls:
            call = s.node
            assert isinstance(call, cst.Call)
            if s.func != "make_optimizer" or "optim." not in _call_name(p, call) or not call.args:
                continue
            first = call.args[0].value
            if isinstance(first, cst.List):
                dicts = [e for e in first.elements if isinstance(e.value, cst.Dict)]
                for e in dicts:
                    r = pos[e.value]
                    text = p.splice(r, '{"lr": 0.0, ' + p.src(r)[1:])
                    yield Mutant("lr_zero_group", "case.py", text, r.start.line, ("GP205", "GP207"), "stale",
                                 r.start.line, "build", f"param group with lr 0 at case.py:{r.start.line}")
                plain = [e for e in first.elements if not isinstance(e.value, cst.Dict)]
                if len(plain) > 1:
                    line = pos[call].start.line
                    stmt_line = s.stmt_rng.start.line if s.stmt_rng else line
                    for e in plain:
                        r = pos[e]
                        text = p.splice(r, "")
                        cut = p.off(r.start.line, r.start.column)
                        after = text[cut:]
                        if after.lstrip(" ").startswith(","):  # the element's comma goes with it
                            text = text[:cut] + after.lstrip(" ")[1:]
                        yield Mutant("dropped_from_optimizer", "case.py", text, stmt_line,
                                     ("GP504", "GP201"), "stale", r.start.line, "build",
                                     f"`{p.code(e.value)}` left out of the optimizer")
            else:
                lr = [a for a in call.args if a.keyword is not None and a.keyword.value == "lr"]
                if lr:
                    r = pos[lr[0].value]
                    yield Mutant("lr_zero_group", "case.py", p.splice(r, "0.0"), r.start.line, ("GP205", "GP207"),
                                 "stale", r.start.line, "build", f"lr 0 at case.py:{r.start.line}")


def _attr_path(name: str) -> str:
    """`h.0.attn.weight` -> `h[0].attn.weight` (a Python expression)."""
    out: list[str] = []
    for part in name.split("."):
        if part.isdigit():
            out[-1] = out[-1] + f"[{part}]"
        else:
            out.append(part)
    return ".".join(out)


def grad_mode_mutant(p: Parsed) -> Mutant:
    text = p.text if p.text.endswith("\n") else p.text + "\n"
    line = len(text.splitlines()) + 1
    return Mutant("grad_mode_off", p.file, text + "torch.set_grad_enabled(False)\n", line, ("GP111",),
                  "stale_or_raises", 1, "build", f"torch.set_grad_enabled(False) left on at import of {p.file}")


def unfreeze_mutants(p: Parsed, optimizer_line: int | None) -> Iterator[Mutant]:
    """The base model's freezing statement removed (`pass`): the optimizer line takes the base."""
    if optimizer_line is None:
        return
    pos = _positions(p)
    for s in p.col.calls:
        call = s.node
        assert isinstance(call, cst.Call)
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "requires_grad_" and s.func == "__init__" \
                and call.args and p.code(call.args[0].value) == "False" and s.stmt_rng is not None:
            stmt = s.stmt
            assert stmt is not None
            text = p.splice(pos[stmt.body[0]], "pass")
            yield Mutant("base_unfrozen", p.file, text, optimizer_line, ("GP503", "GP508"), "trained",
                         s.stmt_rng.start.line, "build", f"freezing call removed at {p.file}:{s.stmt_rng.start.line}",
                         expected_file="case.py")
    for s in p.col.assigns:
        node = s.node
        if isinstance(node, cst.Assign) and s.func == "__init__" and p.code(node.targets[0].target).endswith(
                ".requires_grad") and p.code(node.value) == "False":
            text = p.splice(pos[node], "pass")
            line = pos[node].start.line
            yield Mutant("base_unfrozen", p.file, text, optimizer_line, ("GP503", "GP508"), "trained", line, "build",
                         f"freezing loop body removed at {p.file}:{line}", expected_file="case.py")


def with_expected_file(m: Mutant, file: str) -> Mutant:
    return replace(m, expected_file=file)
