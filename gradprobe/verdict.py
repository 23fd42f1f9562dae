"""A report's verdict: what was verified, what did not run and why, or the problems found (docs/verdicts.md).

Torch-free and process-free, like report.py: the child settles the report it sends, the parent settles it again
after adding what it measured (a timeout, a crash), and the library's report builders settle theirs.

Every engine says, in its report's facts, what it measured and what it could not run (the contract every check
fills, read here generically):

    facts["verified"]: list[str]   one line each: what was measured, with its key number
    facts["not_run"]:  list[{"check": str, "why": str, "cause": Cause}]

`settle(report)` turns them into `report["verdict"]`, the summary's first line(s) and `report["ok"]`:

    problems      an error finding about the code (not one of gradprobe's "could not check" outcomes)
    verified      what was measured, nothing that applies was left out
    partial       something was measured, and a check that applies did not run (each named, with why)
    not_checked   nothing that applies ran

A `not_run` entry with cause "not_applicable" never blocks `verified`. Every other entry that no finding already
states is also a finding of its own, GP121 check-not-run (a warning), so a check that did not run is never silence.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, cast

from typing_extensions import NotRequired, TypedDict

from gradprobe.findings import Finding, Location, Rule, Situation, sort_findings

Cause = Literal["gradprobe", "user_code", "refused", "timeout", "not_applicable"]
Status = Literal["problems", "verified", "partial", "not_checked"]
CAUSES: tuple[Cause, ...] = ("gradprobe", "user_code", "refused", "timeout", "not_applicable")
BLOCKING: frozenset[str] = frozenset({"gradprobe", "user_code", "refused", "timeout"})
HEAD_VERIFIED = 4  # verified lines the summary's first line quotes (all are in verdict.verified)
HEADS: dict[Status, str] = {"problems": "problems found", "verified": "verified", "partial": "partly checked",
                            "not_checked": "not checked"}


class NotRun(TypedDict):
    """A check that applies (or was asked for) and did not run."""

    check: str  # what did not run: "the optimizer step", "gradcheck of ScaledTanh", "steps 3-4"
    why: str  # one sentence: the error, the limit, what the target lacks
    cause: Cause
    location: NotRequired[Location | None]  # the user's line, where one is known (a line of the user's code that raised)
    finding: NotRequired[str]  # the code of the finding that already states it (GP000, GP113, GP114, ...), if any


class Verdict(TypedDict):
    status: Status
    line: str  # the summary's first line
    verified: list[str]
    not_run: list[NotRun]  # every entry, the not-applicable ones too; `blocking` counts the others
    blocking: int
    errors: list[str]  # the codes of the error findings about the code
    warnings: list[str]  # the codes of the warnings (GP121 included)
    head_lines: int  # how many lines at the top of the summary the verdict wrote


GP121: Rule[Any] = Rule(
    code="GP121", name="check-not-run", severity="warning", rank=99,
    summary="A check that applies to this target did not run: gradprobe failed on it, the user's code raised under it, "
            "it was refused or it ran out of time. The report is only partly checked.",
    why="An all-clear is evidence only for what was measured. A check that did not run is said first, in the verdict "
        "(`verdict.not_run`, the summary's first line), and as this finding, so a report never reads as OK over a check "
        "that was skipped. Nothing is claimed about the code by this finding: it says what was not looked at, and why.",
    example="a script whose replay of its accumulation step returned no scalar loss: the step checks were left out",
    message="{check} did not run: {why}",
    fix="See the reason: what did run still stands, and what did not is said first in the verdict.",
    situations={
        "gradprobe": Situation(
            when="gradprobe itself failed on it (its replay, a measurement or a copy raised where the user's code did not)",
            fix="This is gradprobe's limitation, not an error in your code: what did run still stands. The evidence "
                "holds the error; please report it."),
        "user_code": Situation(
            when="the user's code raised or ended under gradprobe before the check could run",
            fix="Look at the error: if your code raises the same way when run plainly, fix it and call again; if it "
                "runs plainly, this is gradprobe's failure (please report it)."),
        "refused": Situation(
            when="gradprobe declined to run it (a replay it will not run twice, a target that lacks what the check needs) "
                 "or a limit refused it (a memory limit, an interpreter that cannot start)",
            fix="Give the target what the check needs (the reason says what), or run the tool that checks it alone."),
        "timeout": Situation(
            when="the call's time ran out before the check finished",
            fix="Give the call a larger timeout_s (or a smaller model or fewer steps) to have it checked."),
    },
)

# findings that say a check could not run (not a problem of the code): their cause, and what they stopped
_OUTCOMES: dict[str, Cause] = {"GP000": "gradprobe", "GP113": "refused", "GP114": "timeout", "GP115": "gradprobe",
                               "GP116": "gradprobe", "GP117": "refused", "GP122": "user_code"}
_STOPPED = {"GP000": "gradprobe's checks", "GP113": "what needed the phase a memory limit stopped",
            "GP114": "every check not finished in time", "GP115": "every check (the child ended without a result)",
            "GP116": "every check (the remote worker failed)", "GP117": "every check (the interpreter did not start)",
            "GP122": "every check (the code could not import the project's own package)"}


def cause_of(value: Any, default: Cause = "gradprobe") -> Cause:
    """A cause as the contract spells it (a value from a child's facts is checked: anything else is `default`)."""
    return cast(Cause, value) if value in CAUSES else default


def add_verified(facts: dict[str, Any], *lines: str) -> None:
    """Say, in an engine's facts, what was measured (one line each, with its key number)."""
    have = facts.setdefault("verified", [])
    have.extend(line for line in lines if line and line not in have)


def add_not_run(facts: dict[str, Any], check: str, why: str, cause: Cause,
                location: Location | Mapping[str, Any] | None = None) -> None:
    """Say, in an engine's facts, that `check` did not run, why, and whose the cause is (gradprobe, the user's code, a
    refusal, a timeout, or not applicable)."""
    if cause not in CAUSES:
        raise ValueError(f"not_run cause {cause!r} is not one of {CAUSES}")
    entry: NotRun = {"check": check, "why": " ".join(str(why).split())[:600], "cause": cause}
    if location:
        entry["location"] = dict(location)  # type: ignore[typeddict-item]
    have = facts.setdefault("not_run", [])
    if not any(e.get("check") == check and e.get("why") == entry["why"] for e in have):
        have.append(entry)


def lift(into: dict[str, Any], sub: Mapping[str, Any] | None, prefix: str = "") -> None:
    """Move a sub-check's own verified/not_run (its facts, nested in a larger report's) up into `into`."""
    if not isinstance(sub, dict):
        return
    for line in sub.pop("verified", None) or []:
        add_verified(into, prefix + str(line))
    for e in sub.pop("not_run", None) or []:
        if isinstance(e, Mapping):
            add_not_run(into, prefix + str(e.get("check")), str(e.get("why")), cause_of(e.get("cause")), e.get("location"))


def _is_outcome(f: Finding) -> bool:
    """A finding that says a check could not run rather than what is wrong with the code."""
    if f["code"] in _OUTCOMES:
        return True
    ev = f.get("evidence") or {}
    return f["code"] == "GP112" and (ev.get("ended") == "timeout" or ev.get("timed_out") is True
                                     or ev.get("read_only_project") is True)


def _first_line(text: str, n: int = 300) -> str:
    line = (str(text).strip().splitlines() or [""])[0]
    return line if len(line) <= n else line[: n - 3] + "..."


def _derived(findings: list[Finding]) -> list[NotRun]:
    """The not-run entries the findings themselves state: gradprobe's outcomes (GP000, GP113, GP114-GP117, a script
    stopped by the timer) and the user's code failing before a check (GP100, GP112)."""
    out: list[NotRun] = []
    for f in findings:
        ev = f.get("evidence") or {}
        code = f["code"]
        if _is_outcome(f):
            cause: Cause = _OUTCOMES.get(code, "gradprobe" if ev.get("read_only_project") is True else "timeout")
            check = _STOPPED.get(code, "the checks of the script's step")
        elif code == "GP100":
            cause = "user_code"
            check = {"optimizer": "optimizer coverage", "after_backward": "the optimizer step"}.get(
                str(ev.get("situation") or ""), "every check that needed the failing code")
        elif code == "GP112":
            cause, check = "user_code", "the checks of the script's step (it reached none)"
        elif code == "GP707":  # a rank whose step was not checked: the merged report covers the others only
            ranks = ", ".join(str(r) for r in ev.get("ranks") or [])
            cause, check = ("user_code" if "exit_status" in ev else "timeout"), f"the checks of rank(s) {ranks}"
        else:
            continue
        entry: NotRun = {"check": check, "why": f"{code} {f['name']}: {_first_line(f['message'])}", "cause": cause,
                         "finding": code}
        out.append(entry)
    return out


def _entries(facts: Mapping[str, Any]) -> list[NotRun]:
    """The engines' not_run entries, checked: a malformed one (a child's bug) is kept, as gradprobe's."""
    out: list[NotRun] = []
    for e in facts.get("not_run") or []:
        if not isinstance(e, Mapping):
            continue
        cause = cause_of(e.get("cause"))
        entry: NotRun = {"check": str(e.get("check") or "a check"), "why": str(e.get("why") or "not said"), "cause": cause}
        if isinstance(e.get("location"), Mapping):
            entry["location"] = dict(e["location"])  # type: ignore[typeddict-item]
        out.append(entry)
    return out


def _gp121(entry: NotRun) -> Finding:
    return GP121.finding(entry["cause"], location=entry.get("location"), check=entry["check"][:1].upper() + entry["check"][1:],
                         why=entry["why"],
                         evidence={"check": entry["check"], "why": entry["why"], "cause": entry["cause"]})


def _said(entries: Iterable[NotRun], n: int = 200) -> str:
    return "; ".join(f"{e['check']} did not run ({_first_line(e['why'], n)})" for e in entries)


def verdict_of(findings: list[Finding], facts: Mapping[str, Any]) -> tuple[Status, list[str], list[NotRun]]:
    """The status, what was verified, and every not-run entry (the engines' and those the findings state)."""
    verified = [str(v) for v in facts.get("verified") or [] if v]
    not_run = _entries(facts) + _derived(findings)
    blocking = [e for e in not_run if e["cause"] in BLOCKING]
    if any(f["severity"] == "error" and not _is_outcome(f) for f in findings):
        return "problems", verified, not_run
    if blocking:
        return ("partial" if verified else "not_checked"), verified, not_run
    if not verified:
        return "not_checked", verified, not_run
    return "verified", verified, not_run


def _head(status: Status, findings: list[Finding], verified: list[str], not_run: list[NotRun]) -> list[str]:
    errors = [f for f in findings if f["severity"] == "error" and not _is_outcome(f)]
    warnings = [f["code"] for f in findings if f["severity"] == "warning" and f["code"] != GP121.code]
    blocking = [e for e in not_run if e["cause"] in BLOCKING]
    warned = f" {len(warnings)} warning(s): {', '.join(warnings)}." if warnings else ""
    if status == "problems":
        top = errors[0]
        fix = top["fix"].splitlines()[0] if top["fix"] else ""
        lines = [f"{HEADS[status]}: {top['code']} {top['name']}: {top['message']}" + (f" Fix: {fix}" if fix else "")]
        if len(errors) > 1:
            lines.append(f"{len(errors) - 1} more error(s): " + ", ".join(f["code"] for f in errors[1:]))
        if blocking:
            lines.append("not run: " + _said(blocking) + ".")
        return lines
    shown = [v.rstrip(". ") for v in verified[:HEAD_VERIFIED]]
    more = f" (+{len(verified) - HEAD_VERIFIED} more in verdict.verified)" if len(verified) > HEAD_VERIFIED else ""
    done = "verified: " + "; ".join(shown) + more if verified else ""
    if status == "verified":
        return [f"{done}.{warned}"]
    if status == "partial":
        return [f"{HEADS[status]}: {_said(blocking)}; {done}.{warned}"]
    moot = [e for e in not_run if e["cause"] == "not_applicable"]
    said = _said(blocking) if blocking else (
        "; ".join(f"{e['check']} does not apply ({_first_line(e['why'], 200)})" for e in moot) if moot
        else "nothing was measured")
    return [f"{HEADS[status]}: {said}.{warned}"]


def inconsistencies(report: Mapping[str, Any]) -> list[str]:
    """What is wrong with a report's verdict (empty when it is consistent): a `verified` or `ok` over a blocking not-run
    entry or an error, a first line that is not the verdict's (or says OK / "No error found"), a blocking entry that is
    neither said first nor a finding. The tests and the benchmarks call it on every report they have."""
    v = report.get("verdict")
    if not isinstance(v, Mapping):
        return ["no verdict"]
    out: list[str] = []
    findings = list(report.get("findings") or [])
    first = (str(report.get("summary") or "").splitlines() or [""])[0]
    blocking = [e for e in v.get("not_run") or [] if e.get("cause") in BLOCKING]
    errors = [f for f in findings if f.get("severity") == "error" and not _is_outcome(f)]
    if report.get("ok") is not (v.get("status") == "verified"):
        out.append(f"ok={report.get('ok')} with status {v.get('status')}")
    if first != v.get("line"):
        out.append("the summary's first line is not the verdict's")
    if "No error found" in str(report.get("summary")) or first.upper().startswith("OK"):
        out.append("says OK / No error found")
    if (v.get("status") == "problems") is not bool(errors):
        out.append(f"status {v.get('status')} with {len(errors)} error finding(s) about the code")
    if v.get("status") == "verified" and (blocking or not v.get("verified")):
        out.append("verified over a check that did not run, or with nothing measured")
    if v.get("status") in ("partial", "not_checked") and not all(str(e.get("check")) in first for e in blocking):
        out.append("a check that did not run is not said first")
    said = {(f.get("evidence") or {}).get("check") for f in findings if f.get("code") == GP121.code}
    if any(e.get("check") not in said for e in blocking if not e.get("finding")):
        out.append("a check that did not run is not a finding (GP121)")
    return out


def summary_body(report: Mapping[str, Any]) -> list[str]:
    """The summary's lines below the verdict's head (what a report rebuilt with make_report passes as its summary)."""
    lines = str(report.get("summary") or "").splitlines()
    head = (report.get("verdict") or {}).get("head_lines") if isinstance(report.get("verdict"), Mapping) else None
    return lines[head:] if isinstance(head, int) and 0 <= head <= len(lines) else lines


def settle(report: dict[str, Any]) -> dict[str, Any]:
    """Compute the report's verdict from its findings and facts, write it as the summary's first line(s), set `ok`
    (True only for `verified`) and state each blocking not-run entry no finding states as GP121. Idempotent."""
    facts: dict[str, Any] = report["facts"] if isinstance(report.get("facts"), dict) else {}
    report["facts"] = facts
    body = summary_body(report)
    findings = [f for f in report.get("findings") or [] if f.get("code") != GP121.code]
    status, verified, not_run = verdict_of(findings, facts)
    findings += [_gp121(e) for e in not_run if e["cause"] in BLOCKING and "finding" not in e]
    findings = sort_findings(findings)
    head = _head(status, findings, verified, not_run)
    report["findings"] = findings
    report["summary"] = "\n".join(head + body)
    report["ok"] = status == "verified"
    report["verdict"] = Verdict(
        status=status, line=head[0], verified=verified, not_run=not_run,
        blocking=sum(e["cause"] in BLOCKING for e in not_run),
        errors=[f["code"] for f in findings if f["severity"] == "error" and not _is_outcome(f)],
        warnings=[f["code"] for f in findings if f["severity"] == "warning"], head_lines=len(head))
    return report
