"""Where a measured leak comes from, measured again (only once a leak was found, so the all-clear stays cheap).

- the first block whose output has it: the outputs of the model's repeated modules (the entries of a ModuleList or
  Sequential of one class) kept in one recorded forward, one backward each, in the order they ran;
- the attention call in that block (scaled_dot_product_attention with its is_causal and mask, or a softmax after a
  masked_fill), and the user's line that built the mask it used: the recorded ops followed back from the mask to
  the ops run in the user's own code (a triu/tril first), or to the buffer it was read from and the line that
  registered it;
- a flag that switches it: each boolean of the model's configuration objects and of the modules of that block,
  flipped one at a time, the probe run again: the flag whose flip removes the leak;
- a change of the call that removes it (packed rows): without an all-ones 0/1 mask, with use_cache=False, with
  position ids that restart at each packed example.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from gradprobe.checks.dependencies.claims import layout
from gradprobe.checks.dependencies.harness import Call, Op, Probe, probed, untouched
from gradprobe.checks.dependencies.jacobian import Leak, Sample, dependency_maps, judge, starts_example
from gradprobe.checks.dependencies.rules import Explained
from gradprobe.checks.dependencies.segments import Segments
from gradprobe.wrappers import unwrap_library

MAX_FLAGS = 40
FLAG_SECONDS = 30.0  # the flag search stops after this long (each flip is one more forward and backward)
_MASK_MAKERS = ("triu", "tril")


@dataclass
class Context:
    """What every re-measurement needs."""

    model: nn.Module
    batch: Any
    loss_fn: Any
    user: Any
    record: Any
    seg: Segments | None
    tokens: torch.Tensor | None = None  # the ids the next-element claim is about


def blocks_of(model: nn.Module) -> set[str]:
    """The paths of the model's repeated modules: entries of a ModuleList/Sequential holding two or more of one class,
    the outermost ones only (a block's own Sequential MLP is inside the block)."""
    found: set[str] = set()
    for name, m in model.named_modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)):
            kids = list(m.named_children())
            classes = [type(c) for _, c in kids]
            if len(kids) >= 2 and max(classes.count(c) for c in classes) >= 2:
                found.update(f"{name}.{k}" if name else k for k, c in kids if classes.count(type(c)) >= 2)
    return {p for p in found if not any(p.startswith(q + ".") for q in found)}


def leaks_of(ctx: Context, sample: Sample, batch: Any = None) -> list[Leak] | None:
    """The sample's leaks, measured again (on another batch, or with a flag flipped); None: the probe could not run."""
    try:
        with untouched(ctx.model):
            probe = probed(ctx.model, ctx.batch if batch is None else batch, ctx.loss_fn, ctx.user)
            lay = layout(probe)
            if lay is None:
                return None
            deps = dependency_maps(lay, [sample], lay.token_leaves)
            leaf = _claim_leaf(lay, ctx.tokens)
    except Exception:
        return None
    return judge(lay, [sample], deps, ctx.seg, None, leaf)


def _claim_leaf(lay: Any, tokens: torch.Tensor | None) -> int | None:
    """The token leaf whose ids are the claim's (the probe is run again: its leaves are new, its ids the same)."""
    if tokens is None:
        return None
    return next((i for i, lf in enumerate(lay.token_leaves) if lf.ids is not None and lf.ids.shape == tokens.shape
                 and torch.equal(lf.ids, tokens)), None)


def leaks_at(ctx: Context, sample: Sample, kind: str, batch: Any = None) -> bool | None:
    """Whether the sample still has a leak of this kind (None: the probe could not run)."""
    found = leaks_of(ctx, sample, batch)
    return None if found is None else any(lk.kind == kind for lk in found)


def _first_block(probe: Probe, leak: Leak, tokens: torch.Tensor | None) -> str | None:
    lay = layout(probe)
    if lay is None:
        return None
    only = _claim_leaf(lay, tokens) if leak.kind == "future" else None
    leaves = [lf.tensor for i, lf in enumerate(lay.token_leaves) if only is None or i == only]
    gen = torch.Generator().manual_seed(1)
    for name, h in probe.blocks.items():
        if h.dim() < 2 or tuple(h.shape[:2]) != (lay.B, lay.T) or not h.requires_grad:
            continue
        row = h[leak.b, leak.t]
        r = torch.randn(row.shape, generator=gen).to(row.dtype)
        grads = torch.autograd.grad(row, leaves, r, retain_graph=True, allow_unused=True)
        for g in grads:
            if g is not None and any(float(g[b, s].abs().sum()) > 0 for b, s in leak.seen[:64]):
                return name
    return None


def _batch_size(probe: Probe) -> int:
    lay = layout(probe)
    return lay.B if lay is not None else 0


