"""fsync(2) through any descriptor of a file makes what the file's write descriptors of this
mount wrote durable and visible to another mount's next open (Linux syncs the inode's dirty
pages whichever descriptor asks, a read-only one too: a process that writes through one
descriptor and syncs through another, or a tool that fsyncs a file it opened read-only)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_mount_hunt15_names import where  # noqa: F401 - where: a fresh directory through both mounts
from test_mount_locks import two  # noqa: F401 - two: the fixture of two mounts under where

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.mark.parametrize("size", [300, (5 << 20) + 3], ids=["inline", "chunks"])
def test_fsync_of_a_read_only_descriptor_syncs_the_writes(where: tuple[Path, Path], size: int) -> None:  # noqa: F811
    a, b = where
    first = os.urandom(size)
    more = os.urandom(size)
    fw = os.open(a / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fw, first)
        fr = os.open(a / "f", os.O_RDONLY)  # (an open syncs what the writer has so far)
        try:
            os.write(fw, more)  # buffered in the mount's write file
            os.fsync(fr)
            # durable and visible: another mount's fresh open reads it, the writer still open
            assert (b / "f").read_bytes() == first + more
        finally:
            os.close(fr)
    finally:
        os.close(fw)
