"""Driver-level mutation operators on a case's case.py (build_model, make_optimizer, train_step): what the unmutated
run measured (`Baseline`) decides where a zero_grad, a loss, a module, the optimizer or a freeze is broken."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, replace

import libcst as cst
from libcst.metadata import CodeRange

from benchmarks.mutants.source import (
    Mutant,
    Parsed,
    Site,
    _call_name,
    _insert_line,
    _positions,
)

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
