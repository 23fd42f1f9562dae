"""Findings built from the catalogue for tests of ranking, folding and rendering (no rule's detector runs)."""

from __future__ import annotations

from typing import Any

from gradprobe.findings import Finding, catalogue


def catalogued_finding(code: str, message: str, *, parameters: list[str] | None = None,
                       location: dict[str, Any] | None = None) -> Finding:
    rule = catalogue()[code]
    return Finding(code=code, name=rule["name"], severity=rule["severity"], message=message,
                   parameters=list(parameters or []), location=location, evidence={}, fix=rule["fix"])  # type: ignore[typeddict-item]
