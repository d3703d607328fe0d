"""Userspace network faults for tests: a Transport wrapper driven by a rules file.

The kernel here has no netem, and every service of a local cluster shares 127.0.0.1, so
network cuts between two services are made inside the processes: every outbound
connection of a process goes through ``FaultyTransport``, which consults the rules in the
JSON file named by ``$LOOMFS_FAULTS_FILE`` (re-read when it changes, checked at most every
``RELOAD_INTERVAL_S``). A rule matches a destination ``host:port`` (or ``*``):

* ``blackhole`` — a partition: connects hang until their timeout, frames sent are dropped
  and frames received on existing connections are dropped (the peer's replies vanish);
* ``reset`` — connects are refused and existing connections are reset on the next send;
* ``delay`` — every frame sent waits ``delay_ms`` first.

``{"rules": [{"to": "127.0.0.1:7001", "action": "blackhole"}]}``. Rules are outbound: a
symmetric cut between A and B is a rule for B in A's file and one for A in B's. Without the
environment variable nothing is wrapped (production never pays for this).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from loomfs.errors import ConnectionFailed, TimedOut
from loomfs.net.protocol import FrameSink
from loomfs.net.scatter import Scatter
from loomfs.net.transport import Address, Channel, Listener, SinkFactory, Transport
from loomfs.wire import frame as fr

logger = logging.getLogger(__name__)

ENV_VAR = "LOOMFS_FAULTS_FILE"
RELOAD_INTERVAL_S = 0.1
ACTIONS = ("blackhole", "reset", "delay")


@dataclass(frozen=True, slots=True)
class Rule:
    to: str  # "host:port" or "*"
    action: str
    delay_ms: float = 0.0


def parse_rules(text: str) -> list[Rule]:
    """Rules from the file's JSON text; a malformed file is an error (tests must not guess)."""
    if not text.strip():
        return []
    doc = json.loads(text)
    rules = []
    for r in doc.get("rules", []):
        action = r.get("action", "")
        if action not in ACTIONS:
            raise ValueError(f"fault rule {r!r}: action must be one of {ACTIONS}")
        rules.append(Rule(str(r.get("to", "*")), action, float(r.get("delay_ms", 0.0))))
    return rules


def write_rules(path: str | os.PathLike[str], rules: list[Rule]) -> None:
    """Replace a process's rules atomically (the process picks them up within 0.1 s)."""
    p = Path(path)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps({"rules": [{"to": r.to, "action": r.action, "delay_ms": r.delay_ms}
                                         for r in rules]}))
    os.replace(tmp, p)


class FaultRules:
    """The current rules of one process, re-read from ``path`` when the file changes."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._rules: list[Rule] = []
        self._stamp: tuple[int, int] | None = None
        self._checked_s = 0.0

    def _reload(self) -> None:
        now = time.monotonic()
        if now - self._checked_s < RELOAD_INTERVAL_S:
            return
        self._checked_s = now
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            rules = parse_rules(self.path.read_text()) if stamp is not None else []
        except (OSError, ValueError) as exc:
            logger.error("fault rules %s unreadable, keeping the old ones: %s", self.path, exc)
            return
        if rules != self._rules:
            logger.warning("fault injection: rules now %s", rules or "none")
        self._rules = rules

    def match(self, address: Address | str) -> Rule | None:
        self._reload()
        text = str(address)
        for r in self._rules:
            if r.to in (text, "*"):
                return r
        return None


class _FaultySink:
    """Drops frames received while the connection's destination is blackholed."""

    def __init__(self, inner: FrameSink, rules: FaultRules, address: Address):
        self.inner, self.rules, self.address = inner, rules, address

    def payload_buffer(self, kind: int, header: fr.Header, length: int) -> memoryview | Scatter | None:
        return self.inner.payload_buffer(kind, header, length)

    def frame_received(self, kind: int, header: fr.Header, payload: memoryview, crc_ok: bool) -> None:
        rule = self.rules.match(self.address)
        if rule is not None and rule.action == "blackhole":
            return
        self.inner.frame_received(kind, header, payload, crc_ok)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.inner.connection_lost(exc)


class _FaultyChannel:
    def __init__(self, inner: Channel, rules: FaultRules, address: Address):
        self.inner, self.rules, self.address = inner, rules, address
        self.peer = inner.peer

    async def send(self, prefix_and_header: bytes, payload: bytes | bytearray | memoryview | None) -> None:
        rule = self.rules.match(self.address)
        if rule is not None:
            if rule.action == "blackhole":
                return
            if rule.action == "reset":
                self.inner.abort(ConnectionResetError("fault injection: reset"))
                raise ConnectionResetError(f"fault injection: connection to {self.address} reset")
            if rule.delay_ms > 0:
                await asyncio.sleep(rule.delay_ms / 1000)
        await self.inner.send(prefix_and_header, payload)

    def abort(self, exc: BaseException | None = None) -> None:
        self.inner.abort(exc)

    def pause_reading(self) -> None:
        self.inner.pause_reading()

    def resume_reading(self) -> None:
        self.inner.resume_reading()

    @property
    def closed(self) -> bool:
        return self.inner.closed


class FaultyTransport(Transport):
    """Wraps a transport; outbound connections obey ``rules``; listening is untouched."""

    def __init__(self, inner: Transport, rules: FaultRules):
        self.inner = inner
        self.rules = rules
        self.max_payload_bytes = inner.max_payload_bytes
        self.auth = inner.auth

    async def connect(self, address: Address, sink_factory: SinkFactory, *, timeout_s: float) -> Channel:
        rule = self.rules.match(address)
        if rule is not None:
            if rule.action == "blackhole":
                await asyncio.sleep(timeout_s)
                raise TimedOut(f"connect to {address} timed out (fault injection: blackhole)")
            if rule.action == "reset":
                raise ConnectionFailed(f"connect to {address}: reset (fault injection)")
            if rule.delay_ms > 0:
                await asyncio.sleep(rule.delay_ms / 1000)
        channel = await self.inner.connect(
            address, lambda ch: _FaultySink(sink_factory(ch), self.rules, address), timeout_s=timeout_s
        )
        return _FaultyChannel(channel, self.rules, address)

    async def listen(self, address: Address, sink_factory: SinkFactory) -> Listener:
        return await self.inner.listen(address, sink_factory)


def maybe_faulty(transport: Transport) -> Transport:
    """``transport`` wrapped in fault injection when ``$LOOMFS_FAULTS_FILE`` is set."""
    path = os.environ.get(ENV_VAR)
    if not path:
        return transport
    logger.warning("fault injection enabled: rules from %s", path)
    return FaultyTransport(transport, FaultRules(path))
