"""Batches as the data loader yields them: copied off the run that consumed them, and several joined into one.

The reference setup of a comparison is fed the examples the setup under test consumed in one optimizer step, as one
batch: the N ranks' batches (rank order), or the k micro-batches (in order), joined along the batch dimension,
recursively over dicts, tuples, lists and dataclass-like containers. Per-example lists (strings, ids) are joined; a
structure of tensors is joined field by field. When the parts cannot be joined into the one batch the reference
would have seen (sequences of different lengths, fields that differ per part and are not per example), joining
refuses with `Unjoinable` and says why; the one padding done is that of a token batch with an `attention_mask`
(right-padded: the mask 0, `labels` -100, other fields 0), which the mask keeps out of the result.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

MAX_DEPTH = 8
PAD_LABEL = -100  # the ignore index of torch's cross-entropy and of the Hugging Face models' `labels`


class Unjoinable(ValueError):
    """The parts cannot be joined into one batch (the reason is the message)."""


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


# joining with keep_equal: a tensor equal in every part is not per-example (a mask, a table, a scalar passed with the
# batch); the reference keeps its own value there (`merge`)
KEEP: Any = _Keep()


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor], depth: int = 0) -> Any:
    """`obj` with every tensor replaced by fn(tensor), containers rebuilt as the same type where they can be."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if depth > MAX_DEPTH:
        return obj
    if isinstance(obj, Mapping):
        out = copy.copy(obj)
        try:
            for k in list(obj.keys()):
                out[k] = map_tensors(obj[k], fn, depth + 1)  # type: ignore[index]
            return out
        except TypeError:  # an immutable mapping
            return {k: map_tensors(v, fn, depth + 1) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(map_tensors(v, fn, depth + 1) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(v, fn, depth + 1) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: map_tensors(getattr(obj, f.name), fn, depth + 1)
                                          for f in dataclasses.fields(obj) if f.init})
    return obj


def detached_copy(batch: Any) -> Any:
    """A copy of a batch with every tensor detached and cloned to the CPU (the run goes on with its own)."""
    return map_tensors(batch, lambda t: t.detach().to("cpu", copy=True))


def tensors_of(obj: Any, depth: int = 0) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth > MAX_DEPTH:
        return []
    if isinstance(obj, Mapping):
        return [t for v in obj.values() for t in tensors_of(v, depth + 1)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors_of(v, depth + 1)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in tensors_of(getattr(obj, f.name), depth + 1)]
    return []


def nbytes(batch: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_of(batch))


def like(batch: Any, template: Any) -> Any:
    """`batch` moved to the device of the first tensor of `template` (the batch the reference's own loader yielded)."""
    found = tensors_of(template)
    if not found:
        return batch
    device = found[0].device
    return map_tensors(batch, lambda t: t.to(device))


def _is_leaf_list(obj: Any) -> bool:
    """A list of per-example values (strings, numbers, None), as default_collate leaves a batch of strings."""
    return isinstance(obj, list) and all(not isinstance(v, (torch.Tensor, Mapping, list, tuple)) for v in obj)


def join(parts: list[Any], where: str = "batch", keep_equal: bool = False) -> Any:
    """The parts (same structure) joined along the batch dimension into one batch (see the module docstring); with
    `keep_equal`, a tensor equal in every part is KEEP."""
    if not parts:
        raise Unjoinable("nothing to join")
    return _join(parts, where, 0, None, keep_equal)


def merge(own: Any, fed: Any, depth: int = 0) -> Any:
    """`own` (what the reference's code passed) with each tensor that `fed` holds at the same place put in its stead
    (moved to the device of the tensor it replaces); KEEP, None and anything else keep the reference's own."""
    if isinstance(fed, torch.Tensor):
        return fed.to(own.device) if isinstance(own, torch.Tensor) else own
    if depth > MAX_DEPTH or fed is None or fed is KEEP:
        return own
    if isinstance(own, Mapping) and isinstance(fed, Mapping):
        out = dict(own) if not hasattr(own, "copy") else own.copy()
        for k in own.keys():
            if k in fed:
                out[k] = merge(own[k], fed[k], depth + 1)
        return out
    if isinstance(own, (list, tuple)) and isinstance(fed, (list, tuple)) and len(own) == len(fed):
        items = [merge(o, f, depth + 1) for o, f in zip(own, fed, strict=True)]
        return type(own)(*items) if hasattr(own, "_fields") else type(own)(items)
    if dataclasses.is_dataclass(own) and not isinstance(own, type) and type(fed) is type(own):
        return dataclasses.replace(own, **{f.name: merge(getattr(own, f.name), getattr(fed, f.name), depth + 1)
                                           for f in dataclasses.fields(own) if f.init})
    return own


