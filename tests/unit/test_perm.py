"""``loomfs.meta.perm`` (pure rules, exhaustively where the space is small) and the namespace
paths the matrix in test_perm_matrix.py does not reach (inode calls, batches, exchange,
layouts, root squash, rights). No sockets."""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import random
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

import crc32c
import pytest

from loomfs.common.identity import TRUSTED, Identity, Right
from loomfs.errors import StatusError
from loomfs.meta import perm
from loomfs.meta.caller import acting_as, caller
from loomfs.meta.ops.batch import BatchOps, Failed, PutItem
from loomfs.meta.ops.inline import Patch
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.wire.types import Attr, FileType, Layout

T = TypeVar("T")
DIR = int(FileType.DIRECTORY)
FILE = int(FileType.FILE)

ROOT = Identity(uid=0, gid=0)
ALICE = Identity(uid=1000, gid=1000)
BOB = Identity(uid=1001, gid=1001, groups=(2000,))
NOBODY = Identity(uid=65534, gid=65534)


def _reference(mode: int, owner: int, group: int, who: Identity, want: int, is_dir: bool) -> bool:
    """POSIX, written independently: root needs an x bit somewhere to execute a file."""
    if who.uid == 0:
        if want & 1 and not is_dir:
            return any(mode & b for b in (0o100, 0o010, 0o001))
        return True
    if who.uid == owner:
        cls = (mode & 0o700) // 0o100
    elif group == who.gid or group in who.groups:
        cls = (mode & 0o070) // 0o010
    else:
        cls = mode & 0o007
    return all(cls & bit for bit in (4, 2, 1) if want & bit)


def test_allowed_matches_posix_for_every_mode_class_and_request() -> None:
    n = 0
    for mode in range(0o1000):
        for who in (ROOT, ALICE, BOB, NOBODY):
            for owner, group in ((1000, 1000), (1001, 2000), (0, 0)):
                for is_dir in (False, True):
                    attr = Attr(type=DIR if is_dir else FILE, mode=mode, uid=owner, gid=group)
                    for want in range(1, 8):
                        assert perm.allowed(attr, who, want) == _reference(mode, owner, group, who, want, is_dir), (
                            oct(mode), who, owner, group, want, is_dir)
                        n += 1
    assert n == 512 * 4 * 3 * 2 * 7


def test_open_bits() -> None:
    assert perm.open_bits(os.O_RDONLY) == perm.R
    assert perm.open_bits(os.O_WRONLY) == perm.W
    assert perm.open_bits(os.O_RDWR) == perm.R | perm.W
    assert perm.open_bits(os.O_RDONLY | os.O_TRUNC) == perm.R | perm.W


def test_search_stops_at_the_first_closed_directory() -> None:
    dirs = [Attr(type=DIR, mode=0o755), Attr(type=DIR, mode=0o700), Attr(type=DIR, mode=0o755)]
    perm.search(dirs, ROOT, "x")
    with pytest.raises(StatusError) as ei:
        perm.search(dirs, ALICE, "x")
    assert ei.value.errno == errno.EACCES


@pytest.mark.parametrize("parent_mode,parent_uid,victim_uid,who,code", [
    (0o1777, 0, 1000, ALICE, 0),  # owner of the victim
    (0o1777, 1001, 1000, BOB, 0),  # owner of the directory
    (0o1777, 0, 1000, BOB, errno.EPERM),
    (0o1777, 0, 1000, ROOT, 0),
    (0o0777, 0, 1000, BOB, 0),  # not sticky
    (0o1755, 0, 1000, ALICE, errno.EACCES),  # no write on the directory comes first
])
def test_may_delete_sticky(parent_mode: int, parent_uid: int, victim_uid: int, who: Identity, code: int) -> None:
    parent = Attr(type=DIR, mode=parent_mode, uid=parent_uid)
    victim = Attr(type=FILE, mode=0o644, uid=victim_uid)
    try:
        perm.may_delete(parent, victim, who, "x")
        got = 0
    except StatusError as exc:
        got = exc.errno or -1
    assert got == code


