"""SQLite engine, the SQL side: the schema, its migrations, and one transaction's methods.

``loomfs.meta.store.sqlite`` owns the connections and when transactions begin and commit.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from loomfs.meta.store.base import (
    DentryRow,
    GcEntry,
    InlineData,
    MetaTxn,
    QuickHit,
    TrimEntry,
    decode_layout,
    encode_layout,
)
from loomfs.meta.store.locks_schema import sqlite_add_locks
from loomfs.wire.types import Attr, FileType

logger = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS inodes (
    id INTEGER PRIMARY KEY, type INTEGER NOT NULL, mode INTEGER NOT NULL, nlink INTEGER NOT NULL,
    uid INTEGER NOT NULL, gid INTEGER NOT NULL, size INTEGER NOT NULL, atime_ns INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL, layout BLOB, symlink TEXT NOT NULL,
    inline INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS inline_data (
    inode INTEGER PRIMARY KEY, data BLOB NOT NULL, crc INTEGER NOT NULL, version INTEGER NOT NULL,
    chunks_dirty INTEGER NOT NULL, claim_owner INTEGER NOT NULL DEFAULT 0,
    claim_until_ns INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS dentries (
    parent INTEGER NOT NULL, name TEXT NOT NULL, inode INTEGER NOT NULL, type INTEGER NOT NULL,
    PRIMARY KEY (parent, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sessions (
    inode INTEGER NOT NULL, session_id INTEGER NOT NULL, client_id INTEGER NOT NULL,
    opened_ns INTEGER NOT NULL, PRIMARY KEY (inode, session_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sessions_by_client ON sessions (client_id);
CREATE TABLE IF NOT EXISTS gc_queue (
    inode INTEGER PRIMARY KEY, layout BLOB, length INTEGER NOT NULL, enqueued_ns INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS gc_by_time ON gc_queue (enqueued_ns);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS trunc_epochs (inode INTEGER PRIMARY KEY, epoch INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS trim_queue (
    inode INTEGER PRIMARY KEY, layout BLOB, length INTEGER NOT NULL, old_length INTEGER NOT NULL,
    idle INTEGER NOT NULL, generation INTEGER NOT NULL, enqueued_ns INTEGER NOT NULL,
    claim_owner INTEGER NOT NULL, claim_until_ns INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS trim_by_time ON trim_queue (enqueued_ns);
"""

_INODE_COLS = "id, type, mode, nlink, uid, gid, size, atime_ns, mtime_ns, ctime_ns, layout, symlink, inline, rdev"
_GET_INODE = f"SELECT {_INODE_COLS} FROM inodes WHERE id = ?"
_PUT_INODE = f"INSERT OR REPLACE INTO inodes ({_INODE_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
_TOUCH = "UPDATE inodes SET mtime_ns = ?, ctime_ns = ?, nlink = nlink + ? WHERE id = ?"
_DEL_INODE = "DELETE FROM inodes WHERE id = ?"
_LOOKUP = "SELECT inode, type FROM dentries WHERE parent = ? AND name = ?"
LOOKUP_PATH_MAX = 16  # deeper paths: a statement per component (``MetaTxn.lookup_path``)
_DIR_TYPE = int(FileType.DIRECTORY)


@functools.cache
def _lookup_path_sql(n: int) -> str:
    """The entries along ``n`` names from ?1, as (inode, type) pairs; NULLs from the first
    name missing, or after the first entry that is not a directory."""
    cols = ", ".join(f"d{k}.inode, d{k}.type" for k in range(n))
    joins = " ".join(
        f"LEFT JOIN dentries d{k} ON d{k - 1}.type = {_DIR_TYPE} AND d{k}.parent = d{k - 1}.inode "
        f"AND d{k}.name = ?{k + 2}"
        for k in range(1, n)
    )
    return f"SELECT {cols} FROM dentries d0 {joins} WHERE d0.parent = ?1 AND d0.name = ?2"