def _attention_in(ops: list[Op], block: str | None) -> Op | None:
    inside = [op for op in ops if block is None or op.module == block or op.module.startswith(block + ".")]
    sdpa = [op for op in inside if op.name == "scaled_dot_product_attention"]
    if sdpa:
        return sdpa[0]
    soft = [i for i, op in enumerate(inside) if op.name == "softmax"]
    if not soft:
        return None
    fills = [op for op in inside[: soft[0]] if op.name.startswith("masked_fill")]
    return fills[-1] if fills else inside[soft[0]]


def _describe(op: Op) -> str:
    if op.name == "scaled_dot_product_attention":
        mask = "None" if op.mask is None else f"a {tuple(op.mask.shape)} {str(op.mask.dtype).replace('torch.', '')} mask"
        text = f"scaled_dot_product_attention(is_causal={op.is_causal}, attn_mask={mask})"
    else:
        text = op.name
    where = (f"at {os.path.basename(op.location['file'])}:{op.location['line']}" if op.location and op.library_line is None
             else f"in {op.library_line}" if op.library_line else "")
    return f"{text} {where}".strip()


def _buffer_site(model: nn.Module, ids: set[int], record: Any) -> dict | None:
    for path, buf in model.named_buffers():
        if id(buf) in ids:
            owner, _, attr = path.rpartition(".")
            try:
                return record.site_of(model.get_submodule(owner) if owner else model, attr) if record else None
            except AttributeError:
                return None
    return None


def mask_origin(ops: list[Op], mask: Any, model: nn.Module, record: Any) -> tuple[dict | None, str | None]:
    """(the user's line that built the mask, how): the ops that made it, followed back to the ones the user's code ran
    itself (triu/tril first), or the buffer it was read from and the line that registered it."""
    if not isinstance(mask, torch.Tensor):
        return None, None
    made = {op.output: op for op in ops if op.output is not None}
    todo: list[int] = [id(mask)]
    seen: set[int] = set()
    user_ops: list[Op] = []
    while todo and len(seen) < 2000:
        tid = todo.pop(0)
        if tid in seen:
            continue
        seen.add(tid)
        op = made.get(tid)
        if op is None:
            continue
        if op.location is not None and op.library_line is None:
            user_ops.append(op)
        todo.extend(op.inputs)
    makers = [op for op in user_ops if op.name in _MASK_MAKERS]
    if makers:
        return makers[0].location, f"torch.{makers[0].name}"
    site = _buffer_site(model, seen, record)
    if site is not None:
        return site, "a buffer registered there"
    return (user_ops[0].location, user_ops[0].name) if user_ops else (None, None)


def batch_axis_reinterpreted(ops: list[Op], B: int) -> tuple[dict | None, str | None]:
    """The first view/reshape run in the user's own code that reinterprets the batch axis: its input leads with the
    batch, its output neither keeps it nor merges it with the axes after it (x.view(T, B, D) on a (B, T, D) tensor,
    where a transpose was meant)."""
    import math

    for op in ops:
        if op.shapes is None or op.location is None or op.library_line is not None:
            continue
        src, dst = op.shapes
        if not src or not dst or src[0] != B or B < 2 or dst[0] == B:
            continue
        merges = {math.prod(src[: j + 1]) for j in range(len(src))}
        if dst[0] not in merges:
            return op.location, f"{op.name} {src} -> {dst}"
    return None, None


def _holders(model: nn.Module, block: str | None) -> Iterator[tuple[Any, str, str, dict | None]]:
    """(object, attribute, shown name, where its holder was built) for every boolean that could switch a mask."""
    configs: dict[int, tuple[Any, str, dict | None]] = {}
    for path, m in model.named_modules():
        inside = block is None or path == block or path.startswith(block + ".") or m is model
        for k, v in vars(m).items():
            if k.startswith("_") or isinstance(v, (nn.Module, torch.Tensor)):
                continue
            if isinstance(v, bool) and k != "training" and inside:
                yield m, k, f"{path or type(m).__name__}.{k}", None
            elif (hasattr(v, "__dict__") and not callable(v) and not isinstance(v, type)
                  and any(isinstance(x, bool) for x in vars(v).values()) and id(v) not in configs):
                configs[id(v)] = (v, k, None)
    for cfg, attr, site in configs.values():
        for k, v in list(vars(cfg).items()):
            if isinstance(v, bool) and not k.startswith("_"):
                yield cfg, k, f"{attr}.{k}", site


def _holder_site(model: nn.Module, obj: Any, record: Any) -> dict | None:
    for _, m in model.named_modules():
        for k, v in vars(m).items():
            if v is obj and record is not None:
                site = record.site_of(m, k)
                if site is not None:
                    return site
    return None


