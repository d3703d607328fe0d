"""Tenant isolation in the namespace (``loomfs.meta.tenancy``): a tenant's token sees its own
tree as "/", cannot reach another tenant's inodes by path or by number. No sockets."""

from __future__ import annotations

import asyncio
import errno
import os
import random
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

import pytest
from test_perm import _OneChain

from loomfs.common.identity import TRUSTED, Identity, Right
from loomfs.meta import tenancy
from loomfs.meta.caller import acting_as
from loomfs.meta.ops.inline import Patch
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.wire.types import ROOT_INODE, Layout

T = TypeVar("T")
ACME = Identity(uid=1000, gid=1000, tenant="acme")
ACME_ROOT = Identity(uid=0, gid=0, tenant="acme")
BETA = Identity(uid=1000, gid=1000, tenant="beta")  # the same uid in another tenant


class Env:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.store = SqliteStore(":memory:")
        self.ns = Namespace(self.store, routing=_OneChain(), rng=random.Random(5),
                            default_layout=Layout(table_id=1, inline_max_bytes=4096))
        self.run(self.ns.init())
        tenancy._known.clear()  # a fresh store: numbers may repeat across tests

    def run(self, aw: Awaitable[T], who: Identity = TRUSTED) -> T:
        async def main() -> T:
            return await aw

        with acting_as(who):
            return self.loop.run_until_complete(main())

    def err(self, aw: Awaitable[Any], who: Identity) -> int:
        with pytest.raises(OSError) as ei:
            self.run(aw, who)
        return ei.value.errno or -1

    def put(self, path: str, data: bytes, who: Identity) -> Any:
        return self.run(self.ns.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, data=data), who).attr


@pytest.fixture
def env() -> Iterator[Env]:
    e = Env()
    yield e
    e.run(e.store.close())
    e.loop.close()
    tenancy._known.clear()


def test_tenants_see_their_own_tree(env: Env) -> None:
    acme = env.run(env.ns.create_tenant("acme", uid=1000, gid=1000))
    beta = env.run(env.ns.create_tenant("beta", uid=1000, gid=1000))
    assert (acme.number, beta.number) == (1, 2)
    assert env.run(env.ns.stat("/"), ACME).inode == tenancy.root_of(1) == acme.root.inode
    env.run(env.ns.mkdir("/data"), ACME)
    f = env.put("/data/f", b"acme's", ACME)
    assert tenancy.tenant_of(f.inode) == 1 and f.uid == 1000
    # beta: the same path is not there; its own file gets its own range
    assert env.err(env.ns.stat("/data/f"), BETA) == errno.ENOENT
    assert env.run(env.ns.readdir("/"), BETA) == ([], False)
    env.run(env.ns.mkdir("/data"), BETA)
    g = env.put("/data/f", b"beta's", BETA)
    assert tenancy.tenant_of(g.inode) == 2
    assert env.run(env.ns.read("/data/f"), ACME)[1] == b"acme's"
    assert env.run(env.ns.read("/data/f"), BETA)[1] == b"beta's"
    # the shared namespace (no tenant) sees neither
    assert env.err(env.ns.stat("/data"), TRUSTED) == errno.ENOENT
    assert [t.name for t in env.run(env.ns.list_tenants())] == ["acme", "beta"]


def test_no_way_out_of_the_tenant_root(env: Env) -> None:
    env.run(env.ns.create_tenant("acme", uid=1000, gid=1000))
    env.put("/outside", b"shared namespace", TRUSTED)
    env.run(env.ns.mkdir("/d"), ACME)
    env.run(env.ns.symlink("../../../..", "/d/up"), ACME)
    env.run(env.ns.symlink("/outside", "/d/abs"), ACME)
    assert env.run(env.ns.stat("/d/up"), ACME).inode == tenancy.root_of(1)  # '..' stops at its root
    assert env.err(env.ns.stat("/d/abs"), ACME) == errno.ENOENT  # '/' is its root
    assert env.err(env.ns.rmdir("/"), ACME_ROOT) == errno.EBUSY


