"""PostgreSQL engine, the SQL side: one transaction's methods.

Reads are prepared statements (asyncpg caches them per connection), one round trip each.
Writes that answer nothing (put, delete, touch, add) are not sent at once: they are kept as
SQL with their values written out as literals (``_lit``: integers, booleans, NULL, quoted
text under ``standard_conforming_strings``, hex bytea) and go to the server in one message
with whatever comes next: the next read of this transaction, or the COMMIT. A create (inode,
entry, parent touch, counters) then costs one round trip for all its writes and the commit.
A deferred write that fails, fails the COMMIT (``CommitFailed``: nothing stored).

``loomfs.meta.store.postgres`` owns the connections, isolation and retries.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from loomfs.meta.store.base import (
    DentryRow,
    GcEntry,
    InlineData,
    MetaTxn,
    TrimEntry,
    decode_layout,
    encode_layout,
)
from loomfs.wire.types import Attr, FileType

if TYPE_CHECKING:
    from loomfs.meta.store.postgres import PostgresStore

_INODE_COLS = "id, type, mode, nlink, uid, gid, size, atime_ns, mtime_ns, ctime_ns, layout, symlink, inline, rdev"
_GET_INODE = f"SELECT {_INODE_COLS} FROM inodes WHERE id = $1"
_GET_INODES = f"SELECT {_INODE_COLS} FROM inodes WHERE id = ANY($1::bigint[])"
_PUT_INODE = (
    f"INSERT INTO inodes ({_INODE_COLS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14) "
    "ON CONFLICT (id) DO UPDATE SET type = excluded.type, mode = excluded.mode, nlink = excluded.nlink, "
    "uid = excluded.uid, gid = excluded.gid, size = excluded.size, atime_ns = excluded.atime_ns, "
    "mtime_ns = excluded.mtime_ns, ctime_ns = excluded.ctime_ns, layout = excluded.layout, "
    "symlink = excluded.symlink, inline = excluded.inline, rdev = excluded.rdev"
)
_TOUCH = "UPDATE inodes SET mtime_ns = $1, ctime_ns = $2, nlink = nlink + $3 WHERE id = $4"
_LOOKUP = "SELECT inode, type FROM dentries WHERE parent = $1 AND name = $2"
# the entries along a path, one round trip: depth i is names[i] in the directory of depth i-1
_LOOKUP_PATH = (
    "WITH RECURSIVE w(depth, inode, type) AS ("
    " SELECT 1, d.inode, d.type FROM dentries d WHERE d.parent = $1 AND d.name = ($2::text[])[1]"
    " UNION ALL"
    " SELECT w.depth + 1, d.inode, d.type FROM w JOIN dentries d"
    " ON d.parent = w.inode AND d.name = ($2::text[])[w.depth + 1]"
    f" WHERE w.type = {int(FileType.DIRECTORY)} AND w.depth < cardinality($2::text[])"
    ") SELECT depth, inode, type FROM w ORDER BY depth"
)
_LIST = "SELECT name, inode, type FROM dentries WHERE parent = $1 AND name > $2 ORDER BY name LIMIT $3"
_PUT_DENTRY = (
    "INSERT INTO dentries (parent, name, inode, type) VALUES ($1,$2,$3,$4) "
    "ON CONFLICT (parent, name) DO UPDATE SET inode = excluded.inode, type = excluded.type"
)
_PUT_INLINE = (
    "INSERT INTO inline_data (inode, data, crc, version, chunks_dirty, claim_owner, claim_until_ns) "
    "VALUES ($1,$2,$3,$4,$5,$6,$7) "
    "ON CONFLICT (inode) DO UPDATE SET data = excluded.data, crc = excluded.crc, "
    "version = excluded.version, chunks_dirty = excluded.chunks_dirty, claim_owner = excluded.claim_owner, "
    "claim_until_ns = excluded.claim_until_ns"
)
_PUT_XATTR = (
    "INSERT INTO xattrs (inode, name, value) VALUES ($1,$2,$3) "
    "ON CONFLICT (inode, name) DO UPDATE SET value = excluded.value"
)
# sum() of bigints is a numeric: held within int64 before the cast (bytes_used of thousands of
# 1 PiB sparse files passed it, and every STATFS failed; review, session 14)
_COUNTERS = (
    "SELECT name, greatest(least(sum(v), 9223372036854775807), -9223372036854775808)::bigint FROM ("
    " SELECT name, delta AS v FROM counter_deltas"
    " UNION ALL"
    " SELECT i.name, coalesce(s.last_value, 0) FROM id_counters i JOIN pg_sequences s"
    " ON s.schemaname = current_schema() AND s.sequencename = i.seq"
    ") x GROUP BY name"
)
_ADD_SESSION = (
    "INSERT INTO sessions (inode, session_id, client_id, opened_ns) VALUES ($1,$2,$3,$4) "
    "ON CONFLICT (inode, session_id) DO UPDATE SET client_id = excluded.client_id, opened_ns = excluded.opened_ns"
)
_ADD_HOLD = (
    "INSERT INTO holds (inode, hold_id, client_id, opened_ns) VALUES ($1,$2,$3,$4) "
    "ON CONFLICT (inode, hold_id) DO UPDATE SET client_id = excluded.client_id, opened_ns = excluded.opened_ns"
)
_ORPHANS_UNHELD = (
    "SELECT inode FROM orphans o WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.inode = o.inode) "
    "AND NOT EXISTS (SELECT 1 FROM holds h WHERE h.inode = o.inode) ORDER BY since_ns LIMIT $1"
)
_GC_COLS = "inode, layout, length, enqueued_ns"
_GC_PUT = (
    f"INSERT INTO gc_queue ({_GC_COLS}) VALUES ($1,$2,$3,$4) ON CONFLICT (inode) DO UPDATE SET "
    "layout = excluded.layout, length = excluded.length, enqueued_ns = excluded.enqueued_ns"
)
_GC_DUE = (
    f"SELECT {_GC_COLS} FROM gc_queue g WHERE enqueued_ns <= $1 "
    "AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.inode = g.inode) ORDER BY enqueued_ns LIMIT $2"
)
_TRIM_COLS = "inode, layout, length, old_length, idle, generation, enqueued_ns, claim_owner, claim_until_ns"
_TRIM_PUT = (
    f"INSERT INTO trim_queue ({_TRIM_COLS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9) ON CONFLICT (inode) DO UPDATE SET "
    "layout = excluded.layout, length = excluded.length, old_length = excluded.old_length, "
    "idle = excluded.idle, generation = excluded.generation, enqueued_ns = excluded.enqueued_ns, "
    "claim_owner = excluded.claim_owner, claim_until_ns = excluded.claim_until_ns"
)
_TRIM_DUE = (
    f"SELECT {_TRIM_COLS} FROM trim_queue t WHERE claim_until_ns <= $1 "
    "AND (NOT idle OR NOT EXISTS (SELECT 1 FROM sessions s WHERE s.inode = t.inode)) "
    "ORDER BY enqueued_ns LIMIT $2"
)
_TRUNC_PUT = (
    "INSERT INTO trunc_epochs (inode, epoch) VALUES ($1,$2) ON CONFLICT (inode) DO UPDATE SET epoch = excluded.epoch"
)


def _attr(row: Any) -> Attr:
    return Attr(
        inode=row[0], type=row[1], mode=row[2], nlink=row[3], uid=row[4], gid=row[5], size=row[6],
        atime_ns=row[7], mtime_ns=row[8], ctime_ns=row[9], layout=decode_layout(row[10]),
        symlink_target=row[11], inline=row[12], rdev=row[13],
    )


_PARAM = re.compile(r"\$(\d+)")


def _lit(v: object) -> str:
    """``v`` as an SQL literal (standard_conforming_strings is on: backslashes are plain)."""
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(int(v))
    if isinstance(v, str):
        if "\x00" in v:
            raise ValueError("a NUL character cannot be stored in a PostgreSQL text value")
        return "'" + v.replace("'", "''") + "'"
    if isinstance(v, bytes | bytearray | memoryview):
        return "'\\x" + bytes(v).hex() + "'::bytea"
    raise TypeError(f"no SQL literal for {type(v).__name__}")


def render(sql: str, args: Sequence[object]) -> str:
    """``sql`` with its ``$n`` parameters replaced by literals of ``args`` (one pass)."""
    return _PARAM.sub(lambda m: _lit(args[int(m.group(1)) - 1]), sql)


def _count(status: str) -> int:
    """Rows touched, from a command tag such as ``DELETE 3``."""
    return int(status.rsplit(" ", 1)[-1])


class ReadOnlyTxn(RuntimeError):
    pass


class PostgresTxn(MetaTxn):
    __slots__ = ("_conn", "_writable", "_store", "added", "pending")

    def __init__(self, conn: Any, writable: bool, store: PostgresStore):
        self._conn = conn
        self._writable = writable
        self._store = store
        self.added: set[str] = set()  # counters this transaction added to
        self.pending: list[str] = []  # deferred writes, rendered (sent with the next read or COMMIT)

    def _defer(self, sql: str, *args: object) -> None:
        if not self._writable:
            raise ReadOnlyTxn("write inside a read transaction")
        self.pending.append(render(sql, args))

    async def flush(self) -> None:
        if self.pending:
            sql = ";".join(self.pending)
            self.pending.clear()
            await self._conn.execute(sql)

    async def _r(self) -> Any:
        if self.pending:
            await self.flush()
        return self._conn

    async def _w(self) -> Any:
        """The connection for a write that answers something (sent now)."""
        if not self._writable:
            raise ReadOnlyTxn("write inside a read transaction")
        return await self._r()

    async def get_inode(self, inode: int) -> Attr | None:
        row = await (await self._r()).fetchrow(_GET_INODE, inode)
        return None if row is None else _attr(row)

    async def get_inodes(self, inodes: Sequence[int]) -> dict[int, Attr]:
        ids = list(inodes)
        if not ids:
            return {}
        return {row[0]: _attr(row) for row in await (await self._r()).fetch(_GET_INODES, ids)}

    async def get_perms(self, inodes: Sequence[int]) -> dict[int, tuple[int, int, int, int]]:
        ids = list(inodes)
        if not ids:
            return {}
        rows = await (await self._r()).fetch(
            "SELECT id, type, mode, uid, gid FROM inodes WHERE id = ANY($1::bigint[])", ids)
        return {r[0]: (r[1], r[2], r[3], r[4]) for r in rows}

    async def put_inode(self, attr: Attr) -> None:
        self._defer(
            _PUT_INODE, attr.inode, attr.type, attr.mode, attr.nlink, attr.uid, attr.gid, attr.size,
            attr.atime_ns, attr.mtime_ns, attr.ctime_ns, encode_layout(attr.layout), attr.symlink_target,
            bool(attr.inline), attr.rdev,
        )

    async def touch_inode(self, inode: int, *, mtime_ns: int, ctime_ns: int, nlink_delta: int = 0) -> None:
        self._defer(_TOUCH, mtime_ns, ctime_ns, nlink_delta, inode)

    async def delete_inode(self, inode: int) -> None:
        self._defer("DELETE FROM inodes WHERE id = $1", inode)
        self._defer("DELETE FROM xattrs WHERE inode = $1", inode)

    # extended attributes --------------------------------------------------------------------

    async def get_xattr(self, inode: int, name: bytes) -> bytes | None:
        v = await (await self._r()).fetchval(
            "SELECT value FROM xattrs WHERE inode = $1 AND name = $2", inode, bytes(name))
        return None if v is None else bytes(v)

    async def list_xattrs(self, inode: int) -> list[tuple[bytes, int]]:
        rows = await (await self._r()).fetch(
            "SELECT name, octet_length(value) FROM xattrs WHERE inode = $1 ORDER BY name", inode)
        return [(bytes(r[0]), int(r[1])) for r in rows]

    async def put_xattr(self, inode: int, name: bytes, value: bytes) -> None:
        self._defer(_PUT_XATTR, inode, bytes(name), bytes(value))

    async def delete_xattr(self, inode: int, name: bytes) -> bool:
        status = await (await self._w()).execute(
            "DELETE FROM xattrs WHERE inode = $1 AND name = $2", inode, bytes(name))
        return _count(status) > 0

    async def get_inline(self, inode: int) -> InlineData | None:
        row = await (await self._r()).fetchrow(
            "SELECT data, crc, version, chunks_dirty, claim_owner, claim_until_ns FROM inline_data "
            "WHERE inode = $1", inode)
        return None if row is None else InlineData(bytes(row[0]), row[1], row[2], row[3], row[4], row[5])

    async def put_inline(self, inode: int, inline: InlineData) -> None:
        self._defer(_PUT_INLINE, inode, bytes(inline.data), inline.crc, inline.version,
                    bool(inline.chunks_dirty), inline.claim_owner, inline.claim_until_ns)

    async def delete_inline(self, inode: int) -> None:
        self._defer("DELETE FROM inline_data WHERE inode = $1", inode)

    async def lookup(self, parent: int, name: str) -> DentryRow | None:
        row = await (await self._r()).fetchrow(_LOOKUP, parent, name)
        return None if row is None else DentryRow(name, row[0], row[1])

    async def lookup_path(self, parent: int, names: Sequence[str]) -> list[DentryRow]:
        if len(names) < 2:
            return await super().lookup_path(parent, names)
        rows = await (await self._r()).fetch(_LOOKUP_PATH, parent, list(names))
        return [DentryRow(names[r[0] - 1], r[1], r[2]) for r in rows]

    async def list_dentries(self, parent: int, after: str, limit: int) -> list[DentryRow]:
        return [DentryRow(r[0], r[1], r[2]) for r in await (await self._r()).fetch(_LIST, parent, after, limit)]

    async def has_dentries(self, parent: int) -> bool:
        return await (await self._r()).fetchval("SELECT 1 FROM dentries WHERE parent = $1 LIMIT 1", parent) is not None

    async def put_dentry(self, parent: int, name: str, inode: int, type: int) -> None:
        self._defer(_PUT_DENTRY, parent, name, inode, type)

    async def delete_dentry(self, parent: int, name: str) -> None:
        self._defer("DELETE FROM dentries WHERE parent = $1 AND name = $2", parent, name)

    # counters -----------------------------------------------------------------------------

    async def next_id(self, counter: str) -> int:
        if not self._writable:
            raise ReadOnlyTxn("write inside a read transaction")
        seq = await self._store.id_sequence(counter)
        base = self._store.id_base.get(counter)
        if base is None:
            base = int(await (await self._r()).fetchval(
                "SELECT coalesce(sum(delta), 0)::bigint FROM counter_deltas WHERE name = $1", counter))
            if counter not in self.added:  # committed data only: safe to keep
                self._store.id_base[counter] = base
        return base + int(await self._conn.fetchval("SELECT nextval($1::regclass)", seq))

    async def add_counter(self, name: str, delta: int) -> None:
        self._defer("INSERT INTO counter_deltas (name, delta) VALUES ($1, $2)", name, delta)
        self.added.add(name)
        self._store.id_base.pop(name, None)
        self._store.counter_rows_added += 1

    async def counters(self) -> dict[str, int]:
        return {r[0]: int(r[1]) for r in await (await self._r()).fetch(_COUNTERS)}

    # sessions -----------------------------------------------------------------------------

    async def add_session(self, inode: int, session_id: int, client_id: int, opened_ns: int) -> None:
        self._defer(_ADD_SESSION, inode, session_id, client_id, opened_ns)

    async def session_client(self, inode: int, session_id: int) -> int | None:
        v = await (await self._r()).fetchval(
            "SELECT client_id FROM sessions WHERE inode = $1 AND session_id = $2", inode, session_id)
        return None if v is None else int(v)

    async def renew_sessions(self, client_id: int, session_ids: Sequence[int], now_ns: int) -> int:
        conn = await self._w()
        ids = list(session_ids)
        n = _count(await conn.execute(
            "UPDATE sessions SET opened_ns = $1 WHERE client_id = $2 AND session_id = ANY($3::bigint[])",
            now_ns, client_id, ids))
        return n + _count(await conn.execute(
            "UPDATE holds SET opened_ns = $1 WHERE client_id = $2 AND hold_id = ANY($3::bigint[])",
            now_ns, client_id, ids))

    async def expire_sessions(self, renewed_before_ns: int, limit: int) -> list[tuple[int, int, int]]:
        conn = await self._w()
        rows = list(await conn.fetch(
            "DELETE FROM sessions WHERE (inode, session_id) IN "
            "(SELECT inode, session_id FROM sessions WHERE opened_ns < $1 LIMIT $2) "
            "RETURNING inode, session_id, client_id", renewed_before_ns, limit))
        rows += await conn.fetch(
            "DELETE FROM holds WHERE (inode, hold_id) IN "
            "(SELECT inode, hold_id FROM holds WHERE opened_ns < $1 LIMIT $2) "
            "RETURNING inode, hold_id, client_id", renewed_before_ns, limit)
        return [(int(a), int(b), int(c)) for a, b, c in rows]

    async def remove_session(self, inode: int, session_id: int) -> bool:
        status = await (await self._w()).execute(
            "DELETE FROM sessions WHERE inode = $1 AND session_id = $2", inode, session_id)
        return _count(status) > 0

    async def has_session(self, inode: int) -> bool:
        return await (await self._r()).fetchval("SELECT 1 FROM sessions WHERE inode = $1 LIMIT 1", inode) is not None

    async def session_count(self, inode: int) -> int:
        return int(await (await self._r()).fetchval("SELECT count(*) FROM sessions WHERE inode = $1", inode))

    async def remove_client_sessions(self, client_id: int) -> int:
        conn = await self._w()
        n = _count(await conn.execute("DELETE FROM sessions WHERE client_id = $1", client_id))
        return n + _count(await conn.execute("DELETE FROM holds WHERE client_id = $1", client_id))

    # read holds and orphans ---------------------------------------------------------------

    async def add_hold(self, inode: int, hold_id: int, client_id: int, opened_ns: int) -> None:
        self._defer(_ADD_HOLD, inode, hold_id, client_id, opened_ns)

    async def remove_hold(self, inode: int, hold_id: int) -> bool:
        status = await (await self._w()).execute("DELETE FROM holds WHERE inode = $1 AND hold_id = $2", inode, hold_id)
        return _count(status) > 0

    async def holders(self, inode: int) -> int:
        return int(await (await self._r()).fetchval(
            "SELECT (SELECT count(*) FROM sessions WHERE inode = $1) + (SELECT count(*) FROM holds WHERE inode = $1)",
            inode))

    async def orphan_put(self, inode: int, since_ns: int) -> None:
        self._defer("INSERT INTO orphans (inode, since_ns) VALUES ($1,$2) "
                    "ON CONFLICT (inode) DO UPDATE SET since_ns = excluded.since_ns", inode, since_ns)

    async def orphan_since(self, inode: int) -> int | None:
        v = await (await self._r()).fetchval("SELECT since_ns FROM orphans WHERE inode = $1", inode)
        return None if v is None else int(v)

    async def orphan_delete(self, inode: int) -> None:
        self._defer("DELETE FROM orphans WHERE inode = $1", inode)

    async def orphans_unheld(self, limit: int) -> list[int]:
        return [int(r[0]) for r in await (await self._r()).fetch(_ORPHANS_UNHELD, limit)]

    async def orphan_list(self, after: int, limit: int) -> list[tuple[int, int]]:
        rows = await (await self._r()).fetch(
            "SELECT inode, since_ns FROM orphans WHERE inode > $1 ORDER BY inode LIMIT $2", after, limit)
        return [(int(a), int(b)) for a, b in rows]

    # GC queue -----------------------------------------------------------------------------

    async def gc_put(self, entry: GcEntry) -> None:
        self._defer(_GC_PUT, entry.inode, encode_layout(entry.layout), entry.length, entry.enqueued_ns)

    async def gc_get(self, inode: int) -> GcEntry | None:
        row = await (await self._r()).fetchrow(f"SELECT {_GC_COLS} FROM gc_queue WHERE inode = $1", inode)
        return None if row is None else _gc(row)

    async def gc_due(self, enqueued_before_ns: int, limit: int) -> list[GcEntry]:
        return [_gc(r) for r in await (await self._r()).fetch(_GC_DUE, enqueued_before_ns, limit)]

    async def gc_delete(self, inode: int) -> None:
        self._defer("DELETE FROM gc_queue WHERE inode = $1", inode)

    async def gc_count(self) -> int:
        return int(await (await self._r()).fetchval("SELECT count(*) FROM gc_queue"))

    # truncate epochs, trim queue ----------------------------------------------------------

    async def trunc_epoch(self, inode: int) -> int:
        v = await (await self._r()).fetchval("SELECT epoch FROM trunc_epochs WHERE inode = $1", inode)
        return 0 if v is None else int(v)

    async def set_trunc_epoch(self, inode: int, epoch: int) -> None:
        if epoch:
            self._defer(_TRUNC_PUT, inode, epoch)
        else:
            self._defer("DELETE FROM trunc_epochs WHERE inode = $1", inode)

    async def trim_put(self, entry: TrimEntry) -> None:
        self._defer(
            _TRIM_PUT, entry.inode, encode_layout(entry.layout), entry.length, entry.old_length,
            bool(entry.idle), entry.generation, entry.enqueued_ns, entry.claim_owner, entry.claim_until_ns)

    async def trim_get(self, inode: int) -> TrimEntry | None:
        row = await (await self._r()).fetchrow(f"SELECT {_TRIM_COLS} FROM trim_queue WHERE inode = $1", inode)
        return None if row is None else _trim(row)

    async def trim_due(self, now_ns: int, limit: int) -> list[TrimEntry]:
        return [_trim(r) for r in await (await self._r()).fetch(_TRIM_DUE, now_ns, limit)]

    async def trim_delete(self, inode: int) -> None:
        self._defer("DELETE FROM trim_queue WHERE inode = $1", inode)

    async def trim_count(self) -> int:
        return int(await (await self._r()).fetchval("SELECT count(*) FROM trim_queue"))

    async def scan_inodes(self, after: int, limit: int) -> list[Attr]:
        rows = await (await self._r()).fetch(
            f"SELECT {_INODE_COLS} FROM inodes WHERE id > $1 ORDER BY id LIMIT $2", after, limit)
        return [_attr(row) for row in rows]

    async def state_get(self, key: str) -> bytes | None:
        v = await (await self._r()).fetchval("SELECT value FROM worker_state WHERE key = $1", key)
        return None if v is None else bytes(v)

    async def state_put(self, key: str, value: bytes) -> None:
        self._defer("INSERT INTO worker_state (key, value) VALUES ($1, $2) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value", key, bytes(value))

    async def state_delete(self, key: str) -> None:
        self._defer("DELETE FROM worker_state WHERE key = $1", key)

    async def state_list(self, prefix: str) -> list[tuple[str, bytes]]:
        rows = await (await self._r()).fetch(
            "SELECT key, value FROM worker_state WHERE left(key, $1) = $2 ORDER BY key", len(prefix), prefix)
        return [(str(r[0]), bytes(r[1])) for r in rows]


def _trim(row: Any) -> TrimEntry:
    layout = decode_layout(row[1])
    assert layout is not None
    return TrimEntry(row[0], layout, row[2], row[3], bool(row[4]), row[5], row[6], row[7], row[8])


def _gc(row: Any) -> GcEntry:
    layout = decode_layout(row[1])
    assert layout is not None
    return GcEntry(row[0], layout, row[2], row[3])
