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
from typing import Any, Protocol

import crc32c

from loomfs.client.readgrants import ReadGrants
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
    QUERY_CHUNKS,
    READ,
    REMOVE_CHUNKS,
    REPORT_CORRUPT,
    TRUNCATE,
    WRITE,
    ChunkId,
    QueryChunksReq,
    ReadReq,
    ReadRsp,
    RemoveChunksReq,
    ReportCorruptReq,
    RequestTag,
    TruncateReq,
    WriteReq,
)
from loomfs.wire.types import Layout

logger = logging.getLogger(__name__)

INDEX_END_ALL = 1 << 62
FENCED_ATTEMPTS = 5  # a fenced trim looks again this often when chunks were written meanwhile
QUERY_PAGE = 10_000
REMOVE_BATCH = 1024  # deleted files per removal request (storage takes up to 4097)
CORRUPT_ROUNDS_MAX = 2  # a chunk failing its CRC on every serving replica this often is EIO
CORRUPT_REREAD_S = 0.5  # ... waiting this long between (the replicas were told to repair it)

# ReadReq.grant (issue 13's read grants) is being added to the wire types: until it is there,
# reads carry no grant and none is fetched
READ_REQ_HAS_GRANT = "grant" in getattr(ReadReq, "__dataclass_fields__", {})
GRANT_REFUSED = frozenset({Status.EACCES, Status.AUTH_EXPIRED})  # a READ whose grant storage refused


def read_req(grant: bytes, **fields: Any) -> ReadReq:
    """A ReadReq with ``fields``, carrying ``grant`` when there is one (and the field exists)."""
    if grant and READ_REQ_HAS_GRANT:
        fields["grant"] = grant
    return ReadReq(**fields)


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

_ZEROS = bytes(1 << 20)
# a write's CRC32C is taken on a worker thread from this size on (the library releases the GIL:
# the chunks of a flush hash on several cores while the loop sends); below it, on the loop
CRC_OFF_LOOP_BYTES = 1 << 20


async def payload_crc(data: memoryview) -> int:
    """CRC32C of ``data``; big ones on the loop's default executor."""
    if len(data) < CRC_OFF_LOOP_BYTES:
        return crc32c.crc32c(data)
    return await asyncio.get_running_loop().run_in_executor(None, crc32c.crc32c, data)


def zero_fill(view: memoryview) -> None:
    """Write zeros over ``view`` without allocating per call."""
    pos, n = 0, len(view)
    while pos < n:
        k = min(n - pos, len(_ZEROS))
        view[pos : pos + k] = _ZEROS[:k]
        pos += k



WRITE_GRANTS_MAX = 65536  # inodes whose write grant a client keeps


def note_grant(store: object, inode: int, reply: object) -> None:
    """Keep the write grant of an open/create reply (none from a meta without auth) in
    ``store.write_grants`` (a StorageClient; test fakes have none), and its read grant, when meta
    put one in (``read_grant``), in ``store.read_grants`` (no READ_GRANTS round trip then)."""
    read_grant = getattr(reply, "read_grant", b"")
    read_kept = getattr(store, "read_grants", None)
    if read_grant and isinstance(read_kept, ReadGrants):
        read_kept.note(inode, read_grant)
    grant = getattr(reply, "write_grant", b"")
    kept = getattr(store, "write_grants", None)
    if not grant or kept is None:
        return
    kept.pop(inode, None)
    kept[inode] = grant
    while len(kept) > WRITE_GRANTS_MAX:  # bounded: the oldest go (opening again gets a new one)
        del kept[next(iter(kept))]

_U64 = (1 << 64) - 1


def replica_pick(inode: int, index: int, stripe: int) -> int:
    """Which serving replica (modulo their number) reads of chunk ``index`` of ``inode`` go
    to: the same one from every client, so a chunk read again and again (a KV-cache block) is
    held by one replica's page cache, not by each in turn. The chunks of one file on one chain
    (every ``stripe``-th) take the replicas in turn, from a place that depends on the inode."""
    h = (inode * 0x9E3779B97F4A7C15) & _U64  # splitmix64's finalizer
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _U64
    return (h ^ (h >> 31)) + index // max(1, stripe)