def test_other_tenants_inodes_are_not_there_by_number(env: Env) -> None:
    env.run(env.ns.create_tenant("acme", uid=1000, gid=1000))
    env.run(env.ns.create_tenant("beta", uid=1000, gid=1000))
    o = env.run(env.ns.open("/f", os.O_CREAT | os.O_WRONLY, mode=0o666), BETA)
    ino, sid = o.attr.inode, o.session_id
    shared = env.put("/shared", b"s", TRUSTED)
    for victim in (ino, shared.inode, ROOT_INODE, tenancy.root_of(2)):
        assert env.err(env.ns.write_inline(victim, sid, [Patch(0, b"x")]), ACME) == errno.ENOENT
        assert env.err(env.ns.setattr("/", inode=victim, mode=0o777), ACME) == errno.ENOENT
        assert env.err(env.ns.migrate(victim), ACME) == errno.ENOENT
        assert env.err(env.ns.sync(victim, 5), ACME) == errno.ENOENT
        # extended attributes by number too (PostgreSQL hunt, session 14: not confined)
        assert env.err(env.ns.getxattr("", b"user.k", inode=victim), ACME) == errno.ENOENT
        assert env.err(env.ns.setxattr("", b"user.k", b"pwned", inode=victim), ACME) == errno.ENOENT
        assert env.err(env.ns.listxattr("", inode=victim), ACME) == errno.ENOENT
        assert env.err(env.ns.removexattr("", b"user.k", inode=victim), ACME) == errno.ENOENT
    assert env.run(env.ns.sessions_held(0, [(ino, sid)]), ACME) == [False]
    assert env.run(env.ns.write_inline(ino, sid, [Patch(0, b"ok")], close=True), BETA).applied
    assert env.run(env.ns.read("/f"), BETA)[1] == b"ok"


def test_tenant_admin_and_errors(env: Env) -> None:
    assert env.err(env.ns.stat("/"), ACME) == errno.EACCES  # a token for a tenant nobody created
    env.run(env.ns.create_tenant("acme", uid=1000, gid=1000, mode=0o700))
    assert env.err(env.ns.create_tenant("acme"), TRUSTED) == errno.EEXIST
    for bad in ("", ".x", "a/b", "x" * 65):
        assert env.err(env.ns.create_tenant(bad), TRUSTED) == errno.EINVAL
    other = Identity(uid=2000, gid=2000, tenant="acme")
    assert env.err(env.ns.mkdir("/x"), other) == errno.EACCES  # POSIX rules hold inside a tenant
    env.run(env.ns.mkdir("/x"), ACME_ROOT)  # the tenant's root user
    assert env.run(env.ns.stat("/x"), ACME).uid == 0
    assert env.err(env.ns.rename("/x", "/y"), other) == errno.EACCES
    assert tenancy.inode_in(3, 7) == (3 << 48) | 7
    with pytest.raises(OSError):
        tenancy.inode_in(3, 1 << 48)


def test_live_inodes_answers_for_every_tenant(env: Env) -> None:
    """fsck cannot walk tenants' trees from the shared root; it asks which inodes live."""
    env.run(env.ns.create_tenant("acme", uid=1000, gid=1000))
    f = env.put("/f", b"x", ACME)
    g = env.put("/g", b"y", TRUSTED)
    gone = env.put("/h", b"z", TRUSTED).inode
    env.run(env.ns.unlink("/h"))
    assert env.run(env.ns.live_inodes([f.inode, g.inode, gone, 1 << 60])) == [f.inode, g.inode]


