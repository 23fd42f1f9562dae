"""The frameworks' own accumulation settings, read in the setup under test and set to 1 in the reference.

gradprobe sets accumulation only through each framework's own API, as a user would: the Hugging Face Trainer's
`TrainingArguments.gradient_accumulation_steps`, Lightning's `Trainer(accumulate_grad_batches=...)`, accelerate's
`Accelerator(gradient_accumulation_steps=...)`. The patch is applied when the framework's module is imported (a
post-import hook on `sys.meta_path`, so a script that never imports a framework pays nothing), and records the value
the script asked for in `seen`. The reference of N processes against one runs as one process under torchrun's
environment (WORLD_SIZE=1); Lightning's Trainer and Fabric check their `devices` x `num_nodes` against it, so there
both are set to 1 (the script's own device count is what ran at N processes).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

Hook = Callable[[ModuleType], None]


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, hook: Hook):
        self.inner, self.hook = inner, hook

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self.inner, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        self.hook(module)


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs hooks[name](module) right after `name` is imported (at once when it is imported already)."""

    def __init__(self, hooks: dict[str, Hook]):
        self.hooks = hooks

    def install(self) -> None:
        for name, hook in list(self.hooks.items()):
            if name in sys.modules:
                hook(sys.modules[name])
                del self.hooks[name]
        sys.meta_path.insert(0, self)

    def find_spec(self, name: str, path: Any = None, target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        hook = self.hooks.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, hook)
                return spec
        return None


def _one_device(kwargs: dict[str, Any], seen: dict[str, Any], name: str) -> None:
    """Lightning's and Fabric's own device setting for a one-process reference: `devices` names the processes of the
    run (Lightning checks devices x num_nodes against torchrun's WORLD_SIZE), so the reference asks for one."""
    devices = kwargs.get("devices", "auto")
    seen[f"{name}_devices"] = devices if isinstance(devices, (int, str)) else len(devices)
    if devices != "auto" and devices not in (1, "1"):
        kwargs["devices"] = 1
    if kwargs.get("num_nodes", 1) != 1:
        kwargs["num_nodes"] = 1


def accumulation_hooks(seen: dict[str, Any], to_one: bool, one_process: bool = False) -> AfterImport:
    """Hooks that record each framework's accumulation setting in `seen` and, with `to_one`, set it to 1; with
    `one_process` (the reference of N processes against one), Lightning's and Fabric's `devices` set to 1."""

    def trainer_args(module: ModuleType) -> None:
        cls = module.TrainingArguments
        orig = cls.__post_init__

        def post_init(self: Any) -> None:
            orig(self)
            seen["transformers"] = int(self.gradient_accumulation_steps)
            if to_one:
                self.gradient_accumulation_steps = 1

        cls.__post_init__ = post_init

    def lightning_trainer(module: ModuleType) -> None:
        cls = module.Trainer
        orig = cls.__init__

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            seen["lightning"] = kwargs.get("accumulate_grad_batches", 1)
            if to_one:
                kwargs["accumulate_grad_batches"] = 1
            if one_process:
                _one_device(kwargs, seen, "lightning")
            orig(self, *args, **kwargs)

        cls.__init__ = init

    def fabric(module: ModuleType) -> None:
        cls = module.Fabric
        orig = cls.__init__

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            if one_process:
                _one_device(kwargs, seen, "fabric")
            orig(self, *args, **kwargs)

        cls.__init__ = init

    def accelerator(module: ModuleType) -> None:
        cls = module.Accelerator
        orig = cls.__init__

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            plugin = kwargs.get("gradient_accumulation_plugin")
            seen["accelerate"] = int(plugin.num_steps if plugin is not None else kwargs.get("gradient_accumulation_steps", 1))
            if to_one:
                kwargs["gradient_accumulation_steps"] = 1
                if plugin is not None:
                    plugin.num_steps = 1
                    kwargs.pop("gradient_accumulation_steps")
            orig(self, *args, **kwargs)

        cls.__init__ = init

    return AfterImport({"transformers.training_args": trainer_args, "lightning.pytorch.trainer.trainer": lightning_trainer,
                        "pytorch_lightning.trainer.trainer": lightning_trainer, "accelerate.accelerator": accelerator,
                        "lightning.fabric.fabric": fabric, "lightning_fabric.fabric": fabric})
