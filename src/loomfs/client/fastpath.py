"""Blocking metadata reads straight from the caller's thread.

A blocking ``fs.stat`` through the async core costs two thread hops (caller -> loop thread
-> caller) on top of the RPC round trip, and on this VM a cross-core wake-up is the expensive
part. For idempotent metadata reads (stat, readdir) the blocking API therefore talks to the
meta server the async core already uses over a small blocking socket of its own, one per
calling thread, with the same frames and checks. Anything unusual (no meta server chosen
yet, a broken connection, a malformed reply, a protocol status) raises ``Unavailable`` and
the caller takes the ordinary async path, which owns failover and retries. POSIX errors
(ENOENT, ENOTDIR, ...) are real answers and are raised as they are.

A connection proves the same credential as the async core's (the HELLO/PROVE handshake of
``loomfs.wire.auth``, inside TLS when the core uses TLS), so meta sees the same caller and
applies the same permission checks on both paths. A refused or expired credential drops the
socket (the next call shakes hands again, with the token file as it is then) and the call
goes the async way, which reports the refusal. Under fault injection (a transport that is not
plain TCP) the fast path stays off: the rules must see every connection.

``LOOMFS_FASTPATH_SPIN_US`` (default 0: off) polls for a reply that long before sleeping in
``recv``. Measured on the shared 2-core VM (``python -m loomfs.bench.opcost``, 150 us): worse
under load (the poll takes the CPU meta needs), so it stays an opt-in for idle or many-core hosts.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import ssl
import struct
import threading
import time
from typing import Any

import crc32c
import msgpack

from loomfs.common import trace
from loomfs.errors import from_status
from loomfs.net.auth import client_proof, new_nonce, server_proof
from loomfs.net.credentials import Credential
from loomfs.net.limits import IDLE_TIMEOUT_S
from loomfs.net.tcp import TcpTransport
from loomfs.net.transport import Address
from loomfs.wire import auth as wa
from loomfs.wire import frame as fr
from loomfs.wire.message import Message, Method
from loomfs.wire.status import AUTH_STATUSES, RETRYABLE, Status

logger = logging.getLogger(__name__)

MAX_REPLY_BYTES = 16 << 20

_PREFIX_SIZE = fr.PREFIX_SIZE
_PREFIX_PACK = fr.PREFIX.pack
_PREFIX_UNPACK = fr.PREFIX.unpack_from
_crc = crc32c.crc32c
_unpackb = msgpack.unpackb
_trace_get = trace.TRACE.get
_new_trace = trace.new_id


class Unavailable(Exception):
    """The fast path cannot answer; use the async path."""


# Before sleeping in recv for a reply, poll for it this long (0: never): a reply that comes
# while we poll needs no wake-up of this thread (expensive across CPUs on a VM). Adaptive: after
# SPIN_MISSES_MAX polls in a row that ran out, no polling for SPIN_PAUSE_CALLS calls.
SPIN_US = int(os.environ.get("LOOMFS_FASTPATH_SPIN_US", "0"))
SPIN_MISSES_MAX = 8
SPIN_PAUSE_CALLS = 256


# a connection unused this long is replaced before the next call, as RpcClient does, so a call
# never races meta closing it for idleness (``net.limits.IDLE_TIMEOUT_S``)
IDLE_RECONNECT_S = IDLE_TIMEOUT_S / 2


class _Conn:
    __slots__ = ("address", "sock", "buf", "spin_ns", "spin_misses", "spin_paused", "spin_hits", "used_at")

    def __init__(self, address: Address, timeout_s: float, tls: ssl.SSLContext | None = None):
        self.address = address
        sock = socket.create_connection((address.host, address.port), timeout=timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            try:
                sock = tls.wrap_socket(sock, server_hostname=address.host)
            except BaseException:
                sock.close()
                raise
        self.sock = sock
        # the kernel keeps the deadline (each send/recv gives up after timeout_s): a Python
        # socket timeout would add a poll() before every send and every receive
        tv = struct.pack("ll", int(timeout_s), int((timeout_s % 1) * 1_000_000))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
        self.sock.settimeout(None)
        self.buf = bytearray(64 << 10)
        self.spin_ns = SPIN_US * 1000 if tls is None else 0  # (an SSL socket takes no MSG_DONTWAIT)
        self.spin_misses = 0
        self.spin_paused = 0
        self.spin_hits = 0
        self.used_at = time.monotonic()

    def _poll_first(self, view: memoryview) -> int:
        """The first bytes of the reply if they come within the spin time, else 0."""
        if self.spin_paused:
            self.spin_paused -= 1
            return 0
        recv_into = self.sock.recv_into
        deadline = time.perf_counter_ns() + self.spin_ns
        while True:
            try:
                k = recv_into(view, 0, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                if time.perf_counter_ns() < deadline:
                    continue
                self.spin_misses += 1
                if self.spin_misses >= SPIN_MISSES_MAX:
                    self.spin_misses = 0
                    self.spin_paused = SPIN_PAUSE_CALLS
                return 0
            if k == 0:
                raise ConnectionResetError("meta closed the connection")
            self.spin_misses = 0
            self.spin_hits += 1
            return k

    def _recv_into(self, view: memoryview, got: int, need: int) -> int:
        """Receive into ``view[got:]`` until at least ``need`` bytes are there; returns how many."""
        while got < need:
            k = self.sock.recv_into(view[got:])
            if k == 0:
                raise ConnectionResetError("meta closed the connection")
            got += k
        return got

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class SyncMetaPath:
    """Per-thread blocking connections to the async core's current meta server."""

    _ids = itertools.count(1 << 40)  # distinct from the async connections' request ids

    def __init__(self, meta_client: Any, *, timeout_s: float = 10.0):
        self._meta = meta_client  # the async MetaClient: its ``_preferred`` is the server to use
        self.timeout_s = timeout_s
        self._deadline_ms = int(timeout_s * 1000)
        self._local = threading.local()
        self.calls = 0
        self.fallbacks = 0

    def _transport_parts(self) -> tuple[Credential | None, ssl.SSLContext | None]:
        """The credential and TLS context the async core's connections use; ``Unavailable``
        when its transport is not plain TCP (fault injection, the simulator)."""
        rpc = getattr(self._meta, "rpc", None)
        if rpc is None:  # nothing to prove (a bare address: tests)
            return None, None
        transport = getattr(rpc, "transport", None)
        if not isinstance(transport, TcpTransport):
            raise Unavailable(f"transport {type(transport).__name__}")
        auth = transport.auth
        return rpc.credential, (auth.tls_client if auth is not None else None)

    def _connect(self, address: Address) -> _Conn:
        """A new connection to ``address``, authenticated as the async core's connections are."""
        cred, tls = self._transport_parts()
        conn = _Conn(address, self.timeout_s, tls)
        try:
            if cred is not None:
                self._handshake(conn, cred)
        except BaseException:
            conn.close()
            raise
        return conn

    def _handshake(self, conn: _Conn, cred: Credential) -> None:
        client_nonce = new_nonce()
        h = self._exchange(conn, wa.HELLO, wa.HelloReq(client_nonce=client_nonce))
        if h.status != Status.OK:
            raise Unavailable(f"handshake: status {h.status}")
        hello = wa.HelloRsp.from_wire(h.body)
        if not hello.auth_required:
            return  # a server without a cluster secret
        if len(hello.server_nonce) != wa.NONCE_BYTES:
            raise Unavailable("handshake: bad server nonce")
        proof = client_proof(cred.key, hello.server_nonce, client_nonce)
        h = self._exchange(conn, wa.PROVE, wa.ProveReq(claims=cred.claims.to_wire(), proof=proof))
        if h.status != Status.OK:
            raise Unavailable(f"handshake refused: status {h.status}")  # the async path reports it
        rsp = wa.ProveRsp.from_wire(h.body)
        if rsp.server_proof != server_proof(cred.key, hello.server_nonce, client_nonce):
            raise Unavailable("the server did not prove the cluster secret")

    def _exchange(self, conn: _Conn, m: Method, req: Message) -> fr.Header:
        """Send one request and receive its reply's header (checked: kind, request id, CRCs);
        the handshake's calls (a ``Header`` for ``wa`` replies)."""
        status, message, body = self._roundtrip(conn, m.service, m.method, req.to_wire())
        return fr.Header(m.service, m.method, 0, 0, status, message, body)

    def _roundtrip(self, conn: _Conn, service: int, method: int, body: dict[str, Any]) -> tuple[int, str, Any]:
        """One request out, its reply in: (status, message, body). The bytes ``fr.encode``
        would send; the reply checked as ``fr.parse_prefix`` / ``fr.decode_header`` and the old
        exchange did (magic, version, kind, bounds, both CRCs, the request id, the types of the
        fields used), without building a ``Header`` or a ``Prefix``: this runs once per
        blocking stat, cat and pipe."""
        rid = next(self._ids)
        t = _trace_get() or _new_trace()
        raw = fr.pack([service, method, rid, self._deadline_ms, 0, "", body, t])
        conn.sock.sendall(_PREFIX_PACK(fr.MAGIC, fr.VERSION, fr.KIND_REQUEST, len(raw), 0, 0, _crc(raw)) + raw)
        # the reply: a small one comes in one recv (one call is in flight per connection, so
        # nothing after the frame can be there)
        buf = conn.buf
        got = conn._poll_first(memoryview(buf)) if conn.spin_ns else 0
        if got < _PREFIX_SIZE:
            got = conn._recv_into(memoryview(buf), got, _PREFIX_SIZE)
        magic, version, kind, hlen, plen, pcrc, hcrc = _PREFIX_UNPACK(buf, 0)
        if magic != fr.MAGIC or version != fr.VERSION or kind != fr.KIND_RESPONSE:
            raise fr.FrameError(f"bad reply prefix {magic:#x}/{version}/{kind}")
        if hlen == 0 or hlen > fr.MAX_HEADER_BYTES or plen > MAX_REPLY_BYTES:
            raise fr.FrameError(f"reply header/payload length {hlen}/{plen} out of bounds")
        hend = _PREFIX_SIZE + hlen
        end = hend + plen
        if got < end:
            if end > len(buf):
                grown = bytearray(end)
                grown[:got] = buf[:got]
                buf = conn.buf = grown
            conn._recv_into(memoryview(buf), got, end)
        elif got > end:
            raise fr.FrameError("bytes after the reply")
        view = memoryview(buf)
        header = view[_PREFIX_SIZE:hend]
        if _crc(header) != hcrc:
            raise fr.FrameError("header checksum mismatch")
        if plen and _crc(view[hend:end]) != pcrc:
            raise fr.FrameError("payload checksum mismatch")
        try:
            items = _unpackb(header, raw=False, strict_map_key=True, use_list=True)
        except Exception as exc:  # msgpack raises several types
            raise fr.FrameError(f"undecodable header: {exc}") from exc
        if type(items) is not list or len(items) < 7:
            raise fr.FrameError("header is not a 7-item array")
        status, message, rbody = items[4], items[5], items[6]
        if items[2] != rid or type(items[2]) is not int:
            raise fr.FrameError("reply does not match the request")
        if type(status) is not int or not isinstance(message, str) or not isinstance(rbody, dict):
            raise fr.FrameError("header status/message/body have wrong types")
        return status, message, rbody

    def call(self, m: Method, req: Message | dict[str, Any], *, resend_safe: bool = False,
             decode: bool = True) -> Any:
        """``resend_safe``: the caller accepts that a call whose reply was lost (``Unavailable``
        after sending) is sent again by the async path, as ``MetaClient`` re-sends a
        non-idempotent call whose connection broke (a put: the same content again; an unlink:
        ENOENT for its own work, like NFS). ``decode`` False: the reply's body as it came (a
        msgpack map), for a caller that looks at a field or two before it decodes the rest
        (``m.response.from_wire``). ``req``: the request, or its body as ``req.to_wire()``
        gives it (a caller on a hot path builds that map itself: a ``Message``'s constructor
        and encoder cost ~3 us for an OPEN)."""
        if not m.idempotent and not resend_safe:
            raise Unavailable(m.name)
        address: Address | None = getattr(self._meta, "_preferred", None)
        if address is None:
            raise Unavailable("no meta server chosen yet")
        conn: _Conn | None = getattr(self._local, "conn", None)
        try:
            now = time.monotonic()
            if conn is None or (conn.address is not address and conn.address != address) \
                    or now - conn.used_at > IDLE_RECONNECT_S:
                if conn is not None:
                    conn.close()
                    self._local.conn = None
                conn = self._local.conn = self._connect(address)
            conn.used_at = now
            status, message, body = self._roundtrip(
                conn, m.service, m.method, req if isinstance(req, dict) else req.to_wire())
        except (OSError, fr.FrameError, Unavailable) as exc:
            if conn is not None:
                conn.close()
            self._local.conn = None
            self.fallbacks += 1
            raise exc if isinstance(exc, Unavailable) else Unavailable(str(exc)) from exc
        if status != 0:  # Status.OK
            st = Status(status) if status in Status._value2member_map_ else Status.INTERNAL
            if st.is_errno and st not in RETRYABLE:
                self.calls += 1
                raise from_status(status, message)
            if st in AUTH_STATUSES:  # an expired or revoked token: shake hands again next time
                conn.close()
                self._local.conn = None
            self.fallbacks += 1
            raise Unavailable(st.name)  # shutting down, EAGAIN, ...: the async path handles it
        self.calls += 1
        return m.response.from_wire(body) if decode else body

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def __repr__(self) -> str:
        return f"SyncMetaPath(calls={self.calls} fallbacks={self.fallbacks})"
