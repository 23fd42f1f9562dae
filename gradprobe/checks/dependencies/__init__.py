"""Dependencies (GP9xx): what an output may not see, measured by autograd on the user's real model and batch.

claims (what the code claims not to see: next element, other examples, other packed examples) -> harness (one
forward with the inputs as leaves) -> jacobian (sampled rows of the Jacobian, one batched backward) -> explain (the
first block, the attention call, the mask's line, the flag) -> rules (GP901-GP904) -> engine (the report).
"""

from gradprobe.checks.dependencies.engine import check_dependencies, dependencies_report

__all__ = ["check_dependencies", "dependencies_report"]
