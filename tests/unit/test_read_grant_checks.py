"""Read grants (issue 13: POSIX read permission at storage), no sockets: the grant key, storage's
cached check (storage/grantcheck.py ReadGrantCheck), meta's minting by inode (meta/readgrants.py
READ_GRANTS) and the client's table (client/readgrants.py)."""

from __future__ import annotations

import asyncio
import errno
import os
import random
from typing import Any

import pytest
from test_perm import _OneChain

from loomfs.client.readgrants import ReadGrants
from loomfs.common import grants
from loomfs.common.identity import SERVICE, Identity, Right
from loomfs.errors import StatusError
from loomfs.meta import tenancy
from loomfs.meta.caller import acting_as
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.readgrants import ReadGrantService
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.net.policy import needs_of
from loomfs.net.rpc import CallContext
from loomfs.storage.grantcheck import ReadGrantCheck
from loomfs.wire.grants import PROOF_MAX_AGE_S, READ_GRANTS, READ_GRANTS_INODES_MAX, ReadGrantsReq
from loomfs.wire.status import Status
from loomfs.wire.types import Layout

SECRET = bytes(range(32))
KEY = grants.read_grant_key(SECRET)
NOW = 1_800_000_000.0
ALICE = Identity(uid=1000, gid=1000, token_id="alice-token")
BOB = Identity(uid=1001, gid=1001, token_id="bob-token")


def test_read_and_write_grants_are_different_keys() -> None:
    assert KEY != grants.grant_key(SECRET)
    w = grants.mint(grants.grant_key(SECRET), 7, ALICE.token_id, NOW + 60)
    with pytest.raises(grants.GrantError):
        grants.verify(KEY, w, 7, ALICE.token_id, NOW)  # a write grant does not let one read
    r = grants.mint(KEY, 7, ALICE.token_id, NOW + 60)
    grants.verify(KEY, r, 7, ALICE.token_id, NOW)
    assert needs_of(READ_GRANTS) == Right.READ


def _refused(fn: Any) -> Status:
    with pytest.raises(StatusError) as ei:
        fn()
    return ei.value.status


def test_storage_checks_present_grants_and_remembers_them() -> None:
    now = [NOW]
    check = ReadGrantCheck(KEY, required=False, wall_clock=lambda: now[0])
    good = grants.mint(KEY, 7, ALICE.token_id, NOW + 60)
    check.check(ALICE, b"", 7)  # not required yet: a read without a grant passes (counted)
    assert check.missing_total == 1
    check.check(ALICE, good, 7)
    assert check.verified_total == 1
    check.check(ALICE, good, 7)
    check.check(ALICE, b"", 7)  # remembered per (token, inode): no second HMAC, grant or not
    assert check.verified_total == 1 and check.missing_total == 1
    assert _refused(lambda: check.check(BOB, good, 7)) is Status.EACCES  # another token's grant
    assert _refused(lambda: check.check(ALICE, good, 8)) is Status.EACCES  # another inode
    assert _refused(lambda: check.check(ALICE, b"x" * 33, 9)) is Status.EACCES  # forged
    now[0] = NOW + 61
    assert _refused(lambda: check.check(ALICE, good, 7)) is Status.AUTH_EXPIRED  # ran out: ask meta again
    check.required = True
    assert _refused(lambda: check.check(ALICE, b"", 7)) is Status.AUTH_EXPIRED  # it had one, expired
    assert _refused(lambda: check.check(ALICE, b"", 10)) is Status.EACCES  # never had one
    assert check.refused_total == 6 and "refused=6" in repr(check)
    ReadGrantCheck(None, required=True).check(ALICE, b"", 7)  # no secret: nothing is checked


class _Env:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.store = SqliteStore(":memory:")
        self.ns = Namespace(self.store, routing=_OneChain(), rng=random.Random(5),
                            default_layout=Layout(table_id=1, inline_max_bytes=4096))
        self.loop.run_until_complete(self.ns.init())
        tenancy._known.clear()
        self.svc = ReadGrantService(self.ns, key=lambda: KEY, wall_clock=lambda: NOW, ttl_s=3600.0)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def file(self, path: str, mode: int, who: Identity) -> int:
        with acting_as(who):
            o = self.run(self.ns.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, mode=mode, data=b"x"))
        return int(o.attr.inode)

    def ask(self, who: Identity, inodes: list[int], proofs: list[bytes] | None = None) -> Any:
        """READ_GRANTS as ``who``; by default each inode with a proof (a grant meta minted for it
        earlier, from a reply that walked the path; expired a moment ago)."""
        ctx = CallContext(payload=memoryview(b""), request_id=1, peer="t", deadline=None, identity=who)
        if proofs is None:
            proofs = [grants.mint(KEY, i, who.token_id, NOW - 10) for i in inodes]
        return self.run(self.svc.read_grants(ReadGrantsReq(inodes=inodes, proofs=proofs), ctx))

    def close(self) -> None:
        self.run(self.store.close())
        self.loop.close()
        tenancy._known.clear()


