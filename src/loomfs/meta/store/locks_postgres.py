"""The lock tables on PostgreSQL (``loomfs.meta.store.locks_schema``, schema 5): the lock methods
of the store seam, on the engine's transaction (``PostgresStore`` hands out this subclass).
Writes run in the engine's SERIALIZABLE transactions: two meta servers granting overlapping
locks at once conflict, and one re-runs (``TxnConflict``)."""

from __future__ import annotations

from collections.abc import Sequence

from loomfs.meta.store.base import LockRow
from loomfs.meta.store.postgres_txn import PostgresTxn, _count

_LOCKS_ON = ("SELECT client_id, owner, type, first_byte, last_byte, pid FROM locks WHERE inode = $1 AND kind = $2 "
             "ORDER BY first_byte")
_LOCK_PUT = ("INSERT INTO locks (inode, kind, client_id, owner, first_byte, type, last_byte, pid) "
             "VALUES ($1,$2,$3,$4,$5,$6,$7,$8)")


class PostgresLockTxn(PostgresTxn):
    __slots__ = ()

    async def locks_on(self, inode: int, kind: int) -> list[LockRow]:
        rows = await (await self._r()).fetch(_LOCKS_ON, inode, kind)
        return [LockRow(*(int(v) for v in r)) for r in rows]

    async def locks_replace(self, inode: int, kind: int, client_id: int, owner: int,
                            rows: Sequence[LockRow]) -> None:
        conn = await self._w()
        await conn.execute("DELETE FROM locks WHERE inode = $1 AND kind = $2 AND client_id = $3 AND owner = $4",
                           inode, kind, client_id, owner)
        if rows:
            await conn.executemany(_LOCK_PUT, [(inode, kind, client_id, owner, r.first, r.type, r.last, r.pid)
                                               for r in rows])

    async def lock_clients_expiry(self, client_ids: Sequence[int]) -> dict[int, int]:
        ids = list(client_ids)
        if not ids:
            return {}
        rows = await (await self._r()).fetch(
            "SELECT client_id, expires_ns FROM lock_clients WHERE client_id = ANY($1::bigint[])", ids)
        return {int(r[0]): int(r[1]) for r in rows}

    async def lock_client_put(self, client_id: int, expires_ns: int) -> None:
        await (await self._w()).execute(
            "INSERT INTO lock_clients (client_id, expires_ns) VALUES ($1, $2) "
            "ON CONFLICT (client_id) DO UPDATE SET expires_ns = excluded.expires_ns", client_id, expires_ns)

    async def lock_client_drop(self, client_id: int) -> int:
        conn = await self._w()
        await conn.execute("DELETE FROM lock_clients WHERE client_id = $1", client_id)
        return _count(await conn.execute("DELETE FROM locks WHERE client_id = $1", client_id))

    async def lock_clients_expired(self, now_ns: int, limit: int) -> list[int]:
        rows = await (await self._r()).fetch(
            "SELECT client_id FROM lock_clients WHERE expires_ns <= $1 ORDER BY expires_ns LIMIT $2", now_ns, limit)
        return [int(r[0]) for r in rows]