@functools.cache
def quick_attr_sql(n: int, with_inline: bool, perms: bool) -> str:
    """``n`` entries along the names from ?1 (inner joins: no row unless all are there), their
    types, then the last one's inode row (and inline row), then (``perms``) the permission
    columns of ?1 and of the ``n - 1`` directories crossed: see ``MetaStore.quick_attr``."""
    types = ", ".join(f"d{k}.type" for k in range(n))
    joins = " ".join(f"JOIN dentries d{k} ON d{k}.parent = d{k - 1}.inode AND d{k}.name = ?{k + 2}"
                     for k in range(1, n))
    cols = ", ".join(f"i.{c.strip()}" for c in _INODE_COLS.split(","))
    extra = ", x.data, x.crc, x.version, x.chunks_dirty" if with_inline else ""
    inline_join = " LEFT JOIN inline_data x ON x.inode = i.id" if with_inline else ""
    perm_cols = perm_joins = ""
    if perms:
        dirs = ["r", *(f"p{k}" for k in range(n - 1))]
        perm_cols = "".join(f", {t}.type, {t}.mode, {t}.uid, {t}.gid" for t in dirs)
        perm_joins = " JOIN inodes r ON r.id = ?1" + "".join(
            f" JOIN inodes p{k} ON p{k}.id = d{k}.inode" for k in range(n - 1))
    return (f"SELECT {types}, {cols}{extra}{perm_cols} FROM dentries d0 {joins} JOIN inodes i ON i.id = d{n - 1}.inode"
            f"{inline_join}{perm_joins} WHERE d0.parent = ?1 AND d0.name = ?2")


def quick_attr_row(row: tuple[Any, ...] | None, n: int, follow_last: bool, with_inline: bool,
                   perms: bool) -> QuickHit | None:
    """``quick_attr_sql``'s row as ``MetaStore.quick_attr``'s answer (None: not a clean hit)."""
    if row is None:
        return None
    for k in range(n - 1):
        if row[k] != _DIR_TYPE:
            return None
    if follow_last and row[n - 1] == _LINK_TYPE:
        return None
    attr = _attr(row[n : n + 14])
    pos = n + 14
    inline = None
    if with_inline:
        if attr.inline:
            if row[pos] is None:
                return None  # an inline inode without its row: the walk's path reports it (EIO)
            inline = InlineData(bytes(row[pos]), row[pos + 1], row[pos + 2], bool(row[pos + 3]))
        pos += 4
    dirs = None
    if perms:
        dirs = [(row[pos + 4 * k], row[pos + 4 * k + 1], row[pos + 4 * k + 2], row[pos + 4 * k + 3])
                for k in range(n)]
    return QuickHit(attr, inline, dirs)


_LINK_TYPE = int(FileType.SYMLINK)
_LIST = "SELECT name, inode, type FROM dentries WHERE parent = ? AND name > ? ORDER BY name LIMIT ?"
_HAS = "SELECT 1 FROM dentries WHERE parent = ? LIMIT 1"
_PUT_DENTRY = "INSERT OR REPLACE INTO dentries (parent, name, inode, type) VALUES (?,?,?,?)"
_DEL_DENTRY = "DELETE FROM dentries WHERE parent = ? AND name = ?"
_NEXT_ID = "UPDATE counters SET value = value + 1 WHERE name = ? RETURNING value"
# CAST: a sum past int64 (SQLite would store it as a float for good) stays an integer, held
# at the int64 bound: bytes_used of thousands of 1 PiB sparse files (review, session 14)
_ADD_COUNTER = (
    "INSERT INTO counters (name, value) VALUES (?, ?) "
    "ON CONFLICT(name) DO UPDATE SET value = CAST(value + excluded.value AS INTEGER)"
)
_GC_DUE = (
    "SELECT inode, layout, length, enqueued_ns FROM gc_queue g WHERE enqueued_ns <= ? "
    "AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.inode = g.inode) "
    "ORDER BY enqueued_ns LIMIT ?"
)
_ORPHANS_UNHELD = (
    "SELECT inode FROM orphans o WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.inode = o.inode) "
    "AND NOT EXISTS (SELECT 1 FROM holds h WHERE h.inode = o.inode) ORDER BY since_ns LIMIT ?"
)
_TRIM_COLS = "inode, layout, length, old_length, idle, generation, enqueued_ns, claim_owner, claim_until_ns"
_TRIM_DUE = (
    f"SELECT {_TRIM_COLS} FROM trim_queue t WHERE claim_until_ns <= ? "
    "AND (idle = 0 OR NOT EXISTS (SELECT 1 FROM sessions s WHERE s.inode = t.inode)) "
    "ORDER BY enqueued_ns LIMIT ?"
)


