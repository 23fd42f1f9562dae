"""Load a target in the child: import the user's code, build model, batch, loss, optimizer, step.

While the user's code builds the model and optimizer, `BuildRecorder` notes
where each module attribute and each optimizer was created, so that findings
can point at the user's line (`self.blocks = [...]`, `Adam(self.parameters())`).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import linecache
import os
import random
import sys
from dataclasses import dataclass, field
from typing import Any, Literal
from collections.abc import Callable

import torch
import torch.nn as nn

from gradprobe.errors import TargetError, TargetRefError
from gradprobe.phases import Phase
from gradprobe.checks.core.torchcompat import data_descriptor, requires_grad_descriptor, settle_device_constructors
from gradprobe.initwrites import STATE_DICT_COPY, InitWrites, WriteLog
from gradprobe.userframes import SETUP_FILENAME, UserCode
from gradprobe.wrappers import unwrap_library

CONVENTIONAL = {
    "model": "build_model",
    "inputs": "make_inputs",
    "loss": "loss_fn",
    "optimizer": "make_optimizer",
    "train_step": "train_step",
}
SETUP_NAMES = {"model": "model", "inputs": "inputs", "loss": "loss_fn", "optimizer": "optimizer", "train_step": "train_step"}


@dataclass
class BuildRecord:
    """Where the user's code set module attributes and created optimizers, in order."""

    seq: int = 0
    setattr_sites: dict = field(default_factory=dict)  # (id(module), name) -> (seq, location)
    optimizer_sites: dict = field(default_factory=dict)  # id(optimizer) -> (seq, location)
    setattr_stacks: dict = field(default_factory=dict)  # (id(module), name) -> user frames, innermost first
    frozen_sites: dict = field(default_factory=dict)  # id(tensor) -> (seq, location) of requires_grad -> False
    # (file, line) of a freeze -> (locals, globals) of the user frame at its first freeze: what its condition read
    freeze_frames: dict = field(default_factory=dict)
    hook_sites: dict = field(default_factory=dict)  # id(tensor) -> (seq, location) of register_hook
    data_sites: dict = field(default_factory=dict)  # id(Parameter) -> (seq, location) of `p.data = ...` (a tie by .data)
    grad_off_sites: list = field(default_factory=list)  # (seq, location) where grad mode was switched off
    group_sources: Any = None  # checks.group_sources.GroupSources: where make_optimizer's param groups came from
    writes: WriteLog = field(default_factory=WriteLog)  # the last initialiser fill or load of each storage (initwrites.py)
    frozen_by_library: set = field(default_factory=set)  # id(tensor) frozen last by library code (an adapter's call)
    keep: list = field(default_factory=list)  # keeps recorded objects alive so ids stay unique
    stepped: list = field(default_factory=list)  # script mode: the optimizers whose step() the script's own loop ran

    def site_of(self, module: nn.Module, name: str) -> dict | None:
        hit = self.setattr_sites.get((id(module), name))
        return hit[1] if hit else None


