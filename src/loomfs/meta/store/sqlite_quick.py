"""Batch lookups on a SQLite connection: many names of one directory in one statement.

``entries(conn, parent, names, with_inline)`` answers, for the names of ``parent`` that are
clean hits, the entry's inode row as an ``Attr`` and (``with_inline``) its inline row: one
``SELECT`` joining ``dentries``, ``inodes`` and ``inline_data`` per ``NAMES_PER_STATEMENT``
names, where one ``lookup`` + ``get_inode`` + ``get_inline`` per name cost three statements
each. A name is left out (the caller resolves it the ordinary way, which answers it exactly)
when its entry is missing, is a symlink, disagrees with its inode about the type, or is an
inline file whose inline row is missing. The statement runs in the caller's transaction
(``SqliteStore.entries_in``): the same snapshot as the rest of its reads.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence

from loomfs.meta.store.base import InlineData
from loomfs.meta.store.sqlite_txn import _INODE_COLS, _attr
from loomfs.wire.types import Attr, FileType

NAMES_PER_STATEMENT = 500  # bound parameters per statement stay far under SQLite's limit
_LINK = int(FileType.SYMLINK)
_NCOLS = len(_INODE_COLS.split(","))


@functools.lru_cache(maxsize=64)
def entries_sql(n: int, with_inline: bool) -> str:
    """The statement for ``n`` names (cached: a handful of sizes recur)."""
    cols = ", ".join(f"i.{c.strip()}" for c in _INODE_COLS.split(","))
    extra = ", x.data, x.crc, x.version, x.chunks_dirty" if with_inline else ""
    join = " LEFT JOIN inline_data x ON x.inode = i.id" if with_inline else ""
    marks = ",".join("?" * n)
    return (f"SELECT d.name, d.type, {cols}{extra} FROM dentries d JOIN inodes i ON i.id = d.inode{join} "
            f"WHERE d.parent = ? AND d.name IN ({marks})")


def entries(conn: sqlite3.Connection, parent: int, names: Sequence[str],
            with_inline: bool) -> dict[str, tuple[Attr, InlineData | None]]:
    """Clean hits among ``names`` in directory ``parent`` (see the module docstring)."""
    out: dict[str, tuple[Attr, InlineData | None]] = {}
    unique = list(dict.fromkeys(names))
    for start in range(0, len(unique), NAMES_PER_STATEMENT):
        part = unique[start : start + NAMES_PER_STATEMENT]
        for row in conn.execute(entries_sql(len(part), with_inline), (parent, *part)):
            dtype = row[1]
            if dtype == _LINK or dtype != row[3]:
                continue
            attr = _attr(row[2 : 2 + _NCOLS])
            inline = None
            if with_inline and attr.inline:
                data = row[2 + _NCOLS]
                if data is None:
                    continue  # the walk's path reports it (EIO)
                inline = InlineData(bytes(data), row[3 + _NCOLS], row[4 + _NCOLS], bool(row[5 + _NCOLS]))
            out[row[0]] = (attr, inline)
    return out
