"""Issue 15 item 6 through the blocking API: truncate to a negative size and names that are
not UTF-8 are EINVAL (an OSError), never a silent no-op or a UnicodeEncodeError."""

from __future__ import annotations

import errno
import os

import pytest

import loomfs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_truncate_negative_is_einval(fs: loomfs.LoomFS, base: str) -> None:
    p = f"{base}/f"
    fs.pipe(p, b"0123456789")
    with pytest.raises(OSError) as e:
        fs.truncate(p, -1)
    assert e.value.errno == errno.EINVAL
    assert fs.cat(p) == b"0123456789"
    with fs.open(p, "r+b") as f, pytest.raises(OSError) as e2:
        f.truncate(-1)
    assert e2.value.errno == errno.EINVAL


def test_undecodable_names_are_einval(fs: loomfs.LoomFS, base: str) -> None:
    bad = os.fsdecode(b"caf\xe9")
    for call in (lambda: fs.pipe(f"{base}/{bad}", b"x"), lambda: fs.stat(f"{base}/{bad}"),
                 lambda: fs.makedirs(f"{base}/{bad}/d"), lambda: fs.rename(base, f"/{bad}"),
                 lambda: fs.symlink(bad, f"{base}/ln"), lambda: fs.open(f"{base}/{bad}", "wb")):
        with pytest.raises(OSError) as e:
            call()
        assert e.value.errno == errno.EINVAL
    assert fs.listdir(base) == []
