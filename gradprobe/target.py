"""The target: how every tool finds the user's model, inputs, loss, optimizer and step.

This is the wire model of spec/targets.md, validated in the server before any
child starts. The child side that imports and builds it is `gradprobe.loading`
(kept apart so that the child needs only torch, not pydantic).
"""

from __future__ import annotations

import os
import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

REF_HELP = '"FILE_OR_MODULE:CALLABLE", e.g. "train.py:build_model" or "mypkg.models:Net"'
_DEVICE = re.compile(r"^(cpu|cuda|cuda:\d+|auto|meta)$")

Ref = Annotated[str | None, Field(default=None, description=f"{REF_HELP}")]


class Target(BaseModel):
    """Where the user's code is and which callables build the model, batch, loss, optimizer and step."""

    model_config = ConfigDict(extra="forbid")

    project_dir: str = Field(description="The user's project root (absolute path); put first on the child's sys.path.")
    model: Ref = Field(
        default=None,
        description=(
            "Callable returning an nn.Module (a class is called with no arguments), as "
            f"{REF_HELP}. The short form \"case.py\" picks up the conventional names "
            "build_model, make_inputs, loss_fn, make_optimizer, train_step defined in that file."
        ),
    )
    inputs: Ref = Field(
        default=None,
        description="Callable returning one batch: a tensor, a tuple (positional args), a dict (keyword args) or an (args, kwargs) pair.",
    )
    loss: Ref = Field(default=None, description="Optional callable (output, batch) -> scalar loss. Default: HF .loss, else a fixed random projection of the outputs.")
    optimizer: Ref = Field(default=None, description="Optional callable (model) -> torch.optim.Optimizer.")
    train_step: Ref = Field(default=None, description="Optional callable (model, batch, optimizer) doing the user's real step; observed instead of a step of our own.")
    setup: str | None = Field(
        default=None,
        description="Optional inline Python run in the child before the references; it may define model, inputs, loss_fn, optimizer, train_step.",
    )
    device: str = Field(default="cpu", description='"cpu", "cuda", "cuda:N", "auto" (CUDA when the child sees a GPU), or "meta" (inspect_parameters only: no weights allocated).')
    seed: int = Field(default=0, description="Random seed set before anything is built, so runs repeat.")
    python: str | None = Field(default=None, description="Optional interpreter for the child (the project's virtualenv); it needs a compatible torch.")
    timeout_s: float = Field(default=120.0, gt=0, le=3600, description="Wall-clock limit for the call in the child; past it the child is killed and GP100 is reported.")

    @field_validator("model", "inputs", "loss", "optimizer", "train_step")
    @classmethod
    def _ref_shape(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = v.strip()
        if not v:
            raise ValueError(f"empty reference: use {REF_HELP}")
        mod, _, name = v.partition(":")
        if not mod or (":" in v and not name):
            raise ValueError(f"{v!r} is not a reference: use {REF_HELP}")
        return v

    @field_validator("device")
    @classmethod
    def _device_shape(cls, v: str) -> str:
        if not _DEVICE.match(v):
            raise ValueError(f"device {v!r} must be cpu, cuda, cuda:N, auto or meta")
        return v

    @model_validator(mode="after")
    def _needs_model(self) -> Target:
        if not self.model and not self.setup:
            raise ValueError('give `model` (e.g. "train.py:build_model" or "case.py") or `setup` code that defines `model`')
        return self

    def check_paths(self) -> None:
        """Errors the caller can fix, found before any child starts (raises ValueError)."""
        if not os.path.isabs(self.project_dir):
            raise ValueError(f"project_dir must be an absolute path, got {self.project_dir!r}")
        if not os.path.isdir(self.project_dir):
            raise ValueError(f"project_dir {self.project_dir!r} is not a directory")
        for field in ("model", "inputs", "loss", "optimizer", "train_step"):
            ref = getattr(self, field)
            if not ref:
                continue
            mod = ref.partition(":")[0]
            if mod.endswith(".py"):
                path = os.path.join(self.project_dir, mod)
                if not os.path.isfile(path):
                    raise ValueError(f"{field}: file {mod!r} not found in project_dir {self.project_dir!r}")
        if self.python is not None and not (os.path.isfile(self.python) and os.access(self.python, os.X_OK)):
            raise ValueError(f"python {self.python!r} is not an executable file")