def test_new_owner_setgid_directory_and_group_membership() -> None:
    sgid = Attr(type=DIR, mode=0o2775, uid=0, gid=2000)
    plain = Attr(type=DIR, mode=0o777, uid=0, gid=0)
    assert perm.new_owner(sgid, ALICE, DIR, 0o755) == (1000, 2000, 0o2755)  # subdirectories stay setgid
    assert perm.new_owner(sgid, ALICE, FILE, 0o2755) == (1000, 2000, 0o755)  # not in group 2000: bit dropped
    assert perm.new_owner(sgid, BOB, FILE, 0o2755) == (1001, 2000, 0o2755)  # a member keeps it
    assert perm.new_owner(plain, NOBODY, FILE, 0o644) == (65534, 65534, 0o644)  # not uid 0 (issue 13)
    assert perm.new_owner(plain, ROOT, FILE, 0o2755) == (0, 0, 0o2755)


def test_chmod_and_chown_rules() -> None:
    f = Attr(type=FILE, mode=0o6755, uid=1000, gid=2000)
    assert perm.chmod_mode(f, ALICE, 0o2755, "f") == 0o755  # not in group 2000
    assert perm.chmod_mode(f, ROOT, 0o2755, "f") == 0o2755
    with pytest.raises(StatusError) as ei:
        perm.chmod_mode(f, BOB, 0o777, "f")
    assert ei.value.errno == errno.EPERM
    assert perm.chown_attrs(f, ROOT, 1001, -1, "f") == (1001, 2000, 0o0755)  # setuid and setgid+x go
    assert perm.chown_attrs(f, ALICE, -1, 1000, "f") == (1000, 1000, 0o0755)
    for uid, gid in ((1001, -1), (-1, 2001)):
        with pytest.raises(StatusError) as ei:
            perm.chown_attrs(f, ALICE, uid, gid, "f")
        assert ei.value.errno == errno.EPERM
    assert perm.chown_attrs(f, BOB, -1, -1, "f") == (1000, 2000, 0o6755)  # nothing asked, nothing checked
    d = Attr(type=DIR, mode=0o2775, uid=1000, gid=1000)
    assert perm.chown_attrs(d, ROOT, 5, 5, "d") == (5, 5, 0o2775)  # directories keep their bits


def test_times_link_and_squash() -> None:
    f = Attr(type=FILE, mode=0o666, uid=1000, gid=1000)
    perm.may_set_times(f, BOB, now=True, what="f")
    with pytest.raises(StatusError) as ei:
        perm.may_set_times(f, BOB, now=False, what="f")
    assert ei.value.errno == errno.EPERM
    with pytest.raises(StatusError) as ei:
        perm.may_set_times(Attr(type=FILE, mode=0o644, uid=1000), BOB, now=True, what="f")
    assert ei.value.errno == errno.EACCES
    perm.may_link(f, BOB, "f")  # readable and writable: protected_hardlinks allows
    with pytest.raises(StatusError):
        perm.may_link(Attr(type=FILE, mode=0o644, uid=1000), BOB, "f")
    token_root = Identity(uid=0, gid=0, rights=Right.user())
    assert perm.effective(token_root, root_squash=True).uid == perm.NOBODY
    assert perm.effective(token_root, root_squash=False) is token_root
    assert perm.effective(TRUSTED, root_squash=True) is TRUSTED  # ADMIN: not squashed


# -- through the namespace ----------------------------------------------------------------------


class _OneChain:
    def __init__(self) -> None:
        from loomfs.common.routing import Routing
        from loomfs.wire.types import ChainInfo, ChainTable, RoutingInfo

        self.routing = Routing(RoutingInfo(version=1, chains=[ChainInfo(chain_id=101, targets=[1], table_id=1)],
                                           tables=[ChainTable(table_id=1, replicas=1, chain_ids=[101])]))

    async def get(self) -> Any:
        return self.routing

    async def refresh(self, min_version: int = 0) -> Any:
        return self.routing


