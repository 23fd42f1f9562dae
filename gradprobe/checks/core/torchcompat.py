"""Every dependency on PyTorch internals and on the wording of PyTorch's messages, in one place.

Private APIs (torch._C...), internal file names, and the regexes that classify torch's
error and warning texts live here. tests/test_torchcompat.py triggers each real torch
error and asserts its pattern still matches, so a PyTorch upgrade that rewords a
message fails loudly instead of silently changing findings.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import torch
from torch.autograd.gradcheck import GradcheckError as GradcheckError  # re-exported

# the function torch.set_grad_enabled / no_grad / enable_grad call: a TorchFunctionMode sees it go by
GRAD_ENABLE = torch._C._set_grad_enabled


@contextmanager
def untraced() -> Iterator[None]:
    """Our own tensor ops inside a step: invisible to the trace mode running beside us."""
    with torch._C.DisableTorchFunction():
        yield


@contextmanager
def checkpoints_run_plainly() -> Iterator[None]:
    """torch.utils.checkpoint.checkpoint() as a plain call of its function while the block runs (both forms: the
    non-reentrant generator and the reentrant CheckpointFunction, which checkpoint() looks up as module globals at
    each call). Checkpointing changes memory, never the math: a probe that changes what a forward runs (dropout off)
    would otherwise meet a recomputation, in its backward, that runs the unchanged forward (CheckpointError:
    different metadata)."""
    import torch.utils.checkpoint as ckpt

    def generator(*args: Any, **kwargs: Any) -> Iterator[None]:
        yield

    class PlainCall:
        @staticmethod
        def apply(function: Any, preserve: Any, *args: Any) -> Any:
            return function(*args)

    saved = {name: ckpt.__dict__[name] for name in ("_checkpoint_without_reentrant_generator", "CheckpointFunction")
             if name in ckpt.__dict__}
    if len(saved) < 2:  # another torch: checkpoints run as they are
        yield
        return
    ckpt._checkpoint_without_reentrant_generator = generator  # type: ignore[assignment]
    ckpt.CheckpointFunction = PlainCall  # type: ignore[assignment, misc]
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(ckpt, name, value)


def is_grad_mode_decorator_frame(code: Any) -> bool:
    """A frame/code of the wrapper that torch's no_grad/inference_mode decorators put around a function."""
    return code is not None and code.co_name == "decorate_context" and code.co_filename.endswith("_contextlib.py")


def decorated_function(frame: FrameType) -> Any:
    """The user's function inside a grad-mode decorator's wrapper frame."""
    return frame.f_locals.get("func")


def tensor_hooks(t: torch.Tensor) -> dict[Any, Any]:
    """The hooks registered with t.register_hook (torch keeps them in the private `_backward_hooks`)."""
    return getattr(t, "_backward_hooks", None) or {}


def settle_device_constructors() -> None:
    """Fill `with torch.device(...)`'s cache of the factories it redirects (torch.utils._device, an lru_cache filled
    on first use) while torch's own factories are in place: filled while gradprobe's factory watch (initwrites.py)
    is patched in, it would hold the watch's wrappers for good, and every later `with torch.device("meta")` would
    build its tensors on the CPU."""
    from torch.utils import _device

    _device._device_constructors()


def requires_grad_descriptor() -> Any:
    """The `requires_grad` attribute descriptor of tensors (on the C base class), to wrap on nn.Parameter."""
    return torch._C.TensorBase.requires_grad


def data_descriptor() -> Any:
    """The `data` attribute descriptor of tensors (on the C base class), to wrap on nn.Parameter."""
    return torch._C.TensorBase.data


def tensor_version(t: torch.Tensor) -> int:
    """The version counter that in-place ops bump (autograd compares it with the saved one)."""
    return int(t._version)


