"""meta service batch calls (methods 30-39): many paths in one round trip.

Every batch answers per item: one missing file does not fail the others. An item that failed
is an ``ItemError`` (its index in the request, a wire ``Status``, a short message); the
client turns it into the ``OSError`` a single call would raise (``loomfs.errors.from_status``).

Bounds. A request names at most ``BATCH_ITEMS_MAX`` paths, and a client keeps a request's
frame header under ``REQUEST_PATH_BYTES_MAX`` of path text; more is split over several
requests. Replies must fit one frame: the msgpack body (attributes, errors) is capped at
``REPLY_BODY_BYTES_MAX`` (the frame allows ``MAX_HEADER_BYTES``) and file contents travel
in the raw payload, capped at ``READ_MANY_DATA_BYTES_MAX``. A reply that would pass either
cap answers a prefix of the request: ``count`` items (at least one), and the client asks
again for the rest. Writes (PUT_MANY, UNLINK_MANY) only ever do the items they answer.

Contents go in frame payloads, never in message bodies: READ_MANY's reply payload is the
inline files' contents concatenated in item order (``lengths`` says how much each has,
``crcs`` their CRC32C as meta stored it); PUT_MANY's request payload is the new contents
concatenated in item order.
"""

from __future__ import annotations

from typing import Any

import msgpack

from loomfs.common.identity import Right
from loomfs.wire.message import Message, many, message, method
from loomfs.wire.types import SERVICE_META, Attr, Layout

BATCH_ITEMS_MAX = 4096
REQUEST_PATH_BYTES_MAX = 512 << 10  # a client's bound on the paths of one request (UTF-8)
REPLY_BODY_BYTES_MAX = 768 << 10  # of the 1 MiB frame header (wire.frame.MAX_HEADER_BYTES)
READ_MANY_DATA_BYTES_MAX = 16 << 20  # inline contents in one READ_MANY reply payload
PUT_MANY_DATA_BYTES_MAX = 16 << 20  # contents in one PUT_MANY request payload
# one PUT_MANY item's bytes: no directory may keep bigger files inline (meta.layout's cap)
PUT_MANY_ITEM_BYTES_MAX = 1 << 20
ITEM_MESSAGE_BYTES_MAX = 128  # an ItemError's message is cut to this (UTF-8): 4096 errors fit a reply


@message
class ItemError(Message):
    """Item ``index`` of the request failed with ``status`` (a ``wire.status.Status``)."""

    index: int = 0
    status: int = 0
    message: str = ""


@message
class IndexedAttr(Message):
    index: int = 0
    attr: Attr | None = None


@message
class PathsReq(Message):
    """STAT_MANY, READ_MANY (``follow_symlinks`` as for STAT/READ), UNLINK_MANY (ignored:
    unlink never follows the last component)."""

    paths: list[str] = many()
    follow_symlinks: bool = True
    # STAT_MANY: answer in ``rows``/``layouts`` (``ATTR_ROW_FIELDS``) instead of ``attrs`` (a
    # server that predates them ignores this and answers ``attrs``)
    compact: bool = False


# the fields of an ``Attr`` row, in order; ``layout`` is an index into the reply's ``layouts``
# (-1: none). A row is a msgpack array: decoding it is one C call, where an ``Attr`` map (with
# its ``Layout`` map, the same for most files) cost ~10 us per file in Python.
ATTR_ROW_FIELDS = ("inode", "type", "mode", "nlink", "uid", "gid", "size", "atime_ns", "mtime_ns", "ctime_ns",
                   "layout", "symlink_target", "inline", "rdev")


@message
class StatManyRsp(Message):
    count: int = 0  # answers paths[:count]; ask again for the rest
    attrs: list[Attr | None] = many()  # one per answered path; None where ``errors`` has it
    errors: list[ItemError] = many()
    # asked ``compact``: instead of ``attrs``, one row per answered path (``ATTR_ROW_FIELDS``;
    # None where ``errors`` has it) and the distinct layouts the rows point at
    rows: list[Any] = many()
    layouts: list[Layout] = many()


@message
class ReadManyRsp(Message):
    """Per answered path, either its content is in the payload (``lengths[i] >= 0``, an
    inline file), or it is in ``chunked`` (a file in chunks: read it from storage with the
    attributes' layout and size), or it is in ``errors`` (EISDIR for a directory)."""

    count: int = 0  # answers paths[:count]; ask again for the rest
    lengths: list[int] = many()  # bytes of item i's content in the payload; -1 = none there
    crcs: list[int] = many()  # CRC32C of item i's content (0 where none)
    chunked: list[IndexedAttr] = many()
    errors: list[ItemError] = many()
    read_grants: list[bytes] = many()  # parallel to ``chunked``: each file's read grant (b"" without a secret)


@message
class PutManyReq(Message):
    """Whole small files (``O_CREAT|O_WRONLY|O_TRUNC`` with the content, as OPEN's put).
    Items are done in order; the payload is their contents concatenated."""

    paths: list[str] = many()
    lengths: list[int] = many()  # bytes of each item's content in the payload
    crcs: list[int] = many()  # CRC32C of each item's content
    mode: int = 0o644  # for files it creates
    uid: int = 0
    gid: int = 0
    client_id: int = 0


