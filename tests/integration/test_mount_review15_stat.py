"""A stat of a file open for writing, idle since its last fsync, leaves its times alone (real
mount, real meta: meta stamps mtime and ctime at every sync that reports a length, and the
writer catch-up of a GETATTR synced the file once per attr_timeout)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from test_mount_locks import two  # noqa: F401 - two: the module's fixture of two mounts

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.mark.parametrize("size", [100, 5 << 20], ids=["inline", "chunks"])
def test_a_stat_of_an_idle_write_file_keeps_its_times(two: tuple[str, str], size: int) -> None:  # noqa: F811
    name = f"review15-idle-{size}-{os.getpid()}-{time.monotonic_ns()}"
    path, other_path = Path(two[0]) / name, Path(two[1]) / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"x" * size)
        os.fsync(fd)
        time.sleep(1.5)  # past attr_timeout: the kernel asks again, the catch-up is due
        before = os.stat(path)
        for _ in range(2):
            time.sleep(1.5)
            now = os.stat(path)
            assert (now.st_mtime_ns, now.st_ctime_ns) == (before.st_mtime_ns, before.st_ctime_ns)
        other = os.stat(other_path)  # and as another mount sees it
        assert (other.st_mtime_ns, other.st_size) == (before.st_mtime_ns, size)
    finally:
        os.close(fd)
