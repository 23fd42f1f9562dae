"""GP319: a freezing rule that matched more than it names. For each user line that froze parameters (recorded while
build_model ran: loading.py's requires_grad_/requires_grad recorder, with the frame's names at its first freeze),
the patterns its enclosing `if` tests (string literals, or the strings a variable or config value held), and, for
every parameter that line froze, whether a pattern matched it as a whole name component (`layer` in
`encoder.layer.3.attn.weight`) or only inside a longer one (`layer` in `encoder.layernorm.weight`,
`head.out_layer.bias`). A rule that froze both kinds froze more than it names: a warning at the line of its condition,
with both counts. A rule whose every match is whole is the user's freeze, as meant: GP105's info says it.
The same reading applies to the name filter of a comprehension over named_parameters() in the function that builds
the optimizer, for the trainable parameters it left out (GP201 says they are missing; this says which line's pattern
left them out, and how).

Why this measurement: the freeze itself is recorded exactly (the recorder already wraps both ways of freezing); the
rule's intent is read from the condition the user wrote, evaluated with the names the frame held, so a pattern from a
config file counts like a literal. Written from google-research/adapter-bert issue #8 ("freezing layer_norm and
head"): freezing by name must leave the layer norms and the classifier head trainable, and a name test that also
matches them freezes what should learn.
"""

from __future__ import annotations

import ast
import linecache
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch.nn as nn

from gradprobe.findings import Finding, Rule, Situation
from gradprobe.userframes import location

Loc = dict[str, Any]

GP319: Rule[FreezeFacts] = Rule(
    code="GP319", name="freeze-rule-overmatch", severity="warning", rank=40,
    summary="A freezing rule (a name test) froze parameters it matched only inside a longer name, besides those it names.",
    why="`if \"layer\" in name` also matches `layernorm` and `out_layer`: the layer norms or the head are frozen with the "
        "blocks and never learn, which reading the config alone does not show.",
    example="for n, p in model.named_parameters():\n    if 'layer' in n: p.requires_grad = False",
    message="The freezing rule at line {line} of {file} tests {patterns} and froze {total} tensors: {whole} have it as a "
            "whole name component ({whole_names}), {partial} contain it only inside a longer name ({partial_names}; "
            "modules {classes}).",
    fix="Match whole name components at line {line} of {file} (e.g. name.startswith(\"{prefix}\")) so that the rule "
        "freezes only the {whole} tensors it names; {partial_names} then stay trainable.",
    situations={
        "config": Situation(
            when="the pattern is a value the condition reads from a variable or config, not a literal on the line",
            message="The freezing rule at line {line} of {file} tests {patterns} (from `{source}`) and froze {total} "
                    "tensors: {whole} have it as a whole name component ({whole_names}), {partial} contain it only "
                    "inside a longer name ({partial_names}; modules {classes}).",
            fix="Narrow the value of `{source}` (the patterns the rule at line {line} of {file} tests) to whole name "
                "components (e.g. \"{prefix}\" instead of \"{first}\"), or compare components in the rule; {partial_names} "
                "then stay trainable."),
        "left_out": Situation(
            when="the rule is the name filter of a comprehension over named_parameters() that builds the optimizer's "
                 "parameters, and what it left out of the optimizer",
            message="The parameter filter at line {line} of {file} tests {patterns} and left {total} trainable tensors out "
                    "of the optimizer: {whole} have it as a whole name component ({whole_names}), {partial} contain it "
                    "only inside a longer name ({partial_names}; modules {classes}).",
            fix="Test whole name components in the filter at line {line} of {file} (e.g. not n.startswith(\"{prefix}\")) "
                "so that it leaves out only the {whole} tensors it names; {partial_names} then get updated."),
    },
)