def test_a_tenantless_user_reaches_only_the_shared_range_by_number(env: Env) -> None:
    """A tenant-less user token is confined to the shared namespace (tenant 0) for calls by
    inode number, as storage confines its chunk access; admins and services reach every inode."""
    env.run(env.ns.create_tenant("acme", uid=1000, gid=1000))
    o = env.run(env.ns.open("/f", os.O_CREAT | os.O_WRONLY, mode=0o666), ACME)
    ino, sid = o.attr.inode, o.session_id
    shared_user = Identity(uid=1000, gid=1000)  # no tenant, no ADMIN
    for victim in (ino, tenancy.root_of(1)):
        assert env.err(env.ns.write_inline(victim, sid, [Patch(0, b"x")]), shared_user) == errno.ENOENT
        assert env.err(env.ns.setattr("/", inode=victim, mode=0o777), shared_user) == errno.ENOENT
        assert env.err(env.ns.sync(victim, 5), shared_user) == errno.ENOENT
    env.run(env.ns.setattr("/", mode=0o777))  # (root's "/" is 0755)
    mine = env.put("/mine", b"m", shared_user)  # its own range still works by number
    env.run(env.ns.setattr("/", inode=mine.inode, mode=0o600), shared_user)
    admin = Identity(uid=0, gid=0, rights=Right.user() | Right.ADMIN)
    assert admin.privileged
    env.run(env.ns.setattr("/", inode=ino, mode=0o640), admin)
    assert env.run(env.ns.stat("/f"), ACME).mode & 0o777 == 0o640


def test_lock_calls_are_confined_to_the_callers_tenant(env: Env) -> None:
    """PostgreSQL hunt (session 14): the lock calls (by inode number) were not confined: a
    tenant's caller could lock, test or release locks on another tenant's or the shared
    namespace's files."""
    from loomfs.meta.service import MetaService
    from loomfs.net.rpc_base import CallContext
    from loomfs.wire import meta_lock as wl

    env.run(env.ns.create_tenant("acme", uid=1000, gid=1000))
    env.run(env.ns.create_tenant("beta", uid=1000, gid=1000))
    theirs = env.run(env.ns.open("/f", os.O_CREAT | os.O_WRONLY, mode=0o666), BETA).attr.inode
    shared = env.put("/shared", b"s", TRUSTED).inode
    mine = env.run(env.ns.open("/m", os.O_CREAT | os.O_WRONLY, mode=0o666), ACME).attr.inode
    svc = MetaService(env.ns)

    def ctx(who: Identity) -> CallContext:
        return CallContext(memoryview(b""), 1, "test", None, 0, who)

    def lock(inode: int) -> wl.LockReq:
        return wl.LockReq(inode=inode, client_id=7, owner=1, kind=1, type=1, first=0, last=10)

    for victim in (theirs, shared):
        assert env.err(svc.lock_set(lock(victim), ctx(ACME)), ACME) == errno.ENOENT
        assert env.err(svc.lock_get(lock(victim), ctx(ACME)), ACME) == errno.ENOENT
        rel = wl.LockReleaseReq(inode=victim, client_id=7, owner=1, kind=1)
        assert env.err(svc.lock_release(rel, ctx(ACME)), ACME) == errno.ENOENT
    assert env.run(svc.lock_set(lock(mine), ctx(ACME)), ACME).granted  # its own file: as before
    # a tenant's inode 1 is its own root (its mount's root is FUSE inode 1): the review of
    # f6f8021 found `flock` on a tenant mount's root refused
    mine_root = wl.LockReq(inode=ROOT_INODE, client_id=7, owner=1, kind=1, type=2, first=0, last=10)
    assert env.run(svc.lock_set(mine_root, ctx(ACME)), ACME).granted
    other = wl.LockReq(inode=ROOT_INODE, client_id=8, owner=2, kind=1, type=2, first=0, last=10)
    assert not env.run(svc.lock_set(other, ctx(ACME)), ACME).granted  # the same lock: held
    assert env.run(svc.lock_set(other, ctx(BETA)), BETA).granted  # beta's root is another inode
    shared_user = Identity(uid=1000, gid=1000)
    assert env.err(svc.lock_set(lock(mine), ctx(shared_user)), shared_user) == errno.ENOENT
    assert env.run(svc.lock_set(lock(shared), ctx(shared_user)), shared_user).granted