def test_meta_grants_what_the_caller_may_read() -> None:
    env = _Env()
    try:
        with acting_as(SERVICE):
            env.run(env.ns.setattr("/", mode=0o777))
            env.run(env.ns.mkdir("/d", mode=0o755))
            env.run(env.ns.create_tenant("acme", uid=1000, gid=1000))
        mine = env.file("/mine", 0o600, ALICE)
        public = env.file("/public", 0o644, BOB)
        private = env.file("/private", 0o600, BOB)
        d = env.run(env.ns.stat("/d")).inode
        acme = env.file("/t", 0o644, Identity(uid=1000, gid=1000, tenant="acme", token_id="a"))
        rsp = env.ask(ALICE, [mine, public, private, d, acme, 999_999])
        assert rsp.ttl_s == 3600.0
        ok = [bool(g) for g in rsp.grants]
        assert ok == [True, True, False, False, False, False]  # 0600 of bob, a directory, another tenant, none
        grants.verify(KEY, rsp.grants[0], mine, ALICE.token_id, NOW)
        with pytest.raises(grants.GrantError):
            grants.verify(KEY, rsp.grants[0], mine, BOB.token_id, NOW)  # bound to the asking token
        assert [bool(g) for g in env.ask(BOB, [mine, private]).grants] == [False, True]
        root = Identity(uid=0, gid=0, token_id="root")
        assert all(env.ask(root, [mine, private]).grants)  # root reads everything ...
        squashed = ReadGrantService(env.ns, key=lambda: KEY, root_squash=True)
        ctx = CallContext(payload=memoryview(b""), request_id=1, peer="t", deadline=None, identity=root)
        req = ReadGrantsReq(inodes=[mine, private], proofs=[grants.mint(KEY, i, root.token_id, NOW) for i in (mine, private)])
        assert not any(env.run(squashed.read_grants(req, ctx)).grants)  # ... unless squashed
        admin = Identity(uid=0, gid=0, rights=Right.user() | Right.ADMIN, token_id="adm")
        rsp = env.ask(admin, [mine])
        assert rsp.grants == [b""] and rsp.ttl_s == 0.0  # admins need none: the client stops asking
        no_secret = ReadGrantService(env.ns, key=lambda: None)
        ctx = CallContext(payload=memoryview(b""), request_id=1, peer="t", deadline=None, identity=ALICE)
        assert env.run(no_secret.read_grants(ReadGrantsReq(inodes=[mine]), ctx)).ttl_s == 0.0
        # an inode number alone earns nothing (a file in a directory the caller cannot search
        # would be readable by guessing it); nor does a proof for another token, another inode,
        # or one that ran out too long ago
        assert [bool(g) for g in env.ask(ALICE, [mine, public], proofs=[]).grants] == [True, False]  # her own only
        bad = [grants.mint(KEY, public, BOB.token_id, NOW), grants.mint(KEY, mine, ALICE.token_id, NOW),
               grants.mint(KEY, public, ALICE.token_id, NOW - PROOF_MAX_AGE_S - 1),
               grants.mint(grants.grant_key(SECRET), public, ALICE.token_id, NOW)]  # a write grant
        assert env.ask(ALICE, [public] * 4, proofs=bad).grants == [b""] * 4
        assert env.ask(ALICE, [public], proofs=[grants.mint(KEY, public, ALICE.token_id, NOW - 3600)]).grants[0]
        with pytest.raises(OSError) as ei:
            env.ask(ALICE, list(range(READ_GRANTS_INODES_MAX + 1)))
        assert ei.value.errno == errno.EINVAL
    finally:
        env.close()