@dataclass
class FreezeRule:
    """One user line that froze parameters, and what its condition tests."""

    at: Loc  # the freezing line
    condition_at: Loc | None  # the line of the `if` whose test picks what to freeze
    patterns: list[str] = field(default_factory=list)
    source: str | None = None  # the variable or config expression the patterns came from (None: literals)
    whole: list[str] = field(default_factory=list)  # frozen tensors the patterns match as a whole component
    partial: list[str] = field(default_factory=list)  # frozen tensors they match only inside a longer name
    classes: list[str] = field(default_factory=list)  # module classes of the partial ones
    left_out: bool = False  # an optimizer's parameter filter (what it left out), not a freeze


@dataclass
class FreezeFacts:
    rules: list[FreezeRule] = field(default_factory=list)


def _whole(pattern: str, name: str) -> bool:
    """`pattern` occurs in `name` on component boundaries ('.'), a plural 's' or a layer index allowed after it."""
    p = pattern.strip(".")
    if not p:
        return False
    return re.search(rf"(?:^|\.){re.escape(p)}(?:s)?(?:\d+)?(?:$|\.)", name) is not None


def _tests(tree: ast.AST, line: int) -> list[ast.expr]:
    """The `if` tests (and comprehension conditions) enclosing `line`, innermost first."""
    out: list[tuple[int, ast.expr]] = []
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and n.lineno <= line <= (n.end_lineno or n.lineno):
            out.append((n.lineno, n.test))
        elif isinstance(n, ast.comprehension):
            out += [(i.lineno, i) for i in n.ifs if i.lineno <= line <= (i.end_lineno or i.lineno) + 1]
    return [t for _, t in sorted(out, key=lambda x: -x[0])]


def _strings(value: Any) -> list[str] | None:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple, set, frozenset)) and value and len(value) <= 100 and \
            all(isinstance(v, str) for v in value):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    return None


def _patterns(test: ast.expr, env: tuple[dict[str, Any], dict[str, Any]], names: list[str]) -> tuple[list[str], str | None]:
    """The strings `test` compares names with: literals, else the value of a variable or config expression it reads
    (the loop's own name variable, a suffix of a frozen parameter's name, is not a pattern)."""
    literals = [n.value for n in ast.walk(test) if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value]
    if literals:
        return literals, None
    for n in ast.walk(test):
        if not isinstance(n, (ast.Name, ast.Attribute, ast.Subscript)) or not isinstance(n.ctx, ast.Load):
            continue
        try:
            value = eval(compile(ast.Expression(body=n), "<gradprobe>", "eval"), env[1], dict(env[0]))
        except Exception:  # a name bound only inside a generator: not readable afterwards
            continue
        found = _strings(value)
        if found and not any(full.endswith(s) for s in found for full in names):
            return found, ast.unparse(n)
    return [], None


