"""What diagnose's scaled sub-checks measured or left out, as the verdict's facts (gradprobe/verdict.py).

The compile, fp16/bf16 parameter and autocast measures each return their facts with `skipped` (why the measure
did not run) and `skip_cause` (whose that is); here they become `facts.verified` lines with their key number, or
`facts.not_run` entries, so that a measure that did not run is never silence.
"""

from __future__ import annotations

from typing import Any

from gradprobe.verdict import add_not_run, add_verified, cause_of

CHECKS = {"compiled": "the torch.compile comparison with eager (GP701)",
          "precision": "the fp16/bf16 parameter underflow measure (GP702)",
          "autocast": "the autocast underflow measure (GP708)"}


def _line(name: str, sub: dict[str, Any]) -> str | None:
    if name == "compiled":
        return (f"torch.compile ({sub.get('wrapper')}) against eager: {sub.get('compared')} parameter gradient(s) compared "
                f"on the same batch and seed, largest relative difference {float(sub.get('largest_rel_diff') or 0.0):.2g}")
    if name == "precision":
        rows = sub.get("low_precision") or []
        worst = max((r.get("underflow") or 0.0 for r in rows), default=0.0)
        return (f"{len(rows)} fp16/bf16 parameter(s) measured against an fp32 copy: largest share of gradient entries "
                f"lost {worst:.2g}")
    if name == "autocast":
        rows = sub.get("worst") or []
        worst = max((r.get("underflow") or 0.0 for r in rows), default=0.0)
        return (f"autocast ({sub.get('dtype')}): {sub.get('measured')} parameter gradient(s) measured against an fp32 step, "
                f"largest share of entries lost to underflow {worst:.2g}")
    return None


def subcheck_verdict(facts: dict[str, Any], name: str, sub: dict[str, Any] | None) -> None:
    """Add what the sub-check `name` ("compiled", "precision", "autocast") measured, or why it did not run, to `facts`."""
    if not isinstance(sub, dict):
        return
    if sub.get("skipped"):
        add_not_run(facts, CHECKS[name], str(sub["skipped"]), cause_of(sub.get("skip_cause"), "refused"))
        return
    line = _line(name, sub)
    if line:
        add_verified(facts, line)


def drop(facts: dict[str, Any], name: str) -> None:
    """Forget what an earlier run of the sub-check `name` said (a script's autocast measure is made again)."""
    check, prefix = CHECKS[name], _line(name, {}) or ""
    facts["not_run"] = [e for e in facts.get("not_run") or [] if e.get("check") != check]
    head = prefix.split(" ", 1)[0]
    facts["verified"] = [v for v in facts.get("verified") or [] if not str(v).startswith(head + " (")]