def test_client_fetches_once_per_inode_batches_and_stops_without_grants() -> None:
    asked: list[list[int]] = []
    now = [0.0]

    async def fetch_many(inodes: list[int], proofs: list[bytes]) -> tuple[list[bytes], float]:
        asked.append(list(inodes))
        await asyncio.sleep(0)
        return [b"g%d" % i if i != 3 else b"" for i in inodes], 100.0

    async def go() -> None:
        rg = ReadGrants(fetch_many, monotonic=lambda: now[0])
        assert rg.get(1) == b""
        assert await rg.grant_for(1) == b"" and asked == []  # lazy: storage has not asked for grants
        rg.eager = True  # (what the first fetch after a refusal does)
        got = await asyncio.gather(rg.grant_for(1), rg.grant_for(1), rg.grant_for(2), rg.grant_for(3))
        assert got == [b"g1", b"g1", b"g2", b""] and asked == [[1, 2, 3]]  # one request, deduplicated
        assert rg.get(1) == b"g1" and await rg.grant_for(3) == b"" and len(asked) == 1  # denied: kept a while
        now[0] = 6.0
        assert await rg.grant_for(3) == b"" and len(asked) == 2  # asked again after DENIED_KEEP_S
        now[0] = 51.0  # past half the TTL: renewed on the next read
        assert rg.get(1) == b"" and await rg.grant_for(1) == b"g1" and len(asked) == 3
        rg.drop(1)
        assert rg.get(1) == b""
        assert await rg.fetch(1) == b"g1" and len(asked) == 4

        async def no_grants(inodes: list[int], proofs: list[bytes]) -> tuple[list[bytes], float]:
            asked.append(list(inodes))
            return [b""] * len(inodes), 0.0

        off = ReadGrants(no_grants)
        off.eager = True
        assert await off.grant_for(5) == b"" and off.fetch_many is None  # ttl 0: never asks again
        assert await off.grant_for(6) == b"" and asked[-1] == [5]

        async def failing(inodes: list[int], proofs: list[bytes]) -> tuple[list[bytes], float]:
            raise ConnectionError("meta unreachable")

        bad = ReadGrants(failing)
        with pytest.raises(ConnectionError):
            await bad.fetch(9)
        assert bad.eager
        assert "kept=0" in repr(bad)

    asyncio.run(go())


def test_grants_in_replies_need_no_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    """meta puts a read grant into replies that checked r already (open for reading, READ,
    READ_MANY: ``meta.readgrants.read_grant``); the client keeps it (``ReadGrants.note``)."""
    import time as _time

    from loomfs.meta import readgrants
    from loomfs.wire.types import Attr, FileType

    monkeypatch.setattr(readgrants, "_process_key", lambda: KEY)
    ctx = CallContext(payload=memoryview(b""), request_id=1, peer="t", deadline=None, identity=ALICE)
    chunked = Attr(inode=42, type=FileType.FILE)
    g = readgrants.read_grant(chunked, ctx)
    grants.verify(KEY, g, 42, ALICE.token_id, _time.time())
    assert readgrants.read_grant(Attr(inode=42, type=FileType.FILE, inline=True), ctx) == b""  # read through meta
    assert readgrants.read_grant(Attr(inode=43, type=FileType.DIRECTORY), ctx) == b""
    admin = CallContext(payload=memoryview(b""), request_id=1, peer="t", deadline=None,
                        identity=Identity(uid=0, gid=0, rights=Right.user() | Right.ADMIN))
    assert readgrants.read_grant(chunked, admin) == b""
    monkeypatch.setattr(readgrants, "_process_key", lambda: None)
    assert readgrants.read_grant(chunked, ctx) == b""  # no secret

    asked: list[list[int]] = []
    sent: list[list[bytes]] = []

    async def fetch_many(inodes: list[int], proofs: list[bytes]) -> tuple[list[bytes], float]:
        asked.append(inodes)
        sent.append(proofs)
        return [b""] * len(inodes), 3600.0

    async def go() -> None:
        rg = ReadGrants(fetch_many)
        rg.note(42, g)
        rg.note(43, b"")  # nothing to keep
        assert rg.get(42) == g and await rg.grant_for(42) == g and asked == []
        rg.note(44, grants.mint(KEY, 44, ALICE.token_id, _time.time() - 1))  # already expired: not kept
        assert rg.get(44) == b""
        rg.drop(42)  # storage refused it: not sent again, but shown as the proof of a renewal
        assert rg.get(42) == b"" and await rg.fetch(42) == b"" and sent[-1] == [g]

    asyncio.run(go())