class BuildRecorder:
    """Context manager that records user lines of `module.attr = ...` and optimizer creation."""

    def __init__(self, user: UserCode, record: BuildRecord, writes: bool = True) -> None:
        self.user, self.record = user, record
        self._active = False
        if writes:
            settle_device_constructors()  # before the factories are patched (torchcompat says why)
        self._writes = InitWrites(user, record.writes) if writes else None  # initialiser fills and loads

    def __enter__(self) -> BuildRecorder:
        user, rec, writes = self.user, self.record, self._writes is not None
        self._setattr = orig_setattr = nn.Module.__setattr__
        self._opt_init = orig_init = torch.optim.Optimizer.__init__

        def recording_setattr(module: nn.Module, name: str, value: Any) -> None:
            stack = user.user_stack(skip=2)
            if stack:
                rec.seq += 1
                rec.setattr_sites[(id(module), name)] = (rec.seq, stack[0])
                rec.setattr_stacks[(id(module), name)] = stack
                rec.keep.append(module)
            old = module.__dict__.get("_parameters", {}).get(name) if writes else None
            if old is not None and isinstance(value, nn.Parameter) and rec.writes.last(value) is None:
                # a loader sets a new Parameter (a tie sets one already noted): over a meta placeholder, as loaders
                # build and fill ("replaced"); over a real one, a load or an adapter re-initialising itself from a
                # tensor the build drew (peft's HRA: nn.Parameter(repeat_interleave(...))): "assigned"
                op = ("load_state_dict" if sys._getframe(1).f_code is STATE_DICT_COPY
                      else "replaced" if old.device.type == "meta" else "assigned")  # load_state_dict(assign=True)
                rec.writes.note(value, "load", op, stack[0] if stack else None)
            return orig_setattr(module, name, value)

        def recording_init(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            loc = user.innermost(skip=1)
            rec.seq += 1
            rec.optimizer_sites[id(opt)] = (rec.seq, loc)
            rec.keep.append(opt)
            return orig_init(opt, *args, **kwargs)

        self._register_buffer = orig_buffer = nn.Module.register_buffer

        def recording_buffer(module: nn.Module, name: str, tensor: torch.Tensor | None, persistent: bool = True) -> None:
            loc = user.innermost(skip=1)
            if loc is not None:
                rec.seq += 1
                rec.setattr_sites[(id(module), name)] = (rec.seq, loc)
                rec.keep.append(module)
            return orig_buffer(module, name, tensor, persistent)

        nn.Module.__setattr__ = recording_setattr  # type: ignore[method-assign, assignment]
        nn.Module.register_buffer = recording_buffer  # type: ignore[method-assign, assignment]
        torch.optim.Optimizer.__init__ = recording_init  # type: ignore[method-assign, assignment]
        self._state = _StateRecorder(user, rec).__enter__()
        if self._writes is not None:
            self._writes.__enter__()
        self._active = True
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        if not self._active:  # already exited (script mode pauses recording before its checks)
            return False
        self._active = False
        nn.Module.__setattr__ = self._setattr  # type: ignore[method-assign]
        nn.Module.register_buffer = self._register_buffer  # type: ignore[method-assign]
        torch.optim.Optimizer.__init__ = self._opt_init  # type: ignore[method-assign]
        if self._writes is not None:
            self._writes.__exit__(*exc)
        self._state.__exit__(*exc)
        return False


class _StateRecorder:
    """Records the user lines that freeze tensors (`requires_grad_(False)`, `p.requires_grad = False`),
    register gradient hooks, and switch gradient recording off (`torch.set_grad_enabled(False)`)."""

    def __init__(self, user: UserCode, record: BuildRecord) -> None:
        self.user, self.record = user, record

    def _note(self, table: dict, t: Any) -> None:
        loc = self.user.innermost(skip=3)
        if loc is not None:
            self.record.seq += 1
            table[id(t)] = (self.record.seq, loc)
            self.record.keep.append(t)

    def _freeze_frame(self, t: Any) -> None:
        """The names the freezing line's frame held at its first freeze (its condition's pattern: GP319)."""
        hit = self.record.frozen_sites.get(id(t))
        if hit is None or (hit[1]["file"], hit[1]["line"]) in self.record.freeze_frames:
            return
        f: Any = sys._getframe(2)
        while f is not None and not self.user.is_user_file(f.f_code.co_filename):
            f = f.f_back
        if f is not None:
            self.record.freeze_frames[(hit[1]["file"], hit[1]["line"])] = (dict(f.f_locals), f.f_globals)

    def _by_library(self, t: Any, frame: Any) -> None:
        """A freeze that library code made (peft's get_peft_model), not the user's line or torch called from it."""
        f = frame
        while f is not None and "/torch/" in f.f_code.co_filename.replace("\\", "/"):
            f = f.f_back  # nn.Module.requires_grad_ called from the user's line is the user's
        if f is not None and not self.user.is_user_file(f.f_code.co_filename):
            self.record.frozen_by_library.add(id(t))
        else:
            self.record.frozen_by_library.discard(id(t))

    def __enter__(self) -> _StateRecorder:
        rec, note = self.record, self._note
        orig_rg_, orig_hook = torch.Tensor.requires_grad_, torch.Tensor.register_hook
        orig_gm = torch.autograd.grad_mode.set_grad_enabled.__init__
        base_rg = requires_grad_descriptor()

        def requires_grad_(t: torch.Tensor, requires_grad: bool = True) -> torch.Tensor:
            if not requires_grad:
                note(rec.frozen_sites, t)
                self._freeze_frame(t)
                self._by_library(t, sys._getframe(1))
            return orig_rg_(t, requires_grad)

        def set_requires_grad(t: torch.Tensor, value: bool) -> None:
            if not value:
                note(rec.frozen_sites, t)
                self._freeze_frame(t)
                self._by_library(t, sys._getframe(1))
            base_rg.__set__(t, value)

        def register_hook(t: torch.Tensor, hook: Callable[..., Any]) -> Any:
            note(rec.hook_sites, t)
            return orig_hook(t, hook)

        def set_grad_enabled_init(self_: Any, mode: bool) -> None:
            caller = sys._getframe(1)
            if not mode and self.user.is_user_file(caller.f_code.co_filename):  # the user's own call, not torch's no_grad
                loc = self.user.location_of(caller.f_code.co_filename, caller.f_lineno, caller.f_code.co_name)
                if loc is not None:
                    rec.seq += 1
                    rec.grad_off_sites.append((rec.seq, loc))
            return orig_gm(self_, mode)

        self._saved = (orig_hook, orig_gm)
        self._own = {k: v for k, v in ((k, torch.Tensor.__dict__.get(k)) for k in ("requires_grad_",)) if v is not None}
        self._own_param = nn.Parameter.__dict__.get("requires_grad")
        self._own_data = nn.Parameter.__dict__.get("data")
        base_data = data_descriptor()

        def set_data(t: torch.Tensor, value: torch.Tensor) -> None:
            # the user's own `p.data = other.data` (two Parameters over one storage: GP805 names the line), not
            # torch's own (Module._apply sets .data under the user's `model.to(...)`)
            caller = sys._getframe(1)
            if self.user.is_user_file(caller.f_code.co_filename):
                rec.seq += 1
                rec.data_sites[id(t)] = (rec.seq, self.user.location_of(caller.f_code.co_filename, caller.f_lineno,
                                                                        caller.f_code.co_name))
                rec.keep.append(t)
            base_data.__set__(t, value)

        torch.Tensor.requires_grad_ = requires_grad_  # type: ignore[method-assign, assignment]
        torch.Tensor.register_hook = register_hook  # type: ignore[method-assign]
        nn.Parameter.requires_grad = property(base_rg.__get__, set_requires_grad)  # type: ignore[assignment]
        nn.Parameter.data = property(base_data.__get__, set_data)  # type: ignore[assignment, method-assign]
        torch.autograd.grad_mode.set_grad_enabled.__init__ = set_grad_enabled_init  # type: ignore[method-assign, assignment]
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        orig_hook, orig_gm = self._saved
        if "requires_grad_" in self._own:
            torch.Tensor.requires_grad_ = self._own["requires_grad_"]  # type: ignore[method-assign]
        else:
            del torch.Tensor.requires_grad_  # the C method of TensorBase shows through again
        if self._own_param is not None:
            nn.Parameter.requires_grad = self._own_param  # type: ignore[assignment]
        else:
            del nn.Parameter.requires_grad
        if self._own_data is not None:
            nn.Parameter.data = self._own_data  # type: ignore[method-assign]
        else:
            del nn.Parameter.data
        torch.Tensor.register_hook = orig_hook  # type: ignore[method-assign]
        torch.autograd.grad_mode.set_grad_enabled.__init__ = orig_gm  # type: ignore[method-assign]
        return False


@dataclass
class Loaded:
    """Live objects of a loaded target, plus what was recorded while building them."""

    model: nn.Module
    batch: Any
    loss_fn: Callable | None
    optimizer: Any
    make_optimizer: Callable | None
    train_step: Callable | None
    user: UserCode
    record: BuildRecord
    device: str
    optimizer_error: TargetError | None = None
    info: dict = field(default_factory=dict)
    wrapper: nn.Module | None = None  # a library wrapper (compiled, DDP) around `model`, see gradprobe/wrappers.py


def _import_file(path: str) -> Any:
    stem = os.path.splitext(os.path.basename(path))[0]
    name = stem if stem.isidentifier() and stem not in sys.modules else f"_gradprobe_user_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TargetRefError(f"cannot import {path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # so pickling by reference (multiprocessing) finds it
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


class Resolver:
    """Turns `FILE_OR_MODULE:CALLABLE` references into objects, importing each file once."""

    def __init__(self, project_dir: str):
        self.project_dir = project_dir
        self.modules: dict[str, Any] = {}

    def module(self, mod: str) -> Any:
        if mod not in self.modules:
            try:
                if mod.endswith(".py"):
                    path = os.path.join(self.project_dir, mod)
                    if not os.path.isfile(path):
                        raise TargetRefError(f"file {mod!r} not found in {self.project_dir}")
                    self.modules[mod] = _import_file(path)
                else:
                    self.modules[mod] = importlib.import_module(mod)
            except TargetRefError:
                raise
            except ModuleNotFoundError as exc:
                if exc.name == mod.split(".")[0]:
                    raise TargetRefError(f"module {mod!r} is not importable from {self.project_dir}") from exc
                raise TargetError("importing", f"importing {mod} failed: {exc}", exc) from exc
            except BaseException as exc:
                raise TargetError("importing", f"importing {mod} failed: {type(exc).__name__}: {exc}", exc) from exc
        return self.modules[mod]

    def resolve(self, ref: str, what: str) -> Any:
        mod, _, name = ref.partition(":")
        module = self.module(mod)
        if not name:
            name = CONVENTIONAL[what]
        obj = module
        for part in name.split("."):
            if not hasattr(obj, part):
                raise TargetRefError(f"{what}: {mod!r} has no attribute {name!r}")
            obj = getattr(obj, part)
        return obj

    def conventional(self, ref: str, what: str) -> Any | None:
        """The conventional name (e.g. make_inputs) from the model's file, if it defines it."""
        mod, _, name = ref.partition(":")
        return getattr(self.module(mod), CONVENTIONAL[what], None)


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise TargetError("building", f"device {device!r} was asked for but this child sees no CUDA device")
    return device


def move_batch(batch: Any, device: str) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, tuple):
        return tuple(move_batch(b, device) for b in batch)
    if isinstance(batch, list):
        return [move_batch(b, device) for b in batch]
    if isinstance(batch, dict):
        return {k: move_batch(v, device) for k, v in batch.items()}
    return batch


def _call_user(phase: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except TargetError:
        raise
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt,)):
            raise
        raise TargetError(phase, f"{phase}: {type(exc).__name__}: {exc}", exc) from exc


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass


