"""``LoomFile``: a real ``io.BufferedIOBase`` over an ``AsyncFile`` on the loop thread."""

from __future__ import annotations

import io
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from loomfs.client.file import AsyncFile

if TYPE_CHECKING:
    from loomfs.client.sync import LoomFS

T = TypeVar("T")


class LoomFile(io.BufferedIOBase):
    """Binary file object; every call runs on the owning ``LoomFS`` loop thread."""

    def __init__(self, fs: LoomFS, afile: AsyncFile, mode: str, generation: int):
        super().__init__()
        self._fs = fs
        self._af = afile
        self._generation = generation
        self.name = afile.path
        self.mode = mode

    def _run(self, make: Callable[[], Awaitable[T]]) -> T:
        return self._fs._run_file(self._generation, make)

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")

    # capabilities
    def readable(self) -> bool:
        self._check_open()
        return self._af.readable

    def writable(self) -> bool:
        self._check_open()
        return self._af.writable

    def seekable(self) -> bool:
        self._check_open()
        return True

    def fileno(self) -> int:
        raise io.UnsupportedOperation("LoomFS files have no OS file descriptor")

    def isatty(self) -> bool:
        return False

    # reading
    def read(self, size: int | None = -1) -> bytes:
        self._check_open()
        return self._run(lambda: self._af.read(-1 if size is None else size))

    def read1(self, size: int = -1) -> bytes:
        return self.read(size)

    def readinto(self, b: Any) -> int:
        self._check_open()
        return self._run(lambda: self._af.readinto(b))

    def readinto1(self, b: Any) -> int:
        return self.readinto(b)

    def readline(self, size: int | None = -1) -> bytes:
        self._check_open()
        return self._run(lambda: self._af.readline(-1 if size is None else size))

    # writing
    def write(self, b: Any) -> int:
        self._check_open()
        return self._run(lambda: self._af.write(b))

    def truncate(self, size: int | None = None) -> int:
        self._check_open()
        return self._run(lambda: self._af.truncate(size))

    def flush(self) -> None:
        if self.closed or self._af.closed:
            return
        self._run(self._af.flush)

    def fsync(self) -> None:
        self._check_open()
        self._run(self._af.fsync)

    # position
    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._check_open()
        return self._run(lambda: self._af.seek(offset, whence))

    def tell(self) -> int:
        self._check_open()
        return self._af.tell()

    def close(self) -> None:
        if self.closed and not self._af.close_pending:
            return
        try:
            if not self._af.closed or self._af.close_pending:  # (an interrupted close: again)
                self._fs._close_file(self._generation, self._af)
            else:  # closed by the client's close: what that met is this close's error
                self._af.raise_close_error()
        finally:
            super().close()

    @property
    def length(self) -> int:
        return self._af.length

    def __repr__(self) -> str:
        return f"LoomFile({self.name!r} mode={self.mode!r} closed={self.closed})"
