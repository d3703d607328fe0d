"""Authorisation end to end (issue 13 items 2 and 6): clients with tokens for other uids, a
read-only token, tenants; over real processes with authentication on (LocalCluster's default).
The permission rules themselves are compared with a local directory in
tests/unit/test_perm_matrix.py."""

from __future__ import annotations

import errno
import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import crc32c
import pytest

import loomfs
from loomfs.config import ClientConfig, RpcConfig
from loomfs.net.credentials import create_token, load_secret_file, rights_for, write_token_file
from loomfs.testing import LocalCluster
from loomfs.wire import meta as wmeta
from loomfs.wire.message import Empty

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture()
def user(cluster: LocalCluster, tmp_path: Path) -> Iterator[Callable[..., loomfs.LoomFS]]:
    """``user(uid, gid, tenant=..., read_only=...)``: a client holding a token for that caller."""
    opened: list[loomfs.LoomFS] = []

    def make(uid: int, gid: int, *, groups: tuple[int, ...] = (), tenant: str = "", read_only: bool = False,
             admin: bool = False) -> loomfs.LoomFS:
        cred = create_token(load_secret_file(cluster.secret_path), uid=uid, gid=gid, groups=groups, tenant=tenant,
                            rights=rights_for(admin=admin, read_only=read_only), ttl_s=600, now_s=time.time())
        path = tmp_path / f"token-{len(opened)}"
        write_token_file(path, cred)
        fs = loomfs.connect(str(cluster.root), config=ClientConfig(rpc=RpcConfig(token_file=str(path))))
        opened.append(fs)
        return fs

    yield make
    for fs in opened:
        fs.close()


def _errno(fn: Callable[..., Any], *args: Any, **kw: Any) -> int:
    with pytest.raises(OSError) as ei:
        fn(*args, **kw)
    return ei.value.errno or -1


def test_nobody_cannot_touch_roots_files(fs: loomfs.LoomFS, base: str, user: Callable[..., loomfs.LoomFS]) -> None:
    """The issue's scenario: a process as nobody cannot read or overwrite a root 0600 file,
    list a 0700 directory, chown or delete; what it may create is recorded as its own."""
    fs.chmod(base, 0o755)
    secret, private, scratch = f"{base}/secret", f"{base}/private", f"{base}/scratch"
    with fs.open(secret, "wb") as f:
        f.write(b"root only")
    fs.chmod(secret, 0o600)
    fs.mkdir(private, mode=0o700)
    with fs.open(f"{private}/inside", "wb") as f:
        f.write(b"x")
    fs.mkdir(scratch, mode=0o777)
    fs.chmod(scratch, 0o1777)
    nobody = user(65534, 65534)
    assert _errno(nobody.cat, secret) == errno.EACCES
    assert _errno(lambda: nobody.open(secret, "rb").read()) == errno.EACCES
    assert _errno(lambda: nobody.open(secret, "wb").close()) == errno.EACCES
    assert _errno(nobody.listdir, private) == errno.EACCES
    assert _errno(nobody.stat, f"{private}/inside") == errno.EACCES
    assert _errno(nobody.chown, secret, 65534, 65534) == errno.EPERM
    assert _errno(nobody.chmod, secret, 0o666) == errno.EPERM
    assert _errno(nobody.unlink, secret) == errno.EACCES
    assert _errno(nobody.rename, secret, f"{scratch}/stolen") == errno.EACCES
    assert fs.cat(secret) == b"root only" and fs.stat(secret).st_mode & 0o777 == 0o600
    # in a sticky world-writable directory nobody creates files of its own, small and in chunks
    with nobody.open(f"{scratch}/mine", "wb") as f:
        f.write(b"nobody's")
    big = os.urandom(3 << 20)  # past the inline limit: storage takes it with meta's write grant
    with nobody.open(f"{scratch}/big", "wb") as f:
        f.write(big)
    for name in ("mine", "big"):
        st = fs.stat(f"{scratch}/{name}")
        assert (st.st_uid, st.st_gid) == (65534, 65534)
    assert nobody.cat(f"{scratch}/big") == big
    # another user cannot delete them there (sticky), root can
    other = user(1000, 1000)
    assert _errno(other.unlink, f"{scratch}/mine") == errno.EPERM
    fs.unlink(f"{scratch}/mine")