def custom_function_entry() -> tuple[type, str, Any]:
    """(class, attribute, C apply) where every custom Function call arrives, aliases included.

    `Function.apply` ends in `super().apply(...)`, resolved at call time on the MRO
    below `Function`: `_SingleLevelFunction` (which defines no apply of its own), then
    `torch._C._FunctionBase.apply`. A watch placed on `_SingleLevelFunction` therefore
    sees `square = Square.apply` bound at import as well as `Square.apply(...)`.
    """
    from torch.autograd.function import _SingleLevelFunction

    return _SingleLevelFunction, "apply", torch._C._FunctionBase.__dict__["apply"]


def function_class_of_node(node: Any) -> type[torch.autograd.Function] | None:
    """The autograd.Function class behind a grad_fn node (a BackwardCFunction carries `_forward_cls`)."""
    cls = getattr(node, "_forward_cls", None)
    return cls if isinstance(cls, type) and issubclass(cls, torch.autograd.Function) else None


def multiprocessing_tensor_reducers() -> dict[Any, Any]:
    """multiprocessing's reducer table, where torch.multiprocessing registers its tensor reducers."""
    from multiprocessing.reduction import ForkingPickler

    reducers: dict[Any, Any] = ForkingPickler._extra_reducers  # type: ignore[attr-defined]
    return reducers


# ---- backward() errors ---------------------------------------------------------------------

# the loss is not connected to any parameter: "element 0 of tensors does not require grad and does not have a grad_fn"
LOSS_NOT_DIFFERENTIABLE = re.compile(r"does not require grad|does not have a grad_fn")
# the narrower test the tracer uses to tell a broken backward from an unconnected loss
LOSS_DOES_NOT_REQUIRE_GRAD = "does not require grad"

BACKWARD_EXPLAIN: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"modified by an inplace operation"),
     "a tensor saved for backward was modified in place after it was used (an in-place op such as +=, relu_(), x[...] = ...)"),
    (re.compile(r"Trying to backward through the graph a second time"),
     "backward ran a second time through a graph whose saved tensors were freed by the first backward"),
    (re.compile(r"a leaf Variable that requires grad is being used in an in-place operation"),
     "a leaf tensor that requires grad (a parameter) was modified in place"),
    (re.compile(r"[Ii]nference tensors cannot be saved for backward"),
     "a tensor created under inference_mode was saved for backward"),
    (re.compile(r"returned an incorrect number of gradients"),
     "a custom autograd.Function's backward returned a different number of gradients than forward took inputs"),
    (re.compile(r"returned an invalid gradient"),
     "a custom autograd.Function's backward returned a gradient of the wrong shape or type"),
]


# "... modified by an inplace operation: [torch.FloatTensor [2, 8, 32]], which is output 0 of AddBackward0,
#  is at version 2; expected version 1 instead. Hint: ..."
INPLACE_DETAIL = re.compile(r"\[torch\.\w+ \[([\d, ]*)\]\], which is output \d+ of (\w+), is at version (\d+); "
                            r"expected version (\d+)")
# backward() on a non-scalar tensor without a gradient argument
LOSS_NOT_SCALAR = re.compile(r"grad can be implicitly created only for scalar outputs")


def inplace_detail(text: str) -> tuple[list[int], int] | None:
    """(shape, version now) of the saved tensor an in-place op modified, from torch's backward error."""
    m = INPLACE_DETAIL.search(text)
    if m is None:
        return None
    shape = [int(x) for x in m.group(1).split(",") if x.strip()]
    return shape, int(m.group(3))


def explain_backward_error(text: str) -> str:
    return next((e for pat, e in BACKWARD_EXPLAIN if pat.search(text)), "see the error")


# ---- custom Function backward structure (autograd's own validation) -------------------------

# GradcheckError (imported above) is what torch.autograd.gradcheck raises on a mismatch; its text is kept as evidence

WRONG_GRADIENT_COUNT = re.compile(r"returned an incorrect number of gradients \(expected (\d+), got (\d+)\)")
WRONG_GRADIENT_SHAPE = re.compile(
    r"returned an invalid gradient at index (\d+) - got (\[[^\]]*\]) but expected shape compatible with (\[[^\]]*\])")
