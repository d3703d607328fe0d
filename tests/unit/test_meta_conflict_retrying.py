"""meta wraps its namespace in ``ConflictRetrying`` only on an engine whose writes may lose a
conflict (PostgreSQL); on SQLite the services call the namespace itself."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any, cast

from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.perm_cost import _OneChain
from loomfs.meta.service import ConflictRetrying, conflict_retrying
from loomfs.meta.store.postgres import PostgresStore
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.wire.types import Layout


def test_sqlite_namespace_is_not_wrapped_postgres_is(tmp_path: Path) -> None:
    assert PostgresStore.conflicts_possible and not SqliteStore.conflicts_possible

    async def go() -> None:
        store = SqliteStore(str(tmp_path / "m.db"))
        ns = Namespace(store, routing=cast(Any, _OneChain()), rng=random.Random(1),
                       default_layout=Layout(table_id=1, inline_max_bytes=65536))
        try:
            assert conflict_retrying(ns) is ns
            store.conflicts_possible = True  # as an engine with conflicts
            live = conflict_retrying(ns)
            assert isinstance(live, ConflictRetrying)
            await ns.init()
            assert (await live.mkdir("/d")).inode > 1  # calls pass through
        finally:
            await store.close()

    asyncio.run(go())
