"""Replication hunt (session 15): a chunk removal (REMOVE_CHUNKS, a deleted file's chunks) and
an update of the same chunk at the head. The head forwards a removal first and removes its own
copy last; an update that reached the head in between went down the chain behind the removal
and re-created the chunk on the successors, then the head removed its own copy: the replicas
disagreed for good (an orphan on some members only, which no resync or scrub ever
reconciles). Three real StorageServices over the simulated network, on virtual time."""

from __future__ import annotations

import asyncio

from test_client_lock_undo import until
from test_replication_defects import KEY, Chain3, run

from loomfs.errors import LoomError
from loomfs.wire.status import Status
from loomfs.wire.storage import REMOVE_CHUNKS, RemoveChunksReq


def _summary(c: Chain3, node: int) -> tuple[int, int, int] | None:
    st = c.engine(node).get(KEY)
    return None if st is None else (st.commit_ver, st.pending_ver if st.has_pending else 0, st.length)


def test_update_at_the_head_during_a_removal_leaves_the_replicas_equal() -> None:
    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"a" * 300)
        rm = RemoveChunksReq(chain_id=1, chain_version=1, inode=KEY.inode, index_begin=0, index_end=1)
        tail = c.nodes[2]
        tail_lock = tail.target.locks.hold(KEY)
        await tail_lock.__aenter__()  # the tail is busy with the chunk: the removal waits there
        removal = asyncio.ensure_future(c.client.call(c.nodes[0].address, REMOVE_CHUNKS, rm))
        await until(lambda: tail.service.being_removed(c.tid(3), KEY) and tail.target.locks.users(KEY) >= 2,
                     "the removal waits for the chunk's lock at the tail")
        assert not removal.done()
        write = asyncio.ensure_future(c.write(1, 0, b"b" * 200))  # a late writer of the deleted file
        # refused at the head (the fix), or (before it) gone down the chain to wait at the tail
        await until(lambda: write.done() or tail.target.locks.users(KEY) >= 3, "the write refused or queued")
        await tail_lock.__aexit__(None, None, None)
        await removal
        try:
            await write
        except LoomError as exc:
            assert exc.status in (Status.EAGAIN, Status.DEADLINE_EXCEEDED), exc
        summaries = {n: _summary(c, n) for n in (1, 2, 3)}
        assert len(set(summaries.values())) == 1, f"replicas differ after a removal: {summaries}"

    run(body)


def test_a_leftover_settled_during_a_removal_is_not_recreated_behind_it() -> None:
    """Simulator seed 303053 (profile "replace"): a write of a new chunk left its pending v1 at
    the head (the forward failed, the client timed out); the file was deleted and its chunks
    removed. While the removal, already done on the successors, waited to remove the head's own
    copy, the chain changed and the head settled its leftovers: it pushed v1 to the successors
    (re-creating the chunk there) and then removed its own copy."""

    async def body(c: Chain3) -> None:
        head = c.nodes[0].service
        c.engine(1).stage_write(KEY, 1, 0, b"late" * 50)  # a forward that failed: a leftover
        head._leftovers.setdefault(c.tid(1), set()).add(KEY)
        at_local_removal = asyncio.Event()
        go_on = asyncio.Event()
        quiet = head.foreground.quiet

        async def held_quiet(max_wait_s: float) -> None:  # the head is about to remove its own copy
            at_local_removal.set()
            await go_on.wait()
            await quiet(max_wait_s)

        head.foreground.quiet = held_quiet  # type: ignore[method-assign]
        rm = RemoveChunksReq(chain_id=1, chain_version=1, inode=KEY.inode, index_begin=0, index_end=1)
        removal = asyncio.ensure_future(c.client.call(c.nodes[0].address, REMOVE_CHUNKS, rm))
        await asyncio.wait_for(at_local_removal.wait(), 5)
        await head.settle_leftovers()  # after a chain change
        go_on.set()
        await removal
        summaries = {n: _summary(c, n) for n in (1, 2, 3)}
        assert len(set(summaries.values())) == 1, f"replicas differ after a removal: {summaries}"

    run(body)