class Env:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.store = SqliteStore(":memory:")
        self.ns = Namespace(self.store, routing=_OneChain(), rng=random.Random(3),
                            default_layout=Layout(table_id=1, inline_max_bytes=4096))
        self.run(self.ns.init())

    def run(self, aw: Awaitable[T], who: Identity = TRUSTED) -> T:
        async def main() -> T:
            return await aw

        with acting_as(who):
            return self.loop.run_until_complete(main())

    def err(self, aw: Awaitable[Any], who: Identity) -> int:
        with pytest.raises(OSError) as ei:
            self.run(aw, who)
        return ei.value.errno or -1

    def put(self, path: str, data: bytes, who: Identity = TRUSTED, mode: int = 0o644) -> Attr:
        return self.run(self.ns.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, mode=mode, data=data), who).attr


@pytest.fixture
def env() -> Iterator[Env]:
    e = Env()
    yield e
    e.run(e.store.close())
    e.loop.close()


def test_caller_defaults_to_trusted_and_is_scoped() -> None:
    assert caller() is TRUSTED
    with acting_as(ALICE) as who:
        assert caller() is who
    assert caller() is TRUSTED


def test_nobody_scenario_in_the_namespace(env: Env) -> None:
    """Issue 13: nobody cannot read or overwrite root's 0600 file, list a 0700 directory,
    chown or delete; what nobody creates is nobody's."""
    env.put("/secret", b"root only", mode=0o600)
    env.run(env.ns.mkdir("/private", mode=0o700))
    env.put("/private/f", b"x")
    assert env.err(env.ns.read("/secret"), NOBODY) == errno.EACCES
    assert env.err(env.ns.open("/secret", os.O_RDONLY), NOBODY) == errno.EACCES
    assert env.err(env.ns.open("/secret", os.O_WRONLY | os.O_TRUNC), NOBODY) == errno.EACCES
    assert env.err(env.ns.open("/secret", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, data=b"mine"), NOBODY) == errno.EACCES
    assert env.err(env.ns.readdir("/private"), NOBODY) == errno.EACCES
    assert env.err(env.ns.stat("/private/f"), NOBODY) == errno.EACCES
    assert env.err(env.ns.setattr("/secret", uid=65534), NOBODY) == errno.EPERM
    assert env.err(env.ns.setattr("/secret", mode=0o666), NOBODY) == errno.EPERM
    assert env.err(env.ns.unlink("/secret"), NOBODY) == errno.EACCES
    assert env.run(env.ns.read("/secret"))[1] == b"root only"
    env.run(env.ns.mkdir("/tmp", mode=0o1777))
    made = env.put("/tmp/mine", b"hello", NOBODY)
    assert (made.uid, made.gid) == (65534, 65534)
    assert env.run(env.ns.stat("/tmp/mine")).uid == 65534


def test_inode_calls_need_write_or_the_session(env: Env) -> None:
    env.run(env.ns.mkdir("/pub", mode=0o777))
    o = env.run(env.ns.open("/pub/f", os.O_CREAT | os.O_WRONLY, mode=0o644), ALICE)
    ino = o.attr.inode
    # alice's session writes; bob, with neither write permission nor the session, cannot
    assert env.run(env.ns.write_inline(ino, o.session_id, [Patch(0, b"abc")]), ALICE).applied
    assert env.err(env.ns.write_inline(ino, 0, [Patch(0, b"evil")]), BOB) == errno.EACCES
    assert env.err(env.ns.write_inline(ino, 999, [Patch(0, b"evil")]), BOB) == errno.EACCES
    assert env.err(env.ns.sync(ino, 10), BOB) == errno.EACCES
    assert env.err(env.ns.migrate(ino), BOB) == errno.EACCES
    assert env.err(env.ns.setattr("/pub/f", inode=ino, size=0), BOB) == errno.EACCES
    # chmod 0444 after the open: the session still writes (POSIX: an open fd keeps its rights)
    env.run(env.ns.setattr("/pub/f", mode=0o444), ALICE)
    env.run(env.ns.report(ino, o.session_id, 4), ALICE)  # SYNC through the session (SyncReq.session_id)
    assert env.err(env.ns.report(ino, 0, 4), ALICE) == errno.EACCES  # without it: w needed
    assert env.run(env.ns.write_inline(ino, o.session_id, [Patch(3, b"d")], close=True), ALICE).applied
    assert env.run(env.ns.read("/pub/f"), ALICE)[1] == b"abcd"