def _run_setup(setup: str, user: UserCode, record: BuildRecord, meta: bool, found: dict[str, Any]) -> None:
    """Execute the target's inline `setup` source; the names it defines (model, inputs, ...) are found."""
    namespace: dict[str, Any] = {"torch": torch, "nn": nn, "__name__": "__gradprobe_setup__"}
    lines = setup.splitlines(keepends=True)
    linecache.cache[SETUP_FILENAME] = (len(setup), None, lines, SETUP_FILENAME)
    try:
        code = compile(setup, SETUP_FILENAME, "exec")
    except SyntaxError as exc:
        raise TargetError("importing", f"setup code has a syntax error: {exc}", exc) from exc
    with BuildRecorder(user, record), (torch.device("meta") if meta else contextlib.nullcontext()):
        _call_user("running setup", exec, code, namespace)
    for what, name in SETUP_NAMES.items():
        if name in namespace:
            found[what] = namespace[name]


def _resolve_references(target: dict[str, Any], resolver: Resolver, found: dict[str, Any]) -> None:
    """The target's FILE_OR_MODULE:CALLABLE references, and the conventional names of the model's file."""
    model_ref = target.get("model")
    for what in CONVENTIONAL:
        ref = target.get(what)
        if ref:
            found[what] = resolver.resolve(ref, what)
        elif model_ref and ":" not in model_ref and what != "model" and what not in found:
            conv = resolver.conventional(model_ref, what)
            if conv is not None:
                found[what] = conv