@contextlib.contextmanager
def _flipped(obj: Any, attr: str) -> Iterator[None]:
    old = getattr(obj, attr)
    object.__setattr__(obj, attr, not old) if isinstance(obj, nn.Module) else setattr(obj, attr, not old)
    try:
        yield
    finally:
        object.__setattr__(obj, attr, old) if isinstance(obj, nn.Module) else setattr(obj, attr, old)


def flag_cause(ctx: Context, sample: Sample, kind: str, block: str | None) -> tuple[str, str, str, dict | None] | None:
    """The boolean whose flip removes the leak: (its name, its value, the value that removes it, where its holder was
    built)."""
    deadline = time.monotonic() + FLAG_SECONDS
    for n, (obj, attr, shown, _) in enumerate(_holders(ctx.model, block)):
        if n >= MAX_FLAGS or time.monotonic() > deadline:
            break
        old = getattr(obj, attr)
        try:
            with _flipped(obj, attr):
                gone = leaks_at(ctx, sample, kind) is False
        except Exception:
            gone = False
        if gone:
            return shown, str(old), str(not old), (_holder_site(ctx.model, obj, ctx.record)
                                                     if not isinstance(obj, nn.Module) else _module_site(ctx, obj))
    return None


def _module_site(ctx: Context, module: nn.Module) -> dict | None:
    for _, m in ctx.model.named_modules():
        for k, v in m._modules.items():
            if v is module and ctx.record is not None:
                return ctx.record.site_of(m, k)
    return None


def _kwargs(batch: Any) -> dict | None:
    if isinstance(batch, dict):
        return batch
    if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[1], dict) and isinstance(batch[0], (tuple, list)):
        return batch[1]
    return None


def _with(batch: Any, **changes: Any) -> Any:
    kw = dict(_kwargs(batch) or {})
    for k, v in changes.items():
        if v is None:
            kw.pop(k, None)
        else:
            kw[k] = v
    return kw if isinstance(batch, dict) else (batch[0], kw)


def accepts(model: nn.Module, name: str) -> bool:
    try:
        params = inspect.signature(unwrap_library(model)[0].forward).parameters
    except (TypeError, ValueError):
        return False
    return name in params


@dataclass
class Change:
    """A change of one call that may remove a packed leak: of the model's own call (a new batch) or of a module call
    made inside the forward (its keyword arguments changed by a pre-hook)."""

    cause: str
    fix: str
    line: dict | None = None  # the user's line that made the call
    batch: Any = None
    module: nn.Module | None = None
    set_kwargs: dict[str, Any] | None = None  # None value: drop the argument


def _ones(t: Any, B: int, T: int) -> bool:
    return (isinstance(t, torch.Tensor) and t.dim() == 2 and tuple(t.shape) == (B, T) and not t.is_floating_point()
            and bool((t == 1).all()))