class _NoServingTarget(LoomError):
    """The chain has no serving target in our routing snapshot (refresh and retry)."""


class _ChainChanged(LoomError):
    """The chain was reconfigured while a call to it hung (retry on the new routing)."""


class ChunkStore(Protocol):
    """What the file layer needs from storage (a fake implements this in tests)."""

    async def read_chunk(
        self, layout: Layout, inode: int, index: int, offset: int, length: int, into: memoryview
    ) -> int: ...

    async def write_chunk(
        self, layout: Layout, inode: int, index: int, offset: int, data: memoryview
    ) -> None: ...

    async def truncate_chunk(self, layout: Layout, inode: int, index: int, length: int, *,
                             fenced: bool = False) -> None: ...

    async def remove_chunks(
        self, layout: Layout, inode: int, index_begin: int, index_end: int = INDEX_END_ALL, *,
        keep_versions: bool = False, fenced: bool = False,
    ) -> None: ...

    async def remove_file_chunks(self, inode: int, layout: Layout, length: int) -> None: ...

    async def remove_files_chunks(self, files: list[tuple[int, Layout]]) -> None: ...


class StorageClient:
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
        prefer = replica_pick(inode, index, len(layout.chains))

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
        self, layout: Layout, inode: int, index: int, offset: int, data: memoryview
    ) -> None:
        """Write ``data`` at ``offset`` of chunk ``index`` through the chain head."""
        chain_id = layout.chains[index % len(layout.chains)]
        crc = await payload_crc(data)
        chunk = ChunkId(inode=inode, index=index)
        async with self._chunk_updates.hold((inode, index)):
            tag = self._tag()

            def make(version: int, target: int) -> Message:
                return WriteReq(
                    chain_id=chain_id, chain_version=version, chunk=chunk, offset=offset,
                    length=len(data), chunk_size=layout.chunk_size, data_crc=crc, tag=tag,
                    durable=layout.durable, grant=self.write_grants.get(inode, b""),
                )

            await self._call_chain(chain_id, "head", WRITE, make, payload=data, payload_crc=crc)

    async def truncate_chunk(self, layout: Layout, inode: int, index: int, length: int, *,
                             fenced: bool = False) -> None:
        """Cut chunk ``index`` to ``length``. ``fenced`` (meta's trimmer): only if the chunk
        was not written after this call looked at it (a copy of the call that arrives late,
        after a write that followed the trim, must not cut that write)."""
        chain_id = layout.chains[index % len(layout.chains)]
        chunk = ChunkId(inode=inode, index=index)
        async with self._chunk_updates.hold((inode, index)):
            tag = self._tag()

            async def attempt() -> None:
                seen = (await self._head_versions(chain_id, inode, index, index + 1)).get(index, 0) if fenced else -1

                def make(version: int, target: int) -> Message:
                    return TruncateReq(
                        chain_id=chain_id, chain_version=version, chunk=chunk, length=length,
                        chunk_size=layout.chunk_size, tag=tag, if_ver_le=seen, durable=layout.durable,
                        grant=self.write_grants.get(inode, b""),
                    )

                await self._call_chain(chain_id, "head", TRUNCATE, make)

            await self._fenced(fenced, attempt, f"truncate of {inode}/{index}")

    async def remove_chunks(
        self, layout: Layout, inode: int, index_begin: int, index_end: int = INDEX_END_ALL, *,
        keep_versions: bool = False, fenced: bool = False,
    ) -> None:
        """Remove chunks [index_begin, index_end) of ``inode`` on every chain of the layout
        (``keep_versions``: a trim of a live file — chunks become empty new versions;
        ``fenced``: a trim that leaves alone chunks written after it looked, see
        ``truncate_chunk``)."""
        if index_end <= index_begin:
            return

        async def one(chain_id: int) -> None:
            async def attempt() -> None:
                tag = self._tag()  # each attempt a new request: chunks an earlier one cut are empty (skipped)
                seen: list[int] = []
                if fenced:
                    vers = await self._head_versions(chain_id, inode, index_begin, index_end)
                    seen = [x for iv in sorted(vers.items()) for x in iv]

                def make(version: int, target: int) -> Message:
                    return RemoveChunksReq(
                        chain_id=chain_id, chain_version=version, inode=inode,
                        index_begin=index_begin, index_end=index_end, tag=tag, keep_versions=keep_versions,
                        fenced=fenced, expect_vers=seen, grant=self.write_grants.get(inode, b""),
                    )

                await self._call_chain(chain_id, "head", REMOVE_CHUNKS, make)

            await self._fenced(fenced, attempt, f"trim of inode {inode} on chain {chain_id}")

        await asyncio.gather(*(one(c) for c in sorted(set(layout.chains))))

    async def _fenced(self, fenced: bool, attempt: Callable[[], Awaitable[None]], what: str) -> None:
        """Run ``attempt``; a fenced one refused because chunks were written after it looked
        (VERSION_MISMATCH) looks again, up to ``FENCED_ATTEMPTS`` times."""
        for n in range(FENCED_ATTEMPTS):
            try:
                await attempt()
                return
            except LoomError as exc:
                if not fenced or exc.status is not Status.VERSION_MISMATCH or n == FENCED_ATTEMPTS - 1:
                    raise
                logger.info("fenced %s: written meanwhile, looking again", what)

    async def _head_versions(self, chain_id: int, inode: int, index_begin: int, index_end: int) -> dict[int, int]:
        """index -> newest version (committed or pending) of the inode's chunks in the range at
        the chain's head."""
        out: dict[int, int] = {}
        begin = index_begin
        while begin < index_end:
            def make(version: int, target: int, begin: int = begin) -> Message:
                return QueryChunksReq(target_id=target, inode=inode, index_begin=begin, index_end=index_end,
                                      limit=QUERY_PAGE)

            rsp = await self._call_chain(chain_id, "head", QUERY_CHUNKS, make)
            metas = [m for m in rsp.body.chunks if m.chunk is not None]
            for m in metas:
                assert m.chunk is not None
                out[m.chunk.index] = max(m.commit_ver, m.update_ver)
            last = metas[-1].chunk if metas else None
            if not rsp.body.more or last is None:
                return out
            begin = last.index + 1
        return out

    async def remove_file_chunks(self, inode: int, layout: Layout, length: int) -> None:
        """Remove every chunk of a file (GC, O_TRUNC).

        ``length`` is the recorded file length; all chunks of the inode are removed anyway,
        since a writer may have written past the length meta recorded.
        """
        await self.remove_chunks(layout, inode, 0, INDEX_END_ALL)

    async def remove_files_chunks(self, files: list[tuple[int, Layout]]) -> None:
        """Remove every chunk of many deleted files (GC): one request per chain for up to
        ``REMOVE_BATCH`` of them, instead of one per chain per file."""
        by_chain: dict[int, list[int]] = {}
        for inode, layout in files:
            for chain_id in sorted(set(layout.chains)):
                by_chain.setdefault(chain_id, []).append(inode)

        async def one(chain_id: int, inodes: list[int]) -> None:
            tag = self._tag()

            def make(version: int, target: int) -> Message:
                return RemoveChunksReq(chain_id=chain_id, chain_version=version, inode=inodes[0],
                                       more_inodes=inodes[1:], tag=tag)

            await self._call_chain(chain_id, "head", REMOVE_CHUNKS, make)

        await asyncio.gather(*(one(c, inodes[i:i + REMOVE_BATCH]) for c, inodes in sorted(by_chain.items())
                               for i in range(0, len(inodes), REMOVE_BATCH)))

    def __repr__(self) -> str:
        return f"StorageClient(client={self.client_id:#x} retries={self.retries_total})"