def test_read_only_token_reads_but_never_writes(fs: loomfs.LoomFS, base: str,
                                                user: Callable[..., loomfs.LoomFS]) -> None:
    fs.chmod(base, 0o777)
    with fs.open(f"{base}/f", "wb") as f:
        f.write(b"data")
    fs.chmod(f"{base}/f", 0o666)
    ro = user(1000, 1000, read_only=True)
    assert ro.cat(f"{base}/f") == b"data"
    assert "f" in ro.listdir(base)
    for fn, args in ((ro.mkdir, (f"{base}/d",)), (ro.unlink, (f"{base}/f",)), (ro.chmod, (f"{base}/f", 0o600)),
                     (ro.rename, (f"{base}/f", f"{base}/g"))):
        assert _errno(fn, *args) == errno.EPERM, fn
    assert _errno(lambda: ro.open(f"{base}/f", "wb").close()) == errno.EPERM
    assert _errno(lambda: ro.open(f"{base}/new", "wb").close()) == errno.EPERM
    assert fs.cat(f"{base}/f") == b"data"


def test_tenants_cannot_see_each_other(fs: loomfs.LoomFS, user: Callable[..., loomfs.LoomFS]) -> None:
    names = [f"t{secrets.token_hex(4)}" for _ in range(2)]
    made = [fs.run(fs.client.meta.call(wmeta.TENANT_CREATE, wmeta.TenantCreateReq(name=n, uid=1000, gid=1000)))
            for n in names]
    assert made[0].number != made[1].number
    listed = {t.name for t in fs.run(fs.client.meta.call(wmeta.TENANT_LIST, Empty())).tenants}
    assert set(names) <= listed
    a, b = user(1000, 1000, tenant=names[0]), user(1000, 1000, tenant=names[1])
    a.mkdir("/data")
    with a.open("/data/f", "wb") as f:
        f.write(b"tenant a")
    ino = a.stat("/data/f").st_ino
    assert b.listdir("/") == []
    assert _errno(b.stat, "/data/f") == errno.ENOENT
    assert not fs.exists("/data/f") or fs.stat("/data/f").st_ino != ino  # not in the shared namespace
    # guessing the inode number from another tenant: as if it did not exist
    req = wmeta.SetattrReq(path="/", inode=ino, mode=0o777)
    assert _errno(lambda: b.run(b.client.meta.call(wmeta.SETATTR, req))) == errno.ENOENT
    wreq = wmeta.InlineWriteReq(inode=ino, patches=[wmeta.InlinePatch(offset=0, data=b"evil")],
                                crc=crc32c.crc32c(b"evil"))
    assert _errno(lambda: b.run(b.client.meta.call(wmeta.WRITE_INLINE, wreq))) == errno.ENOENT
    assert a.cat("/data/f") == b"tenant a"
    # the shared namespace's admin cannot walk there, but fsck asks meta which inodes live
    live = fs.run(fs.client.meta.call(wmeta.INODES_LIVE, wmeta.InodesReq(inodes=[ino, ino + 1_000_000])))
    assert live.inodes == [ino]
    # only administrators make tenants or ask GC questions
    assert _errno(lambda: a.run(a.client.meta.call(wmeta.TENANT_CREATE, wmeta.TenantCreateReq(name="x")))) == errno.EPERM
    for m in (wmeta.GC_QUEUED, wmeta.INODES_LIVE):
        assert _errno(lambda m=m: a.run(a.client.meta.call(m, wmeta.InodesReq(inodes=[ino])))) == errno.EPERM


def test_tenant_cli(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``loomfs admin tenant create|list`` (cli/admin_tenant.py) with the cluster's admin token."""
    import argparse
    import json

    from loomfs.cli import admin_tenant
    from loomfs.net import auth

    monkeypatch.setenv(auth.TOKEN_FILE_ENV, str(cluster.root / auth.CLUSTER_TOKEN_FILE))
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", dest="cluster_dir")
    admin_tenant.register(parser.add_subparsers(dest="cmd"))
    name = f"cli{secrets.token_hex(3)}"
    args = parser.parse_args(["--dir", str(cluster.root), "tenant", "create", name, "--uid", "1000", "--gid", "1000",
                              "--mode", "750", "--json"])
    assert args.func(args) == 0
    made = json.loads(capsys.readouterr().out)
    assert (made["name"], made["uid"], made["gid"], made["mode"]) == (name, 1000, 1000, "750")
    assert args.func(args) == 1 and "exists" in capsys.readouterr().err.lower()  # EEXIST, said plainly
    args = parser.parse_args(["--dir", str(cluster.root), "tenant", "list", "--json"])
    assert args.func(args) == 0
    assert name in {t["name"] for t in json.loads(capsys.readouterr().out)}
