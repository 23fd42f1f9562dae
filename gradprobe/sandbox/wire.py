"""Typed wire models from the standard library alone: the protocol's base (sandbox/protocol.py).

The child runs inside the target's own interpreter, which needs nothing but the standard library
and torch (pydantic may be missing, or built for another Python), so the protocol's models are
keyword-only dataclasses with the few model methods both sides use: `model_dump`/`model_dump_json`
to send, `model_validate`/`model_validate_json` to read (types checked and converted from the
annotations: nested models, enums, literals, lists, dicts, optionals; unknown keys ignored), and
`model_copy(update=...)`. A value of the wrong type raises `WireError` (a ValueError).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from typing_extensions import dataclass_transform

M = TypeVar("M", bound="WireModel")
T = TypeVar("T")


class WireError(ValueError):
    """A message that does not fit its model."""


def Field(*, default_factory: Callable[[], Any]) -> Any:  # reads like the pydantic field it replaces
    return dataclasses.field(default_factory=default_factory)


@dataclass_transform(kw_only_default=True, field_specifiers=(Field, dataclasses.field))
def model(cls: type[T]) -> type[T]:
    """Make a WireModel subclass a keyword-only dataclass."""
    return dataclasses.dataclass(kw_only=True)(cls)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, WireModel)


def _union(args: tuple[Any, ...], value: Any, where: str) -> Any:
    for arg in args:  # left to right: the first that fits
        try:
            return _convert(arg, value, where)
        except WireError:
            continue
    raise WireError(f"{where}: {value!r:.80} fits none of {args}")


def _container(origin: Any, args: tuple[Any, ...], value: Any, where: str) -> Any:
    if origin is list and isinstance(value, list):
        return [_convert(args[0], v, where) for v in value] if args else list(value)
    if origin is dict and isinstance(value, dict):
        return {k: _convert(args[1], v, where) for k, v in value.items()} if args else dict(value)
    raise WireError(f"{where}: expected a {origin.__name__}, got {type(value).__name__}")


def _scalar(tp: Any, value: Any, where: str) -> Any:
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float) and isinstance(value, bool):
        raise WireError(f"{where}: expected {tp.__name__}, got a bool")
    if isinstance(value, tp):
        return value
    raise WireError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        return _union(tuple(a for a in typing.get_args(tp) if a is not type(None)), value, where)
    if tp is type(None):
        if value is None:
            return None
        raise WireError(f"{where}: expected null")
    if origin is typing.Literal:
        if value in typing.get_args(tp):
            return value
        raise WireError(f"{where}: {value!r:.80} is not one of {typing.get_args(tp)}")
    if origin in (list, dict):
        return _container(origin, typing.get_args(tp), value, where)
    if _is_model(tp):
        return value if isinstance(value, tp) else tp.model_validate(value)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError as exc:
            raise WireError(f"{where}: {exc}") from None
    return _scalar(tp, value, where)


def _plain(value: Any, exclude_none: bool) -> Any:
    if isinstance(value, WireModel):
        return value.model_dump(exclude_none=exclude_none)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list):
        return [_plain(v, exclude_none) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v, exclude_none) for k, v in value.items()}
    return value


class WireModel:
    """Base of the protocol's models (each decorated with `@model`)."""

    @classmethod
    def model_validate(cls: type[M], obj: Any) -> M:
        if isinstance(obj, cls):
            return obj
        if not isinstance(obj, dict):
            raise WireError(f"{cls.__name__}: expected an object, got {type(obj).__name__}")
        hints = _hints(cls)
        kwargs = {f.name: _convert(hints[f.name], obj[f.name], f"{cls.__name__}.{f.name}")
                  for f in dataclasses.fields(cls) if f.name in obj}  # type: ignore[arg-type]
        try:
            return cls(**kwargs)
        except TypeError as exc:  # a required field is missing
            raise WireError(f"{cls.__name__}: {exc}") from None

    @classmethod
    def model_validate_json(cls: type[M], data: str | bytes) -> M:
        try:
            obj = json.loads(data)
        except json.JSONDecodeError as exc:
            raise WireError(f"{cls.__name__}: not JSON ({exc})") from None
        return cls.model_validate(obj)

    def model_dump(self, *, exclude_none: bool = False) -> dict[str, Any]:
        out = {f.name: _plain(getattr(self, f.name), exclude_none) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        return {k: v for k, v in out.items() if v is not None} if exclude_none else out

    def model_dump_json(self, *, exclude_none: bool = False) -> str:
        return json.dumps(self.model_dump(exclude_none=exclude_none))

    def model_copy(self: M, *, update: dict[str, Any] | None = None) -> M:
        return dataclasses.replace(self, **(update or {}))  # type: ignore[type-var]