def _join(parts: list[Any], where: str, depth: int, padding: dict[str, Any] | None, keep: bool = False) -> Any:
    first = parts[0]
    if any(type(p) is not type(first) for p in parts):
        raise Unjoinable(f"{where}: the parts are of different types ({', '.join(sorted({type(p).__name__ for p in parts}))})")
    if isinstance(first, torch.Tensor):
        if keep and len(parts) > 1 and all(p.shape == first.shape and torch.equal(p, first) for p in parts[1:]):
            return KEEP
        return _join_tensors(parts, where, padding)
    if depth > MAX_DEPTH:
        raise Unjoinable(f"{where}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(first, Mapping):
        return _join_mapping(parts, where, depth, keep)
    if _is_leaf_list(first):
        return type(first)(v for p in parts for v in p)
    if isinstance(first, (list, tuple)):
        if any(len(p) != len(first) for p in parts):
            raise Unjoinable(f"{where}: the parts have {sorted({len(p) for p in parts})} fields")
        fields = [_join([p[i] for p in parts], f"{where}[{i}]", depth + 1, padding, keep) for i in range(len(first))]
        return type(first)(*fields) if hasattr(first, "_fields") else type(first)(fields)
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        return dataclasses.replace(first, **{
            f.name: _join([getattr(p, f.name) for p in parts], f"{where}.{f.name}", depth + 1, padding, keep)
            for f in dataclasses.fields(first) if f.init})
    if all(_same(p, first) for p in parts):
        return first
    raise Unjoinable(f"{where}: a {type(first).__name__} that differs between the parts and is not a per-example list")


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return a is b


def _join_mapping(parts: list[Any], where: str, depth: int, keep: bool = False) -> Any:
    first = parts[0]
    keys = list(first.keys())
    if any(list(p.keys()) != keys for p in parts):
        raise Unjoinable(f"{where}: the parts have different keys")
    padding = _token_padding(parts)
    out = copy.copy(first)
    joined = {k: _join([p[k] for p in parts], f"{where}[{k!r}]", depth + 1, padding.get(k) if padding else None, keep)
              for k in keys}
    try:
        for k, v in joined.items():
            out[k] = v
        return out
    except TypeError:
        return joined


def _token_padding(parts: list[Any]) -> dict[str, Any] | None:
    """A token batch (an `attention_mask` among its fields): the value each field is right-padded with."""
    if not all(isinstance(p.get("attention_mask"), torch.Tensor) for p in parts):
        return None
    return {k: (0 if k == "attention_mask" else PAD_LABEL if k == "labels" else 0) for k in parts[0].keys()}


def _join_tensors(parts: list[torch.Tensor], where: str, padding: Any) -> torch.Tensor:
    first = parts[0]
    if first.dim() == 0:
        if all(torch.equal(p, first) for p in parts):
            return first
        raise Unjoinable(f"{where}: a scalar that differs between the parts ({', '.join(str(p.item()) for p in parts[:4])})")
    if any(p.dim() != first.dim() for p in parts):
        raise Unjoinable(f"{where}: the parts have different numbers of dimensions")
    rest = {tuple(p.shape[1:]) for p in parts}
    if len(rest) > 1:
        if padding is None or first.dim() < 2 or len({tuple(p.shape[2:]) for p in parts}) > 1:
            raise Unjoinable(f"{where}: the parts have shapes {sorted(tuple(p.shape) for p in parts)}, which differ beyond "
                             "the batch dimension (sequences of different lengths) and carry no attention_mask to pad with")
        width = max(p.shape[1] for p in parts)
        parts = [torch.nn.functional.pad(p, (0, 0) * (p.dim() - 2) + (0, width - p.shape[1]), value=padding)
                 for p in parts]
    return torch.cat(parts, dim=0)


def padded(parts: list[Any]) -> bool:
    """Whether joining these parts pads sequences (a token batch of different lengths)."""
    return any(isinstance(p, Mapping) and _token_padding([p]) is not None for p in parts[:1]) and len(
        {tuple(t.shape[1:2]) for p in parts for t in tensors_of(p) if t.dim() > 1}) > 1