def _changes_of(kw: dict[str, Any], target: nn.Module, seg: Segments, what: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(cause, fix, keyword changes) for one call's keyword arguments."""
    B, T = seg.ids.shape
    out: list[tuple[str, str, dict[str, Any]]] = []
    for key, v in kw.items():
        if _ones(v, B, T):
            out.append((f"{what} passes an all-ones `{key}`; without it the packed examples stay apart (measured: the "
                        "all-ones mask hides the restarts)", f"drop `{key}`", {key: None}))
    if accepts(target, "use_cache") and kw.get("use_cache") is not False:
        out.append((f"{what} runs with the KV cache on (use_cache not False); with use_cache=False the packed examples "
                    "stay apart (measured: the cache built by default turns the per-example mask off)",
                    "use_cache=False", {"use_cache": False}))
    if accepts(target, "position_ids") and seg.how != "position ids that restart" and "position_ids" not in kw:
        starts = torch.zeros_like(seg.ids)
        for b, spans in enumerate(seg.spans):
            for s, e in spans:
                starts[b, s:e] = torch.arange(e - s)
        device = next((v.device for v in kw.values() if isinstance(v, torch.Tensor)), torch.device("cpu"))
        out.append((f"{what} gives no position ids; with position ids that restart at each packed example they stay "
                    f"apart (measured: this attention ignores {seg.describe()})", "position_ids restarting",
                    {"position_ids": starts.to(device)}))
    return out


def call_changes(ctx: Context, calls: list[Call], call_line: dict | None) -> list[Change]:
    """Changes worth measuring for a packed leak, in the order they are tried: the model's own call, then the module
    calls inside the forward (outermost first) that carry the packed rows."""
    if ctx.seg is None:
        return []
    out: list[Change] = []
    kw = _kwargs(ctx.batch)
    if kw is not None:
        for cause, fix, changes in _changes_of(kw, ctx.model, ctx.seg, "the model's call"):
            out.append(Change(cause, fix, call_line, batch=_with(ctx.batch, **changes)))
    B, T = ctx.seg.ids.shape
    seen: set[int] = set()
    for c in sorted(calls, key=lambda c: c.path.count(".")):
        if not c.path or id(c.module) in seen or not any(isinstance(v, torch.Tensor) and v.dim() == 2
                                                          and tuple(v.shape) == (B, T) for v in c.kwargs.values()):
            continue
        seen.add(id(c.module))
        what = f"the call of `{c.path}` ({type(c.module).__name__})" + (f" at {_at(c.location)}" if c.location else "")
        for cause, fix, changes in _changes_of(c.kwargs, c.module, ctx.seg, what):
            out.append(Change(cause, fix, c.location, module=c.module, set_kwargs=changes))
    return out[:12]


def _at(loc: dict | None) -> str:
    return f"{os.path.basename(loc['file'])}:{loc['line']}" if loc else "?"


@contextlib.contextmanager
def _applied(change: Change) -> Iterator[None]:
    if change.module is None or change.set_kwargs is None:
        yield
        return
    changes = change.set_kwargs

    def hook(m: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        new = {k: v for k, v in kwargs.items() if not (k in changes and changes[k] is None)}
        new.update({k: v for k, v in changes.items() if v is not None})
        return args, new

    handle = change.module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def packed_cause(ctx: Context, sample: Sample, calls: list[Call], call_line: dict | None) -> Change | None:
    """The first change of a call that keeps the packed examples apart."""
    for change in call_changes(ctx, calls, call_line):
        with _applied(change):
            if leaks_at(ctx, sample, "packed", change.batch) is False:
                return change
    return None


def explain(ctx: Context, leak: Leak, sample: Sample, call_line: dict | None) -> Explained:
    """Measure where `leak` comes from (see the module's docstring). A failure here leaves the part unexplained."""
    e = Explained(call_line=call_line)
    calls: list[Call] = []
    try:
        with untouched(ctx.model):
            probe = probed(ctx.model, ctx.batch, ctx.loss_fn, ctx.user, record=True, blocks=blocks_of(ctx.model))
            e.layer = _first_block(probe, leak, ctx.tokens)
        calls = probe.calls
        op = _attention_in(probe.ops, e.layer)
        if e.layer is not None:
            _origin(ctx, leak, e, op)
        if op is not None and not e.origin_alone:
            e.attention = _describe(op)
            e.attention_line = op.location
            e.mask_line, e.mask_how = mask_origin(probe.ops, op.mask, ctx.model, ctx.record)
        if leak.kind == "example":
            B = ctx.seg.ids.shape[0] if ctx.seg is not None else _batch_size(probe)
            e.mask_line, e.mask_how = batch_axis_reinterpreted(probe.ops, B)
        del probe
    except Exception:
        pass
    if leak.kind == "packed":
        change = packed_cause(ctx, sample, calls, call_line)
        if change is not None:
            e.batch_cause, e.batch_fix, e.change_line = change.cause, change.fix, change.line
            return e
    flag = flag_cause(ctx, sample, leak.kind, e.layer)
    if flag is not None:
        e.config_key, e.config_value, e.config_fix, e.config_site = flag
    return e


def _origin(ctx: Context, leak: Leak, e: Explained, op: Op | None) -> None:
    """Inside the first block: the module that computes the leak (origin.py); when it makes no attention call, the
    attention is not blamed and the module is named instead."""
    from gradprobe.checks.dependencies.origin import leak_origin

    found = leak_origin(ctx.model, ctx.batch, ctx.loss_fn, ctx.user, str(e.layer), leak,
                        lambda lay: _claim_leaf(lay, ctx.tokens))
    if found is None:
        return
    e.origin, line = found
    e.origin_alone = op is None or not (op.module == e.origin or op.module.startswith(e.origin + "."))
    if e.origin_alone:  # the line in its forward that computes it, else where the module was built
        e.origin_site = line or _module_site(ctx, ctx.model.get_submodule(e.origin))


def outside_training(ctx: Context, samples: list[Sample]) -> Leak | None:
    """A packed example's first token that sees another packed example only when the model is called with
    use_cache=True (its generation default): one forward, the first tokens in one backward pass."""
    kw = _kwargs(ctx.batch)
    starts = [s for s in samples if starts_example(s, ctx.seg)]
    if kw is None or not starts or not accepts(ctx.model, "use_cache") or kw.get("use_cache") is True:
        return None
    try:
        with untouched(ctx.model):
            probe = probed(ctx.model, _with(ctx.batch, use_cache=True), ctx.loss_fn, ctx.user)
            lay = layout(probe)
            if lay is None:
                return None
            group = [list(range(len(starts)))]
            found = judge(lay, starts, dependency_maps(lay, starts, lay.token_leaves, group), ctx.seg, group)
    except Exception:
        return None
    return next((lk for lk in found if lk.kind == "packed"), None)

