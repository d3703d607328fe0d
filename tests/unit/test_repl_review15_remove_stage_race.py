"""Review of 161d9fc (session 15): "nothing re-creates a chunk while a removal of it is under
way" was checked once, when an update took the chunk's lock. An update of a *new* chunk that
took the lock just before the removal registered and was still staging (the file engine writes
a whole chunk on an I/O thread, an await) was not listed by the removal's wait for in-flight
updates (the chunk did not exist yet): the removal went down the chain, then the update was
staged, forwarded behind it and re-created the chunk on the successors, and the head, whose
own removal then listed the chunk, removed its copy: an orphan on some members only, for good.
Three real StorageServices over the simulated network, on virtual time."""

from __future__ import annotations

import asyncio
from typing import Any

from test_replication_defects import KEY, Chain3, run

from loomfs.errors import LoomError
from loomfs.wire.status import Status
from loomfs.wire.storage import REMOVE_CHUNKS, RemoveChunksReq


def _summary(c: Chain3, node: int) -> tuple[int, int, int] | None:
    st = c.engine(node).get(KEY)
    return None if st is None else (st.commit_ver, st.pending_ver if st.has_pending else 0, st.length)


def test_an_update_staging_when_a_removal_starts_does_not_recreate_the_chunk_behind_it() -> None:
    async def body(c: Chain3) -> None:
        head = c.nodes[0].service
        engine = c.engine(1)
        staging = asyncio.Event()
        release = asyncio.Event()
        staged = asyncio.Event()
        stage = engine.astage_write

        async def slow_stage(*args: Any, **kw: Any) -> Any:  # a whole-chunk write on an I/O thread
            staging.set()
            await release.wait()
            try:
                return await stage(*args, **kw)
            finally:
                staged.set()

        engine.astage_write = slow_stage
        forward = head._forward_chain

        async def forward_then_release(pos: Any, m: Any, *args: Any, **kw: Any) -> Any:
            out = await forward(pos, m, *args, **kw)
            if m == REMOVE_CHUNKS:  # the successors removed (nothing): now the head's stage ends
                release.set()
                await asyncio.wait_for(staged.wait(), 5)
            return out

        head._forward_chain = forward_then_release
        write = asyncio.ensure_future(c.write(1, 0, b"w" * 300))  # a late writer of the deleted file
        await asyncio.wait_for(staging.wait(), 5)
        rm = RemoveChunksReq(chain_id=1, chain_version=1, inode=KEY.inode, index_begin=0, index_end=1)
        await c.client.call(c.nodes[0].address, REMOVE_CHUNKS, rm)
        try:
            await write
        except LoomError as exc:
            assert exc.status in (Status.EAGAIN, Status.DEADLINE_EXCEEDED), exc
        summaries = {n: _summary(c, n) for n in (1, 2, 3)}
        assert len(set(summaries.values())) == 1, f"replicas differ after a removal: {summaries}"

    run(body)
