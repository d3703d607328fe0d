"""An in-memory simulated network behind the Transport seam.

Frames travel between channels in one process, with seeded latency, and the test can cut
links (partitions) or drop a fraction of frames. Delivery goes through the same
``FrameSink`` calls the TCP protocol makes (``payload_buffer`` then ``frame_received``), so
RPC servers and clients run unchanged on it. Everything random comes from one seeded
``random.Random``: the same seed and the same program give the same schedule.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field

from loomfs.errors import ConnectionFailed
from loomfs.net.protocol import FrameSink
from loomfs.net.transport import Address, Channel, Listener, SinkFactory, Transport
from loomfs.wire import frame as fr

logger = logging.getLogger(__name__)


@dataclass
class LinkFaults:
    latency_s: float = 0.0005
    jitter_s: float = 0.0002
    drop_rate: float = 0.0  # frames silently lost (the connection then times out)


@dataclass
class SimNetwork:
    seed: int = 0
    faults: LinkFaults = field(default_factory=LinkFaults)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._listeners: dict[Address, SinkFactory] = {}
        self._cut: set[frozenset[str]] = set()
        self._channels: list[SimChannel] = []
        self.frames_delivered = 0
        self.frames_dropped = 0

    def transport(self, host: str) -> SimTransport:
        return SimTransport(self, host)

    def partition(self, a: str, b: str) -> None:
        """Cut traffic between hosts ``a`` and ``b`` (both directions)."""
        self._cut.add(frozenset((a, b)))

    def heal(self, a: str | None = None, b: str | None = None) -> None:
        if a is None:
            self._cut.clear()
        else:
            self._cut.discard(frozenset((a, b or a)))

    def is_cut(self, a: str, b: str) -> bool:
        return frozenset((a, b)) in self._cut

    def delay_s(self) -> float:
        f = self.faults
        return max(0.0, f.latency_s + self.rng.uniform(-f.jitter_s, f.jitter_s))

    def __repr__(self) -> str:
        return (f"SimNetwork(seed={self.seed} listeners={len(self._listeners)} cuts={len(self._cut)} "
                f"delivered={self.frames_delivered} dropped={self.frames_dropped})")


class SimChannel:
    def __init__(self, net: SimNetwork, local_host: str, peer: str):
        self.net = net
        self.local_host = local_host
        self.peer = peer
        self.other: SimChannel | None = None
        self.sink: FrameSink | None = None
        self._closed = False
        self._paused = False
        self._backlog: list[tuple[bytes, bytes]] = []
        self._last_due = 0.0  # deliveries stay in order

    @property
    def closed(self) -> bool:
        return self._closed

    async def send(self, prefix_and_header: bytes, payload: bytes | bytearray | memoryview | None) -> None:
        if self._closed or self.other is None:
            raise ConnectionResetError("channel closed")
        other = self.other
        data = bytes(payload) if payload is not None else b""
        if self.net.is_cut(self.local_host, other.local_host) or (
            self.net.faults.drop_rate and self.net.rng.random() < self.net.faults.drop_rate
        ):
            self.net.frames_dropped += 1
            return
        loop = asyncio.get_running_loop()
        due = max(loop.time() + self.net.delay_s(), self._last_due)
        self._last_due = due
        loop.call_at(due, other._arrive, bytes(prefix_and_header), data)

    def _arrive(self, head: bytes, payload: bytes) -> None:
        if self._closed or self.sink is None:
            return
        if self._paused:
            self._backlog.append((head, payload))
            return
        self._deliver(head, payload)

    def _deliver(self, head: bytes, payload: bytes) -> None:
        assert self.sink is not None
        try:
            prefix = fr.parse_prefix(head, fr.DEFAULT_MAX_PAYLOAD_BYTES)
            header = fr.decode_header(prefix, memoryview(head)[fr.PREFIX_SIZE:])
            header.payload_crc = prefix.payload_crc
        except fr.FrameError as exc:
            logger.warning("sim: closing channel from %s: %s", self.peer, exc)
            self.abort(exc)
            return
        self.net.frames_delivered += 1
        if prefix.payload_len:
            dest = self.sink.payload_buffer(prefix.kind, header, prefix.payload_len)
            dest[:] = payload
            self.sink.frame_received(prefix.kind, header, dest, fr.crc(dest) == prefix.payload_crc)
        else:
            self.sink.frame_received(prefix.kind, header, memoryview(b""), True)

    def abort(self, exc: BaseException | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        if self.sink is not None:
            self.sink.connection_lost(exc)
        other = self.other
        if other is not None and not other._closed:
            asyncio.get_running_loop().call_soon(other.abort, None)

    def pause_reading(self) -> None:
        self._paused = True

    def resume_reading(self) -> None:
        self._paused = False
        backlog, self._backlog = self._backlog, []
        for head, payload in backlog:
            self._deliver(head, payload)

    def __repr__(self) -> str:
        return f"SimChannel({self.local_host}->{self.peer} closed={self._closed})"


class _SimListener(Listener):
    def __init__(self, net: SimNetwork, address: Address):
        self.net = net
        self.address = address

    async def close(self) -> None:
        self.net._listeners.pop(self.address, None)


class SimTransport(Transport):
    """One host's view of a SimNetwork."""

    def __init__(self, net: SimNetwork, host: str):
        self.net = net
        self.host = host
        self.max_payload_bytes = fr.DEFAULT_MAX_PAYLOAD_BYTES
        self._next_port = 40000

    async def connect(self, address: Address, sink_factory: SinkFactory, *, timeout_s: float) -> Channel:
        factory = self.net._listeners.get(address)
        if factory is None or self.net.is_cut(self.host, address.host):
            await asyncio.sleep(min(timeout_s, self.net.delay_s()))
            raise ConnectionFailed(f"sim: connect to {address} refused")
        self._next_port += 1
        mine = SimChannel(self.net, self.host, str(address))
        theirs = SimChannel(self.net, address.host, f"{self.host}:{self._next_port}")
        mine.other, theirs.other = theirs, mine
        theirs.sink = factory(theirs)
        mine.sink = sink_factory(mine)
        self.net._channels.append(mine)
        await asyncio.sleep(self.net.delay_s())
        return mine

    async def listen(self, address: Address, sink_factory: SinkFactory) -> Listener:
        if address.port == 0:
            self._next_port += 1
            address = Address(address.host, self._next_port)
        if address in self.net._listeners:
            raise OSError(98, f"sim: {address} already in use")
        self.net._listeners[address] = sink_factory
        return _SimListener(self.net, address)

    def __repr__(self) -> str:
        return f"SimTransport({self.host})"
