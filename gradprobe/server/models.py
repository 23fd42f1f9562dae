"""Pydantic wire models of what every tool returns (the outputSchema)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from gradprobe.findings import Finding, Location


class NotRunEntry(BaseModel):
    """A check that applies and did not run."""

    check: str = Field(description="What did not run (e.g. \"the optimizer step\", \"gradcheck of ScaledTanh\").")
    why: str = Field(description="Why: the error, the limit, or what the target lacks.")
    cause: Literal["gradprobe", "user_code", "refused", "timeout", "not_applicable"] = Field(description=(
        "Whose it is: gradprobe's own failure, the user's code raising under gradprobe, refused (a replay declined, a "
        "limit, what the target lacks), a timeout, or not applicable (never blocks `verified`)."))
    location: Location | None = Field(default=None, description="The user's line, where one is known.")
    finding: str | None = Field(default=None, description="The code of the finding that states it (GP000, GP113, ...).")


class Verdict(BaseModel):
    """What the report can be trusted for (docs/verdicts.md)."""

    status: Literal["problems", "verified", "partial", "not_checked"] = Field(description=(
        "problems: an error finding about the code; verified: what was measured, nothing that applies left out; "
        "partial: some check that applies did not run; not_checked: nothing that applies ran."))
    line: str = Field(description="The summary's first line: 'problems found: ...', 'verified: ...', 'partly checked: "
                                  "<check> did not run (<why>); verified: ...' or 'not checked: ...'.")
    verified: list[str] = Field(description="What was measured, one line each with its key number.")
    not_run: list[NotRunEntry] = Field(description="Each check that did not run, with why and whose the cause is.")
    blocking: int = Field(description="How many not_run entries block `verified` (every cause but not_applicable).")
    errors: list[str] = Field(description="Codes of the error findings about the code.")
    warnings: list[str] = Field(description="Codes of the warnings (GP121 check-not-run included).")
    head_lines: int = Field(description="How many lines at the top of `summary` the verdict wrote.")


class Report(BaseModel):
    """What every gradprobe tool returns."""

    tool: str = Field(description="The tool that produced this report.")
    ok: bool = Field(description="True only when the verdict is 'verified': no error finding, and every check that applies "
                                 "ran. Read `verdict` for what was measured and what did not run.")
    verdict: Verdict = Field(description="What was verified, what did not run and why, or the problems found.")
    findings: list[Finding] = Field(
        description="Findings, errors first; each names parameters, the user's line, evidence and a fix.")
    summary: str = Field(description="A few lines a person reads first; the first is the verdict (problems found, "
                                     "verified, partly checked or not checked).")
    facts: dict[str, Any] = Field(
        default_factory=dict,
        description="Tool-specific measurements (parameter table, per-parameter gradients, optimizer groups, sandbox info); "
                    "facts.verified and facts.not_run are what each check said it measured or could not run.")