def _build_model(model: Any, user: UserCode, record: BuildRecord, meta: bool) -> nn.Module:
    from gradprobe.modelset import from_given

    if model is None:
        raise TargetRefError("no model: give `model` or define `model` in setup")
    if not isinstance(model, nn.Module) and from_given(model) is None:
        if not callable(model):
            raise TargetError("building", f"model is a {type(model).__name__}, not an nn.Module or a callable returning one")
        with BuildRecorder(user, record), (torch.device("meta") if meta else contextlib.nullcontext()):
            model = _call_user("building the model", model)
    several = from_given(model)  # a tuple, list or dict of modules: several models, checked as one
    if several is not None:
        return several
    if not isinstance(model, nn.Module):
        raise TargetError("building", f"the model callable returned a {type(model).__name__}, not an nn.Module (or a "
                                      "tuple, list or dict of nn.Modules)")
    return model


def _make_optimizer(make_optimizer: Any, model: nn.Module, user: UserCode,
                    record: BuildRecord) -> tuple[Any, Callable[..., Any] | None, TargetError | None]:
    """(optimizer, the callable that made it, the error it raised): an optimizer object given as is has no callable."""
    optimizer = None
    optimizer_error = None
    if isinstance(make_optimizer, torch.optim.Optimizer) or not callable(make_optimizer):
        optimizer, make_optimizer = make_optimizer, None
    else:
        from gradprobe.checks.optimizer.group_sources import GroupRecorder, GroupSources

        record.group_sources = GroupSources()
        try:
            with BuildRecorder(user, record, writes=False), GroupRecorder(user, record.group_sources):
                optimizer = _call_user("making the optimizer", make_optimizer, model)
        except TargetError as exc:
            optimizer_error = exc
    if isinstance(optimizer, (tuple, list, dict)):  # (optimizer, scheduler) and friends
        items = optimizer.values() if isinstance(optimizer, dict) else optimizer
        optimizer = next((o for o in items if isinstance(o, torch.optim.Optimizer)), optimizer)
    return optimizer, make_optimizer, optimizer_error


