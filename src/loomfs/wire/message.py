"""Message base: frozen, slotted, keyword-only dataclasses that travel as msgpack maps.

Rules (STYLE.md §5): every field has a default; unknown fields are ignored on decode, so
old and new peers interoperate; nested messages, lists of messages and optional messages
are supported; anything else must be a msgpack primitive (int, float, str, bytes, bool,
None, list/dict of those).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from loomfs.common.identity import Right
from loomfs.errors import StatusError
from loomfs.wire.status import Status

T = TypeVar("T", bound="Message")

_C = TypeVar("_C", bound=type)


@typing.dataclass_transform(frozen_default=True, kw_only_default=True, field_specifiers=(dataclasses.field,))
def message(cls: _C) -> _C:
    """Decorator for wire messages: a frozen, slotted, keyword-only dataclass."""
    return dataclass(frozen=True, slots=True, kw_only=True)(cls)  # type: ignore[return-value]


def many() -> Any:
    """Default for a list field: ``targets: list[int] = many()``."""
    return dataclasses.field(default_factory=list)

_Decoder = Callable[[Any], Any]
_Encoder = Callable[[Any], Any]


class Message:
    """Base class for wire messages. Subclasses are decorated with ``@message``."""

    __slots__ = ()

    def to_wire(self) -> dict[str, Any]:
        plan = type(self)._get_plan()
        return {name: enc(getattr(self, name)) for name, enc, _ in plan}

    @classmethod
    def from_wire(cls: type[T], data: Any) -> T:
        if not isinstance(data, dict):
            raise StatusError(Status.BAD_REQUEST, f"{cls.__name__}: body is not a map")
        kwargs: dict[str, Any] = {}
        for name, _, dec in cls._get_plan():
            if name in data:
                try:
                    kwargs[name] = dec(data[name])
                except StatusError:
                    raise
                except Exception as exc:
                    raise StatusError(
                        Status.BAD_REQUEST, f"{cls.__name__}.{name}: {exc}"
                    ) from exc
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise StatusError(Status.BAD_REQUEST, f"{cls.__name__}: {exc}") from exc

    @classmethod
    def _get_plan(cls) -> tuple[tuple[str, _Encoder, _Decoder], ...]:
        plan = cls.__dict__.get("_plan_cache")
        if plan is None:
            hints = typing.get_type_hints(cls)
            plan = tuple(
                (f.name, *_codec_for(hints[f.name])) for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            )
            type.__setattr__(cls, "_plan_cache", plan)
        return plan


def _identity(v: Any) -> Any:
    return v


def _check(kind: type | tuple[type, ...], name: str) -> _Decoder:
    def dec(v: Any) -> Any:
        if isinstance(v, bool) and kind is int:
            raise TypeError(f"expected {name}, got bool")
        if not isinstance(v, kind):
            raise TypeError(f"expected {name}, got {type(v).__name__}")
        return v

    return dec


def _codec_for(tp: Any) -> tuple[_Encoder, _Decoder]:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if isinstance(tp, type) and issubclass(tp, Message):
        msg_cls = tp
        return (lambda v: v.to_wire()), (lambda v: msg_cls.from_wire(v))
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            enc, dec = _codec_for(non_none[0])
            return (lambda v: None if v is None else enc(v)), (
                lambda v: None if v is None else dec(v)
            )
        return _identity, _identity
    if origin in (list, tuple) and args:
        inner = args[0]
        enc, dec = _codec_for(inner)
        if enc is _identity and dec is _identity:
            return list, _list_of(_identity, origin)
        return (lambda v: [enc(x) for x in v]), _list_of(dec, origin)
    if tp is int:
        return _identity, _check(int, "int")
    if tp is bool:
        return _identity, _check(bool, "bool")
    if tp is float:
        return _identity, _check((int, float), "float")
    if tp is str:
        return _identity, _check(str, "str")
    if tp is bytes:
        return _identity, _check(bytes, "bytes")
    return _identity, _identity


def _list_of(dec: _Decoder, origin: Any) -> _Decoder:
    def decode(v: Any) -> Any:
        if not isinstance(v, list):
            raise TypeError("expected list")
        out = [dec(x) for x in v]
        return tuple(out) if origin is tuple else out

    return decode


@message
class Empty(Message):
    pass


@dataclass(frozen=True, slots=True)
class Method:
    """One RPC: numbered (service, method), request and response types, retry safety."""

    service: int
    method: int
    name: str
    request: type[Message]
    response: type[Message]
    idempotent: bool = False
    # rights the caller's identity must hold (``loomfs.common.identity``); the RPC server
    # refuses the call with EPERM otherwise. NONE: any authenticated caller.
    needs: Right = Right.NONE

    @property
    def key(self) -> tuple[int, int]:
        return (self.service, self.method)


class Registry:
    """All methods by (service, method); ids are never reused."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[int, int], Method] = {}

    def add(self, m: Method) -> Method:
        if m.key in self._by_key:
            raise ValueError(f"method id {m.key} reused by {m.name}")
        self._by_key[m.key] = m
        return m

    def get(self, key: tuple[int, int]) -> Method | None:
        return self._by_key.get(key)

    def __iter__(self) -> typing.Iterator[Method]:
        return iter(self._by_key.values())


METHODS = Registry()


def method(
    service: int,
    method_id: int,
    name: str,
    request: type[Message],
    response: type[Message],
    *,
    idempotent: bool = False,
    needs: Right = Right.NONE,
) -> Method:
    return METHODS.add(Method(service, method_id, name, request, response, idempotent, needs))
