"""Fuzzing every message decoder (bounded time: hypothesis, no database).

For every registered method, request and response bodies are decoded from random msgpack
values and from maps with the message's own field names holding hostile values (huge and
negative integers, wrong types, deep nesting, long strings). A decoder returns an instance
or raises ``StatusError(BAD_REQUEST)``, nothing else; what it returns encodes again and
decodes to the same message.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loomfs.wire.grants
import loomfs.wire.meta
import loomfs.wire.meta_batch
import loomfs.wire.mgmtd
import loomfs.wire.storage  # noqa: F401  (registers their methods)
from loomfs.errors import StatusError
from loomfs.wire.message import METHODS, Message
from loomfs.wire.status import Status

FUZZ = settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

TYPES: list[type[Message]] = sorted({t for m in METHODS for t in (m.request, m.response)}, key=lambda t: t.__name__)

HOSTILE_INTS = st.sampled_from([0, -1, 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), -(2**64) + 1])
LEAF = st.one_of(st.none(), st.booleans(), st.integers(-(2**64) + 1, 2**64 - 1), HOSTILE_INTS,
                 st.floats(), st.text(max_size=30), st.binary(max_size=30),
                 st.sampled_from(["", "/", "..", "a" * 300, "\x00", "/a/../../b", "\udcff"[:0] + "é" * 50]))
VALUE = st.recursive(LEAF, lambda c: st.one_of(st.lists(c, max_size=5),
                                               st.dictionaries(st.text(max_size=10), c, max_size=5)),
                     max_leaves=20)


def _decode(cls: type[Message], body: Any) -> None:
    # what a peer can send is what msgpack can carry: go through the codec like the wire does
    try:
        wire = msgpack.unpackb(msgpack.packb(body, use_bin_type=True), raw=False, strict_map_key=False)
    except (OverflowError, ValueError, TypeError):
        return
    try:
        msg = cls.from_wire(wire)
    except StatusError as exc:
        assert exc.status is Status.BAD_REQUEST, (cls.__name__, exc)
        return
    assert isinstance(msg, cls)
    again = cls.from_wire(msgpack.unpackb(msgpack.packb(msg.to_wire(), use_bin_type=True), raw=False))
    assert again == msg, cls.__name__


@FUZZ
@given(st.sampled_from(TYPES), VALUE)
def test_random_bodies(cls: type[Message], body: Any) -> None:
    _decode(cls, body)


@FUZZ
@given(st.sampled_from(TYPES), st.data())
def test_own_fields_with_hostile_values(cls: type[Message], data: st.DataObject) -> None:
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    if not names:
        _decode(cls, data.draw(st.dictionaries(st.text(max_size=5), VALUE, max_size=3)))
        return
    chosen = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True))
    body = {name: data.draw(VALUE) for name in chosen}
    _decode(cls, body)


def test_every_method_is_fuzzed() -> None:
    assert len(TYPES) >= 40, len(TYPES)
