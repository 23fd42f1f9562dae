"""The one protocol between the parent (server or CLI) and the child (inside the boundary).

Every message is a typed model, serialised once on the sending side (`model_dump_json`) and read
once on the receiving side (`model_validate_json`); neither side parses the other's prose. The models
are standard-library dataclasses (gradprobe/sandbox/wire.py), not pydantic: the child runs in the
target's interpreter, which needs only the standard library and torch.

    parent -> child   Job (stdin, or the warm worker's frame), Policy (launch.py's argv, or the frame)
    child  -> parent  Control (the control socket, from the confining code, before any user code runs),
                      Progress and Result (JSON lines on the result pipe; never stdout, which is the user's)

Phases are one enum both sides import. An isolation layer is a `Layer` (whether it is enforced, and
its text); the report shows it as before, the text with "MISSING: " in front when it is not enforced.
The child's result pipe is reachable by the user's code, so the parent reads it as untrusted: a line
that is not a valid message is dropped.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from gradprobe.phases import PROGRESS_STEPS, Phase
from gradprobe.sandbox.wire import Field, WireModel, model

__all__ = ["PROGRESS_STEPS", "Phase"]  # re-exported: the protocol's phases


# ---- parent -> child --------------------------------------------------------------------------------------------

@model
class Job(WireModel):
    """One tool call: which tool, on which target (Target.model_dump()), with which options."""

    tool: str
    target: dict[str, Any] = Field(default_factory=dict)
    options: dict[str, Any] = Field(default_factory=dict)


@model
class Layer(WireModel):
    """One isolation layer as applied (by the child) or seen (by the parent, from outside)."""

    enforced: bool | None  # None: not asked for (isolation off)
    text: str

    @property
    def missing(self) -> bool:
        return self.enforced is False

    def shown(self) -> str:
        """As the report shows it."""
        return f"MISSING: {self.text}" if self.missing else self.text

    @classmethod
    def of(cls, enforced: bool, text: str) -> Layer:
        return cls(enforced=enforced, text=text)


@model
class ChildLimits(WireModel):
    """The rlimits the confining code sets (None: leave it)."""

    memory_bytes: int | None = None
    cpu_seconds: int | None = None
    file_bytes: int | None = None
    open_files: int | None = None


@model
class CgroupSpec(WireModel):
    """What the warm worker needs to make a call's cgroup itself."""

    memory_bytes: int | None = None
    pids: int = 512
    server: str
    parents: dict[str, str] = Field(default_factory=dict)  # where the server's subtree is, per hierarchy (cgroup_tree)


@model
class OpenTree(WireModel):
    """A directory (or a single file) the server opened (O_PATH) and passes to the launcher at the same fd number."""

    path: str  # its real path, read from the open fd when it was opened
    fd: int


@model
class PythonExec(WireModel):
    """The interpreter the target runs, resolved once by the server (sandbox/interpreter.py): the launcher executes
    exactly the open file `fd` (/proc/self/fd/N) as `argv0`, and binds only `trees` (its installation prefixes)."""

    fd: int | None = None
    argv0: str = ""
    trees: list[OpenTree] = Field(default_factory=list)


@model
class Policy(WireModel):
    """How the confining code (confine.py) builds the call's boundary."""

    enabled: bool = True  # namespaces, Landlock, capabilities, cgroups where the machine allows
    require: bool = False  # refuse to run user code when a layer is missing
    cgroups: list[str] = Field(default_factory=list)  # cgroup.procs files to join (a cold call's group)
    cgroup_state: Layer = Field(default_factory=lambda: Layer(enforced=None, text="off"))  # that group, as reported
    cgroup_spec: CgroupSpec | None = None
    project_dir: str | None = None
    project_dir_real: str | None = None  # set by the confining code: the directory it opened and checked
    allowed_roots: list[str] = Field(default_factory=list)
    package_root: str = ""
    scratch: str = ""
    python: str | None = None  # the interpreter's real path (None: the server's own)
    python_exec: PythonExec | None = None  # that interpreter as opened by the server (None: the server's own)
    extra_ro: list[str] = Field(default_factory=list)
    read_paths: list[str] = Field(default_factory=list)  # the target's read_paths, opened and checked like the project
    idmap_data: bool = False  # the project and read_paths read as the server's user (a server without roots) or not
    scratch_bytes: int = 1024**3
    shm_bytes: int = 512 * 1024**2
    devices: list[str] = Field(default_factory=list)
    limits: ChildLimits = Field(default_factory=ChildLimits)


# ---- child -> parent: the control socket (the confining code, before user code) ---------------------------------

def shown(layers: dict[str, Layer]) -> dict[str, str]:
    return {name: layer.shown() for name, layer in layers.items()}


@model
class Control(WireModel):
    """A message of the confining code: its pid, the layers it applied (then it waits for "g"), or why it refused."""

    pid: int | None = None
    layers: dict[str, Layer] | None = None
    refused: str | None = None


# ---- child -> parent: the result pipe -----------------------------------------------------------------------------

@model
class Progress(WireModel):
    type: Literal["progress"] = "progress"
    phase: Phase
    elapsed_s: float = 0.0


@model
class ToolError(WireModel):
    """The call cannot run as asked: the caller's arguments, or the interpreter the target named."""

    tool_error: str
    tool_error_kind: Literal["caller", "interpreter"] = "caller"


@model
class Result(WireModel):
    """The call's answer: a report (the envelope of report.make_report, JSON-safe) or a tool error."""

    type: Literal["result"] = "result"
    report: ToolError | dict[str, Any]  # left to right: a ToolError when it has one's fields, else the report


@model
class StartFailed(WireModel):
    """launch.py's word: the interpreter the target names could not be executed (written before any user code)."""

    type: Literal["start_failed"] = "start_failed"
    python: str
    error: str


ChildMessage = Progress | Result | StartFailed


class _ChildMessages:
    """Reads one line of the result pipe as the message its "type" names; anything else raises ValueError."""

    kinds: dict[str, type[Progress] | type[Result] | type[StartFailed]] = {
        "progress": Progress, "result": Result, "start_failed": StartFailed}

    def validate_json(self, data: str | bytes) -> ChildMessage:
        obj = json.loads(data)
        if not isinstance(obj, dict) or obj.get("type") not in self.kinds:
            raise ValueError("not a child message")
        return self.kinds[obj["type"]].model_validate(obj)


CHILD_MESSAGE = _ChildMessages()


def json_safe(obj: Any, depth: int = 0) -> Any:
    """Plain JSON values only: non-finite floats become None, unknown objects their repr."""
    if depth > 40:
        return repr(obj)[:200]
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [json_safe(v, depth + 1) for v in obj]
    try:
        import torch

        if isinstance(obj, torch.Tensor) and obj.numel() == 1:
            return json_safe(obj.item(), depth + 1)
    except Exception:
        pass
    return repr(obj)[:500]
