"""The tools, in one torch-free table read by the CLI, the server, the job runner and the tests.

Adding a tool: one row here, its check function (a report builder taking the loaded
target and the tool's options), and its MCP face in gradprobe/server/tools/<name>.py.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable


@dataclass(frozen=True)
class Tool:
    name: str
    check: str  # "module:function" of the report builder: fn(loaded, **options) -> report dict
    needs_step: bool  # runs a forward/backward, so the target needs inputs or a train_step
    allows_meta: bool  # may run on device="meta" (no weights)
    help: str  # one line for the CLI

    def check_function(self) -> Callable[..., dict]:
        module, _, attr = self.check.partition(":")
        fn: Callable[..., dict] = getattr(importlib.import_module(module), attr)
        return fn


TOOLS: tuple[Tool, ...] = (
    Tool("diagnose", "gradprobe.checks.diagnosis:diagnose_report", needs_step=False, allows_meta=False,
         help="every check that applies, the root cause first"),
    Tool("inspect_parameters", "gradprobe.checks.registration:inspect_report", needs_step=False, allows_meta=True,
         help="registration problems: tensors that are not parameters, plain containers, frozen and tied parameters"),
    Tool("check_optimizer_coverage", "gradprobe.checks.optimizer:optimizer_report", needs_step=False, allows_meta=False,
         help="parameters the optimizer misses or holds stale, and one real step"),
    Tool("trace_grad_path", "gradprobe.checks.trace:trace_report", needs_step=True, allows_meta=False,
         help="one traced step: which parameters get no gradient and the line that cuts the path"),
    Tool("run_gradcheck", "gradprobe.checks.gradcheck:gradcheck_report", needs_step=True, allows_meta=False,
         help="gradcheck of the custom autograd Functions the model calls"),
    Tool("verify_prompt_tuning", "gradprobe.checks.prompt_tuning:prompt_report", needs_step=True, allows_meta=False,
         help="soft prompt / PEFT prompt-tuning checks"),
    Tool("audit_training", "gradprobe.checks.steps:audit_report", needs_step=True, allows_meta=False,
         help="several real steps of the user's loop: LR as applied, gradients at step time, updates, EMA copies (GP6xx)"),
)

BY_NAME: dict[str, Tool] = {t.name: t for t in TOOLS}
NAMES: tuple[str, ...] = tuple(BY_NAME)


def run_tool(name: str, loaded: Any, options: dict[str, Any]) -> dict:
    """Run one tool on a loaded target (see gradprobe.loading), as the sandboxed child does."""
    tool = BY_NAME.get(name)
    if tool is None:
        raise ValueError(f"unknown tool {name!r}")
    return tool.check_function()(loaded, **options)