INVALID_GRADIENT = re.compile(r"returned an invalid gradient at index (\d+) - (.*)")

# ---- warnings ------------------------------------------------------------------------------

NONLEAF_GRAD_WARNING = "not a leaf Tensor is being accessed"
CHECKPOINT_NO_INPUT_GRAD_WARNING = "None of the inputs have requires_grad=True"
ANOMALY_FORWARD_TRACE_MARKERS = ("Traceback of forward call", "forward call that caused")
ANOMALY_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def is_anomaly_forward_trace(text: str) -> bool:
    return any(m in text for m in ANOMALY_FORWARD_TRACE_MARKERS)


# ---- optimizer construction errors ---------------------------------------------------------

OPTIMIZER_EMPTY = "empty parameter list"
OPTIMIZER_PARAM_IN_SEVERAL_GROUPS = "more than one parameter group"
OPTIMIZER_NON_LEAF = "non-leaf"

# ---- module construction -------------------------------------------------------------------

MISSING_SUPER_INIT = re.compile(r"before Module.__init__\(\) call|has no attribute '_(parameters|modules|buffers)'")

# ---- resource limits -----------------------------------------------------------------------

# an allocation the memory limit refused. CPU: "[enforce fail at alloc_cpu.cpp:N] ... DefaultCPUAllocator: can't
# allocate memory: you tried to allocate N bytes. Error code 12 (Cannot allocate memory)" (the sandbox's RLIMIT_AS,
# or the machine); CUDA: torch.OutOfMemoryError "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has ..." (and
# the driver's own "CUDA error: out of memory", cuBLAS's workspace); MPS: "MPS backend out of memory"
ALLOCATION_FAILURE = re.compile(r"DefaultCPUAllocator: can't allocate memory|CUDA out of memory|CUDA error: out of memory"
                                r"|CUBLAS_STATUS_ALLOC_FAILED|MPS backend out of memory")
ALLOCATION_REQUEST_BYTES = re.compile(r"you tried to allocate (\d+) bytes")
ALLOCATION_REQUEST_TEXT = re.compile(r"[Tt]ried to allocate ([\d.]+ ?[KMGTP]?i?B)\b")
OUT_OF_MEMORY_ERROR: type[BaseException] | None = getattr(torch, "OutOfMemoryError", None)  # torch >= 2.1; CUDA's


def allocation_failure(exc: BaseException | None) -> dict[str, Any] | None:
    """What an exception says about an allocation that a memory limit refused, or None when it is not one.

    By type (MemoryError, torch.OutOfMemoryError) or by torch's allocator message; an exception raised
    `from` one (a library re-raising it) counts too. The dict holds what was measured: `device` ("cpu",
    "cuda", "mps", or "python" for a MemoryError), `exception`, `error` (the message's first line) and,
    when the message has it, `requested_bytes` or `requested` (the allocator's own wording)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = str(exc)
        by_type = isinstance(exc, MemoryError) or (OUT_OF_MEMORY_ERROR is not None and isinstance(exc, OUT_OF_MEMORY_ERROR))
        if by_type or ALLOCATION_FAILURE.search(text):
            out: dict[str, Any] = {"exception": type(exc).__name__, "error": (text.splitlines() or [""])[0][:500]}
            if "DefaultCPUAllocator" in text:
                out["device"] = "cpu"
            elif "CUDA" in text or "CUBLAS" in text or (OUT_OF_MEMORY_ERROR is not None and isinstance(exc, OUT_OF_MEMORY_ERROR)):
                out["device"] = "cuda"
            elif "MPS" in text:
                out["device"] = "mps"
            else:
                out["device"] = "python"
            m = ALLOCATION_REQUEST_BYTES.search(text)
            if m:
                out["requested_bytes"] = int(m.group(1))
            else:
                m2 = ALLOCATION_REQUEST_TEXT.search(text)
                if m2:
                    out["requested"] = m2.group(1)
            return out
        exc = exc.__cause__
    return None
