"""A reply payload received straight into several buffers (a scatter receive).

A KV-cache get reads a whole chunk that holds several values (``kvcache/_reads.py``); with a
``Scatter`` as the read's destination the payload lands in the callers' own buffers, part
after part, instead of in one scratch buffer the values are then copied out of. The frame's
CRC32C still covers the whole payload and is checked on arrival, as for any payload.

A sink's ``payload_buffer`` may answer a ``Scatter`` whose ``nbytes`` equals the payload's
length; ``FrameProtocol`` and the simulated channel then fill its parts in order (on the
event loop: a scatter payload is never handed to a receive thread) and pass an empty payload
to ``frame_received``.
"""

from __future__ import annotations

from collections.abc import Iterable


class Scatter:
    """Writable byte views filled one after the other (empty views are dropped)."""

    __slots__ = ("parts", "nbytes")

    def __init__(self, parts: Iterable[memoryview]):
        self.parts = [p for p in parts if len(p)]
        self.nbytes = sum(len(p) for p in self.parts)

    def __len__(self) -> int:
        return self.nbytes

    def write(self, data: memoryview | bytes | bytearray, at: int = 0) -> int:
        """Copy ``data`` into the parts starting at byte ``at`` of the whole; returns the bytes
        written (``data`` beyond the end is left out)."""
        src = memoryview(data).cast("B") if not isinstance(data, memoryview) or data.format != "B" else data
        done = 0
        base = 0
        for p in self.parts:
            end = base + len(p)
            if done < len(src) and at + done < end:
                off = at + done - base
                n = min(len(p) - off, len(src) - done)
                p[off : off + n] = src[done : done + n]
                done += n
            base = end
        return done

    def zero_from(self, at: int) -> None:
        """Zero every byte from ``at`` on (a short read)."""
        base = 0
        for p in self.parts:
            end = base + len(p)
            if end > at:
                off = max(0, at - base)
                p[off:] = bytes(len(p) - off)
            base = end

    def __repr__(self) -> str:
        return f"Scatter(parts={len(self.parts)} nbytes={self.nbytes})"
