"""Model-level mutation operators: each finds its sites in one file of a source (the model's forward side, a custom
Function's backward, a soft prompt) and yields the `Mutant`s that break the gradient path there (MODEL_OPS)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import libcst as cst
from libcst.metadata import CodeRange

from benchmarks.mutants.source import (
    DRIVER_FUNCS,
    Mutant,
    Parsed,
    Site,
    _call_name,
    _dotted,
    _indent_of,
    _is_atom,
    _positions,
    _wrap,
)

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
