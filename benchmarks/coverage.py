"""The coverage matrix of the several-steps codes (GP6xx): for each code and each setting (the build_model() form, a
script's plain loop, Lightning, the Hugging Face Trainer, accelerate), the buggy examples and the healthy twins that a
test runs. Written to docs/coverage.md; tests/test_coverage_matrix.py checks that the file is current.

    python -m benchmarks.coverage > docs/coverage.md

Where each example comes from (read with `ast`, nothing is run):
- examples/broken/*.py (run by tests/test_examples.py): its EXPECT header. Buggy: a GP6xx code in `codes`; healthy
  twin: a healthy example whose `absent` lists the code (the test asserts the code is not raised on it).
- examples/scripts/codes_*/*.py (run by tests/test_script_codes.py): the same EXPECT header, in the script.
- the script projects of tests/test_audit_scripts.py (its CASES and DIAGNOSE lists): the expectation the test gives;
  a healthy project is the twin of the codes its `absent` lists and of those its `_broken` twin expects;
- the few script projects a test was written for (DEDICATED below), where that test names them.
The setting of a script is what it imports: lightning, transformers' Trainer, accelerate, else a plain loop.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from gradprobe.findings import catalogue

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "broken"
SCRIPTS = ROOT / "examples" / "scripts"
COMMAND = "python -m benchmarks.coverage > docs/coverage.md"
SETTINGS = ("build_model()", "plain loop", "Lightning", "HF Trainer", "accelerate")

_GRADSCALER = ("fp16 with a GradScaler: on CPU this framework makes no GradScaler (fp16 needs a GPU there), and its own "
               "clipping unscales first; a user hook runs after that unscale")
# (code, setting) -> why the code cannot apply there (the framework makes the bug impossible, or the form lacks it)
NOT_APPLICABLE = {
    ("GP601", "Lightning"): "accumulate_grad_batches scales the loss and clears the gradients itself",
    ("GP601", "HF Trainer"): "gradient_accumulation_steps: the Trainer scales the loss and clears the gradients itself",
    ("GP602", "Lightning"): "Lightning calls zero_grad() at every optimizer step",
    ("GP602", "HF Trainer"): "the Trainer calls zero_grad() at every optimizer step",
    ("GP604", "Lightning"): "Lightning steps the scheduler after the optimizer",
    ("GP604", "HF Trainer"): "the Trainer steps the scheduler after the optimizer",
    ("GP607", "Lightning"): "configure_optimizers() is called once per fit",
    ("GP607", "HF Trainer"): "the Trainer builds its optimizer once per train()",
    ("GP610", "HF Trainer"): "Trainer.training_step() calls model.train() at every step",
    ("GP612", "build_model()"): "that form has no epoch: `inputs` returns one batch and the step is called on it again "
                                "and again (a schedule has no epoch to be measured against)",
    ("GP615", "Lightning"): _GRADSCALER,
    ("GP615", "HF Trainer"): _GRADSCALER,
    ("GP615", "accelerate"): _GRADSCALER,
    ("GP617", "Lightning"): _GRADSCALER,
    ("GP617", "HF Trainer"): _GRADSCALER,
    ("GP617", "accelerate"): _GRADSCALER,
    ("GP616", "plain loop"): "overfitting one batch reruns the step on a fixed batch: the build_model() form only",
    ("GP616", "Lightning"): "overfitting one batch reruns the step on a fixed batch: the build_model() form only",
    ("GP616", "HF Trainer"): "overfitting one batch reruns the step on a fixed batch: the build_model() form only",
    ("GP616", "accelerate"): "overfitting one batch reruns the step on a fixed batch: the build_model() form only",
}
# (code, setting) -> what was measured where an example was tried and not kept
NOTES = {
    ("GP618", "HF Trainer"): "tried, not kept: the Trainer's default clipping (max_grad_norm=1) and linear decay kept "
                             "a head at lr 10 below the rule's threshold (update/weight 1.0, then 0.26, 0.19, 0.21 with "
                             "SGD; 1.0 then 0.08 with AdamW); the rule asks for >= 0.5 at every step",
    ("GP618", "Lightning"): "tried, not kept: a head group at lr 10, 30 and 100 (SGD, configure_optimizers) measured "
                            "update/weight 0.497-1.21, 0.47-1.21 and 0.465-1.24 over 4 steps: one step each time below "
                            "the rule's 0.5 at every step (the ratio is taken against the weights after the update, "
                            "which the oversized steps grew)",
}


# script projects checked by a test written for them (not a case list): (code, project, buggy or healthy, test file).
# Each counts only where the project exists and the test file names it.
DEDICATED = [
    ("GP611", "steps_accum_twice_broken", "buggy", "test_accumulation_schedule.py"),
    ("GP611", "steps_accum_tokens", "healthy", "test_accumulation_schedule.py"),
    ("GP612", "steps_scheduler_broken", "buggy", "test_accumulation_schedule.py"),
    ("GP612", "steps_scheduler", "healthy", "test_accumulation_schedule.py"),
]


def _expect(tree: ast.Module) -> dict | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "EXPECT":
            value: dict = ast.literal_eval(node.value)
            return value
    return None


def _setting(source: str) -> str:
    if re.search(r"^\s*(import|from)\s+(lightning|pytorch_lightning)\b", source, re.M):
        return "Lightning"
    if re.search(r"^\s*from\s+transformers\s+import\s+.*\bTrainer\b", source, re.M):
        return "HF Trainer"
    if re.search(r"^\s*from\s+accelerate\s+import\b", source, re.M):
        return "accelerate"
    return "plain loop"


def _literal_list(path: Path, name: str) -> list:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            value: list = ast.literal_eval(node.value)
            return value
    return []


Cell = dict[str, list[str]]  # "buggy" / "healthy" -> example names


def _add(matrix: dict[tuple[str, str], Cell], code: str, setting: str, kind: str, name: str) -> None:
    names = matrix.setdefault((code, setting), {"buggy": [], "healthy": []})[kind]
    if name not in names:
        names.append(name)


def _from_header(matrix: dict[tuple[str, str], Cell], expect: dict, setting: str, name: str, codes: set[str]) -> None:
    for code in expect.get("codes") or []:
        if code in codes:
            _add(matrix, code, setting, "buggy", name)
    if expect.get("healthy") or not expect.get("codes"):
        for code in expect.get("absent") or []:
            if code in codes:
                _add(matrix, code, setting, "healthy", name)


def collect(codes: set[str]) -> dict[tuple[str, str], Cell]:
    matrix: dict[tuple[str, str], Cell] = {}
    for path in sorted(EXAMPLES.glob("*.py")):
        expect = _expect(ast.parse(path.read_text()))
        if expect is not None:
            _from_header(matrix, expect, "build_model()", path.name, codes)
    for path in sorted(SCRIPTS.glob("codes_*/*.py")):
        source = path.read_text()
        expect = _expect(ast.parse(source))
        if expect is not None:
            _from_header(matrix, expect, _setting(source), f"{path.parent.name}/{path.name}", codes)
    tests = ROOT / "tests" / "test_audit_scripts.py"
    cases = {c[0]: c[-1] for c in _literal_list(tests, "CASES") + _literal_list(tests, "DIAGNOSE")}
    for project, expect in cases.items():
        source = "\n".join(p.read_text() for p in sorted((SCRIPTS / project).glob("*.py")))
        twin = cases.get(f"{project}_broken", {}) if expect.get("healthy") else {}
        _from_header(matrix, {**expect, "absent": list(expect.get("absent") or []) + list(twin.get("codes") or [])},
                     _setting(source), f"{project}/", codes)
    for code, project, kind, test in DEDICATED:
        test_path, folder = ROOT / "tests" / test, SCRIPTS / project
        if code in codes and folder.is_dir() and test_path.is_file() and f'"{project}"' in test_path.read_text():
            source = "\n".join(p.read_text() for p in sorted(folder.glob("*.py")))
            _add(matrix, code, _setting(source), kind, f"{project}/")
    return matrix


def _cell(matrix: dict[tuple[str, str], Cell], code: str, setting: str, foot: dict[str, int]) -> str:
    cell = matrix.get((code, setting))
    why = NOT_APPLICABLE.get((code, setting)) or NOTES.get((code, setting))
    mark = ""
    if why is not None:
        mark = f" [{foot.setdefault(why, len(foot) + 1)}]"
    if cell is None:
        return ("n/a" if (code, setting) in NOT_APPLICABLE else "-") + mark
    counts = f"{len(cell['buggy'])} / {len(cell['healthy'])}"
    return (f"n/a ({counts})" if (code, setting) in NOT_APPLICABLE else counts) + mark


def coverage_markdown() -> str:
    rules = {code: doc for code, doc in catalogue().items() if code.startswith("GP6")}
    matrix = collect(set(rules))
    foot: dict[str, int] = {}
    lines = [
        "# Coverage of the several-steps codes (GP6xx)", "",
        f"Generated by `{COMMAND}` from the examples' EXPECT headers and the script cases of "
        "tests/test_audit_scripts.py; tests/test_coverage_matrix.py checks that it is current.", "",
        "Each cell: buggy examples / healthy twins that a test runs through the real server (a healthy twin is a "
        "healthy example on which the test asserts the code is not raised). `-`: none yet; `n/a`: the code cannot "
        "apply there (the note says why; counts beside it: healthy runs that check it stays absent). "
        "The build_model() form is run by tests/test_examples.py; "
        "examples/scripts/codes_* by tests/test_script_codes.py; the other script projects by "
        "tests/test_audit_scripts.py.", "",
        "| code | name | " + " | ".join(SETTINGS) + " |",
        "|---|---|" + "---|" * len(SETTINGS),
    ]
    for code, doc in rules.items():
        cells = [_cell(matrix, code, s, foot) for s in SETTINGS]
        lines.append(f"| {code} | {doc['name']} | " + " | ".join(cells) + " |")
    lines += [""] + [f"[{n}] {why}." for why, n in foot.items()]
    lines += ["", "## The examples, by code", ""]
    for code in rules:
        lines.append(f"- **{code}**")
        for setting in SETTINGS:
            cell = matrix.get((code, setting))
            if cell is None:
                continue
            parts = [f"buggy: {', '.join(f'`{n}`' for n in cell['buggy'])}" if cell["buggy"] else "",
                     f"healthy: {', '.join(f'`{n}`' for n in cell['healthy'])}" if cell["healthy"] else ""]
            lines.append(f"  - {setting}: " + "; ".join(p for p in parts if p))
    return "\n".join(lines) + "\n"


def main() -> int:
    sys.stdout.write(coverage_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