@message
class PutManyRsp(Message):
    count: int = 0  # did paths[:count] (the rest untouched: send them again)
    # items left untouched because their content does not fit the file's inline limit:
    # write them as ordinary files (a write open, chunks, close)
    fallback: list[int] = many()
    errors: list[ItemError] = many()


@message
class UnlinkManyRsp(Message):
    count: int = 0  # did paths[:count] (the rest untouched: send them again)
    errors: list[ItemError] = many()


STAT_MANY = method(SERVICE_META, 30, "stat_many", PathsReq, StatManyRsp, idempotent=True)
READ_MANY = method(SERVICE_META, 31, "read_many", PathsReq, ReadManyRsp, idempotent=True)
# changing the namespace needs the WRITE right (a read-only token gets EPERM)
PUT_MANY = method(SERVICE_META, 32, "put_many", PutManyReq, PutManyRsp, needs=Right.WRITE)
UNLINK_MANY = method(SERVICE_META, 33, "unlink_many", PathsReq, UnlinkManyRsp, needs=Right.WRITE)


def short_message(text: str) -> str:
    """``text`` cut to ``ITEM_MESSAGE_BYTES_MAX`` bytes of UTF-8 (lone surrogates become '?')."""
    return text.encode("utf-8", "replace")[:ITEM_MESSAGE_BYTES_MAX].decode("utf-8", "ignore")


_U64 = (1 << 64) - 1
_BIG_LAYOUT = Layout(chunk_size=_U64, stripe=_U64, table_id=_U64, replicas=_U64, chains=[], inline_max_bytes=_U64,
                     ec_k=_U64, ec_m=_U64)
# the most an Attr with no chains and no symlink target can take in msgpack
_ATTR_BYTES_FIXED = len(msgpack.packb(Attr(
    inode=_U64, type=_U64, mode=_U64, nlink=_U64, uid=_U64, gid=_U64, size=_U64, atime_ns=_U64,
    mtime_ns=_U64, ctime_ns=_U64, layout=_BIG_LAYOUT, inline=True, rdev=_U64,
).to_wire()))
# an ItemError with the longest message, plus its place in a list
ITEM_ERROR_BYTES_MAX = len(msgpack.packb(
    ItemError(index=_U64, status=_U64, message="x" * ITEM_MESSAGE_BYTES_MAX).to_wire()
)) + 5
INDEX_BYTES_MAX = 9  # a msgpack uint64


def attr_row(attr: Attr, layouts: list[Layout], index: dict[int, int]) -> list[Any]:
    """``attr`` as a row (``ATTR_ROW_FIELDS``); its layout is added to ``layouts`` unless the
    same object is there already (``index``: id(layout) -> position; meta's layouts are
    shared objects, one per distinct stored layout)."""
    lay = attr.layout
    if lay is None:
        at = -1
    else:
        at = index.get(id(lay), -1)
        if at < 0 or layouts[at] is not lay:
            at = index[id(lay)] = len(layouts)
            layouts.append(lay)
    return [attr.inode, int(attr.type), attr.mode, attr.nlink, attr.uid, attr.gid, attr.size, attr.atime_ns,
            attr.mtime_ns, attr.ctime_ns, at, attr.symlink_target, attr.inline, attr.rdev]


def attr_of_row(row: Any, layouts: list[Layout]) -> Attr:
    """``attr_row``'s inverse; a malformed row raises ``ValueError``."""
    if type(row) is not list or len(row) != len(ATTR_ROW_FIELDS):
        raise ValueError("attribute row of the wrong shape")
    ino, typ, mode, nlink, uid, gid, size, atime, mtime, ctime, at, target, inline, rdev = row
    for v in (ino, typ, mode, nlink, uid, gid, size, atime, mtime, ctime, at, rdev):
        if type(v) is not int:
            raise ValueError("attribute row: a number field is not an integer")
    if type(target) is not str or type(inline) is not bool:
        raise ValueError("attribute row: bad symlink target or inline flag")
    if not -1 <= at < len(layouts):
        raise ValueError(f"attribute row: layout {at} of {len(layouts)}")
    return Attr(inode=ino, type=typ, mode=mode, nlink=nlink, uid=uid, gid=gid, size=size, atime_ns=atime,
                mtime_ns=mtime, ctime_ns=ctime, layout=layouts[at] if at >= 0 else None, symlink_target=target,
                inline=inline, rdev=rdev)


def attr_bytes_max(attr: Attr) -> int:
    """An upper bound on ``attr``'s msgpack size (cheap: no encoding)."""
    n = _ATTR_BYTES_FIXED + 4 * len(attr.symlink_target) + 5
    if attr.layout is not None:
        n += INDEX_BYTES_MAX * len(attr.layout.chains)
    return n


INDEXED_ATTR_OVERHEAD_BYTES = len(msgpack.packb(IndexedAttr(index=_U64).to_wire())) + 5

# PUT_MANY and UNLINK_MANY answer every item they are sent: the worst reply must fit
assert BATCH_ITEMS_MAX * (ITEM_ERROR_BYTES_MAX + INDEX_BYTES_MAX) <= REPLY_BODY_BYTES_MAX
