"""An in-memory simulated network behind the Transport seam.

Frames travel between channels in one process, with seeded latency. Delivery goes through the
same ``FrameSink`` calls the TCP protocol makes (``payload_buffer`` then ``frame_received``),
so RPC servers and clients run unchanged on it. Everything random comes from one seeded
``random.Random``: the same seed and the same program give the same schedule.

Faults, and the TCP behaviour each one models:

* ``partition(a, b)`` / ``cut(a, b)``: a two-way or one-way (a -> b) cut. Like a dead switch
  under TCP, frames on a cut link are not lost but *held* (TCP retransmits them) and delivered,
  in order, when the link heals, which is how a stale request reaches a server long after its
  sender gave up. A connect across a cut (either direction: the handshake needs both) hangs
  until its timeout.
* ``pause(host)``: a gray failure (a stopped process, a wedged NIC): frames to and from the
  host are held until ``resume``; connects to it still succeed (the kernel accepts them).
* ``LinkFaults.drop_rate``: frames silently lost (the call then times out); kept for unit tests.
* ``LinkState.reset_rate``: a frame is lost *and* its connection reset (what a lost segment
  becomes under TCP: the peer sees the connection break, not a gap in the stream).
* ``LinkState.extra_delay_s``: a delay spike on one directed link (order kept).
* ``LinkState.reorder_s``: each frame gets a random extra delay up to this and per-connection
  FIFO is not kept. One TCP connection never reorders, but the RPC layer runs every request
  in its own task and a multiplexed connection gives no order between requests, so this
  models requests that took different connections or paths.
* ``LinkState.dup_rate``: a request frame is delivered a second time, later, on a fresh
  connection whose reply nobody reads. TCP never duplicates within a connection; this models
  an RPC retried by its sender on a new connection while the first copy was still in flight.
* ``crash_host(host)``: a process crash: its listeners vanish and every connection it holds
  is reset (peers see the reset one latency later), in a deterministic order.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import random
from dataclasses import dataclass, field

from loomfs.errors import ConnectionFailed, ConnectRefused, TimedOut
from loomfs.net.protocol import FrameSink
from loomfs.net.scatter import Scatter
from loomfs.net.transport import Address, Channel, Listener, SinkFactory, Transport
from loomfs.wire import frame as fr

logger = logging.getLogger(__name__)

# The simulated host whose code is running: frames are delivered (and resets noticed) in the
# receiving host's context, so tasks a delivery starts belong to that host (the simulator's
# loop uses this to freeze or kill one host's tasks).
CURRENT_HOST: contextvars.ContextVar[str] = contextvars.ContextVar("loomfs_sim_host", default="")


@dataclass
class LinkFaults:
    """Network-wide defaults."""

    latency_s: float = 0.0005
    jitter_s: float = 0.0002
    drop_rate: float = 0.0  # frames silently lost (the connection then times out)


@dataclass
class LinkState:
    """Faults on one directed link (src host -> dst host)."""

    extra_delay_s: float = 0.0
    reorder_s: float = 0.0
    reset_rate: float = 0.0
    dup_rate: float = 0.0
    dup_delay_s: float = 0.05  # a duplicate arrives up to this long after the original

    @property
    def quiet(self) -> bool:
        return not (self.extra_delay_s or self.reorder_s or self.reset_rate or self.dup_rate)


@dataclass(slots=True)
class _Held:
    sender: SimChannel
    head: bytes
    payload: bytes
    arrived: bool  # True: it reached the (paused) receiver; False: it waits to be sent


@dataclass
class SimNetwork:
    seed: int = 0
    faults: LinkFaults = field(default_factory=LinkFaults)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._listeners: dict[Address, SinkFactory] = {}
        self._cut: set[tuple[str, str]] = set()  # directed (src, dst); membership tests only
        self._paused: dict[str, bool] = {}
        self._links: dict[tuple[str, str], LinkState] = {}
        self._held: list[_Held] = []
        self._channels: list[SimChannel] = []
        self._contexts: dict[str, contextvars.Context] = {}
        self.frames_delivered = 0
        self.frames_dropped = 0
        self.frames_held = 0
        self.frames_duplicated = 0
        self.connections_reset = 0

    def transport(self, host: str) -> SimTransport:
        return SimTransport(self, host)

    # ---- faults -----------------------------------------------------------------------
    def partition(self, a: str, b: str) -> None:
        """Cut traffic between hosts ``a`` and ``b`` (both directions)."""
        self._cut.add((a, b))
        self._cut.add((b, a))

    def cut(self, src: str, dst: str) -> None:
        """Cut traffic from ``src`` to ``dst`` only (``dst`` can still reach ``src``)."""
        self._cut.add((src, dst))

    def heal(self, a: str | None = None, b: str | None = None) -> None:
        """Remove every cut, or the cuts between ``a`` and ``b`` (both directions)."""
        if a is None:
            self._cut.clear()
        else:
            self._cut.discard((a, b or a))
            self._cut.discard((b or a, a))
        self._release()

    def is_cut(self, a: str, b: str) -> bool:
        """Is traffic from ``a`` to ``b`` cut?"""
        return (a, b) in self._cut

    def pause(self, host: str) -> None:
        self._paused[host] = True

    def resume(self, host: str) -> None:
        self._paused.pop(host, None)
        self._release()

    def is_paused(self, host: str) -> bool:
        return host in self._paused

    def set_link(self, src: str, dst: str, state: LinkState) -> None:
        if state.quiet:
            self._links.pop((src, dst), None)
        else:
            self._links[(src, dst)] = state

    def clear_links(self) -> None:
        self._links.clear()

    def link(self, src: str, dst: str) -> LinkState | None:
        return self._links.get((src, dst))

    def crash_host(self, host: str) -> None:
        """A process crash: listeners gone, every connection of ``host`` reset."""
        for addr in [a for a in self._listeners if a.host == host]:
            del self._listeners[addr]
        gone = [h for h in self._held if host in (h.sender.local_host, h.sender.peer_host)]
        for h in gone:
            h.sender.held_frames -= not h.arrived
        self._held = [h for h in self._held if host not in (h.sender.local_host, h.sender.peer_host)]
        for ch in self._channels:
            if not ch.closed and host in (ch.local_host, ch.peer_host):
                ch.abort(ConnectionResetError(f"sim: host {host} crashed"))
        self._prune()

    def heal_all(self) -> None:
        """Remove every cut, pause and link fault; deliver what was held."""
        self._cut.clear()
        self._paused.clear()
        self._links.clear()
        self._release()

    # ---- internals ----------------------------------------------------------------------
    def context_of(self, host: str) -> contextvars.Context:
        """A context in which ``CURRENT_HOST`` is ``host`` (callbacks for that host run in it)."""
        ctx = self._contexts.get(host)
        if ctx is None:
            ctx = self._contexts[host] = contextvars.copy_context()
            ctx.run(CURRENT_HOST.set, host)
        return ctx

    def blocked(self, src: str, dst: str) -> bool:
        return (src, dst) in self._cut or src in self._paused or dst in self._paused

    def hold(self, sender: SimChannel, head: bytes, payload: bytes, *, arrived: bool) -> None:
        self.frames_held += 1
        if not arrived:
            sender.held_frames += 1
        self._held.append(_Held(sender, head, payload, arrived))

    def _release(self) -> None:
        if not self._held:
            return
        keep: list[_Held] = []
        for h in self._held:
            ch = h.sender
            if not h.arrived:
                ch.held_frames -= 1
            if ch.closed or ch.other is None or ch.other.closed:
                continue
            if h.arrived:
                if ch.peer_host in self._paused:
                    keep.append(h)
                else:
                    asyncio.get_running_loop().call_soon(ch.other._arrive, h.head, h.payload,
                                                         context=self.context_of(ch.peer_host))
            elif self.blocked(ch.local_host, ch.peer_host) or ch.held_frames_kept:
                ch.held_frames += 1  # still blocked (or behind a frame that is): order is kept
                ch.held_frames_kept = True
                keep.append(h)
            else:
                ch.transmit(h.head, h.payload)
        for h in keep:
            h.sender.held_frames_kept = False
        self._held = keep

    def _prune(self) -> None:
        self._channels = [c for c in self._channels if not c.closed]

    def register(self, ch: SimChannel) -> None:
        self._channels.append(ch)
        if len(self._channels) > 256 and len(self._channels) % 256 == 0:
            self._prune()

    def delay_s(self) -> float:
        f = self.faults
        return max(0.0, f.latency_s + self.rng.uniform(-f.jitter_s, f.jitter_s))

    def __repr__(self) -> str:
        return (f"SimNetwork(seed={self.seed} listeners={len(self._listeners)} cuts={len(self._cut)} "
                f"paused={len(self._paused)} delivered={self.frames_delivered} dropped={self.frames_dropped} "
                f"held={self.frames_held})")


class _DiscardSink:
    """The reading end of a duplicate request's connection: the reply goes nowhere."""

    def __init__(self, channel: SimChannel):
        self.channel = channel

    def payload_buffer(self, kind: int, header: fr.Header, length: int) -> memoryview:
        return memoryview(bytearray(length))

    def frame_received(self, kind: int, header: fr.Header, payload: memoryview, crc_ok: bool) -> None:
        self.channel.abort()

    def connection_lost(self, exc: BaseException | None) -> None:
        pass


