"""Persistent mgmtd state: one row per record in a small SQLite (WAL) database.

The single-mgmtd mode (one process). Several mgmtd processes share a PostgreSQL store
instead (``loomfs.mgmtd.pgstore``, docs/mgmtd-ha.md); both save the rows ``encode_rows`` makes.

Heartbeat times are not persisted: after a restart every known node gets a fresh lease,
so a restarted mgmtd keeps serving the routing it had.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgpack

from loomfs.mgmtd.state import ChainRecord, ClusterState, NodeRecord, TableRecord, TargetRecord

SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (kind TEXT NOT NULL, id INTEGER NOT NULL, value BLOB NOT NULL,
                               PRIMARY KEY (kind, id));
"""

logger = logging.getLogger(__name__)

_NOT_PERSISTED = frozenset({"scrub"})  # reported with every heartbeat


class MgmtdStore:
    def __init__(self, url: str):
        prefix = "sqlite:///"
        if not url.startswith(prefix):
            raise ValueError(f"mgmtd store supports sqlite:/// URLs, got {url!r}")
        self.path = url[len(prefix):]
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        if self.path != ":memory:":  # at rest: 0600 before SQLite opens it (-wal/-shm follow)
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
            os.chmod(self.path, 0o600)
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)

    def load(self, state: ClusterState, now_s: float) -> None:
        decode_rows(self._db.execute("SELECT kind, id, value FROM kv").fetchall(), state, now_s)

    def save(self, state: ClusterState) -> None:
        rows = encode_rows(state)
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM kv")
            self._db.executemany("INSERT INTO kv (kind, id, value) VALUES (?, ?, ?)", rows)

    def close(self) -> None:
        self._db.close()


Row = tuple[str, int, bytes]


def decode_rows(rows: Iterable[Sequence[Any]], state: ClusterState, now_s: float) -> None:
    """Fill ``state`` from saved rows (both stores). The version comes back bumped: a new
    incarnation (a restart, or a standby taking over) always advertises a newer version."""
    for kind, _id, blob in rows:
        v = msgpack.unpackb(blob)
        if kind == "node":
            state.nodes[v["node_id"]] = NodeRecord(v["node_id"], v["kind"], v["host"], v["port"],
                                                   v["state"], now_s, v.get("draining", False),
                                                   v.get("metrics_port", 0), domain=v.get("domain", ""))
        elif kind == "target":
            known = {k: x for k, x in v.items() if k in TargetRecord.__slots__ and k not in _NOT_PERSISTED}
            t = state.targets[v["target_id"]] = TargetRecord(**known)
            if t.offline_since_s:
                t.offline_since_s = now_s  # monotonic times do not survive a restart
            if t.fenced_until_s:
                t.fenced_until_s = now_s + state.unreachable_hold_s
                t.last_fence_s = now_s
            elif t.last_fence_s:
                # the old process's reading: compared with this clock (which may be behind it, a
                # rebooted host or another mgmtd taking over) the quiet period that resets the
                # fence count would never pass, and every fence would double the hold again
                t.last_fence_s = now_s
            if t.revoke_deadline_s:  # leases granted by the last incarnation may still run
                t.revoke_deadline_s = now_s + state.lease_s
                t.revoke_acked = False
        elif kind == "chain":
            state.chains[v["chain_id"]] = ChainRecord(**v)
        elif kind == "table":
            known = {k: x for k, x in v.items() if k in TableRecord.__slots__}
            table = state.tables[v["table_id"]] = TableRecord(**known)
            if "ec" not in v and table.replicas == 1:
                # saved before tables said whether they are an EC group's: treated as replicated
                # (a target whose node is gone is kept, never swapped for an empty spare), the
                # choice that drops nothing; an EC table is marked again by the operator
                logger.warning("chain table %d (single replica) was saved before mgmtd recorded EC tables: treated "
                               "as replicated (a lost target is kept, never replaced by an empty spare); if it is "
                               "an EC group's table: loomfs admin table set-ec %d --yes", table.table_id,
                               table.table_id)
        elif kind == "accepted_losses":
            state.accepted_losses = int(v)
        elif kind == "version":
            state.version = v + 1  # a new incarnation always advertises a newer version
        elif kind == "revoked":  # token id -> until (wall-clock s): mgmtd.revoked
            state.revoked_tokens = {str(t): float(u) for t, u in v.items()}


def encode_rows(state: ClusterState) -> list[Row]:
    rows: list[Row] = [("version", 0, msgpack.packb(state.version))]
    rows += [("node", n.node_id, msgpack.packb({"node_id": n.node_id, "kind": n.kind, "host": n.host,
                                                 "port": n.port, "state": n.state,
                                                 "draining": n.draining,
                                                 "metrics_port": n.metrics_port, "domain": n.domain}))
             for n in state.nodes.values()]
    rows += [("target", t.target_id, msgpack.packb({f: getattr(t, f) for f in TargetRecord.__slots__
                                                     if f not in _NOT_PERSISTED}))
             for t in state.targets.values()]
    rows += [("chain", c.chain_id, msgpack.packb({f: getattr(c, f) for f in ChainRecord.__slots__}))
             for c in state.chains.values()]
    rows += [("table", t.table_id, msgpack.packb({f: getattr(t, f) for f in TableRecord.__slots__}))
             for t in state.tables.values()]
    if state.revoked_tokens:
        rows.append(("revoked", 0, msgpack.packb(state.revoked_tokens)))
    if state.accepted_losses:
        rows.append(("accepted_losses", 0, msgpack.packb(state.accepted_losses)))
    return rows