def _attr(row: tuple[Any, ...]) -> Attr:
    return Attr(
        inode=row[0], type=row[1], mode=row[2], nlink=row[3], uid=row[4], gid=row[5], size=row[6],
        atime_ns=row[7], mtime_ns=row[8], ctime_ns=row[9], layout=decode_layout(row[10]),
        symlink_target=row[11], inline=bool(row[12]), rdev=row[13],
    )


class ReadOnlyTxn(sqlite3.Error):
    pass


class SqliteTxn(MetaTxn):
    __slots__ = ("_c", "_writable")

    def __init__(self, conn: sqlite3.Connection, writable: bool):
        self._c = conn
        self._writable = writable

    def _w(self) -> sqlite3.Connection:
        if not self._writable:
            raise ReadOnlyTxn("write inside a read transaction")
        if not self._c.in_transaction:  # SQLite dropped it (SQLITE_FULL...): never autocommit
            raise sqlite3.OperationalError("the write transaction was rolled back by an earlier error")
        return self._c

    async def get_inode(self, inode: int) -> Attr | None:
        row = self._c.execute(_GET_INODE, (inode,)).fetchone()
        return None if row is None else _attr(row)

    async def get_inodes(self, inodes: Sequence[int]) -> dict[int, Attr]:
        out: dict[int, Attr] = {}
        ids = list(inodes)
        for i in range(0, len(ids), 500):
            part = ids[i : i + 500]
            sql = f"SELECT {_INODE_COLS} FROM inodes WHERE id IN ({','.join('?' * len(part))})"
            for row in self._c.execute(sql, part):
                out[row[0]] = _attr(row)
        return out

    async def get_perms(self, inodes: Sequence[int]) -> dict[int, tuple[int, int, int, int]]:
        out: dict[int, tuple[int, int, int, int]] = {}
        ids = list(inodes)
        for i in range(0, len(ids), 500):
            part = ids[i : i + 500]
            sql = f"SELECT id, type, mode, uid, gid FROM inodes WHERE id IN ({','.join('?' * len(part))})"
            for ino, typ, mode, uid, gid in self._c.execute(sql, part):
                out[ino] = (typ, mode, uid, gid)
        return out

    async def put_inode(self, attr: Attr) -> None:
        self._w().execute(
            _PUT_INODE,
            (
                attr.inode, attr.type, attr.mode, attr.nlink, attr.uid, attr.gid, attr.size,
                attr.atime_ns, attr.mtime_ns, attr.ctime_ns, encode_layout(attr.layout),
                attr.symlink_target, int(attr.inline), attr.rdev,
            ),
        )

    async def get_inline(self, inode: int) -> InlineData | None:
        row = self._c.execute(
            "SELECT data, crc, version, chunks_dirty, claim_owner, claim_until_ns FROM inline_data WHERE inode = ?",
            (inode,),
        ).fetchone()
        return None if row is None else InlineData(bytes(row[0]), row[1], row[2], bool(row[3]), row[4], row[5])

    async def put_inline(self, inode: int, inline: InlineData) -> None:
        self._w().execute(
            "INSERT OR REPLACE INTO inline_data (inode, data, crc, version, chunks_dirty, claim_owner, claim_until_ns) "
            "VALUES (?,?,?,?,?,?,?)",
            (inode, inline.data, inline.crc, inline.version, int(inline.chunks_dirty), inline.claim_owner,
             inline.claim_until_ns),
        )

    async def delete_inline(self, inode: int) -> None:
        self._w().execute("DELETE FROM inline_data WHERE inode = ?", (inode,))

    async def touch_inode(self, inode: int, *, mtime_ns: int, ctime_ns: int, nlink_delta: int = 0) -> None:
        self._w().execute(_TOUCH, (mtime_ns, ctime_ns, nlink_delta, inode))

    async def delete_inode(self, inode: int) -> None:
        c = self._w()
        c.execute(_DEL_INODE, (inode,))
        c.execute("DELETE FROM xattrs WHERE inode = ?", (inode,))

    async def get_xattr(self, inode: int, name: bytes) -> bytes | None:
        row = self._c.execute("SELECT value FROM xattrs WHERE inode = ? AND name = ?", (inode, name)).fetchone()
        return None if row is None else bytes(row[0])

    async def list_xattrs(self, inode: int) -> list[tuple[bytes, int]]:
        rows = self._c.execute("SELECT name, length(value) FROM xattrs WHERE inode = ? ORDER BY name", (inode,))
        return [(bytes(n), int(size)) for n, size in rows]

    async def put_xattr(self, inode: int, name: bytes, value: bytes) -> None:
        self._w().execute("INSERT OR REPLACE INTO xattrs (inode, name, value) VALUES (?,?,?)",
                          (inode, bytes(name), bytes(value)))

    async def delete_xattr(self, inode: int, name: bytes) -> bool:
        return self._w().execute("DELETE FROM xattrs WHERE inode = ? AND name = ?", (inode, bytes(name))).rowcount > 0

    async def lookup(self, parent: int, name: str) -> DentryRow | None:
        row = self._c.execute(_LOOKUP, (parent, name)).fetchone()
        return None if row is None else DentryRow(name, row[0], row[1])

    async def lookup_path(self, parent: int, names: Sequence[str]) -> list[DentryRow]:
        """One statement for the whole path (a join per component; each next entry only under
        a directory): the same rows as one ``lookup`` per name, a fifth of the statements."""
        n = len(names)
        if n < 2 or n > LOOKUP_PATH_MAX:
            return await super().lookup_path(parent, names)
        row = self._c.execute(_lookup_path_sql(n), (parent, *names)).fetchone()
        out: list[DentryRow] = []
        if row is None:
            return out
        for k in range(n):
            inode = row[2 * k]
            if inode is None:
                break
            t = row[2 * k + 1]
            out.append(DentryRow(names[k], inode, t))
            if t != _DIR_TYPE:
                break
        return out

    async def list_dentries(self, parent: int, after: str, limit: int) -> list[DentryRow]:
        return [DentryRow(n, i, t) for n, i, t in self._c.execute(_LIST, (parent, after, limit))]

    async def has_dentries(self, parent: int) -> bool:
        return self._c.execute(_HAS, (parent,)).fetchone() is not None

    async def put_dentry(self, parent: int, name: str, inode: int, type: int) -> None:
        self._w().execute(_PUT_DENTRY, (parent, name, inode, type))

    async def delete_dentry(self, parent: int, name: str) -> None:
        self._w().execute(_DEL_DENTRY, (parent, name))

    async def next_id(self, counter: str) -> int:
        c = self._w()
        row = c.execute(_NEXT_ID, (counter,)).fetchone()
        if row is None:
            c.execute(_ADD_COUNTER, (counter, 1))
            return 1
        return int(row[0])

    async def add_counter(self, name: str, delta: int) -> None:
        self._w().execute(_ADD_COUNTER, (name, delta))

    async def counters(self) -> dict[str, int]:
        return {n: v for n, v in self._c.execute("SELECT name, value FROM counters")}

    async def add_session(self, inode: int, session_id: int, client_id: int, opened_ns: int) -> None:
        self._w().execute(
            "INSERT OR REPLACE INTO sessions (inode, session_id, client_id, opened_ns) VALUES (?,?,?,?)",
            (inode, session_id, client_id, opened_ns),
        )

    async def session_client(self, inode: int, session_id: int) -> int | None:
        row = self._c.execute(
            "SELECT client_id FROM sessions WHERE inode = ? AND session_id = ?", (inode, session_id)
        ).fetchone()
        return None if row is None else int(row[0])

    async def renew_sessions(self, client_id: int, session_ids: Sequence[int], now_ns: int) -> int:
        c = self._w()
        ids = list(session_ids)
        n = 0
        for i in range(0, len(ids), 500):
            part = ids[i : i + 500]
            marks = ",".join("?" * len(part))
            for table, col in (("sessions", "session_id"), ("holds", "hold_id")):
                sql = f"UPDATE {table} SET opened_ns = ? WHERE client_id = ? AND {col} IN ({marks})"
                n += c.execute(sql, [now_ns, client_id, *part]).rowcount
        return n

    async def expire_sessions(self, renewed_before_ns: int, limit: int) -> list[tuple[int, int, int]]:
        c = self._w()
        rows = c.execute(
            "DELETE FROM sessions WHERE (inode, session_id) IN "
            "(SELECT inode, session_id FROM sessions WHERE opened_ns < ? LIMIT ?) "
            "RETURNING inode, session_id, client_id",
            (renewed_before_ns, limit),
        ).fetchall()
        rows += c.execute(
            "DELETE FROM holds WHERE (inode, hold_id) IN "
            "(SELECT inode, hold_id FROM holds WHERE opened_ns < ? LIMIT ?) "
            "RETURNING inode, hold_id, client_id",
            (renewed_before_ns, limit),
        ).fetchall()
        return [(int(a), int(b), int(c)) for a, b, c in rows]

    async def remove_session(self, inode: int, session_id: int) -> bool:
        cur = self._w().execute(
            "DELETE FROM sessions WHERE inode = ? AND session_id = ?", (inode, session_id)
        )
        return cur.rowcount > 0

    async def has_session(self, inode: int) -> bool:
        row = self._c.execute("SELECT 1 FROM sessions WHERE inode = ? LIMIT 1", (inode,)).fetchone()
        return row is not None

    async def session_count(self, inode: int) -> int:
        return int(self._c.execute("SELECT COUNT(*) FROM sessions WHERE inode = ?", (inode,)).fetchone()[0])

    async def remove_client_sessions(self, client_id: int) -> int:
        c = self._w()
        n = c.execute("DELETE FROM sessions WHERE client_id = ?", (client_id,)).rowcount
        return n + c.execute("DELETE FROM holds WHERE client_id = ?", (client_id,)).rowcount

    async def add_hold(self, inode: int, hold_id: int, client_id: int, opened_ns: int) -> None:
        self._w().execute(
            "INSERT OR REPLACE INTO holds (inode, hold_id, client_id, opened_ns) VALUES (?,?,?,?)",
            (inode, hold_id, client_id, opened_ns),
        )

    async def remove_hold(self, inode: int, hold_id: int) -> bool:
        return self._w().execute("DELETE FROM holds WHERE inode = ? AND hold_id = ?", (inode, hold_id)).rowcount > 0

    async def holders(self, inode: int) -> int:
        row = self._c.execute(
            "SELECT (SELECT COUNT(*) FROM sessions WHERE inode = ?1) + (SELECT COUNT(*) FROM holds WHERE inode = ?1)",
            (inode,),
        ).fetchone()
        return int(row[0])

    async def orphan_put(self, inode: int, since_ns: int) -> None:
        self._w().execute("INSERT OR REPLACE INTO orphans (inode, since_ns) VALUES (?,?)", (inode, since_ns))

    async def orphan_since(self, inode: int) -> int | None:
        row = self._c.execute("SELECT since_ns FROM orphans WHERE inode = ?", (inode,)).fetchone()
        return None if row is None else int(row[0])

    async def orphan_delete(self, inode: int) -> None:
        self._w().execute("DELETE FROM orphans WHERE inode = ?", (inode,))

    async def orphans_unheld(self, limit: int) -> list[int]:
        return [int(r[0]) for r in self._c.execute(_ORPHANS_UNHELD, (limit,))]

    async def orphan_list(self, after: int, limit: int) -> list[tuple[int, int]]:
        rows = self._c.execute("SELECT inode, since_ns FROM orphans WHERE inode > ? ORDER BY inode LIMIT ?",
                               (after, limit))
        return [(int(a), int(b)) for a, b in rows]

    async def gc_put(self, entry: GcEntry) -> None:
        self._w().execute(
            "INSERT OR REPLACE INTO gc_queue (inode, layout, length, enqueued_ns) VALUES (?,?,?,?)",
            (entry.inode, encode_layout(entry.layout), entry.length, entry.enqueued_ns),
        )

    async def gc_get(self, inode: int) -> GcEntry | None:
        row = self._c.execute(
            "SELECT inode, layout, length, enqueued_ns FROM gc_queue WHERE inode = ?", (inode,)
        ).fetchone()
        return None if row is None else _gc(row)

    async def gc_due(self, enqueued_before_ns: int, limit: int) -> list[GcEntry]:
        return [_gc(r) for r in self._c.execute(_GC_DUE, (enqueued_before_ns, limit))]

    async def gc_delete(self, inode: int) -> None:
        self._w().execute("DELETE FROM gc_queue WHERE inode = ?", (inode,))

    async def gc_count(self) -> int:
        return int(self._c.execute("SELECT COUNT(*) FROM gc_queue").fetchone()[0])

    async def trunc_epoch(self, inode: int) -> int:
        row = self._c.execute("SELECT epoch FROM trunc_epochs WHERE inode = ?", (inode,)).fetchone()
        return 0 if row is None else int(row[0])

    async def set_trunc_epoch(self, inode: int, epoch: int) -> None:
        c = self._w()
        if epoch:
            c.execute("INSERT OR REPLACE INTO trunc_epochs (inode, epoch) VALUES (?,?)", (inode, epoch))
        else:
            c.execute("DELETE FROM trunc_epochs WHERE inode = ?", (inode,))

    async def trim_put(self, entry: TrimEntry) -> None:
        self._w().execute(
            f"INSERT OR REPLACE INTO trim_queue ({_TRIM_COLS}) VALUES (?,?,?,?,?,?,?,?,?)",
            (entry.inode, encode_layout(entry.layout), entry.length, entry.old_length, int(entry.idle),
             entry.generation, entry.enqueued_ns, entry.claim_owner, entry.claim_until_ns),
        )

    async def trim_get(self, inode: int) -> TrimEntry | None:
        row = self._c.execute(f"SELECT {_TRIM_COLS} FROM trim_queue WHERE inode = ?", (inode,)).fetchone()
        return None if row is None else _trim(row)

    async def trim_due(self, now_ns: int, limit: int) -> list[TrimEntry]:
        return [_trim(r) for r in self._c.execute(_TRIM_DUE, (now_ns, limit))]

    async def trim_delete(self, inode: int) -> None:
        self._w().execute("DELETE FROM trim_queue WHERE inode = ?", (inode,))

    async def trim_count(self) -> int:
        return int(self._c.execute("SELECT COUNT(*) FROM trim_queue").fetchone()[0])

    async def scan_inodes(self, after: int, limit: int) -> list[Attr]:
        rows = self._c.execute(f"SELECT {_INODE_COLS} FROM inodes WHERE id > ? ORDER BY id LIMIT ?", (after, limit))
        return [_attr(row) for row in rows]

    async def state_get(self, key: str) -> bytes | None:
        row = self._c.execute("SELECT value FROM worker_state WHERE key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    async def state_put(self, key: str, value: bytes) -> None:
        self._w().execute("INSERT OR REPLACE INTO worker_state (key, value) VALUES (?,?)", (key, bytes(value)))

    async def state_delete(self, key: str) -> None:
        self._w().execute("DELETE FROM worker_state WHERE key = ?", (key,))

    async def state_list(self, prefix: str) -> list[tuple[str, bytes]]:
        rows = self._c.execute("SELECT key, value FROM worker_state WHERE substr(key, 1, ?) = ? ORDER BY key",
                               (len(prefix), prefix))
        return [(k, bytes(v)) for k, v in rows]


def _trim(row: tuple[Any, ...]) -> TrimEntry:
    layout = decode_layout(row[1])
    assert layout is not None
    return TrimEntry(row[0], layout, row[2], row[3], bool(row[4]), row[5], row[6], row[7], row[8])


def _gc(row: tuple[Any, ...]) -> GcEntry:
    layout = decode_layout(row[1])
    assert layout is not None
    return GcEntry(row[0], layout, row[2], row[3])


SCHEMA_VERSION = 7  # PRAGMA user_version of a store this code wrote


class SchemaTooNew(sqlite3.DatabaseError):
    """The store was written by a newer LoomFS (its user_version is above ours)."""


def _create_tables(conn: sqlite3.Connection) -> None:
    for stmt in SCHEMA.split(";"):  # not executescript: that COMMITs first
        if stmt.strip():
            conn.execute(stmt)


def _add_inline_column(conn: sqlite3.Connection) -> None:
    cols = {row[1] for row in conn.execute("PRAGMA table_info(inodes)")}
    if "inline" not in cols:
        conn.execute("ALTER TABLE inodes ADD COLUMN inline INTEGER NOT NULL DEFAULT 0")
        logger.info("metastore: added the inodes.inline column")


def _add_worker_state(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS worker_state (key TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID")


def _add_xattrs_and_rdev(conn: sqlite3.Connection) -> None:
    """Extended attributes, and device numbers in their own column (they were decimal text
    in ``symlink`` before)."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS xattrs (inode INTEGER NOT NULL, name BLOB NOT NULL, value BLOB NOT NULL, "
        "PRIMARY KEY (inode, name)) WITHOUT ROWID"
    )
    cols = {row[1] for row in conn.execute("PRAGMA table_info(inodes)")}
    if "rdev" not in cols:
        conn.execute("ALTER TABLE inodes ADD COLUMN rdev INTEGER NOT NULL DEFAULT 0")
        moved = conn.execute(
            f"UPDATE inodes SET rdev = CAST(symlink AS INTEGER), symlink = '' WHERE type IN ({_DEVICE_TYPES}) "
            "AND symlink != '' AND length(symlink) <= 18 AND symlink NOT GLOB '*[^0-9]*'"
        ).rowcount
        logger.info("metastore: added the inodes.rdev column (%d device numbers moved)", moved)


def _add_holds_and_orphans(conn: sqlite3.Connection) -> None:
    """Read holds (leased like write sessions) and orphans (files open somewhere whose last
    name went): POSIX unlink-while-open across clients."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS holds (inode INTEGER NOT NULL, hold_id INTEGER NOT NULL, "
        "client_id INTEGER NOT NULL, opened_ns INTEGER NOT NULL, PRIMARY KEY (inode, hold_id)) WITHOUT ROWID"
    )
    conn.execute("CREATE INDEX IF NOT EXISTS holds_by_client ON holds (client_id)")
    conn.execute("CREATE TABLE IF NOT EXISTS orphans (inode INTEGER PRIMARY KEY, since_ns INTEGER NOT NULL)")


def _add_inline_claims(conn: sqlite3.Connection) -> None:
    """The migration claim of inline files (``InlineData.claim_owner``)."""
    cols = {row[1] for row in conn.execute("PRAGMA table_info(inline_data)")}
    for col in ("claim_owner", "claim_until_ns"):
        if col not in cols:
            conn.execute(f"ALTER TABLE inline_data ADD COLUMN {col} INTEGER NOT NULL DEFAULT 0")
    logger.info("metastore: inline_data has its migration claim columns")


_DEVICE_TYPES = f"{int(FileType.CHAR_DEVICE)}, {int(FileType.BLOCK_DEVICE)}"

# MIGRATIONS[n] brings a store at version n to n + 1 (version 1: the tables of SCHEMA
# without inline data; stores written before versioning carry user_version 0 and are
# brought up from whatever they hold, each step checking before it changes anything)
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _create_tables,  # 0 -> 1
    _add_inline_column,  # 1 -> 2: inline files
    _add_worker_state,  # 2 -> 3: background workers' progress (the EC rebuild)
    _add_xattrs_and_rdev,  # 3 -> 4: extended attributes, device numbers
    _add_holds_and_orphans,  # 4 -> 5: read holds, orphan inodes
    sqlite_add_locks,  # 5 -> 6: cross-client locks (flock, POSIX ranges), lock leases
    _add_inline_claims,  # 6 -> 7: inline files' migration claims (several meta processes)
]
assert len(MIGRATIONS) == SCHEMA_VERSION


def migrate_schema(conn: sqlite3.Connection) -> int:
    """Bring a store up to ``SCHEMA_VERSION`` (one transaction); returns the version found.
    A store at a newer version is refused (``SchemaTooNew``)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(f"metastore schema version {version}; this LoomFS knows up to {SCHEMA_VERSION}")
        for n in range(version, SCHEMA_VERSION):
            MIGRATIONS[n](conn)
        if version != SCHEMA_VERSION:
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return version
