"""Real-mount versions of session 15's listing fixes (unit-tested then in
tests/unit/test_mount_review15_races.py): a directory listing that crosses many READDIR pages
goes on through one open descriptor while another mount renames the directory away and makes a
new one under its old name. The descriptor's listing must never hand out the new directory's
names: it lists the directory it opened, or fails (ENOENT), as a local file system lists the
inode it opened."""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

import pytest
from test_mount_hunt15_misc import small_pages  # noqa: F401 - a mount whose READDIRs ask meta for 16 entries a page
from test_mount_hunt15_names import where  # noqa: F401 - a fresh directory through both mounts
from test_mount_locks import two  # noqa: F401 - the two mounts under where

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

_SYS_GETDENTS64 = 217  # x86-64


class Dents:
    """getdents64(2) through one descriptor, a batch at a time (a small buffer: the kernel
    asks the mount for the next READDIR page as the listing goes on)."""

    def __init__(self, path: Path, buf_bytes: int = 1024) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        self._buf = ctypes.create_string_buffer(buf_bytes)
        self._size = buf_bytes

    def batch(self) -> list[str]:
        """The next names ([] at the end); OSError as getdents64 fails."""
        n = self._libc.syscall(_SYS_GETDENTS64, self.fd, self._buf, self._size)
        if n < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        raw = self._buf.raw
        names: list[str] = []
        pos = 0
        while pos < n:
            reclen = int.from_bytes(raw[pos + 16:pos + 18], "little")
            names.append(os.fsdecode(raw[pos + 19:pos + reclen].split(b"\0", 1)[0]))
            pos += reclen
        return [x for x in names if x not in (".", "..")]

    def close(self) -> None:
        os.close(self.fd)


def _rest(d: Dents) -> tuple[list[str], OSError | None]:
    """The names left in ``d``'s listing, and the error that ended it (None: its end)."""
    names: list[str] = []
    for _ in range(100_000):
        try:
            got = d.batch()
        except OSError as exc:
            return names, exc
        if not got:
            return names, None
        names += got
    raise AssertionError("the listing never ended")


@pytest.mark.parametrize("remake", [True, False], ids=["remade", "renamed-only"])
def test_a_listing_goes_on_in_the_directory_it_opened(where: tuple[Path, Path], small_pages: Path,  # noqa: F811
                                                      remake: bool) -> None:
    a, b = where
    (a / "d").mkdir()
    old = {f"old-{i:04d}-{'p' * 24}" for i in range(300)}  # ~19 pages of 16 through small_pages
    for n in old:
        (a / "d" / n).write_bytes(b"")
    listing = Dents(small_pages / a.name / "d")
    try:
        first = listing.batch()
        assert first and set(first) <= old
        os.rename(b / "d", b / "moved")  # through the other mount: this one is not told
        if remake:
            (b / "d").mkdir()
            for i in range(150):  # names before and after the listing's cursor
                (b / "d" / f"a-intruder-{i:04d}").write_bytes(b"")
                (b / "d" / f"zz-intruder-{i:04d}").write_bytes(b"")
        rest, err = _rest(listing)
    finally:
        listing.close()
    names = first + rest
    strangers = sorted(set(names) - old)
    assert not strangers, f"the listing handed out another directory's names: {strangers[:5]}"
    assert len(names) == len(set(names)), "a name listed twice"
    if err is not None:
        assert err.errno == errno.ENOENT, err
    else:  # it listed the directory it opened to its end
        assert set(names) == old, sorted(old - set(names))[:5]
    assert sorted(os.listdir(b / "moved")) == sorted(old)
