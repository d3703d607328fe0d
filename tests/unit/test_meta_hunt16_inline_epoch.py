"""Hunt 16 (meta removes or cuts data it must keep): a writer of an inline file learns the
file's truncate epoch from WRITE_INLINE (``applied=False``: the file is in chunks now) and from
MIGRATE, and then writes chunks at that epoch. Rule 1 of ``loomfs.meta.trim``: every reply that
hands a writer the current epoch settles the file's pending truncate trim first; otherwise the
trim, cut later (by the GC, or the next call that settles), cuts bytes the writer wrote after it
learnt the epoch and reported at it (an fsync that answered OK). Chunk model, SQLite in memory,
ManualClock, no sockets."""

from __future__ import annotations

import os

from test_meta_inline import LIMIT, WritingChunks, chunks, env  # noqa: F401 - fixtures: the writing chunk model, an inline Env over it
from test_meta_namespace import CREAT, Env
from test_meta_trim import _gc

from loomfs.meta.ops.inline import Patch
from loomfs.meta.store.base import TrimEntry

W = os.O_WRONLY
MIB = 1 << 20


async def _trim(env: Env, inode: int) -> TrimEntry | None:  # noqa: F811
    async with env.store.read() as t:
        return await t.trim_get(inode)


def _inline_writer_then_chunks_then_crashed_truncate(env: Env, chunks: WritingChunks) -> tuple[int, int]:  # noqa: F811
    """An inline writer W (still open); the file moves to chunks and grows to 3 MiB; a truncate
    to 1 MiB commits on a meta that dies before it cuts (the trim stays queued). Returns
    (inode, W's session)."""
    w = env.run(env.ns.open("/f", CREAT, client_id=1))
    ino = w.attr.inode
    assert w.attr.inline and w.trunc_epoch == 0
    assert env.run(env.ns.write_inline(ino, w.session_id, [Patch(0, b"hello")])).applied
    env.run(env.ns.migrate(ino))  # another writer's append past the limit, say
    x = env.run(env.ns.open("/f", W, client_id=2))
    chunks.write(ino, 0, b"x" * (3 * MIB))
    env.run(env.ns.close(ino, x.session_id, 3 * MIB, trunc_epoch=x.trunc_epoch))
    trimmer = env.ns.trimmer
    env.ns.trimmer = None  # the meta that truncates dies between its commit and its cut
    r = env.run(env.ns.setattr("/f", size=MIB))
    assert r.trunc_epoch == 1 and env.run(_trim(env, ino)) is not None
    env.ns.trimmer = trimmer  # the meta W talks to now
    return ino, w.session_id


def test_write_inline_on_a_file_in_chunks_settles_the_pending_trim_first(env: Env, chunks: WritingChunks) -> None:  # noqa: F811
    ino, sid = _inline_writer_then_chunks_then_crashed_truncate(env, chunks)
    rsp = env.run(env.ns.write_inline(ino, sid, [Patch(2 * MIB, b"late!")]))
    assert not rsp.applied and rsp.trunc_epoch == 1  # W now writes chunks, at epoch 1
    chunks.write(ino, 2 * MIB, b"late!")
    attr = env.run(env.ns.sync(ino, 2 * MIB + 5, trunc_epoch=rsp.trunc_epoch))  # fsync: OK
    assert attr is not None and attr.size == 2 * MIB + 5
    env.run(_gc(env, chunks, env.ns.trimmer).run_once())  # type: ignore[arg-type]
    assert env.run(_trim(env, ino)) is None
    assert chunks.read(ino, 2 * MIB, 5) == b"late!", "the late trim cut bytes written and fsync'd after it"
    assert chunks.read(ino, MIB, 8) == bytes(8)  # the truncate's cut: the old bytes are gone


def test_migrate_of_a_file_in_chunks_settles_the_pending_trim_first(env: Env, chunks: WritingChunks) -> None:  # noqa: F811
    ino, sid = _inline_writer_then_chunks_then_crashed_truncate(env, chunks)
    _attr, epoch = env.run(env.ns.migrate(ino))  # W's write goes past the limit: MIGRATE
    assert epoch == 1
    chunks.write(ino, 2 * MIB, b"late!")
    attr = env.run(env.ns.close(ino, sid, 2 * MIB + 5, trunc_epoch=epoch))
    assert attr is not None and attr.size == 2 * MIB + 5
    env.run(_gc(env, chunks, env.ns.trimmer).run_once())  # type: ignore[arg-type]
    assert chunks.read(ino, 2 * MIB, 5) == b"late!", "the late trim cut bytes written and reported after it"
    assert chunks.read(ino, MIB, 8) == bytes(8)
