"""Chunk I/O against storage chains: replica choice, CRAQ retries, routing refresh.

Reads go to any serving replica (random, to spread load) and move to the tail when a
replica answers NOT_COMMITTED; writes go to the chain head with a request tag that stays
the same across retries so the head applies a replayed write once. Routing problems
(stale chain version, unknown/not-serving target, chain being reconfigured, a dead
connection) refresh routing and retry with backoff until the call's deadline.

Failover: a replica that failed (dead connection, timeout, bad CRC) is avoided by the next
read attempts; a call that is slow (``watch_after_s``) watches routing meanwhile and is
abandoned for a retry as soon as its chain is reconfigured (a hung server is replaced by
mgmtd after its lease), so a server that dies costs a stall of about one lease, not an error.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from loomfs.client.chunk_store import (
    CRC_OFF_LOOP_BYTES,
    GRANT_REFUSED,
    INDEX_END_ALL,
    READ_REQ_HAS_GRANT,
    WRITE_GRANTS_MAX,
    ChunkStore,
    note_grant,
    payload_crc,
    read_req,
    replica_pick,
    zero_fill,
)
from loomfs.client.readgrants import ReadGrants
from loomfs.client.storage_trims import FENCED_ATTEMPTS, QUERY_PAGE, REMOVE_BATCH, ChunkTrims
from loomfs.common.clock import LOOP_CLOCK, Clock
from loomfs.common.keylocks import KeyLocks
from loomfs.common.retry import Backoff
from loomfs.common.routing import Routing, RoutingClient
from loomfs.errors import ChecksumError, ConnectionFailed, LoomError, ProtocolError, TimedOut
from loomfs.net.rpc import Response, RpcClient
from loomfs.net.scatter import Scatter
from loomfs.net.transport import Address
from loomfs.wire.message import Message, Method
from loomfs.wire.status import Status
from loomfs.wire.storage import (
    READ,
    REPORT_CORRUPT,
    WRITE,
    ChunkId,
    ReadRsp,
    ReportCorruptReq,
    RequestTag,
    WriteReq,
)
from loomfs.wire.types import Layout

__all__ = ["CRC_OFF_LOOP_BYTES", "FENCED_ATTEMPTS", "GRANT_REFUSED", "INDEX_END_ALL", "QUERY_PAGE",
           "READ_REQ_HAS_GRANT", "REMOVE_BATCH", "WRITE_GRANTS_MAX", "ChunkStore", "StorageClient",
           "note_grant", "payload_crc", "read_req", "replica_pick", "zero_fill"]

logger = logging.getLogger(__name__)

CORRUPT_ROUNDS_MAX = 2  # a chunk failing its CRC on every serving replica this often is EIO
CORRUPT_REREAD_S = 0.5  # ... waiting this long between (the replicas were told to repair it)

# statuses after which routing is refreshed before the next try
_REFRESH = frozenset(
    {
        Status.STALE_CHAIN_VERSION,
        Status.UNKNOWN_TARGET,
        Status.TARGET_NOT_SERVING,
        Status.CHAIN_UNAVAILABLE,
        Status.NOT_HEAD,
    }
)
# statuses retried as they are, after a backoff
_BACKOFF = frozenset({Status.SHUTTING_DOWN, Status.EAGAIN, Status.CHECKSUM_MISMATCH})


class _NoServingTarget(LoomError):
    """The chain has no serving target in our routing snapshot (refresh and retry)."""


class _ChainChanged(LoomError):
    """The chain was reconfigured while a call to it hung (retry on the new routing)."""


class StorageClient(ChunkTrims):
    """Chunk reads/writes with CRAQ replica choice and routing-aware retries."""

    def __init__(
        self,
        rpc: RpcClient,
        routing: RoutingClient,
        client_id: int,
        *,
        call_timeout_s: float = 30.0,
        backoff_initial_s: float = 0.02,
        backoff_max_s: float = 1.0,
        rng: random.Random | None = None,
        watch_after_s: float = 1.0,
        watch_refresh_s: float = 0.25,
        clock: Clock = LOOP_CLOCK,
    ):
        self.rpc = rpc
        self.clock = clock  # deadlines and watch intervals (the simulator passes virtual time)
        # meta's write grants (loomfs.common.grants) by inode, from open replies; sent with every
        # chunk change of that inode (storage checks them when the cluster has a secret)
        self.write_grants: dict[int, bytes] = {}
        # meta's read grants by inode, sent with every chunk READ (core sets fetch_many when it
        # has a token; without one nothing is fetched and reads carry none)
        self.read_grants = ReadGrants()
        self.routing = routing
        self.client_id = client_id
        self.call_timeout_s = call_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._rng = rng or random.Random()
        self._request_ids = itertools.count(1)
        # one update of a chunk in flight at a time (retries included): a chunk then sees this
        # client's request ids in increasing order, so replicas recognise a late duplicate of an
        # older request by its id alone (loomfs.storage.dedupe)
        self._chunk_updates: KeyLocks[tuple[int, int]] = KeyLocks()
        self.retries_total = 0
        self.corrupt_reports_total = 0
        self._reports: set[asyncio.Task[None]] = set()  # corrupt-chunk reports in flight
        self.failovers_total = 0  # calls abandoned because their chain changed under them
        self.watch_after_s = watch_after_s
        self.watch_refresh_s = watch_refresh_s
        self._watch_refreshed_s = 0.0

    async def _call_watching(self, chain_id: int, version: int, target: int, call: Awaitable[Response[Any]],
                             remaining: float) -> Response[Any]:
        """Run ``call``; once it is slow, refresh routing every ``watch_refresh_s`` and give up
        on it (raise _ChainChanged) when the chain's version moved past ``version``."""
        task = asyncio.ensure_future(call)
        try:
            done, _ = await asyncio.wait({task}, timeout=min(self.watch_after_s, remaining))
            end = self.clock.monotonic() + remaining
            while not done:
                r: Routing | None = None
                try:
                    if self.clock.monotonic() - self._watch_refreshed_s >= self.watch_refresh_s:
                        self._watch_refreshed_s = self.clock.monotonic()  # one refresh for all slow calls
                        r = await self.routing.refresh(min_version=0)
                    else:
                        r = await self.routing.get()
                except (LoomError, OSError):
                    pass
                info = r.chains.get(chain_id) if r is not None else None
                if info is not None and info.version > version:
                    self.failovers_total += 1
                    raise _ChainChanged(f"chain {chain_id} v{version} -> v{info.version} while waiting on "
                                        f"target {target}")
                left = end - self.clock.monotonic()
                if left <= 0:
                    break
                done, _ = await asyncio.wait({task}, timeout=min(self.watch_refresh_s, left))
            return await task
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def _report_corrupt(self, address: Address, target: int, req: Message) -> None:
        """Tell ``target`` its copy of the chunk failed the CRC here (a whole-chunk read is
        checked at the client only), so the node repairs it now; fire and forget."""
        chunk = getattr(req, "chunk", None)
        if chunk is None:
            return
        self.corrupt_reports_total += 1

        async def send() -> None:
            try:
                await self.rpc.call(address, REPORT_CORRUPT, ReportCorruptReq(target_id=target, chunk=chunk),
                                    timeout_s=5.0, retry=False)
            except (LoomError, OSError) as exc:
                logger.debug("reporting corrupt chunk %s on target %d failed: %s", chunk, target, exc)

        task = asyncio.ensure_future(send())
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    def _tag(self) -> RequestTag:
        return RequestTag(client_id=self.client_id, request_id=next(self._request_ids))

    async def _call_chain(
        self,
        chain_id: int,
        role: str,  # "any" | "head" | "tail"
        m: Method,
        make_req: Callable[[int, int], Message],  # (chain_version, target_id) -> request
        *,
        payload: memoryview | None = None,
        payload_crc: int | None = None,
        recv_into: memoryview | Scatter | None = None,
        prefer: int | None = None,
    ) -> Response[Any]:
        """``prefer`` (role "any"): pick replica ``prefer % n`` of the n candidates instead of
        a random one (a chunk's reads go to one replica, whose page cache then holds it)."""
        deadline = self.clock.monotonic() + self.call_timeout_s
        attempt = 0
        last: BaseException | None = None
        avoid: set[int] = set()  # replicas that just failed a read
        corrupt: set[int] = set()  # replicas whose copy failed its CRC in this call
        corrupt_rounds = 0  # times every serving replica failed it (each time they were told)
        while True:
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                raise TimedOut(f"{m.name} on chain {chain_id}: gave up after {attempt} tries: {last}") from last
            routing: Routing = await self.routing.get()
            refresh = False
            try:
                chain = routing.chain(chain_id)
                targets = routing.serving_targets(chain_id)
                if not targets:
                    raise _NoServingTarget(f"chain {chain_id} has no serving target")
                if role == "head":
                    target = targets[0]
                elif role == "tail":
                    target = targets[-1]
                else:
                    pick = [t for t in targets if t not in avoid] or targets
                    target = pick[(self._rng.randrange(len(pick)) if prefer is None else prefer) % len(pick)]
                address = routing.address_of(target)
                req = make_req(chain.version, target)
                call = self.rpc.call(
                    address,
                    m,
                    req,
                    payload=payload,
                    payload_crc=payload_crc,
                    recv_into=recv_into,
                    timeout_s=remaining,
                    retry=False,
                )
                return await self._call_watching(chain_id, chain.version, target, call, remaining)
            except _ChainChanged as exc:
                last = exc
                attempt += 1
                continue  # routing is already fresh: retry at once
            except (ConnectionFailed, TimedOut, _NoServingTarget) as exc:
                last, refresh = exc, True
                if role == "any" and not isinstance(exc, _NoServingTarget):
                    avoid.add(target)
            except LoomError as exc:
                st = exc.status
                if st is Status.NOT_COMMITTED and role == "any":
                    role, last = "tail", exc
                    attempt += 1
                    continue  # straight to the tail, no backoff
                elif st in _REFRESH:
                    last, refresh = exc, True
                    if st is Status.TARGET_NOT_SERVING and role == "any":
                        avoid.add(target)  # e.g. a replica cut off from mgmtd: read another one
                elif st in _BACKOFF or st is Status.NOT_COMMITTED:
                    last = exc
                    if st is Status.CHECKSUM_MISMATCH and m is READ:
                        avoid.add(target)  # a corrupt replica: read another one
                        corrupt.add(target)
                        self._report_corrupt(address, target, req)
                        if corrupt >= set(targets):
                            corrupt_rounds += 1
                            chunk = getattr(req, "chunk", None)
                            if corrupt_rounds >= CORRUPT_ROUNDS_MAX:
                                raise ChecksumError(
                                    f"chunk {chunk.inode}:{chunk.index} of chain {chain_id} failed its CRC32C on "
                                    f"every serving replica (targets {sorted(corrupt)}), also after they were "
                                    "told to repair it" if chunk is not None else str(exc)
                                ) from exc
                            # every copy we can read is bad: the nodes we told may repair theirs
                            # from a member that is not serving; read once more after a moment
                            await asyncio.sleep(CORRUPT_REREAD_S)
                            avoid.clear()
                            corrupt.clear()
                            continue
                        if role == "tail":
                            role = "any"  # the tail's copy is bad: another replica may serve it
                else:
                    raise
            attempt += 1
            self.retries_total += 1
            logger.debug("%s chain %d attempt %d: %s", m.name, chain_id, attempt, last)
            if refresh:
                try:
                    await self.routing.refresh(min_version=routing.version)
                except (LoomError, OSError) as exc:
                    logger.debug("routing refresh failed: %s", exc)
            delay = min(Backoff(self.backoff_initial_s, self.backoff_max_s).delay_s(attempt - 1, self._rng),
                        max(0.0, deadline - self.clock.monotonic()))
            await asyncio.sleep(delay)

    async def read_chunk(
        self, layout: Layout, inode: int, index: int, offset: int, length: int, into: memoryview
    ) -> int:
        """Read ``length`` bytes at ``offset`` of chunk ``index`` into ``into[:length]``.

        Returns how many bytes the chunk had there; the rest of ``into[:length]`` is zeroed
        (a missing or short chunk reads as zeros).
        """
        return (await self.read_chunk_crc(layout, inode, index, offset, length, into))[0]

    async def read_chunk_crc(
        self, layout: Layout, inode: int, index: int, offset: int, length: int, into: memoryview | Scatter
    ) -> tuple[int, int | None]:
        """``read_chunk`` and the CRC32C of ``into[:length]`` when the chunk had all ``length``
        bytes: the reply's payload CRC, checked on arrival (a caller holding its own CRC of
        those bytes compares instead of hashing them again); None when part was zero-filled.
        ``into`` may be a ``Scatter`` of exactly ``length`` bytes (the reply lands in its parts)."""
        if isinstance(into, Scatter):
            if len(into) != length:
                raise ValueError(f"scatter of {len(into)} bytes for a read of {length}")
        else:
            into = into[:length]
        chain_id = layout.chains[index % len(layout.chains)]
        chunk = ChunkId(inode=inode, index=index)
        grants = self.read_grants
        grant = await self.read_grant(inode)
        # one replica per chunk (its page cache keeps it hot), and chunks next to each other on
        # different chains read from different replica positions: chains list their replicas in
        # the same node order where a chain table is regular (the local cluster's), so two
        # chunks of one row read from one node, serially; a KV get of 16 x 2 MiB values (two
        # 16 MiB chunks) then had one storage node serve both (docs/kvcache.md, session 15)
        stripe = len(layout.chains)
        prefer = replica_pick(inode, index, stripe) + index % max(1, stripe)

        def make(version: int, target: int) -> Message:
            return read_req(grant, chain_id=chain_id, chain_version=version, chunk=chunk, offset=offset,
                            length=length, target_id=target)

        try:
            rsp = await self._call_chain(chain_id, "any", READ, make, recv_into=into, prefer=prefer)
        except LoomError as exc:
            if exc.status not in GRANT_REFUSED or not READ_REQ_HAS_GRANT or grants.fetch_many is None:
                raise
            grants.drop(inode)  # refused (expired, revoked key): once more with a fresh one
            grant = await grants.fetch(inode)
            if not grant:
                raise
            rsp = await self._call_chain(chain_id, "any", READ, make, recv_into=into, prefer=prefer)
        body: ReadRsp = rsp.body
        n = (rsp.scattered or len(rsp.payload)) if body.exists else 0
        if n > length:
            raise ProtocolError(f"read of chunk {inode}:{index} returned {n} > {length} bytes")
        if isinstance(into, Scatter):
            if n and not rsp.scattered:
                into.write(rsp.payload)  # a short reply: not received into the parts
            if n < length:
                into.zero_from(n)
                return n, None
        elif n and rsp.payload.obj is not into.obj:
            into[:n] = rsp.payload  # the transport could not use our buffer
        if n < length:
            assert not isinstance(into, Scatter)
            zero_fill(into[n:])
            return n, None
        return n, rsp.payload_crc if n else None

    async def read_grant(self, inode: int) -> bytes:
        """The read grant to send with a READ of ``inode`` (kept, else fetched from meta; b""
        without one)."""
        if not READ_REQ_HAS_GRANT:
            return b""
        return self.read_grants.get(inode) or await self.read_grants.grant_for(inode)

    async def write_chunk(
        self, layout: Layout, inode: int, index: int, offset: int, data: memoryview, *, if_ver_le: int = -1,
    ) -> int:
        """Write ``data`` at ``offset`` of chunk ``index`` through the chain head; returns the
        chunk's version after it. ``if_ver_le`` >= 0: only if the chunk is no newer than that
        version at the head (a fenced write: VERSION_MISMATCH, nothing written)."""
        chain_id = layout.chains[index % len(layout.chains)]
        crc = await payload_crc(data)
        chunk = ChunkId(inode=inode, index=index)
        async with self._chunk_updates.hold((inode, index)):
            tag = self._tag()

            def make(version: int, target: int) -> Message:
                return WriteReq(
                    chain_id=chain_id, chain_version=version, chunk=chunk, offset=offset,
                    length=len(data), chunk_size=layout.chunk_size, data_crc=crc, tag=tag,
                    durable=layout.durable, grant=self.write_grants.get(inode, b""), if_ver_le=if_ver_le,
                )

            rsp = await self._call_chain(chain_id, "head", WRITE, make, payload=data, payload_crc=crc)
            return int(rsp.body.commit_ver)

    def __repr__(self) -> str:
        return f"StorageClient(client={self.client_id:#x} retries={self.retries_total})"
