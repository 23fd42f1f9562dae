"""Generated documentation: `python -m gradprobe.docgen > docs/findings.md`.

docs/findings.md is written from the rules catalogue (`gradprobe.findings.catalogue()`),
never by hand; tests/test_docs.py fails when the checked-in file differs from what this
prints, so a new or changed code comes with its regenerated page.
"""

from __future__ import annotations

import sys

from gradprobe.findings import RuleDoc, catalogue

COMMAND = "python -m gradprobe.docgen > docs/findings.md"

FAMILIES = {
    "GP0": "Internal",
    "GP1": "Registration and loading (GP1xx)",
    "GP2": "Optimizer coverage (GP2xx)",
    "GP3": "The traced step (GP3xx)",
    "GP4": "Custom autograd Functions (GP4xx)",
    "GP5": "Prompt tuning (GP5xx)",
    "GP6": "Several training steps (GP6xx)",
    "GP7": "Compiled graphs and mixed precision (GP7xx)",
    "GP8": "Equivalence (GP8xx)",
    "GP9": "Dependencies (GP9xx)",
}


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _block(text: str) -> str:
    return "```\n" + text.strip("\n") + "\n```"


def _situations(rule: RuleDoc) -> list[str]:
    """The situations a rule tells apart, each with its own fix where it has one."""
    if not rule["situations"]:
        return []
    out = ["", "Situations it tells apart (each with its own message):", ""]
    for key, case in rule["situations"].items():
        sev = f", {case['severity']}" if case.get("severity") else ""
        head = f"- `{key}`{sev}: {case.get('when', key)}."
        if case.get("fix"):
            out += [head + " Fix:", "", "  " + _block(case["fix"]).replace("\n", "\n  ")]
        else:
            out.append(head + " Fix: as above.")
    return out


def findings_markdown(rules: dict[str, RuleDoc] | None = None) -> str:
    rules = catalogue() if rules is None else rules
    out = [
        "# Finding codes",
        "",
        f"<!-- Generated from gradprobe.findings.catalogue() by `{COMMAND}`: do not edit by hand. -->",
        "",
        "Every finding gradprobe reports has a stable code, a name, a severity, the parameters it is about,",
        "the location in your code, the evidence measured, and a fix. The same catalogue is served over MCP",
        "as the resources `gradprobe://findings` and `gradprobe://findings/{code}`.",
        "",
        "| code | name | severity | what it means |",
        "| --- | --- | --- | --- |",
    ]
    out += [f"| [{c}](#{c.lower()}) | `{r['name']}` | {r['severity']} | {_cell(r['summary'])} |" for c, r in rules.items()]
    family = None
    for code, rule in rules.items():
        if code[:3] != family:
            family = code[:3]
            out += ["", f"## {FAMILIES.get(family, family + 'xx')}"]
        out += [
            "",
            f"### {code}",
            "",
            f"**`{rule['name']}`** ({rule['severity']}). {rule['summary']}",
            "",
            f"Why it breaks gradients: {rule['why']}",
            "",
            "Example:",
            "",
            _block(rule["example"]),
            "",
            "Fix:",
            "",
            _block(rule["fix"]),
        ]
        out += _situations(rule)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["findings"]):
        print(f"usage: {COMMAND}", file=sys.stderr)
        return 2
    sys.stdout.write(findings_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
