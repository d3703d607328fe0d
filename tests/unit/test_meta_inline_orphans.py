"""An inline file unlinked while its writer holds it: the writer's last WRITE_INLINE with
close drops the nameless file in that transaction (as CLOSE does), not at GC's next sweep."""

from __future__ import annotations

import os

from test_meta_namespace import CREAT, Env

from loomfs.meta.ops.inline import Patch


def _orphans(env: Env) -> list[int]:
    async def go() -> list[int]:
        async with env.store.read() as t:
            return [i for i, _ in await t.orphan_list(0, 100)]
    return env.run(go())


def test_last_inline_write_with_close_drops_the_orphan() -> None:
    env = Env(inline_max_bytes=4096)
    try:
        o = env.run(env.ns.open("/w", CREAT | os.O_WRONLY | os.O_TRUNC, client_id=7))
        assert o.session_id and o.attr.inline
        ino = o.attr.inode
        env.run(env.ns.unlink("/w"))
        assert _orphans(env) == [ino]  # nameless, held by its writer
        w = env.run(env.ns.write_inline(ino, o.session_id, [Patch(0, b"last bytes")], close=True))
        assert w.applied
        assert _orphans(env) == []
        assert env.run(env.ns.getattr_inode(ino)) is None  # dropped with the writer's close
        # a file that still has its name is only closed
        o2 = env.run(env.ns.open("/v", CREAT | os.O_WRONLY | os.O_TRUNC, client_id=7))
        env.run(env.ns.write_inline(o2.attr.inode, o2.session_id, [Patch(0, b"kept")], close=True))
        assert env.run(env.ns.read("/v"))[1] == b"kept" and _orphans(env) == []
    finally:
        env.close()
