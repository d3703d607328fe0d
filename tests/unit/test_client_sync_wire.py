"""The blocking client's shortcuts from an undecoded reply body (strict paths): a stat built
straight from meta's attribute map equals the one built through ``Attr``, and anything
unusual falls back to the full decode (None)."""

from __future__ import annotations

import errno
from typing import Any

import crc32c
import msgpack
import pytest

from loomfs.client.core import LAZY_FLAGS
from loomfs.client.sync_wire import (
    _inline_bytes_of_wire,
    _path_body,
    _put_open_body,
    _stat_result_of_wire,
    stat_result,
)
from loomfs.errors import LoomError
from loomfs.wire import meta as wmeta
from loomfs.wire.types import Attr, FileType, Layout


def on_the_wire(attr: Attr) -> dict[str, Any]:
    """The map as the fast path receives it (through msgpack: enums are plain ints)."""
    out: dict[str, Any] = msgpack.unpackb(msgpack.packb(attr.to_wire(), use_bin_type=True), raw=False)
    return out


ATTRS = [
    Attr(inode=7, type=FileType.FILE, mode=0o4755, nlink=2, uid=10, gid=20, size=4097,
         atime_ns=1_796_357_008_960_005_187, mtime_ns=1_796_357_027_982_681_759, ctime_ns=3,
         layout=Layout(chains=[1, 2]), inline=True),
    Attr(inode=1, type=FileType.DIRECTORY, mode=0o755, nlink=3),
    Attr(inode=9, type=FileType.SYMLINK, symlink_target="/x", size=2),
    Attr(inode=11, type=FileType.CHAR_DEVICE, rdev=(5 << 8) | 1),
    Attr(inode=12, type=99),  # a type this client does not know: no type bits, as stat_result
]


@pytest.mark.parametrize("attr", ATTRS)
def test_the_same_stat_result_as_through_attr(attr: Attr) -> None:
    wire = on_the_wire(attr)
    got = _stat_result_of_wire(wire)
    want = stat_result(Attr.from_wire(wire))
    assert got is not None
    assert tuple(got) == tuple(want)
    for name in ("st_atime", "st_mtime", "st_ctime", "st_atime_ns", "st_mtime_ns", "st_ctime_ns",
                 "st_blksize", "st_blocks", "st_rdev"):
        assert getattr(got, name) == getattr(want, name), name


@pytest.mark.parametrize("field", ["type", "mode", "inode", "nlink", "uid", "gid", "size", "atime_ns",
                                   "mtime_ns", "ctime_ns", "rdev"])
@pytest.mark.parametrize("bad", ["missing", True, "7", 1.5, None])
def test_anything_unusual_is_left_to_the_full_decode(field: str, bad: Any) -> None:
    wire = on_the_wire(ATTRS[0])
    if bad == "missing":
        del wire[field]
    else:
        wire[field] = bad
    assert _stat_result_of_wire(wire) is None
    assert _stat_result_of_wire(None) is None
    assert _stat_result_of_wire([1, 2]) is None


def test_inline_bytes_checked_or_left_to_the_full_decode() -> None:
    data = b"abc" * 100
    crc = crc32c.crc32c(data)
    body: dict[str, Any] = {"attr": on_the_wire(ATTRS[0]), "data": data, "data_crc": crc, "read_grant": b""}
    assert _inline_bytes_of_wire("/f", body) == data
    with pytest.raises(LoomError) as err:
        _inline_bytes_of_wire("/f", {**body, "data_crc": crc ^ 1})
    assert err.value.errno == errno.EIO
    assert _inline_bytes_of_wire("/f", {**body, "data": None}) is None  # chunked: read the chunks
    assert _inline_bytes_of_wire("/f", {**body, "attr": None}) is None  # NotFound from the full path
    assert _inline_bytes_of_wire("/d", {**body, "attr": on_the_wire(ATTRS[1])}) is None  # EISDIR from it
    assert _inline_bytes_of_wire("/f", {**body, "data_crc": "x"}) is None


def test_request_maps_built_by_hand_are_the_messages_encodings() -> None:
    """The fast path builds these maps itself; they must stay what the Message would send."""
    for follow in (True, False):
        assert _path_body("/a/b", follow) == wmeta.PathReq(path="/a/b", follow_symlinks=follow).to_wire()
    data = b"z" * 4096
    want = wmeta.OpenReq(path="/d/f", flags=LAZY_FLAGS, mode=0o644, client_id=77, session_id=(1 << 62) | 5,
                         data=data, data_crc=crc32c.crc32c(data)).to_wire()
    got = _put_open_body("/d/f", 77, (1 << 62) | 5, data)
    assert got == want
    assert list(got) == list(want)  # the same order too: the same bytes on the wire