def test_batches_check_each_item(env: Env) -> None:
    env.run(env.ns.mkdir("/pub", mode=0o777))
    env.put("/pub/open", b"o")
    env.put("/pub/closed", b"c", mode=0o600)
    batch = BatchOps(env.ns)
    stats = env.run(batch.stat_many(["/pub/open", "/pub/closed"]), NOBODY)
    assert all(isinstance(s, Attr) for s in stats)  # stat needs search only
    reads = env.run(batch.read_many(["/pub/open", "/pub/closed"]), NOBODY)
    assert not isinstance(reads[0], Failed) and reads[0].data == b"o"
    assert isinstance(reads[1], Failed) and reads[1].status == errno.EACCES
    items = [PutItem("/pub/new", b"n", crc32c.crc32c(b"n")), PutItem("/pub/closed", b"x", crc32c.crc32c(b"x"))]
    puts = env.run(batch.put_many(items, uid=0), NOBODY)
    assert not isinstance(puts[0], Failed)
    assert isinstance(puts[1], Failed) and puts[1].status == errno.EACCES
    assert env.run(env.ns.stat("/pub/new")).uid == 65534  # the body's uid 0 is not the caller's
    env.run(env.ns.mkdir("/ro", mode=0o755))
    env.put("/ro/f", b"f")
    gone = env.run(batch.unlink_many(["/pub/new", "/ro/f"]), NOBODY)
    assert not isinstance(gone[0], Failed)
    assert isinstance(gone[1], Failed) and gone[1].status == errno.EACCES


def test_exchange_layout_readdir_attrs_and_rights(env: Env) -> None:
    env.run(env.ns.mkdir("/a", mode=0o777))
    env.run(env.ns.mkdir("/b", mode=0o755))
    env.put("/a/x", b"x")
    env.put("/b/y", b"y")
    assert env.err(env.ns.exchange("/a/x", "/b/y"), ALICE) == errno.EACCES  # no write on /b
    env.run(env.ns.setattr("/b", mode=0o777))
    env.run(env.ns.exchange("/a/x", "/b/y"), ALICE)
    env.run(env.ns.mkdir("/a/d", mode=0o755))  # root's directory: moving it elsewhere rewrites '..'
    env.run(env.ns.mkdir("/b/e", mode=0o755))
    assert env.err(env.ns.exchange("/a/d", "/b/e"), ALICE) == errno.EACCES
    assert env.err(env.ns.set_layout("/a", Layout(table_id=1)), ALICE) == errno.EPERM
    env.run(env.ns.mkdir("/a/mine", mode=0o755), ALICE)
    env.run(env.ns.set_layout("/a/mine", Layout(table_id=1, chunk_size=1 << 20)), ALICE)
    env.run(env.ns.mkdir("/r", mode=0o744))  # readable, not searchable by others
    env.put("/r/f", b"f")
    entries, _ = env.run(env.ns.readdir("/r", with_attrs=True), ALICE)
    assert [e.name for e in entries] == ["f"] and entries[0].attr is None
    reader = Identity(uid=1000, gid=1000, rights=Right.READ)
    assert env.err(env.ns.open("/a/new", os.O_CREAT | os.O_WRONLY), reader) == errno.EPERM
    assert env.run(env.ns.read("/a/x"), reader)[1] == b"y"  # exchanged
    squashed = Identity(uid=0, gid=0, rights=Right.user())
    with acting_as(squashed, root_squash=True) as who:
        assert who.uid == perm.NOBODY


