# ruff: noqa: F811  (the fixtures imported from test_meta_inline, used as arguments)
"""The migration claim of inline files (``InlineData.claim_owner``): two meta processes over
one store (two ``Namespace`` objects, each with its own trimmer owner) never let a
migration's copy of old content land after the other moved the file to chunks. A model of
the chunks stands in for storage (no sockets)."""

from __future__ import annotations

import asyncio
import errno
import os
import random
from typing import Any

import pytest
from test_meta_inline import WritingChunks, chunks, env, put, row  # noqa: F401  (fixtures)
from test_meta_namespace import Env

from loomfs.meta.ops.inline import Patch
from loomfs.meta.service import Namespace
from loomfs.meta.trim import Trimmer

CHUNKED_TRUNC = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


@pytest.fixture
def other(env: Env, chunks: WritingChunks) -> Namespace:
    """A second meta process over the same store: its own migrations, its own trim owner."""
    ns = Namespace(env.store, routing=env.routing, clock=env.clock, rng=random.Random(8),
                   default_layout=env.ns.default_layout, chunk_writer=chunks)
    ns.trimmer = Trimmer(env.store, chunks, clock=env.clock, owner=0x2222, wait_s=0.0)
    return ns


def test_an_o_trunc_to_chunks_on_another_meta_waits_for_the_migrations_copy(
    env: Env, other: Namespace, chunks: WritingChunks,
) -> None:
    """PostgreSQL hunt, session 14: a migration on one meta copied the old content while an
    O_TRUNC in chunks arrived at another, which waited only for its own migrations: its cut
    came before the copy landed, and an extend then read the old bytes past the new end."""
    old = b"S" * 100
    inode = put(env, "/f", old).attr.inode  # type: ignore[attr-defined]
    tasks: list[asyncio.Task[Any]] = []

    async def rewrite_elsewhere() -> None:
        tasks.append(asyncio.ensure_future(other.open("/f", CHUNKED_TRUNC, chunked=True, client_id=3)))
        for _ in range(5):  # it runs as far as it can before the copy lands
            await asyncio.sleep(0)

    chunks.before_write.append(rewrite_elsewhere())
    attr, _ = env.run(env.ns.migrate(inode))
    assert not attr.inline
    o = env.run(tasks[0])
    env.run(other.close(inode, o.session_id, 0, trunc_epoch=o.trunc_epoch))
    env.run(other.setattr("/f", size=100))  # an extend: zeros, never the old content
    assert chunks.read(inode, 0, 100) == bytes(100)
    assert env.run(env.ns.stat("/f")).size == 100


def test_two_metas_migrating_one_file_copy_it_once(env: Env, other: Namespace, chunks: WritingChunks) -> None:
    """The second meta's migration waits for the first's claim and finds the file in chunks;
    before, it cut and copied again, and a copy landing after the writers' first bytes
    overwrote them with the old content."""
    inode = put(env, "/f", b"m" * 300).attr.inode  # type: ignore[attr-defined]
    tasks: list[asyncio.Task[Any]] = []

    async def migrate_elsewhere() -> None:
        tasks.append(asyncio.ensure_future(other.migrate(inode)))
        for _ in range(5):
            await asyncio.sleep(0)

    chunks.before_write.append(migrate_elsewhere())
    env.run(env.ns.migrate(inode))
    attr, _ = env.run(tasks[0])
    assert not attr.inline
    assert [c for c in chunks.calls if c[0] == "write"] == [("write", inode, 0, 300)]
    assert env.ns.migrations_total + other.migrations_total == 1


def test_a_patch_elsewhere_keeps_the_claim_and_the_migration_copies_again(
    env: Env, other: Namespace, chunks: WritingChunks,
) -> None:
    inode = put(env, "/f", b"a" * 10).attr.inode  # type: ignore[attr-defined]
    seen: list[Any] = []

    async def patch_elsewhere() -> None:
        w = await other.write_inline(inode, 0, [Patch(0, b"B")])
        assert w.applied
        async with env.store.read() as t:
            seen.append(await t.get_inline(inode))

    chunks.before_write.append(patch_elsewhere())
    attr, _ = env.run(env.ns.migrate(inode))
    assert not attr.inline
    assert seen[0].claim_owner == env.ns.migration_owner and seen[0].claim_until_ns > env.clock.now_ns()
    assert chunks.read(inode, 0, 10) == b"B" + b"a" * 9  # the second round's copy


def test_a_hung_copy_fences_every_move_to_chunks_until_its_claim_runs_out(
    env: Env, other: Namespace, chunks: WritingChunks,
) -> None:
    """A copy with no answer may still land: neither this meta (a second migration) nor
    another (an O_TRUNC in chunks) moves the file until the claim's time has passed."""
    inode = put(env, "/f", b"h" * 50).attr.inode  # type: ignore[attr-defined]
    env.ns.migration_copy_timeout_s = 0.01
    env.ns.migration_wait_s = other.migration_wait_s = 0.0
    never = asyncio.Event()
    chunks.before_write.append(never.wait())
    assert env.err(env.ns.migrate(inode)) == errno.EIO
    r = row(env, inode)
    assert r is not None and r.claim_owner == 0 and r.claim_until_ns > env.clock.now_ns()
    chunks.before_write.clear()
    assert env.err(other.open("/f", CHUNKED_TRUNC, chunked=True, client_id=3)) == errno.EAGAIN
    assert env.err(env.ns.migrate(inode)) == errno.EAGAIN
    assert env.run(env.ns.read("/f"))[1] == b"h" * 50  # inline and whole meanwhile
    w = env.run(other.write_inline(inode, 0, [Patch(50, b"!")]))  # patches never wait for a fence
    assert w.applied
    env.clock.advance(env.ns.migration_claim_s + 1)
    o = env.run(other.open("/f", CHUNKED_TRUNC, chunked=True, client_id=3))
    assert not o.attr.inline and o.attr.size == 0


def test_a_failed_copy_drops_the_claim(env: Env, other: Namespace, chunks: WritingChunks) -> None:
    inode = put(env, "/f", b"x" * 20).attr.inode  # type: ignore[attr-defined]
    chunks.fail_writes = True
    assert env.err(env.ns.migrate(inode)) == errno.EIO
    r = row(env, inode)
    assert r is not None and r.claim_until_ns == 0 and r.chunks_dirty  # no write in flight: no fence
    chunks.fail_writes = False
    attr, _ = env.run(other.migrate(inode))  # another meta goes on at once (and cuts first)
    assert not attr.inline and chunks.read(inode, 0, 20) == b"x" * 20
