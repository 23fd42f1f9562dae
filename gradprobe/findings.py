"""The finding shape, the `Rule` unit, and the catalogue of stable codes (spec/findings.md).

A finding code is one unit, the way a lint rule is one in ruff: one `Rule` object holds
its code, name, severity, rank in root-cause order (lower explains more; diagnose ranks
and folds by it), its docs, its message and fix templates (one per situation the rule
tells apart), and its detector: a small function from measured facts to findings.

    GP302 = Rule(
        code="GP302", name="detach-in-forward", severity="error", rank=27,
        summary="...", why="...", example="...",
        message="The path from the loss to {count} parameter(s) ({names}) is cut by `{op}`{where}.",
        fix="Remove the .detach() ...",
        situations={"library": Situation(severity="warning", fix="Nothing to fix if the library means it ...")},
    )

    @GP302.detector
    def detach_in_forward(facts: TraceFacts) -> Iterator[Finding]:
        for cut in facts.cuts_of("detach"):
            yield GP302.finding(count=..., names=..., op=..., where=..., parameters=..., location=...)

A message or fix is written once, in its rule; `grep -rn GP302 gradprobe/` shows the rule and
nothing else emits it. An engine is three plain stages: measure facts, `run_rules` over them,
rank. The catalogue is read from the `Rule(...)` literals with `ast`, so the server serves it
(and the docs are generated from it) without importing torch or the check modules.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar, cast

from typing_extensions import TypedDict

Severity = Literal["error", "warning", "info"]
SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}

PACKAGE = Path(__file__).resolve().parent

F = TypeVar("F")  # the facts a detector reads


class Location(TypedDict):
    file: str
    line: int
    function: str
    code: str


class Finding(TypedDict):
    code: str
    name: str
    severity: Severity
    message: str
    parameters: list[str]
    location: Location | None
    evidence: dict[str, Any]
    fix: str


class SituationDoc(TypedDict, total=False):
    severity: Severity
    when: str
    fix: str


class RuleDoc(TypedDict):
    """A catalogue entry, as served (gradprobe://findings) and documented (docs/findings.md)."""

    code: str
    name: str
    severity: Severity
    rank: int
    summary: str
    why: str
    example: str
    fix: str
    situations: dict[str, SituationDoc]


@dataclass(frozen=True)
class Situation:
    """A case the rule tells apart, with its own message, fix or severity (the rule's own where not given)."""

    when: str
    message: str | None = None
    fix: str | None = None
    severity: Severity | None = None


class MissingField(KeyError):
    """A rule's template names a field its caller did not give (a gradprobe bug: reported as GP000)."""


@dataclass
class Rule(Generic[F]):
    """One finding code: identity, docs, templates, and the detector that emits it."""

    code: str
    name: str
    severity: Severity
    rank: int
    summary: str
    why: str
    example: str
    message: str
    fix: str
    situations: Mapping[str, Situation] = field(default_factory=dict)
    detect: Callable[[F], Iterable[Finding]] | None = field(default=None, repr=False)

    def detector(self, fn: Callable[[F], Iterable[Finding]]) -> Callable[[F], Iterable[Finding]]:
        """Decorator: `fn(facts)` yields this rule's findings."""
        self.detect = fn
        return fn

    def finding(
        self,
        situation: str | None = None,
        *,
        parameters: Iterable[str] = (),
        location: Location | Mapping[str, Any] | None = None,
        evidence: Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> Finding:
        """A finding of this rule; the message and fix are the rule's templates (or the situation's) filled with `fields`."""
        case = self.situations[situation] if situation is not None else None
        message = (case.message if case and case.message is not None else self.message)
        fix = (case.fix if case and case.fix is not None else self.fix)
        try:
            text, fix_text = message.format(**fields), fix.format(**fields)
        except KeyError as exc:
            raise MissingField(f"{self.code}: template field {exc} not given") from None
        return Finding(
            code=self.code,
            name=self.name,
            severity=(case.severity if case and case.severity else self.severity),
            message=text,
            parameters=list(parameters),
            location=cast("Location | None", dict(location) if location is not None else None),
            evidence=dict(evidence or {}),
            fix=fix_text,
        )


def run_rules(rules: Iterable[Rule[F]], facts: F) -> list[Finding]:
    """The middle stage of every engine: each rule's detector over the same measured facts, in the given order."""
    out: list[Finding] = []
    for rule in rules:
        if rule.detect is not None:
            out.extend(rule.detect(facts))
    return out


# ---- the catalogue, read from the Rule(...) literals without importing the check modules -----------------------

def _literal(node: ast.expr) -> Any:
    """A literal keyword value; `Situation(...)` calls become their keyword dicts."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Situation":
        return {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg}
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True) if k is not None}
    return ast.literal_eval(node)


def rules_declared_in(path: Path) -> list[dict[str, Any]]:
    """The keyword literals of every `Rule(...)` call in one source file."""
    text = path.read_text(encoding="utf-8")
    if "Rule(" not in text:
        return []
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Rule":
            out.append({kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg and kw.arg != "detect"})
    return out


def rule_sources() -> list[Path]:
    """Every module of the package that declares rules."""
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "findings.py" and "Rule(" in p.read_text(encoding="utf-8"))


def _doc(decl: dict[str, Any]) -> RuleDoc:
    decl.setdefault("example", "")
    situations = {k: SituationDoc(**{f: v for f, v in s.items() if f in ("severity", "when", "fix")})
                  for k, s in decl.get("situations", {}).items()}
    return RuleDoc(code=decl["code"], name=decl["name"], severity=decl["severity"], rank=decl["rank"],
                   summary=decl["summary"], why=decl["why"], example=decl["example"], fix=decl["fix"],
                   situations=situations)


@functools.cache
def catalogue() -> dict[str, RuleDoc]:
    """Every code, collected from the rule declarations, in code order."""
    out: dict[str, RuleDoc] = {}
    for path in rule_sources():
        for decl in rules_declared_in(path):
            if decl["code"] in out:
                raise ValueError(f"{decl['code']} is declared twice ({path})")
            out[decl["code"]] = _doc(decl)
    return dict(sorted(out.items()))


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Errors first, then warnings, then info; stable within a severity."""
    return sorted(findings, key=lambda f: SEVERITY_RANK[f["severity"]])
