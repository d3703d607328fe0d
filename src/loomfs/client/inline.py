"""An inline file's bytes as one open file object sees them (``loomfs.meta.ops.inline``).

Meta sends an inline file's content with the open (or READ) reply; the file object reads
from that copy and applies its own writes to it at once, keeping the writes (patches) to
send to meta on flush/fsync/close (WRITE_INLINE, one transaction). A new file opened with
"w" has no inode yet: its bytes wait here and go to meta with the create at close (a put:
one round trip for the whole small file).
"""

from __future__ import annotations

import crc32c

from loomfs.errors import LoomError
from loomfs.wire.meta import InlinePatch


def check_crc(path: str, data: bytes, crc: int) -> bytes:
    """Inline bytes from meta carry their CRC32C; a mismatch is EIO."""
    if crc32c.crc32c(data) != crc:
        raise LoomError("inline data from meta fails its CRC32C", errno=5, path=path)
    return data


def stored_inline(open_body: object) -> bool:
    """Whether an OPEN reply's body, undecoded (a msgpack map), says a put was stored inline
    and opened no write session: the usual answer to a small put, which then needs nothing
    more (so the fast path does not decode the rest of it)."""
    if type(open_body) is not dict or open_body.get("session_id", 0) != 0:
        return False
    attr = open_body.get("attr")
    return type(attr) is dict and attr.get("inline") is True


PATCHES_MAX = 256  # unsent writes kept before they go to meta (bounds a WRITE_INLINE request)
# meta's cap on any inline limit: inline bytes travel in a frame header (1 MiB at most)
INLINE_CAP_BYTES = 512 << 10


class InlineContent:
    """Content plus the writes not yet sent; ``limit``: the most bytes it may hold."""

    __slots__ = ("buf", "limit", "patches")

    def __init__(self, data: bytes | bytearray, limit: int):
        self.buf = bytearray(data)
        self.limit = limit
        self.patches: list[tuple[int, bytearray]] = []

    def __len__(self) -> int:
        return len(self.buf)

    def fits(self, end: int) -> bool:
        return end <= self.limit

    def write(self, pos: int, data: memoryview) -> None:
        end = pos + len(data)
        if end > len(self.buf):
            self.buf.extend(bytes(end - len(self.buf)))
        self.buf[pos:end] = data
        last = self.patches[-1] if self.patches else None
        if last is not None and last[0] + len(last[1]) == pos:
            last[1].extend(data)  # a stream of small writes is one patch
        else:
            self.patches.append((pos, bytearray(data)))

    def read_into(self, pos: int, view: memoryview) -> int:
        n = max(0, min(len(view), len(self.buf) - pos))
        view[:n] = self.buf[pos : pos + n]
        return n

    def truncate(self, size: int, *, record: bool = False) -> None:
        """The content after a truncate that meta applied; ``record``: a file not created
        yet, whose writes must carry the new length too (an empty patch at ``size`` extends)."""
        if size < len(self.buf):
            del self.buf[size:]
            self.patches = [(o, d[: size - o]) for o, d in self.patches if o < size]
            if record and not any(o + len(d) >= size for o, d in self.patches):
                # the new length is carried too (a lazy file's bytes may go to chunks, whose
                # length comes from the patches' ends: a cut into a hole kept only the bytes)
                self.patches.append((size, bytearray()))
        else:
            self.buf.extend(bytes(size - len(self.buf)))
            if record:
                self.patches.append((size, bytearray()))

    def take_patches(self) -> tuple[list[InlinePatch], int]:
        """The writes to send, and the CRC32C over their data; forgets them."""
        patches, self.patches = self.patches, []
        crc = 0
        out = []
        for off, data in patches:
            b = bytes(data)
            crc = crc32c.crc32c(b, crc)
            out.append(InlinePatch(offset=off, data=b))
        return out, crc

    def __repr__(self) -> str:
        return f"InlineContent({len(self.buf)}/{self.limit} bytes, {len(self.patches)} unsent)"
