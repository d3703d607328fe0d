"""Lock client ids are bound to the user who uses them, over real processes with auth on
(docs/security.md, "Lock client ids"): a client of another user that names a lock holder's
client id and owner in LOCK_SET/GET/RELEASE/RENEW cannot unlock, release, take over or end
that client's locks, and LOCK_GET does not tell it the holder's client id; the holder and an
administrator (admin token) still can."""

from __future__ import annotations

# ruff: noqa: F811  (the fixtures imported from the sibling module are the parameters below)
import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from test_storage_tenants import clients, token  # noqa: F401 (fixtures: user tokens, clients closed at the end)

import loomfs
from loomfs.client.locks import locks_of
from loomfs.client.sync_locks import POSIX, READ, WRITE, lock
from loomfs.config import ClientConfig, RpcConfig
from loomfs.testing import LocalCluster
from loomfs.wire import meta_lock as wl
from loomfs.wire.message import Message, Method

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _user(cluster: LocalCluster, token_file: Path, clients: list[loomfs.LoomFS]) -> loomfs.LoomFS:
    fs = loomfs.connect(str(cluster.root), config=ClientConfig(rpc=RpcConfig(token_file=str(token_file))))
    clients.append(fs)
    return fs


def _call(fs: loomfs.LoomFS, m: Method, req: Message) -> object:
    return fs.run(fs.client.meta.call(m, req))


def test_another_users_client_cannot_use_a_lock_holders_client_id(
        cluster: LocalCluster, fs: loomfs.LoomFS, base: str, token: Callable[..., Path],
        clients: list[loomfs.LoomFS]) -> None:
    path = f"{base}/shared.db"
    with fs.open(path, "wb") as f:  # made by the admin token; locks need no POSIX permission
        f.write(b"x" * 100)
    ino = fs.stat(path).st_ino
    alice = _user(cluster, token(1000, 1000), clients)
    bob = _user(cluster, token(1001, 1001), clients)
    lock(alice, path, WRITE, kind=POSIX, first=0, last=99, wait=False)
    a_id, a_owner = alice.client.client_id, locks_of(alice.client).default_owner

    # F_GETLK from bob: the lock in the way, without alice's client id or owner
    rsp = _call(bob, wl.LOCK_GET, wl.LockReq(inode=ino, kind=POSIX, client_id=bob.client.client_id, owner=1,
                                             type=WRITE, first=50, last=50))
    assert isinstance(rsp, wl.LockRsp) and rsp.conflict is not None
    assert (rsp.conflict.client_id, rsp.conflict.owner, rsp.conflict.type, rsp.conflict.first,
            rsp.conflict.last) == (0, 0, WRITE, 0, 99)
    # alice's other owners are told it is her own client (a mount shows its own processes' pids)
    rsp = _call(alice, wl.LOCK_GET, wl.LockReq(inode=ino, kind=POSIX, client_id=a_id, owner=a_owner + 1,
                                               type=READ, first=0, last=0))
    assert isinstance(rsp, wl.LockRsp) and rsp.conflict is not None
    assert (rsp.conflict.client_id, rsp.conflict.owner) == (a_id, a_owner)

    # bob names alice's client id and owner in every call that could end or take her lock
    as_alice = wl.LockReq(inode=ino, kind=POSIX, client_id=a_id, owner=a_owner, first=0, last=99)
    rsp = _call(bob, wl.LOCK_SET, dataclasses.replace(as_alice, type=WRITE))
    assert isinstance(rsp, wl.LockRsp) and not rsp.granted  # no take-over: it conflicts, as any client does
    rsp = _call(bob, wl.LOCK_SET, as_alice)  # type 0: an unlock
    assert isinstance(rsp, wl.LockRsp) and rsp.granted  # (of bob's own nothing)
    rsp = _call(bob, wl.LOCK_RELEASE, wl.LockReleaseReq(inode=ino, kind=POSIX, client_id=a_id, owner=a_owner))
    assert isinstance(rsp, wl.LockReleaseRsp) and rsp.released == 0
    _call(bob, wl.LOCK_RENEW, wl.LockRenewReq(client_id=a_id, drop=True))

    # alice's lock is untouched and her lease alive
    with pytest.raises(BlockingIOError):
        lock(bob, path, READ, kind=POSIX, first=10, last=10, wait=False)
    rsp = _call(alice, wl.LOCK_RENEW, wl.LockRenewReq(client_id=a_id, lease_s=30.0))
    assert isinstance(rsp, wl.LockRenewRsp) and rsp.held

    # an administrator sees the id meta keeps alice's client under, and can end its locks
    rsp = _call(fs, wl.LOCK_GET, wl.LockReq(inode=ino, kind=POSIX, client_id=fs.client.client_id, owner=1,
                                            type=WRITE, first=0, last=0))
    assert isinstance(rsp, wl.LockRsp) and rsp.conflict is not None
    kept, owner = rsp.conflict.client_id, rsp.conflict.owner
    assert kept < 0 and owner == a_owner
    rsp = _call(fs, wl.LOCK_RELEASE, wl.LockReleaseReq(inode=ino, kind=POSIX, client_id=kept, owner=owner))
    assert isinstance(rsp, wl.LockReleaseRsp) and rsp.released == 1
    lock(bob, path, WRITE, kind=POSIX, first=0, last=99, wait=False)