def _inputs(found: dict[str, Any], meta: bool) -> Any:
    inputs = found.get("inputs")
    if inputs is None or meta:
        return None
    return _call_user("making the inputs", inputs) if callable(inputs) and not isinstance(inputs, torch.Tensor) else inputs


def load_target(target: dict[str, Any], progress: Callable[[str], None] = lambda phase: None,
                batch_seed: int | None = None) -> Loaded:
    """Import and build everything a target names. Raises TargetError / TargetRefError. `batch_seed`: the seed set
    again just before the batch is made (a rank of several, scriptmode/modelranks.py: each rank its own batch)."""
    project_dir = os.path.realpath(target["project_dir"])
    user = UserCode(project_dir)
    record = BuildRecord()
    if project_dir not in sys.path:
        sys.path.insert(0, project_dir)
    seed_everything(int(target.get("seed") or 0))
    device = target.get("device") or "cpu"
    meta = device == "meta"
    if not meta:
        device = resolve_device(device)
    found: dict[str, Any] = {}

    progress(Phase.IMPORTING)
    if target.get("setup"):
        _run_setup(target["setup"], user, record, meta, found)
    with _StateRecorder(user, record):
        _resolve_references(target, Resolver(project_dir), found)

    progress(Phase.BUILDING)
    from gradprobe.modelset import ModelSet, for_user

    model, wrapper = unwrap_library(_build_model(found.get("model"), user, record, meta))
    info: dict[str, Any] = {"device": device, "grad_enabled_after_build": torch.is_grad_enabled()}
    if wrapper is not None:
        info["wrapper"] = type(wrapper).__name__
    if not meta:
        from gradprobe.frameworks import lightning_defaults

        lightning = lightning_defaults(model, found)
        if lightning:
            info["lightning"] = lightning
    if batch_seed is not None:
        seed_everything(batch_seed)
    batch = _inputs(found, meta)
    if not meta and device != "cpu":
        model = model.to(device)
        batch = move_batch(batch, device)
        info["moved_to"] = device
    if isinstance(model, ModelSet):  # the user's functions take the models as build_model() returned them
        found.update({k: for_user(found[k]) for k in ("optimizer", "train_step") if callable(found.get(k))
                      and not isinstance(found[k], torch.optim.Optimizer)})
        info["models"] = {"given_as": model.given, "names": model.labels}
        if found.get("train_step") is None and batch is not None:  # gradprobe does not guess how a step uses them
            batch = None
            info["models"]["note"] = (f"build_model() returned {len(model.labels)} models ({', '.join(model.labels)}) and "
                                      "no train_step: the step-based checks were skipped (a train_step(models, batch, "
                                      "optimizer) says how one step uses them)")
    optimizer, make_optimizer, optimizer_error = None, found.get("optimizer"), None
    if make_optimizer is not None and not meta:
        optimizer, make_optimizer, optimizer_error = _make_optimizer(make_optimizer, model, user, record)
    return Loaded(model=model, batch=batch, loss_fn=found.get("loss"), optimizer=optimizer, make_optimizer=make_optimizer,
                  train_step=found.get("train_step"), user=user, record=record, device=device,
                  optimizer_error=optimizer_error, info=info, wrapper=wrapper)


def live_target(model: nn.Module, batch: Any = None, loss_fn: Callable | None = None, optimizer: Any = None,
                train_step: Callable | None = None, project_dir: str | None = None) -> Loaded:
    """Wrap live objects (a notebook's model and batch) as a loaded target, for the library entry points.

    `project_dir` decides which frames are "user" lines; by default the directory of the file that
    defines the model's class.
    """
    import inspect

    model, wrapper = unwrap_library(model)
    if project_dir is None:
        try:
            project_dir = os.path.dirname(inspect.getfile(type(model)))
        except (TypeError, OSError):
            project_dir = os.getcwd()
    return Loaded(model=model, batch=batch, loss_fn=loss_fn, optimizer=optimizer, make_optimizer=None,
                  train_step=train_step, user=UserCode(project_dir), record=BuildRecord(), device="cpu",
                  info={"grad_enabled_after_build": torch.is_grad_enabled()}, wrapper=wrapper)
