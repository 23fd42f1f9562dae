"""The tools, in one torch-free table read by the CLI, the server, the job runner and the tests.

Adding a tool: one row here, its check function (a report builder taking the loaded
target and the tool's options), and its MCP face in gradprobe/server/tools/<name>.py.

Each tool owns one family of finding codes, by prefix ("GP3" is GP3xx); the codes and the
range a description or the README quotes come from the catalogue (`code_range("trace_grad_path")`
is "GP301–GP314"), never from a list kept by hand (tests/test_docs.py checks the README).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gradprobe.findings import catalogue


@dataclass(frozen=True)
class Tool:
    name: str
    check: str  # "module:function" of the report builder: fn(loaded, **options) -> report dict
    needs_step: bool  # runs a forward/backward, so the target needs inputs or a train_step
    allows_meta: bool  # may run on device="meta" (no weights)
    help: str  # one line for the CLI
    family: str | None = None  # the code prefix of the findings it owns ("GP1": GP1xx); None: every family (diagnose)

    def check_function(self) -> Callable[..., dict]:
        module, _, attr = self.check.partition(":")
        fn: Callable[..., dict] = getattr(importlib.import_module(module), attr)
        return fn


TOOLS: tuple[Tool, ...] = (
    Tool("diagnose", "gradprobe.checks.diagnosis:diagnose_report", needs_step=False, allows_meta=False,
         help="every check that applies, the root cause first", family=None),
    Tool("inspect_parameters", "gradprobe.checks.registration:inspect_report", needs_step=False, allows_meta=True,
         help="registration problems: tensors that are not parameters, plain containers, frozen and tied parameters",
         family="GP1"),
    Tool("check_optimizer_coverage", "gradprobe.checks.optimizer:optimizer_report", needs_step=False, allows_meta=False,
         help="parameters the optimizer misses or holds stale, and one real step", family="GP2"),
    Tool("trace_grad_path", "gradprobe.checks.trace:trace_report", needs_step=True, allows_meta=False,
         help="one traced step: which parameters get no gradient and the line that cuts the path", family="GP3"),
    Tool("run_gradcheck", "gradprobe.checks.gradcheck:gradcheck_report", needs_step=True, allows_meta=False,
         help="gradcheck of the custom autograd Functions the model calls", family="GP4"),
    Tool("verify_prompt_tuning", "gradprobe.checks.prompt:prompt_report", needs_step=True, allows_meta=False,
         help="soft prompt / PEFT prompt-tuning checks", family="GP5"),
    Tool("audit_training", "gradprobe.checks.steps:audit_report", needs_step=True, allows_meta=False,
         help="several real steps of the user's loop: LR as applied, gradients at step time, updates, EMA copies",
         family="GP6"),
    Tool("check_dependencies", "gradprobe.checks.dependencies:dependencies_report", needs_step=True, allows_meta=False,
         help="what each output may not see: later positions, other examples, other packed examples (by autograd)",
         family="GP9"),
    Tool("check_equivalence", "gradprobe.checks.equivalence.engine:equivalence_report", needs_step=False,
         allows_meta=False, help="the gradient of two setups that must agree (N processes and one, k micro-batches and "
                                 "one batch, packed and padded, a custom op and its reference, one storage in two "
                                 "parameters), measured against each other", family="GP8"),
)

BY_NAME: dict[str, Tool] = {t.name: t for t in TOOLS}
NAMES: tuple[str, ...] = tuple(BY_NAME)


def codes(name: str) -> list[str]:
    """The catalogued codes of a tool's family, in order (every code for diagnose)."""
    family = BY_NAME[name].family
    return [code for code in catalogue() if family is None or code.startswith(family)]


def code_range(name: str) -> str:
    """The range of a tool's codes as the docs quote it: "GP301–GP314" (an en dash); "all" for diagnose."""
    if BY_NAME[name].family is None:
        return "all"
    found = codes(name)
    return f"{found[0]}–{found[-1]}" if len(found) > 1 else found[0]


def family_of(code: str) -> str | None:
    """The tool whose family a code belongs to (None for a code of no tool's family, such as GP000 internal-error)."""
    return next((t.name for t in TOOLS if t.family is not None and code.startswith(t.family)), None)


def run_tool(name: str, loaded: Any, options: dict[str, Any]) -> dict:
    """Run one tool on a loaded target (see gradprobe.loading), as the sandboxed child does."""
    tool = BY_NAME.get(name)
    if tool is None:
        raise ValueError(f"unknown tool {name!r}")
    return tool.check_function()(loaded, **options)