def test_mkdir_parents_and_setgid_inheritance(env: Env) -> None:
    env.run(env.ns.mkdir("/s", mode=0o777))
    env.run(env.ns.setattr("/s", gid=2000))
    env.run(env.ns.setattr("/s", mode=0o2777))
    made = env.run(env.ns.mkdir("/s/p/q", mode=0o755, parents=True), ALICE)
    assert (made.uid, made.gid, made.mode) == (1000, 2000, 0o2755)
    assert env.err(env.ns.mkdir("/closed/x", parents=True), ALICE) == errno.EACCES  # root's / is 0755
    # root creating on a caller's behalf (the FUSE mount) names the owner in the request
    on_behalf = env.run(env.ns.mkdir("/s/m", uid=1001, gid=1001))
    assert (on_behalf.uid, on_behalf.gid) == (1001, 1001)
    ignored = env.run(env.ns.mkdir("/s/n", uid=0, gid=0), ALICE)  # others cannot
    assert (ignored.uid, ignored.gid) == (1000, 2000)


def test_every_class_of_user_is_exercised() -> None:
    """The identities above differ in the ways the rules look at (owner, group, other, root)."""
    attrs = [Attr(type=FILE, mode=m, uid=1000, gid=2000) for m in (0o400, 0o040, 0o004)]
    seen = {tuple(perm.allowed(a, who, perm.R) for a in attrs) for who in (ALICE, BOB, NOBODY)}
    assert seen == {(True, False, False), (False, True, False), (False, False, True)}
    assert list(itertools.chain.from_iterable([[perm.allowed(a, ROOT, perm.R)] for a in attrs])) == [True] * 3


def test_search_rows_agrees_with_allowed() -> None:
    """The walk's check (rows of the store's get_perms) decides as ``allowed`` does."""
    for mode in range(0o1000):
        for who in (ROOT, ALICE, BOB, NOBODY):
            for owner, group in ((1000, 1000), (1001, 2000), (0, 0)):
                row = (DIR, mode, owner, group)
                try:
                    perm.search_rows([row], who, "d")
                    ok = True
                except StatusError as exc:
                    assert exc.errno == errno.EACCES
                    ok = False
                assert ok == perm.allowed(Attr(type=DIR, mode=mode, uid=owner, gid=group), who, perm.X)


def test_service_acts_for_the_connection_and_squashes_root(env: Env) -> None:
    """The RPC adapter (no sockets): the connection's identity, never the body's uid, and with
    root squash a token's uid 0 without ADMIN is nobody."""
    from loomfs.meta.service import MetaService
    from loomfs.net.rpc import CallContext
    from loomfs.wire import meta as w

    env.run(env.ns.mkdir("/closed", mode=0o700))
    token_root = Identity(uid=0, gid=0, rights=Right.user(), token_id="t-root")

    def ctx(who: Identity) -> CallContext:
        return CallContext(memoryview(b""), 1, "test", None, 0, who)

    plain, squashing = MetaService(env.ns), MetaService(env.ns, root_squash=True)
    env.run(plain.stat(w.PathReq(path="/closed"), ctx(token_root)))
    env.run(plain.mkdir(w.MkdirReq(path="/closed/x", uid=1000), ctx(token_root)))
    with pytest.raises(OSError) as ei:
        env.run(squashing.mkdir(w.MkdirReq(path="/closed/y"), ctx(token_root)))
    assert ei.value.errno == errno.EACCES
    with pytest.raises(OSError) as ei:  # a body claiming uid 0 changes nothing
        env.run(plain.mkdir(w.MkdirReq(path="/closed/z", uid=0, gid=0), ctx(ALICE)))
    assert ei.value.errno == errno.EACCES
    admin = Identity(uid=0, gid=0, rights=Right.all(), token_id="admin")
    env.run(squashing.mkdir(w.MkdirReq(path="/closed/w"), ctx(admin)))  # ADMIN is not squashed
    assert caller() is TRUSTED  # each request's identity stayed in its own task
