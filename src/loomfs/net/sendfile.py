"""A reply payload that is a region of a file, sent with ``os.sendfile`` (zero-copy).

A storage server answering a whole-chunk read of a chunk that is in its page cache hands the
transport a ``FileRegion`` (its own fd, offset, length) instead of reading the bytes into a
buffer: ``FrameProtocol.send`` moves them page cache -> socket with ``os.sendfile``, no copy
through user space and no buffer. The frame's payload CRC is the stored chunk CRC (the sender
does not hash the bytes); the receiver checks the bytes it got against it, end to end, as
HDFS's datanode ``transferTo()``s a block with its stored checksums.

Any other channel (the simulator, TLS, uvloop) reads the region into memory first
(``bytes(region)``), so a region works everywhere, only without the zero copy. The region owns
its fd: whoever sends it closes it (``close``, from the reply's ``on_sent``), and a region
that is never sent is closed by the garbage collector.
"""

from __future__ import annotations

import os


class FileRegion:
    """``length`` bytes of the open file ``fd`` from ``offset``; owns ``fd``."""

    __slots__ = ("fd", "offset", "length", "__weakref__")

    def __init__(self, fd: int, offset: int, length: int):
        self.fd = -1  # owned only once checked (a bad region leaves the caller's fd alone)
        if offset < 0 or length < 0:
            raise ValueError(f"bad file region offset={offset} length={length}")
        self.fd, self.offset, self.length = fd, offset, length

    def __len__(self) -> int:
        return self.length

    def read_into(self, view: memoryview) -> int:
        """Read the region into ``view`` (at least ``length`` bytes); returns the bytes read
        (fewer only if the file is shorter than the region)."""
        got = 0
        while got < self.length:
            n = os.preadv(self.fd, [view[got : self.length]], self.offset + got)
            if n <= 0:
                break
            got += n
        return got

    def __bytes__(self) -> bytes:
        buf = bytearray(self.length)
        n = self.read_into(memoryview(buf))
        if n != self.length:
            raise OSError(f"file region: read {n} of {self.length} bytes")
        return bytes(buf)

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass

    def __repr__(self) -> str:
        return f"FileRegion(fd={self.fd} offset={self.offset} length={self.length})"


def sendfile_some(sock_fd: int, region: FileRegion, done: int) -> int:
    """Send what the socket takes now of ``region`` past its first ``done`` bytes; returns
    the bytes sent (0 when the socket buffer is full: BlockingIOError is caught). Raises
    OSError when the file ends early (the region outlived its file) or the socket fails."""
    try:
        n = os.sendfile(sock_fd, region.fd, region.offset + done, region.length - done)
    except (BlockingIOError, InterruptedError):
        return 0
    if n == 0 and done < region.length:
        raise OSError(f"file region ended at {done} of {region.length} bytes")
    return n
