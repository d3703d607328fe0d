"""The generated message codecs (``Message._compile``) against the reference ones."""

from __future__ import annotations

import pytest

from loomfs.errors import StatusError


def test_compiled_codecs_agree_with_the_generic_ones() -> None:
    """Every registered method's request and response: the generated encoder and decoder give
    what the reference (plan-walking) ones give, for defaults, values and bad input."""
    from loomfs.wire import meta as wm  # noqa: F401  (registers the meta methods)
    from loomfs.wire import meta_batch, storage  # noqa: F401
    from loomfs.wire.message import METHODS
    from loomfs.wire.types import Attr, Layout

    classes = {c for m in METHODS for c in (m.request, m.response)} | {Attr, Layout}
    for cls in classes:
        msg = cls()
        assert msg.to_wire() == msg._to_wire_generic()
        assert cls.from_wire(msg.to_wire()) == cls._from_wire_generic(msg.to_wire()) == msg
        for bad in ([1], "x", None):
            with pytest.raises(StatusError) as fast:
                cls.from_wire(bad)
            with pytest.raises(StatusError) as ref:
                cls._from_wire_generic(bad)
            assert str(fast.value) == str(ref.value)
        for name, _, _ in cls._get_plan():  # a wrong type in each field: the same refusal, or both accept
            for wrong in ("s", 1, True, b"b", [1], {"k": 1}, 1.5):
                data = {**msg.to_wire(), name: wrong}
                try:
                    want: object = cls._from_wire_generic(data)
                except StatusError as exc:
                    want = str(exc)
                try:
                    got: object = cls.from_wire(data)
                except StatusError as exc:
                    got = str(exc)
                assert got == want, (cls.__name__, name, wrong)
    a = Attr(inode=7, size=3, layout=Layout(chains=[1, 2]), inline=True, symlink_target="t")
    assert Attr.from_wire({**a.to_wire(), "unknown_field": 1}) == a  # unknown fields ignored


def test_decoders_build_by_slots_with_fresh_factory_defaults() -> None:
    """Decoders set the slots directly: defaults as the class gives them (a fresh list per
    message for ``many()`` fields), equal and hashing alike to the constructed message."""
    from loomfs.wire import meta as wm
    from loomfs.wire.types import Attr

    a, b = wm.InodesReq.from_wire({}), wm.InodesReq.from_wire({})
    assert a == wm.InodesReq() and a.inodes == [] and a.inodes is not b.inodes
    got = Attr.from_wire({"inode": 7, "size": 3, "unknown": 1})
    assert got == Attr(inode=7, size=3) and hash(got) == hash(Attr(inode=7, size=3))
    with pytest.raises(AttributeError):
        got.size = 4  # type: ignore[misc]  (still frozen)


def test_decoder_of_a_class_with_post_init_calls_the_class() -> None:
    from loomfs.wire.message import Message, message

    @message
    class Checked(Message):
        n: int = 0

        def __post_init__(self) -> None:
            if self.n < 0:
                raise ValueError("n must not be negative")

    assert Checked.from_wire({"n": 2}) == Checked(n=2)
    with pytest.raises(StatusError, match="negative"):
        Checked.from_wire({"n": -1})
