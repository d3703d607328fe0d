"""The lock tables on SQLite (``loomfs.meta.store.locks_schema``, schema 6): the lock methods of
the store seam, on the engine's transaction (``SqliteStore`` hands out this subclass)."""

from __future__ import annotations

from collections.abc import Sequence

from loomfs.meta.store.base import LockRow
from loomfs.meta.store.sqlite_txn import SqliteTxn

_LOCKS_ON = ("SELECT client_id, owner, type, first_byte, last_byte, pid FROM locks WHERE inode = ? AND kind = ? "
             "ORDER BY first_byte")
_LOCK_PUT = ("INSERT OR REPLACE INTO locks (inode, kind, client_id, owner, first_byte, type, last_byte, pid) "
             "VALUES (?,?,?,?,?,?,?,?)")


class SqliteLockTxn(SqliteTxn):
    __slots__ = ()

    async def locks_on(self, inode: int, kind: int) -> list[LockRow]:
        return [LockRow(*r) for r in self._c.execute(_LOCKS_ON, (inode, kind))]

    async def locks_replace(self, inode: int, kind: int, client_id: int, owner: int,
                            rows: Sequence[LockRow]) -> None:
        c = self._w()
        c.execute("DELETE FROM locks WHERE inode = ? AND kind = ? AND client_id = ? AND owner = ?",
                  (inode, kind, client_id, owner))
        c.executemany(_LOCK_PUT, [(inode, kind, client_id, owner, r.first, r.type, r.last, r.pid) for r in rows])

    async def lock_clients_expiry(self, client_ids: Sequence[int]) -> dict[int, int]:
        ids = list(client_ids)
        out: dict[int, int] = {}
        for i in range(0, len(ids), 500):
            part = ids[i : i + 500]
            sql = f"SELECT client_id, expires_ns FROM lock_clients WHERE client_id IN ({','.join('?' * len(part))})"
            out.update((int(a), int(b)) for a, b in self._c.execute(sql, part))
        return out

    async def lock_client_put(self, client_id: int, expires_ns: int) -> None:
        self._w().execute("INSERT OR REPLACE INTO lock_clients (client_id, expires_ns) VALUES (?,?)",
                          (client_id, expires_ns))

    async def lock_client_drop(self, client_id: int) -> int:
        c = self._w()
        c.execute("DELETE FROM lock_clients WHERE client_id = ?", (client_id,))
        return int(c.execute("DELETE FROM locks WHERE client_id = ?", (client_id,)).rowcount)

    async def lock_clients_expired(self, now_ns: int, limit: int) -> list[int]:
        rows = self._c.execute("SELECT client_id FROM lock_clients WHERE expires_ns <= ? ORDER BY expires_ns LIMIT ?",
                               (now_ns, limit))
        return [int(r[0]) for r in rows]
