"""Extended attributes and device numbers through the blocking API against real processes:
``LoomFS.getxattr/listxattr/setxattr/removexattr`` raise the OSErrors ``os.*xattr`` raise, and
``LoomFS.stat`` shows a device node's ``st_rdev``."""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path

import pytest

import loomfs
from loomfs.config import ClientConfig, RpcConfig
from loomfs.net.credentials import create_token, load_secret_file, rights_for, write_token_file
from loomfs.testing import LocalCluster
from loomfs.wire.types import FileType

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def errno_of(fn: object, *args: object, **kw: object) -> int:
    with pytest.raises(OSError) as info:
        fn(*args, **kw)  # type: ignore[operator]
    return info.value.errno or 0


def test_xattrs_through_the_blocking_api(fs: loomfs.LoomFS, base: str) -> None:
    f, d = f"{base}/f", f"{base}/d"
    fs.pipe(f, b"data")
    fs.mkdir(d)
    before = fs.stat(f).st_ctime_ns
    fs.setxattr(f, "user.a", b"1")
    fs.setxattr(f, b"user.\xff", b"\x00bin")
    fs.setxattr(d, "user.dir", b"D")
    assert fs.stat(f).st_ctime_ns >= before
    assert fs.getxattr(f, "user.a") == b"1"
    assert fs.getxattr(f, b"user.\xff") == b"\x00bin"
    assert fs.listxattr(f) == ["user.a", os.fsdecode(b"user.\xff")]
    assert fs.listxattr(d) == ["user.dir"]
    assert errno_of(fs.setxattr, f, "user.a", b"2", os.XATTR_CREATE) == errno.EEXIST
    assert errno_of(fs.setxattr, f, "user.b", b"2", os.XATTR_REPLACE) == errno.ENODATA
    assert errno_of(fs.getxattr, f, "user.none") == errno.ENODATA
    assert errno_of(fs.getxattr, f, "user." + "n" * 251) == errno.ERANGE  # refused before a round trip
    assert errno_of(fs.setxattr, f, "user.big", bytes((64 << 10) + 1)) == errno.E2BIG
    assert errno_of(fs.setxattr, f, "trusted.k", b"") == errno.ENOTSUP
    assert errno_of(fs.getxattr, f"{base}/nope", "user.a") == errno.ENOENT
    fs.setxattr(f, "user.a", bytes(64 << 10), os.XATTR_REPLACE)
    assert len(fs.getxattr(f, "user.a")) == 64 << 10
    fs.symlink(f, f"{base}/l")
    assert fs.getxattr(f"{base}/l", "user.a") == bytes(64 << 10)
    assert errno_of(fs.setxattr, f"{base}/l", "user.a", b"", follow_symlinks=False) == errno.EPERM
    fs.removexattr(f, "user.a")
    assert errno_of(fs.removexattr, f, "user.a") == errno.ENODATA
    assert fs.listxattr(f) == [os.fsdecode(b"user.\xff")]
    with fs.open(f"{base}/w", "wb") as w:  # a "w" file this client has not created yet
        w.write(b"x")
        fs.setxattr(f"{base}/w", "user.k", b"v")
    assert fs.getxattr(f"{base}/w", "user.k") == b"v" and fs.cat(f"{base}/w") == b"x"


def test_device_numbers_in_stat(fs: loomfs.LoomFS, base: str) -> None:
    dev = os.makedev(259, 7)
    fs.run(fs.client.mknod(f"{base}/blk", FileType.BLOCK_DEVICE, 0o600, dev))
    fs.run(fs.client.mknod(f"{base}/fifo", FileType.FIFO, 0o644))
    st = fs.lstat(f"{base}/blk")
    assert stat.S_ISBLK(st.st_mode) and st.st_rdev == dev and st.st_size == 0
    st = fs.lstat(f"{base}/fifo")
    assert stat.S_ISFIFO(st.st_mode) and st.st_rdev == 0


def test_xattrs_through_fsspec(cluster: LocalCluster, fs: loomfs.LoomFS, base: str) -> None:
    from loomfs.fsspec import LoomFileSystem

    lfs = LoomFileSystem(cluster.mgmtd_address)
    url = f"loom://{cluster.mgmtd_address}{base}/x"
    lfs.pipe(url, b"x")
    lfs.setxattr(url, "user.tag", b"train")
    assert lfs.getxattr(url, "user.tag") == b"train" == fs.getxattr(f"{base}/x", "user.tag")
    assert lfs.listxattr(url) == ["user.tag"]
    with pytest.raises(FileExistsError):
        lfs.setxattr(url, "user.tag", b"again", os.XATTR_CREATE)
    lfs.removexattr(url, "user.tag")
    assert lfs.listxattr(url) == []


def _client_as(cluster: LocalCluster, tmp_path: Path, uid: int, gid: int, *, read_only: bool = False) -> loomfs.LoomFS:
    cred = create_token(load_secret_file(cluster.secret_path), uid=uid, gid=gid,
                        rights=rights_for(admin=False, read_only=read_only), ttl_s=600, now_s=time.time())
    path = tmp_path / f"token-{uid}-{int(read_only)}"
    write_token_file(path, cred)
    return loomfs.connect(str(cluster.root), config=ClientConfig(rpc=RpcConfig(token_file=str(path))))


def test_meta_checks_the_callers_permissions(cluster: LocalCluster, fs: loomfs.LoomFS, base: str,
                                             tmp_path: Path) -> None:
    """Over authenticated connections (no kernel in between): meta checks read permission for
    getxattr, write permission for setxattr/removexattr, and a read-only token may not change
    attributes at all (the methods need Right.WRITE)."""
    fs.chmod(base, 0o777)
    for name, mode in (("public", 0o644), ("private", 0o600), ("open", 0o666)):
        fs.pipe(f"{base}/{name}", b"")
        fs.setxattr(f"{base}/{name}", "user.k", b"v")
        fs.chmod(f"{base}/{name}", mode)
    user = _client_as(cluster, tmp_path, 1001, 1001)
    ro = _client_as(cluster, tmp_path, 1001, 1001, read_only=True)
    try:
        assert user.getxattr(f"{base}/public", "user.k") == b"v"
        assert errno_of(user.getxattr, f"{base}/private", "user.k") == errno.EACCES
        assert user.listxattr(f"{base}/private") == ["user.k"]
        assert errno_of(user.setxattr, f"{base}/public", "user.k", b"x") == errno.EACCES
        assert errno_of(user.removexattr, f"{base}/public", "user.k") == errno.EACCES
        user.setxattr(f"{base}/open", "user.k", b"by 1001")
        assert fs.getxattr(f"{base}/open", "user.k") == b"by 1001"
        assert ro.getxattr(f"{base}/open", "user.k") == b"by 1001"
        assert errno_of(ro.setxattr, f"{base}/open", "user.k", b"x") == errno.EPERM
        assert errno_of(ro.removexattr, f"{base}/open", "user.k") == errno.EPERM
    finally:
        user.close()
        ro.close()
