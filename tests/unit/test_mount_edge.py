"""The mount's error edge: any exception in a handler is an errno for that request; the
daemon keeps serving (pyfuse3 stops its loop on an unexpected exception and the kernel then
waits forever for the answer: a hung ``df``)."""

from __future__ import annotations

import asyncio
import errno

import pyfuse3
import pytest

from loomfs.mount.edge import fuse_errors


class Ops:
    @fuse_errors
    async def broken(self) -> None:
        raise AttributeError("a bug")

    @fuse_errors
    async def missing(self) -> None:
        raise FileNotFoundError(errno.ENOENT, "gone")


def test_any_exception_becomes_an_errno() -> None:
    with pytest.raises(pyfuse3.FUSEError) as err:
        asyncio.run(Ops().broken())
    assert err.value.errno == errno.EIO
    with pytest.raises(pyfuse3.FUSEError) as err:
        asyncio.run(Ops().missing())
    assert err.value.errno == errno.ENOENT