def _rule(at: Loc, frozen: list[str], classes: dict[str, str], env: Any) -> FreezeRule | None:
    try:
        tree = ast.parse("".join(linecache.getlines(at["file"])))
    except (SyntaxError, ValueError):
        return None
    for test in _tests(tree, at["line"]):
        patterns, source = _patterns(test, env, frozen) if env is not None else ([], None)
        if not patterns and env is None:
            patterns = [n.value for n in ast.walk(test) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        if patterns:
            rule = FreezeRule(at, location(at["file"], test.lineno, at["function"]), patterns, source)
            for n in frozen:
                (rule.whole if any(_whole(p, n) for p in patterns) else rule.partial).append(n)
            rule.classes = sorted({classes.get(n, "?") for n in rule.partial})
            return rule
    return None


def measure_freezes(model: nn.Module, record: Any) -> FreezeFacts:
    """Each recorded freezing line, its patterns, and which of the tensors it froze they match whole or in part."""
    facts = FreezeFacts()
    sites = getattr(record, "frozen_sites", None) or {}
    if not sites:
        return facts
    by_line: dict[tuple[str, int], tuple[Loc, list[str]]] = {}
    classes = _module_classes(model)
    for mname, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            full = f"{mname}.{pname}" if mname else pname
            hit = sites.get(id(p))
            if hit is not None and not p.requires_grad:
                loc = hit[1]
                by_line.setdefault((loc["file"], loc["line"]), (loc, []))[1].append(full)
    frames = getattr(record, "freeze_frames", None) or {}
    for key, (loc, frozen) in by_line.items():
        rule = _rule(loc, frozen, classes, frames.get(key))
        if rule is not None:
            facts.rules.append(rule)
    return facts


def _prefix(pattern: str, whole: list[str]) -> str:
    """The name prefix the whole matches share, up to the pattern's component ("encoder.layer."), else ".pattern."."""
    p = pattern.strip(".")
    heads: set[str | None] = set()
    for n in whole:
        parts = n.split(".")
        i = next((k for k, c in enumerate(parts) if re.fullmatch(rf"{re.escape(p)}s?\d*", c)), None)
        heads.add(".".join(parts[: i + 1]) + "." if i is not None else None)
    head = heads.pop() if len(heads) == 1 else None
    return head if head is not None else f".{p}."


def _module_classes(model: nn.Module) -> dict[str, str]:
    return {f"{m}.{p}" if m else p: type(mod).__name__
            for m, mod in model.named_modules() for p, _ in mod.named_parameters(recurse=False)}


def _filters(tree: ast.AST, site: Loc) -> list[ast.comprehension]:
    """Comprehensions over `.named_parameters()` with a condition, in the function that built the optimizer."""
    scope = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.lineno <= site["line"] <= (n.end_lineno or n.lineno) and n.name == site.get("function")), None)
    return [c for c in ast.walk(scope) if isinstance(c, ast.comprehension) and c.ifs and isinstance(c.iter, ast.Call)
            and getattr(c.iter.func, "attr", None) == "named_parameters"] if scope is not None else []


def measure_left_out(model: nn.Module, missing: list[str], site: Loc | None) -> FreezeFacts:
    """The name filter in the optimizer's function that left `missing` (trainable parameters in no group) out, and
    which of them its literal patterns match whole or in part (a pattern read from a config is not judged here)."""
    facts = FreezeFacts()
    if not missing or site is None:
        return facts
    try:
        tree = ast.parse("".join(linecache.getlines(site["file"])))
    except (SyntaxError, ValueError):
        return facts
    classes = _module_classes(model)
    for comp in _filters(tree, site):
        patterns = [n.value for c in comp.ifs for n in ast.walk(c) if isinstance(n, ast.Constant)
                    and isinstance(n.value, str) and n.value]
        hit = [n for n in missing if any(p.strip(".") in n for p in patterns)]
        if not patterns or not hit:
            continue
        at = location(site["file"], comp.ifs[0].lineno, site.get("function") or "?")
        rule = FreezeRule(at, at, patterns, left_out=True)
        for n in hit:
            (rule.whole if any(_whole(p, n) for p in patterns) else rule.partial).append(n)
        rule.classes = sorted({classes.get(n, "?") for n in rule.partial})
        facts.rules.append(rule)
    return facts


def _names(names: list[str], cap: int = 4) -> str:
    return ", ".join(names[:cap]) + (f" and {len(names) - cap} more" if len(names) > cap else "")


@GP319.detector
def detect_overmatch(facts: FreezeFacts) -> Iterator[Finding]:
    for r in facts.rules:
        if not (r.whole and r.partial):
            continue
        at = r.condition_at or r.at
        shown = ", ".join(f'"{p}"' for p in r.patterns[:4]) + (" ..." if len(r.patterns) > 4 else "")
        first = r.patterns[0].strip(".")
        yield GP319.finding(
            "left_out" if r.left_out else "config" if r.source else None, parameters=r.partial, location=at,
            evidence={"patterns": r.patterns, "source": r.source, "frozen_at": r.at, "whole": r.whole,
                      "partial": r.partial, "partial_modules": r.classes},
            line=at["line"], file=at["file"].rsplit("/", 1)[-1], patterns=shown, source=r.source,
            total=len(r.whole) + len(r.partial), whole=len(r.whole), partial=len(r.partial),
            whole_names=_names(r.whole), partial_names=_names(r.partial), classes=", ".join(r.classes), first=first,
            prefix=_prefix(first, r.whole))
