"""READ_MANY's light lookup on a SQLite connection: the inline files among many names of one
directory, without building their attributes.

``inline_files(txn, parent, names, who)`` answers, for the names of ``parent`` that are
plain inline files the caller may read, their content and its CRC32C (checked against the
stored one here, as ``meta.ops.inline.check_crc`` does): one ``SELECT`` of the columns a read
needs (``dentries`` joined with ``inodes`` and ``inline_data``) per ``NAMES_PER_STATEMENT``
names. ``sqlite_quick.entries`` answers the same rows as an ``Attr`` and an ``InlineData``
each (~5 us of Python a file, most of a batch read of small files: KV-cache index entries);
here a hit is a tuple. Everything else (a missing name, a directory, a symlink, a file in
chunks, a type mismatch, a permission refusal, inline data missing or failing its CRC) is left
out: the caller answers those items the ordinary way, which gives exactly the single call's
answer (its error, its attributes). The statement runs in the caller's transaction (the same
snapshot as the rest of its reads); None for a transaction of another engine.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import crc32c

from loomfs.common.identity import Identity
from loomfs.meta.store.sqlite_txn import SqliteTxn
from loomfs.wire.types import FileType

NAMES_PER_STATEMENT = 500  # bound parameters per statement stay far under SQLite's limit
_FILE = int(FileType.FILE)
_R = 4  # the read bit of a mode's rwx triple


@functools.lru_cache(maxsize=64)
def inline_sql(n: int) -> str:
    """The statement for ``n`` names (cached: a handful of sizes recur)."""
    marks = ",".join("?" * n)
    return ("SELECT d.name, i.mode, i.uid, i.gid, x.data, x.crc FROM dentries d JOIN inodes i ON i.id = d.inode "
            "JOIN inline_data x ON x.inode = i.id "
            f"WHERE d.parent = ? AND d.name IN ({marks}) AND d.type = {_FILE} AND i.type = {_FILE} AND i.inline != 0")


def _may_read(mode: int, uid: int, gid: int, who: Identity) -> bool:
    """``perm.allowed(attr, who, R)`` for a regular file, from its columns."""
    if who.uid == 0:
        return True
    bits = mode >> 6 if who.uid == uid else mode >> 3 if (gid == who.gid or gid in who.groups) else mode
    return bool(bits & _R)


def inline_files(txn: Any, parent: int, names: Sequence[str], who: Identity) -> dict[str, tuple[bytes, int]] | None:
    """name -> (content, CRC32C) for the plain inline files among ``names`` in directory
    ``parent`` that ``who`` may read (see the module docstring); None: not a SQLite transaction."""
    if not isinstance(txn, SqliteTxn):
        return None
    conn = txn._c  # noqa: SLF001  (this engine's own connection, as sqlite_quick uses it)
    out: dict[str, tuple[bytes, int]] = {}
    unique = list(dict.fromkeys(names))
    root = who.uid == 0
    crc = crc32c.crc32c
    for start in range(0, len(unique), NAMES_PER_STATEMENT):
        part = unique[start : start + NAMES_PER_STATEMENT]
        for name, mode, uid, gid, data, stored in conn.execute(inline_sql(len(part)), (parent, *part)):
            if data is None or (not root and not _may_read(mode, uid, gid, who)):
                continue
            data = bytes(data)
            if crc(data) != stored:
                continue  # the ordinary path reports it (EIO) and logs the store's corruption
            out[name] = (data, stored)
    return out
