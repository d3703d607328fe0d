"""Wire maps the blocking API's caller-thread paths (``sync_fast``) build and read by hand,
without the message objects (their constructors and decoders cost microseconds of a small
call), and ``stat_result``: LoomFS attributes as an ``os.stat_result``."""

from __future__ import annotations

import os
import stat as stat_mod
from typing import Any

import crc32c

from loomfs.client.core import LAZY_FLAGS
from loomfs.client.inline import check_crc
from loomfs.wire.types import Attr, FileType

_TYPE_BITS: dict[int, int] = {FileType.FILE: stat_mod.S_IFREG, FileType.DIRECTORY: stat_mod.S_IFDIR,
              FileType.SYMLINK: stat_mod.S_IFLNK, FileType.FIFO: stat_mod.S_IFIFO,
              FileType.SOCKET: stat_mod.S_IFSOCK, FileType.CHAR_DEVICE: stat_mod.S_IFCHR,
              FileType.BLOCK_DEVICE: stat_mod.S_IFBLK}
STAT_BLKSIZE_BYTES = 1 << 20  # st_blksize, as the mount answers (tools size buffers by it)


def _path_body(p: str, follow_symlinks: bool) -> dict[str, Any]:
    """``wmeta.PathReq(path=p, follow_symlinks=...).to_wire()``, without the object (~0.5 us)."""
    return {"path": p, "follow_symlinks": follow_symlinks}


def _put_open_body(p: str, client_id: int, session_id: int, data: bytes) -> dict[str, Any]:
    """``wmeta.OpenReq(...).to_wire()`` of a put (a "w" create carrying its bytes), without
    the object: its constructor and encoder cost ~3 us of a put's client CPU."""
    return {"path": p, "flags": LAZY_FLAGS, "mode": 0o644, "uid": 0, "gid": 0, "client_id": client_id,
            "session_id": session_id, "data": data, "data_crc": crc32c.crc32c(data), "chunked": False}


def _stat_result_of_wire(a: object) -> os.stat_result | None:
    """``stat_result(Attr.from_wire(a))`` for an attribute map as meta sends it, without
    building the ``Attr`` (and its ``Layout``); None for anything else (a missing field, a
    field that is not an int): the caller decodes it whole, with its checks."""
    if type(a) is not dict:
        return None
    try:
        t, mode, inode, nlink, uid, gid, size = a["type"], a["mode"], a["inode"], a["nlink"], a["uid"], a["gid"], a["size"]
        at, mt, ct, rdev = a["atime_ns"], a["mtime_ns"], a["ctime_ns"], a["rdev"]
    except KeyError:
        return None
    if not (type(t) is int and type(mode) is int and type(inode) is int and type(nlink) is int
            and type(uid) is int and type(gid) is int and type(size) is int and type(at) is int
            and type(mt) is int and type(ct) is int and type(rdev) is int):
        return None
    return os.stat_result((
        _TYPE_BITS.get(t, 0) | (mode & 0o7777), inode, 0, nlink, uid, gid, size,
        at // 10**9, mt // 10**9, ct // 10**9, at / 1e9, mt / 1e9, ct / 1e9, at, mt, ct,
        STAT_BLKSIZE_BYTES, (size + 511) // 512, rdev,
    ))


def _inline_bytes_of_wire(p: str, body: dict[str, Any]) -> bytes | None:
    """A READ reply's bytes, undecoded, when it is an inline file's (checked against their
    CRC32C: EIO on a mismatch); None for anything else (decode it whole)."""
    data = body.get("data")
    attr = body.get("attr")
    crc = body.get("data_crc")
    if type(data) is not bytes or type(attr) is not dict or attr.get("type") != FileType.FILE or type(crc) is not int:
        return None
    return check_crc(p, data, crc)


def stat_result(a: Attr) -> os.stat_result:
    """LoomFS attributes as an ``os.stat_result`` (times in seconds and *_ns)."""
    mode = _TYPE_BITS.get(a.type, 0) | (a.mode & 0o7777)  # (FileType is an IntEnum: ints find it)
    return os.stat_result((
        mode, a.inode, 0, a.nlink, a.uid, a.gid, a.size,
        a.atime_ns // 10**9, a.mtime_ns // 10**9, a.ctime_ns // 10**9,
        a.atime_ns / 1e9, a.mtime_ns / 1e9, a.ctime_ns / 1e9,
        a.atime_ns, a.mtime_ns, a.ctime_ns,
        STAT_BLKSIZE_BYTES, (a.size + 511) // 512, a.rdev,  # st_blksize, st_blocks, st_rdev
    ))
