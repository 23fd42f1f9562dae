"""A `build_model()` target at several ranks: what each rank runs in place of a script.

scriptmode/ranks.py forks the ranks (torchrun-style environment: RANK, WORLD_SIZE, MASTER_ADDR on the call's private
loopback) and runs, on each, script mode's job with its watches (the rank watch, the step watch) around a `ModelStep`
instead of a script. The step watch stops it at its first optimizer.step() (or after the steps audit_training
watches) and script mode's checks run there; the ranks' reports are merged by rankmerge.py. On each rank, in order:

1. the process group is initialised (gloo, from the environment) before any of the target's code runs, so that a
   build_model() that wraps its own model (DistributedDataParallel, `fully_shard`), seeds per rank or reads
   `dist.get_rank()` works as written;
2. the target is loaded as in the single-rank form (gradprobe/loading.py: the target's seed before the model is
   built, the same on every rank), except that its batch is made after `seed + rank` was set: every rank gets a batch
   of its own, as a DistributedSampler gives each rank different data;
3. the model build_model() returned is wrapped in DistributedDataParallel (defaults) unless it already is distributed
   (a DDP or FSDP wrapper, a `fully_shard`ed module, DTensor parameters), or has nothing to train;
4. the step runs as in the single-rank form (checks/core/step.attempt_step) on the wrapped model: the target's
   train_step, or forward, the target's loss (or the default loss), zero_grad, backward and optimizer.step() with
   the target's optimizer, or an SGD over the trainable parameters when the target has none. It is repeated on the
   same batch until the step watch stops it.
What was done (who wrapped the model, the batch seeds, whose optimizer) goes to the report's `facts.ranks.model_form`.
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch.nn as nn

    from gradprobe.errors import TargetError, TargetRefError
    from gradprobe.loading import Loaded
    from gradprobe.sandbox.protocol import ToolError
    from gradprobe.scriptmode.observe import StepWatch

DEFAULT_LR = 1e-3  # gradprobe's SGD when the target gives no optimizer (the single-rank form's checks take none)
MAX_STEPS = 100  # the step watch stops the loop long before (at the first step, or after audit_training's steps)


# the DistributedDataParallel wrappers gradprobe made (step 3): a finding about their settings is about gradprobe's
# choice, not the user's code (GP704's `ddp_stalled_by_gradprobe`)
WRAPPED_BY_GRADPROBE: weakref.WeakSet[Any] = weakref.WeakSet()


def distributed_already(model: nn.Module) -> str | None:
    """How the model is already distributed, by what it is (never by names of the user's): a DDP or FSDP wrapper or a
    `fully_shard`ed module anywhere in it, or DTensor parameters (tensor parallel); None when it is a plain model."""
    for m in model.modules():
        for k in type(m).__mro__:
            if k.__module__.startswith(("torch.distributed.", "torch.nn.parallel.distributed")):
                return k.__name__
    if any(hasattr(p, "placements") and callable(getattr(p, "to_local", None)) for p in model.parameters()):
        return "DTensor parameters"
    return None


@dataclass
class ModelStep:
    """One rank's run of a build_model() target (see the module docstring): called as the rank's script."""

    target: dict[str, Any]
    facts: dict[str, Any] = field(default_factory=dict)
    failure: TargetError | TargetRefError | None = None  # the target could not be loaded: reported as in one rank
    step_watch: StepWatch | None = None  # script mode's step watch (set by scriptmode/run.py before the call)

    def __call__(self) -> None:
        import torch.distributed as dist

        from gradprobe.checks.core.step import StepResult, attempt_step
        from gradprobe.errors import TargetError, TargetRefError
        from gradprobe.loading import load_target

        if not dist.is_initialized():
            dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        seed = int(self.target.get("seed") or 0)
        self.facts.update(process_group=f"initialised by gradprobe (gloo, {size} ranks) before build_model()",
                          batch_seeds={str(r): seed + r for r in range(size)})
        watch, passive = self.step_watch, self.step_watch.passive if self.step_watch is not None else False
        try:
            if watch is not None:  # a step while the target builds (a warm-up step in build_model() or setup) is
                watch.passive = True  # not the step to check, as in one process (where no watch runs then)
            loaded = load_target(self.target, batch_seed=seed + rank)
            if loaded.optimizer_error is not None and loaded.optimizer is None:
                raise loaded.optimizer_error
        except (TargetError, TargetRefError) as exc:
            self.failure = exc
            raise
        finally:
            if watch is not None:
                watch.passive = passive
        step = dataclasses.replace(loaded, model=self._wrapped(loaded), optimizer=self._optimizer(loaded))
        for _ in range(MAX_STEPS):
            result = StepResult(kind="train_step" if step.train_step is not None else "default")
            attempt_step(step, result, optimizer_step=True)  # the user's own errors propagate: the rank's finding
            if result.loss_problem is not None:
                raise ValueError(result.loss_problem)

    def _wrapped(self, loaded: Loaded) -> nn.Module:
        """What build_model() returned, wrapped in DistributedDataParallel when it is a plain model."""
        from torch.nn.parallel import DistributedDataParallel

        returned = loaded.wrapper if loaded.wrapper is not None else loaded.model
        how = distributed_already(returned)
        if how is not None:
            self.facts["wrapped"] = f"as build_model() returned it ({how}): not wrapped again"
            return returned
        if not any(p.requires_grad for p in returned.parameters()):
            self.facts["wrapped"] = "not wrapped: the model has no trainable parameter (DDP would refuse it)"
            return returned
        self.facts["wrapped"] = ("by gradprobe: DistributedDataParallel(model) with its defaults "
                                 "(find_unused_parameters=False), as a training script would")
        ddp = DistributedDataParallel(returned)
        WRAPPED_BY_GRADPROBE.add(ddp)
        return ddp

    def _optimizer(self, loaded: Loaded) -> Any:
        import torch

        if loaded.optimizer is not None or loaded.train_step is not None:
            self.facts["optimizer"] = "the target's" if loaded.optimizer is not None else "none (the target's train_step)"
            return loaded.optimizer
        self.facts["optimizer"] = f"gradprobe's SGD(lr={DEFAULT_LR}) over the trainable parameters (the target gives none)"
        return torch.optim.SGD([p for p in loaded.model.parameters() if p.requires_grad], lr=DEFAULT_LR)

    def finish(self, tool: str, report: ToolError | dict[str, Any]) -> ToolError | dict[str, Any]:
        """The rank's report: the single-rank form's load failure when the target could not be loaded, and what
        this rank did (facts.model_form, lifted into facts.ranks by rankmerge.py)."""
        from gradprobe.errors import TargetRefError
        from gradprobe.sandbox.protocol import ToolError

        if isinstance(self.failure, TargetRefError):
            return ToolError(tool_error=str(self.failure))
        if self.failure is not None:
            from gradprobe.sandbox.failures import load_failure_report
            from gradprobe.userframes import UserCode

            report = load_failure_report(tool, self.failure, UserCode(os.path.realpath(self.target["project_dir"])))
        if isinstance(report, dict):
            report.setdefault("facts", {})["model_form"] = dict(self.facts)
        return report