class SimChannel:
    def __init__(self, net: SimNetwork, local_host: str, peer: str, peer_host: str,
                 remote_address: Address | None = None):
        self.net = net
        self.local_host = local_host
        self.peer = peer
        self.peer_host = peer_host
        self.remote_address = remote_address  # the listener we connected to (client side)
        self.other: SimChannel | None = None
        self.sink: FrameSink | None = None
        self._closed = False
        self._paused = False
        self._stalled = False  # a payload waits for a buffer from the sink
        self._backlog: list[tuple[bytes, bytes]] = []
        self._last_due = 0.0  # deliveries stay in order (unless the link reorders)
        self.held_frames = 0  # frames of ours held back by a cut or pause (later ones queue behind)
        self.held_frames_kept = False  # scratch flag while held frames are released

    @property
    def closed(self) -> bool:
        return self._closed

    async def send(self, prefix_and_header: bytes, payload: bytes | bytearray | memoryview | None) -> None:
        if self._closed or self.other is None:
            raise ConnectionResetError("channel closed")
        head = bytes(prefix_and_header)
        data = bytes(payload) if payload is not None else b""
        net = self.net
        if self.held_frames or net.blocked(self.local_host, self.peer_host):
            net.hold(self, head, data, arrived=False)
            return
        self.transmit(head, data)

    def transmit(self, head: bytes, data: bytes) -> None:
        """Put one frame on the wire now (the link is not blocked)."""
        net = self.net
        other = self.other
        assert other is not None
        if net.faults.drop_rate and net.rng.random() < net.faults.drop_rate:
            net.frames_dropped += 1
            return
        loop = asyncio.get_running_loop()
        link = net.link(self.local_host, self.peer_host)
        due = loop.time() + net.delay_s()
        if link is not None:
            if link.reset_rate and net.rng.random() < link.reset_rate:
                net.frames_dropped += 1
                net.connections_reset += 1
                loop.call_at(due, self.abort, ConnectionResetError("sim: connection reset"),
                             context=net.context_of(self.local_host))
                return
            due += link.extra_delay_s
            if link.reorder_s:
                due += net.rng.uniform(0.0, link.reorder_s)
            if link.dup_rate and head[3] == fr.KIND_REQUEST and self.remote_address is not None \
                    and net.rng.random() < link.dup_rate:
                net.frames_duplicated += 1
                dup_due = due + net.rng.uniform(0.0, link.dup_delay_s)
                loop.call_at(dup_due, _deliver_duplicate, net, self.local_host, self.remote_address, head, data,
                             context=net.context_of(self.peer_host))
            if not link.reorder_s:
                due = max(due, self._last_due)
        else:
            due = max(due, self._last_due)
        self._last_due = max(self._last_due, due)
        loop.call_at(due, other._arrive, head, data, context=net.context_of(other.local_host))

    def _arrive(self, head: bytes, payload: bytes) -> None:
        if self._closed or self.sink is None:
            return
        if self.local_host in self.net._paused:
            assert self.other is not None
            self.net.hold(self.other, head, payload, arrived=True)
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
            if dest is None:  # no budget for it now: wait until the sink resumes reading
                self.net.frames_delivered -= 1
                self._paused = self._stalled = True
                self._backlog.insert(0, (head, payload))
                return
            if isinstance(dest, Scatter):  # received into its parts; the sink gets an empty payload
                dest.write(payload)
                self.sink.frame_received(prefix.kind, header, memoryview(b""), fr.crc(payload) == prefix.payload_crc)
                return
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
            # the peer learns of the reset one latency later
            loop = asyncio.get_running_loop()
            loop.call_at(loop.time() + self.net.faults.latency_s, other.abort, None,
                         context=self.net.context_of(other.local_host))

    def pause_reading(self) -> None:
        self._paused = True

    def resume_reading(self) -> None:
        self._paused = self._stalled = False
        while self._backlog and not self._stalled and not self._closed:
            head, payload = self._backlog.pop(0)
            self._deliver(head, payload)

    def __repr__(self) -> str:
        return f"SimChannel({self.local_host}->{self.peer} closed={self._closed})"


