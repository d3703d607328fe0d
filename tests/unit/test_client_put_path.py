"""The small-put path's helpers: session ids from a pool, an OPEN reply read without decoding,
the frame encoder's reused msgpack packer."""

from __future__ import annotations

import os

import msgpack
import pytest

from loomfs.client.inline import stored_inline
from loomfs.client.session_ids import IDS_PER_READ, SessionIds
from loomfs.wire import frame as fr
from loomfs.wire import meta as w
from loomfs.wire.types import Attr, Layout


def test_session_ids_unique_in_range_and_pooled() -> None:
    ids = SessionIds()
    got = [ids.take() for _ in range(3 * IDS_PER_READ)]
    assert len(set(got)) == len(got)
    assert all(1 << 62 <= i < 1 << 63 for i in got)
    assert ids.reads == 3


def test_session_ids_forget_after_fork() -> None:
    ids = SessionIds()
    ids.take()
    ids.forget()
    assert repr(ids) == "SessionIds(pooled=0 reads=1)"
    ids.take()
    assert ids.reads == 2


def test_forked_child_does_not_reuse_parent_ids() -> None:
    from loomfs.client.session_ids import session_ids

    session_ids.take()  # the pool holds ids now
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(wfd, str(session_ids.take()).encode())
        os._exit(0)
    os.close(wfd)
    child = int(os.read(r, 64))
    os.close(r)
    os.waitpid(pid, 0)
    mine = [session_ids.take() for _ in range(IDS_PER_READ)]
    assert child not in mine


def _body(rsp: w.OpenRsp) -> dict[str, object]:
    """The body as the fast path receives it (through msgpack)."""
    header = fr.Header(1, 2, 3, 0, 0, "", rsp.to_wire())
    data = fr.encode(fr.KIND_RESPONSE, header)
    _, h, _ = fr.decode_frame(data)
    return h.body


@pytest.mark.parametrize(("rsp", "expected"), [
    (w.OpenRsp(attr=Attr(inode=5, inline=True, layout=Layout())), True),
    (w.OpenRsp(attr=Attr(inode=5, inline=True), session_id=7), False),  # a write session: finish the put
    (w.OpenRsp(attr=Attr(inode=5, inline=False), session_id=7), False),  # chunks
    (w.OpenRsp(attr=None), False),
])
def test_stored_inline_matches_the_decoded_reply(rsp: w.OpenRsp, expected: bool) -> None:
    body = _body(rsp)
    assert stored_inline(body) is expected
    decoded = w.OpenRsp.from_wire(body)
    assert expected == (decoded.attr is not None and decoded.attr.inline and not decoded.session_id)


@pytest.mark.parametrize("body", [None, [], {"attr": []}, {"attr": {"inline": 1}}, {"attr": {"inline": True},
                                                                                    "session_id": "x"}])
def test_stored_inline_refuses_odd_bodies(body: object) -> None:
    assert stored_inline(body) is False


def test_frame_packer_reused_and_reset_after_errors() -> None:
    obj = [1, "x", {"a": b"\x00" * 10}]
    assert fr.pack(obj) == msgpack.packb(obj, use_bin_type=True)
    with pytest.raises(TypeError):
        fr.pack([1, object()])
    assert fr.pack(obj) == msgpack.packb(obj, use_bin_type=True)  # nothing left from the failed one
    big = b"\x01" * (fr.PACKER_KEEP_BYTES + 1)
    first = fr._packers.packer  # noqa: SLF001
    assert fr.pack(big) == msgpack.packb(big, use_bin_type=True)
    assert fr._packers.packer is not first  # noqa: SLF001  (a grown buffer is not kept)
