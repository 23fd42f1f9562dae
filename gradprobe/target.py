"""The target: how every tool finds the user's model, inputs, loss, optimizer and step.

This is the wire model of spec/targets.md, validated in the server before any
child starts. The child side that imports and builds it is `gradprobe.loading`
(kept apart so that the child needs only torch, not pydantic).
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gradprobe.envrules import refused as refused_env

REF_HELP = '"FILE_OR_MODULE:CALLABLE", e.g. "train.py:build_model" or "mypkg.models:Net"'
_DEVICE = re.compile(r"^(cpu|cuda|cuda:\d+|auto|meta)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
MAX_PEEK_BYTES = 1 << 20  # the most of a model file the server reads to suggest script mode

Ref = Annotated[str | None, Field(default=None, description=f"{REF_HELP}")]


class Target(BaseModel):
    """Where the user's code is and which callables build the model, batch, loss, optimizer and step."""

    model_config = ConfigDict(extra="forbid")

    project_dir: str = Field(default="", description=(
        "The user's project root (absolute path), the directory the user runs the code from: a script runs with it as "
        "its working directory. May be left out when `model` or `script` is an absolute file path: the model file's "
        "directory is then the project, and a script's project is the nearest directory above it holding "
        "pyproject.toml, setup.py, setup.cfg or .git (else the script's own directory)."))
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
        description=("Callable returning one batch: a tensor, a tuple (positional args), a dict (keyword args) "
                     "or an (args, kwargs) pair."),
    )
    loss: Ref = Field(default=None, description=(
        "Optional callable (output, batch) -> scalar loss, or a dict/tuple/list of loss terms (summed as trainers do: a "
        "dict's 'loss' entry, else its entries whose key contains 'loss', else every scalar entry; each entry is a "
        "named term of facts.loss_terms). Default: HF .loss, else a fixed random projection of the outputs."))
    optimizer: Ref = Field(default=None, description="Optional callable (model) -> torch.optim.Optimizer.")
    train_step: Ref = Field(default=None, description=(
        "Optional callable (model, batch, optimizer) doing the user's real step; observed instead of a step of our own."))
    setup: str | None = Field(
        default=None,
        description=("Optional inline Python run in the child before the references; it may define model, inputs, "
                     "loss_fn, optimizer, train_step."),
    )
    device: str = Field(default="cpu", description=(
        '"cpu", "cuda", "cuda:N", "auto" (CUDA when the child sees a GPU), or "meta" (inspect_parameters only: '
        "no weights allocated)."))
    seed: int = Field(default=0, description="Random seed set before anything is built, so runs repeat.")
    python: str | None = Field(default=None, description=(
        "Interpreter that runs the code (absolute path, e.g. the project's .venv/bin/python; it needs torch). Default: the "
        "project's own environment (.venv, venv, env, .pixi, conda environment.yml) found in project_dir or its parents, "
        'else the server\'s interpreter; "server" forces the server\'s.'))
    script: str | None = Field(default=None, description=(
        "A training script (path relative to project_dir) run as __main__ until its first optimizer step, which is "
        "captured and checked (instead of model/inputs/...)."))
    module: str | None = Field(default=None, description=(
        "Like `script`, for a `python -m` entry point (a dotted module name importable from project_dir)."))
    args: list[str] = Field(default_factory=list, description="The script's command-line arguments (sys.argv[1:]).")
    world_size: int = Field(default=1, ge=1, le=4, description=(
        "Run the target as this many ranks on this machine (2 to 4), torchrun-style (RANK, LOCAL_RANK, WORLD_SIZE, "
        "MASTER_ADDR=127.0.0.1, MASTER_PORT set; gloo on the call's private loopback), all in the same sandboxed call; "
        "findings are merged and say which ranks they hold on. A script runs as it would under torchrun. A "
        "build_model() target: the process group is initialised before build_model(), a model it returns unwrapped is "
        "wrapped in DistributedDataParallel, and each rank makes its own batch (seed + rank) and runs one training step. "
        "1 (the default): one process, and a script that starts its own workers with torch.multiprocessing.spawn has "
        "them followed."))
    timeout_s: float = Field(default=120.0, gt=0, le=3600, description=(
        "Wall-clock limit for the call in the child; past it the child is killed and GP114 is reported."))
    read_paths: list[str] = Field(default_factory=list, description=(
        "Absolute paths (files or directories) the code may read besides the project, read-only: data sets, caches "
        '(e.g. "/data/cifar", "/home/ana/.cache/huggingface"). A server over HTTP accepts only paths inside its allowed roots.'))
    env: dict[str, str] = Field(default_factory=dict, description=(
        'Environment variables for the child (never the server\'s own), e.g. {"WANDB_MODE": "disabled"}. '
        "A server over HTTP accepts only the names its operator allowed (--allow-env)."))
    memory_gb: float | None = Field(default=None, gt=0, description=(
        "Memory limit of this check in GB (default: the server's, sized to the machine); up to the server's ceiling "
        "(--max-memory-gb)."))

    @model_validator(mode="before")
    @classmethod
    def _project_from_model_path(cls, data: Any) -> Any:
        """`{"model": "/abs/path/model.py"}` alone: the file's directory is the project (roots still apply)."""
        if not isinstance(data, dict) or data.get("project_dir"):
            return data
        for field in ("model", "script"):
            ref = data.get(field)
            if isinstance(ref, str) and os.path.isabs(ref.strip()):
                path, sep, name = ref.strip().partition(":")
                if path.endswith(".py"):
                    root = project_root_of(path) if field == "script" else os.path.dirname(path)
                    return {**data, "project_dir": root, field: os.path.relpath(path, root) + sep + name}
        return data

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

    @field_validator("python")
    @classmethod
    def _python_shape(cls, v: str | None) -> str | None:
        if v is None or v == "server":
            return v
        if not v.strip():
            raise ValueError('empty interpreter: write an absolute path, or "server" for the server\'s own')
        if not os.path.isabs(v):
            raise ValueError(f"{v!r} is a relative path: write the interpreter's absolute path, e.g. "
                             '"/home/ana/proj/.venv/bin/python" (the server cannot know which directory it is relative to)')
        return v

    @field_validator("read_paths")
    @classmethod
    def _read_paths_shape(cls, v: list[str]) -> list[str]:
        for path in v:
            if not os.path.isabs(path):
                raise ValueError(f"read_paths: {path!r} is a relative path: write absolute paths, e.g. \"/data/cifar\"")
            if os.path.realpath(path) == "/":
                raise ValueError("read_paths: '/' would show the child the whole machine: name the data's own directory")
        return v

    @field_validator("env")
    @classmethod
    def _env_shape(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if not _ENV_NAME.match(name):
                raise ValueError(f"env: {name!r} is not a variable name (letters, digits and _)")
            why = refused_env(name)
            if why:
                raise ValueError(why)
        return v

    @field_validator("device")
    @classmethod
    def _device_shape(cls, v: str) -> str:
        if not _DEVICE.match(v):
            raise ValueError(f"device {v!r} must be cpu, cuda, cuda:N, auto or meta")
        return v

    @model_validator(mode="after")
    def _needs_model(self) -> Target:
        if self.script and self.module:
            raise ValueError("give `script` or `module`, not both")
        if self.world_size > 1 and self.device == "meta":
            raise ValueError('`world_size` > 1 runs a training step on every rank: it needs real weights, not device "meta"')
        if (self.script or self.module) and (self.model or self.setup):
            raise ValueError("a `script`/`module` target brings its own model: drop `model`/`setup`")
        if not self.model and not self.setup and not self.script and not self.module:
            raise ValueError('give `model` (e.g. "train.py:build_model" or "case.py") or `setup` code that defines `model`')
        if not self.project_dir:
            raise ValueError("`project_dir` is missing: " + _FIELD_HINTS["project_dir"])
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
        self._suggest_script_mode()
        for path in self.read_paths:
            if not os.path.exists(path):
                raise ValueError(f"read_paths: {path!r} does not exist")
        if self.script:
            path = os.path.realpath(os.path.join(self.project_dir, self.script))
            if not path.startswith(os.path.realpath(self.project_dir) + os.sep):
                raise ValueError(f"script {self.script!r} is outside project_dir {self.project_dir!r}")
            if not os.path.isfile(path):
                raise ValueError(f"script: file {self.script!r} not found in project_dir {self.project_dir!r}")


    def _suggest_script_mode(self) -> None:
        """The short form on a file without build_model (an ordinary training script): say how to run it as one."""
        if not self.model or ":" in self.model or not self.model.endswith(".py") or self.setup:
            return
        names = _top_level_names(os.path.join(self.project_dir, self.model))
        if names is None or "build_model" in names:
            return
        raise ValueError(
            f"{self.model} defines no build_model(), so the short form has no model to build. If it is a training script, "
            f'run it as one: {{"script": "{self.model}", "args": [...]}} (command line: gradprobe diagnose --script '
            f'{self.model} -- ARGS); it runs to its first optimizer step, which is checked. Or name the callable that '
            f'returns the model: "model": "{self.model}:CALLABLE"')


PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")


def project_root_of(script: str) -> str:
    """The project a script belongs to, when no directory was given: the nearest directory above it that holds a
    project marker (pyproject.toml, setup.py, setup.cfg, .git), where `python scripts/run.py` is run from; else the
    script's own directory."""
    here = os.path.dirname(os.path.abspath(script))
    d = here
    while True:
        if any(os.path.exists(os.path.join(d, m)) for m in PROJECT_MARKERS):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return here
        d = parent


def _top_level_names(path: str) -> set[str] | None:
    """Names a file defines at module level (None when it cannot be told: unreadable, a syntax error, `import *`)."""
    import ast

    try:
        with open(path, "rb") as f:
            source = f.read(MAX_PEEK_BYTES + 1)  # the server's own look at the file is capped (the child reads it all)
        if len(source) > MAX_PEEK_BYTES:
            return None
        tree = ast.parse(source.decode("utf-8", "replace"))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    names: set[str] = set()
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(a.name == "*" for a in node.names):
                return None
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo.extend(node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
                        + [s for h in getattr(node, "handlers", []) for s in h.body])
    return names


DOCS_HINT = "see docs/targets.md"
_FIELD_HINTS = {
    "target": 'pass {"target": {"model": "/home/ana/proj/train.py"}} (the fields are in docs/targets.md)',
    "project_dir": ('write the absolute path of your project, e.g. "/home/ana/proj" '
                    "(or give `model` or `script` as an absolute file path)"),
    "model": f"write {REF_HELP}, or just the file, e.g. \"train.py\"",
    "inputs": f"write {REF_HELP.replace('build_model', 'make_batch')}",
    "loss": f"write {REF_HELP.replace('build_model', 'loss_fn')}",
    "optimizer": f"write {REF_HELP.replace('build_model', 'make_optimizer')}",
    "train_step": f"write {REF_HELP.replace('build_model', 'train_step')}",
    "setup": "write inline Python source that defines `model` (and `inputs`, ...)",
    "device": 'write "cpu", "cuda", "cuda:N", "auto" or "meta"',
    "seed": "write an integer, e.g. 0",
    "python": 'write the absolute path of an interpreter, e.g. "/home/ana/proj/.venv/bin/python", or "server"',
    "timeout_s": "write a number of seconds between 0 and 3600, e.g. 120",
    "script": 'write the training script\'s path relative to project_dir, e.g. "train.py"',
    "module": 'write a dotted module name run like python -m, e.g. "mypkg.train"',
    "args": 'write a list of strings, e.g. ["--max_iters=1", "--device=cpu"]',
    "read_paths": 'write a list of absolute paths, e.g. ["/data/cifar", "/home/ana/.cache/huggingface"]',
    "env": 'write an object of names to strings, e.g. {"WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}',
    "memory_gb": "write a number of GB, e.g. 16",
}


def _field_name(loc: tuple) -> str:
    return ".".join(str(part) for part in loc)


def _sentence(err: Any, prefix: str) -> str:
    loc = tuple(err.get("loc") or ())
    where = _field_name((prefix,) + loc) if prefix else _field_name(loc)
    field = str(loc[-1]) if loc else ""
    kind = err.get("type", "")
    hint = _FIELD_HINTS.get(field, "")
    if kind == "missing":
        if not loc:
            return f"{where} is missing."
        return f"`{where}` is missing: {hint or 'give a value'}."
    if kind == "extra_forbidden":
        known = ", ".join(Target.model_fields)
        return f"`{where}` is not a target field; the fields are {known} ({DOCS_HINT})."
    if kind == "model_type" or (not loc and kind.endswith("_type")):
        return (f"`{prefix or 'target'}` must be an object, e.g. "
                '{"model": "/home/ana/proj/train.py"} or {"project_dir": "/home/ana/proj", "model": "train.py"}.')
    msg = str(err.get("msg", "")).removeprefix("Value error, ")
    if kind == "value_error":
        named = re.match(r"`(\w+)`(.*)", msg, re.S)  # a whole-target check about one field: name it as the field
        if named and named.group(1) in Target.model_fields and not (loc and str(loc[-1]) in Target.model_fields):
            path = ((prefix,) if prefix else ()) + loc
            return f"`{_field_name((path or ('target',)) + (named.group(1),))}`{named.group(2)}."
        return f"`{where}`: {msg}." if loc else f"{prefix or 'target'}: {msg}."
    return f"`{where}` is not valid ({msg[:1].lower() + msg[1:]}): {hint or DOCS_HINT}."


def explain_validation_error(exc: ValidationError, prefix: str = "") -> str:
    """One or two sentences naming the field and what to write, instead of pydantic's dump."""
    errors = exc.errors(include_url=False)
    if not errors:
        return f"{prefix or 'target'} is not valid ({DOCS_HINT})."
    text = _sentence(errors[0], prefix)
    if len(errors) > 1:
        text += f" ({len(errors) - 1} more problem(s) in the same call; {DOCS_HINT}.)"
    return text