def _deliver_duplicate(net: SimNetwork, src_host: str, address: Address, head: bytes, payload: bytes) -> None:
    """Deliver a copy of a request on a fresh connection (a retried RPC's first copy)."""
    factory = net._listeners.get(address)
    if factory is None or net.blocked(src_host, address.host):
        return
    ghost = SimChannel(net, src_host, str(address), address.host, address)
    server_side = SimChannel(net, address.host, f"{src_host}:dup", src_host)
    ghost.other, server_side.other = server_side, ghost
    ghost.sink = _DiscardSink(ghost)
    server_side.sink = factory(server_side)
    net.register(ghost)
    net.register(server_side)
    server_side._arrive(head, payload)


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
        net = self.net
        if net.is_cut(self.host, address.host) or net.is_cut(address.host, self.host):
            await asyncio.sleep(timeout_s)  # the handshake is lost until the connect times out
            if net.is_cut(self.host, address.host) or net.is_cut(address.host, self.host):
                raise TimedOut(f"sim: connect to {address} timed out (link cut)")
        factory = net._listeners.get(address)
        if factory is None:
            await asyncio.sleep(min(timeout_s, net.delay_s()))
            raise ConnectRefused(f"sim: connect to {address} refused")
        self._next_port += 1
        mine = SimChannel(net, self.host, str(address), address.host, address)
        theirs = SimChannel(net, address.host, f"{self.host}:{self._next_port}", self.host)
        mine.other, theirs.other = theirs, mine
        theirs.sink = factory(theirs)
        mine.sink = sink_factory(mine)
        net.register(mine)
        net.register(theirs)
        await asyncio.sleep(net.delay_s())
        if mine.closed:
            raise ConnectionFailed(f"sim: connection to {address} reset during connect")
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
