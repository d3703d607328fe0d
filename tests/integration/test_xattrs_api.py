"""Extended attributes and device numbers through the blocking API against real processes:
``LoomFS.getxattr/listxattr/setxattr/removexattr`` raise the OSErrors ``os.*xattr`` raise, and
``LoomFS.stat`` shows a device node's ``st_rdev``."""

from __future__ import annotations

import errno
import os
import stat

import pytest

import loomfs
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
