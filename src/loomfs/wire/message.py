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
        return type(self)._compile()[0](self)

    @classmethod
    def from_wire(cls: type[T], data: Any) -> T:
        return cls._compile()[1](cls, data)

    @classmethod
    def _from_wire_generic(cls: type[T], data: Any) -> T:
        """The reference decoder (the compiled ones do the same, faster)."""
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

    def _to_wire_generic(self) -> dict[str, Any]:
        plan = type(self)._get_plan()
        return {name: enc(getattr(self, name)) for name, enc, _ in plan}

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

    @classmethod
    def _compile(cls) -> tuple[Callable[[Any], dict[str, Any]], Callable[[Any, Any], Any]]:
        """This class's encoder and decoder, generated once from its plan (every meta request
        and reply goes through them: a generic loop over the plan cost several microseconds
        per message). Same results and errors as ``_to_wire_generic``/``_from_wire_generic``."""
        compiled = cls.__dict__.get("_compiled_cache")
        if compiled is None:
            compiled = _compile_codecs(cls, cls._get_plan())
            type.__setattr__(cls, "_compiled_cache", compiled)
            # from now on the class's own methods (a subclass's call falls back to its own),
            # unless the class wrote its own
            if "to_wire" not in cls.__dict__:
                type.__setattr__(cls, "to_wire", compiled[0])
            if "from_wire" not in cls.__dict__:
                type.__setattr__(cls, "from_wire", classmethod(compiled[1]))
        return compiled


# exact types a decoder accepts as they are (anything else goes through the decoder, which
# accepts or refuses it as the generic one does)
_FAST_TYPES: dict[str, str] = {"int": "int", "bool": "bool", "str": "str", "bytes": "bytes", "float": "float"}


def _direct_fields(cls: type, names: list[str]) -> list[tuple[Any, Any, bool]] | None:
    """Per field: its slot's setter, its default and whether that is a factory; None when
    the class cannot be built by setting its slots (a field without a default or outside
    ``__init__``, no slots, a ``__post_init__``): then decoders call the class."""
    if "__post_init__" in dir(cls):
        return None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    out: list[tuple[Any, Any, bool]] = []
    for name in names:
        f = fields.get(name)
        slot: Any = cls.__dict__.get(name)
        if f is None or not f.init or not hasattr(slot, "__set__") or isinstance(slot, property):
            return None
        if f.default is not dataclasses.MISSING:
            out.append((slot.__set__, f.default, False))
        elif f.default_factory is not dataclasses.MISSING:
            out.append((slot.__set__, f.default_factory, True))
        else:
            return None
    return out


def _compile_codecs(cls: type, plan: tuple[tuple[str, _Encoder, _Decoder], ...]) -> tuple[Any, Any]:
    """The encoder, and a decoder that builds the message by setting its slots (what the
    dataclass ``__init__`` does, without its keyword parsing and per-field ``object.__setattr__``:
    half an ``Attr``'s decode) where ``_direct_fields`` allows, else by calling the class."""
    env: dict[str, Any] = {"StatusError": StatusError, "BAD_REQUEST": Status.BAD_REQUEST, "_cls_name": cls.__name__,
                           "_new": object.__new__}
    direct = _direct_fields(cls, [name for name, _, _ in plan])
    enc_items: list[str] = []
    dec_lines: list[str] = []
    for i, (name, enc, dec) in enumerate(plan):
        if not name.isidentifier():  # pragma: no cover - dataclass fields are identifiers
            raise ValueError(f"field name {name!r}")
        if enc is _identity:
            enc_items.append(f"{name!r}: self.{name}")
        else:
            env[f"_e{i}"] = enc
            enc_items.append(f"{name!r}: _e{i}(self.{name})")
        env[f"_d{i}"] = dec
        if direct is not None:
            env[f"_s{i}"], env[f"_f{i}"], factory = direct[i]
            put = f"_s{i}(obj, {{}})"
            missing = ["    else:", f"        {put.format(f'_f{i}()' if factory else f'_f{i}')}"]
        else:
            put = f"kw[{name!r}] = {{}}"
            missing = []
        kind = getattr(dec, "_fast_type", None)
        dec_lines.append(f"    if {name!r} in data:")
        dec_lines.append(f"        v = data[{name!r}]")
        if dec is _identity:
            dec_lines.append(f"        {put.format('v')}")
        elif kind is not None:
            dec_lines.append(f"        if type(v) is {kind}:")
            dec_lines.append(f"            {put.format('v')}")
            dec_lines.append("        else:")
            dec_lines.append(f"            field = {name!r}")
            dec_lines.append(f"            {put.format(f'_d{i}(v)')}")
        else:
            dec_lines.append(f"        field = {name!r}")
            dec_lines.append(f"        {put.format(f'_d{i}(v)')}")
        dec_lines.extend(missing)
    if direct is not None:
        start, finish = ["    obj = _new(_cls)"], ["    return obj"]
    else:
        start = ["    kw = {}"]
        finish = [
            "    try:",
            "        return cls(**kw)",
            "    except (TypeError, ValueError) as exc:",
            "        raise StatusError(BAD_REQUEST, f'{_cls_name}: {exc}') from exc",
        ]
    src = [
        "def to_wire(self):",
        "    if self.__class__ is not _cls:",
        "        return self._to_wire_generic()",
        "    return {" + ", ".join(enc_items) + "}",
        "def from_wire(cls, data):",
        "    if cls is not _cls:",
        "        return cls._from_wire_generic(data)",
        "    if not isinstance(data, dict):",
        "        raise StatusError(BAD_REQUEST, _cls_name + ': body is not a map')",
        *start,
        "    field = ''",
        "    try:",
        *("    " + line for line in dec_lines or ["    pass"]),
        "    except StatusError:",
        "        raise",
        "    except Exception as exc:",
        "        raise StatusError(BAD_REQUEST, f'{_cls_name}.{field}: {exc}') from exc",
        *finish,
    ]
    env["_cls"] = cls
    exec("\n".join(src), env)  # noqa: S102 - generated from the class's own field names
    return env["to_wire"], env["from_wire"]


def _identity(v: Any) -> Any:
    return v


def _check(kind: type | tuple[type, ...], name: str) -> _Decoder:
    def dec(v: Any) -> Any:
        if isinstance(v, bool) and kind is int:
            raise TypeError(f"expected {name}, got bool")
        if not isinstance(v, kind):
            raise TypeError(f"expected {name}, got {type(v).__name__}")
        return v

    dec._fast_type = _FAST_TYPES.get(name)  # type: ignore[attr-defined]  # accepted as is by the compiled decoders
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
