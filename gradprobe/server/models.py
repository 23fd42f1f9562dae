"""Pydantic wire models of what every tool returns (the outputSchema)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from gradprobe.findings import Finding


class Report(BaseModel):
    """What every gradprobe tool returns."""

    tool: str = Field(description="The tool that produced this report.")
    ok: bool = Field(description="True when no finding has severity 'error'.")
    findings: list[Finding] = Field(
        description="Findings, errors first; each names parameters, the user's line, evidence and a fix.")
    summary: str = Field(description="A few lines a person reads first; the first names the root cause and the fix.")
    facts: dict[str, Any] = Field(
        default_factory=dict,
        description="Tool-specific measurements (parameter table, per-parameter gradients, optimizer groups, sandbox info).")
