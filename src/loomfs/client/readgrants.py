"""The client's read grants (``loomfs.common.grants``): one per inode it reads in chunks, asked of
meta by inode (READ_GRANTS, ``meta/readgrants.py``) the first time, kept until past half its
life, sent with every chunk READ of that inode (``ReadReq.grant``).

``get(inode)`` is the hot path (a dict look-up and a clock comparison); ``fetch(inode)`` asks meta
(concurrent readers of one inode share one question, and inodes asked at the same moment go in
one request); ``drop(inode)`` forgets a grant storage refused (then fetch again, once).

Lazy until storage asks: grants come free in meta's open / READ / READ_MANY replies (``note``),
and ``grant_for`` fetches one for an inode without a kept grant only once this client has seen
storage refuse a read for want of one (``fetch`` after a refusal turns that on). So while
storage does not require read grants, a client never pays a READ_GRANTS round trip.
Without ``fetch_many`` (a client of a cluster without auth, tests' fakes) nothing is fetched
and reads carry no grant, as before read grants. A reply with ``ttl_s == 0`` means meta issues
no grants to this caller (no cluster secret, or an admin token, which storage lets through):
fetching stops for good.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from loomfs.common import grants

READ_GRANTS_MAX = 65536  # inodes whose read grant a client keeps (the oldest go first)
DENIED_KEEP_S = 5.0  # an inode meta granted nothing for is not asked about again for this long
BATCH_MAX = 1024  # inodes per READ_GRANTS (wire.grants.READ_GRANTS_INODES_MAX)

# (inodes, proofs: the grants held for them, maybe expired) -> (new grants, ttl_s)
FetchMany = Callable[[list[int], list[bytes]], Awaitable[tuple[list[bytes], float]]]


class ReadGrants:
    def __init__(self, fetch_many: FetchMany | None = None, *, monotonic: Callable[[], float] = time.monotonic):
        self.fetch_many = fetch_many
        self.monotonic = monotonic
        self._kept: dict[int, tuple[bytes, float]] = {}  # inode -> (grant, renew after; monotonic s)
        # inode -> the last grant meta gave (kept past a refusal): READ_GRANTS renews only with it
        self._proofs: dict[int, bytes] = {}
        self._asking: dict[int, asyncio.Future[bytes]] = {}
        self._queued: list[int] = []
        self.fetches_total = 0  # READ_GRANTS requests sent
        self.eager = False  # storage refused a read without a grant: fetch before reading from now on

    def get(self, inode: int) -> bytes:
        """The grant to send with a READ of ``inode`` (b"" when none is kept or it is due for renewal)."""
        kept = self._kept.get(inode)
        if kept is None or self.monotonic() > kept[1]:
            return b""
        return kept[0]

    async def grant_for(self, inode: int) -> bytes:
        """A kept grant, else one fetched from meta (b"" when meta grants none or cannot be asked)."""
        kept = self._kept.get(inode)
        if kept is not None and self.monotonic() <= kept[1]:
            return kept[0]  # (b"": meta denied it a moment ago)
        if self.fetch_many is None or not self.eager:
            return b""
        return await self.fetch(inode)

    async def fetch(self, inode: int) -> bytes:
        """Ask meta for ``inode``'s grant now (a read was refused for want of one: from now on
        ``grant_for`` fetches before reading)."""
        if self.fetch_many is None:
            return b""
        self.eager = True
        fut = self._asking.get(inode)
        if fut is None:
            fut = self._asking[inode] = asyncio.get_running_loop().create_future()
            self._queued.append(inode)
            if len(self._queued) == 1:  # the first of a burst sends them all, after this turn
                asyncio.get_running_loop().call_soon(self._send)
        return await asyncio.shield(fut)

    def _send(self) -> None:
        batch, self._queued = self._queued[:BATCH_MAX], self._queued[BATCH_MAX:]
        if self._queued:
            asyncio.get_running_loop().call_soon(self._send)
        asyncio.ensure_future(self._ask(batch))

    async def _ask(self, inodes: list[int]) -> None:
        assert self.fetch_many is not None
        self.fetches_total += 1
        proofs = [self._proof(inode) for inode in inodes]
        try:
            got, ttl_s = await self.fetch_many(inodes, proofs)
        except BaseException as exc:  # the readers see meta's error (and retry as they would)
            for inode in inodes:
                fut = self._asking.pop(inode, None)
                if fut is not None and not fut.done():
                    fut.set_exception(exc if isinstance(exc, Exception) else ConnectionError(str(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        if ttl_s <= 0:
            self.fetch_many = None  # meta grants this caller nothing (no secret, or an admin)
        else:
            now = self.monotonic()
            for inode, grant in zip(inodes, got, strict=False):
                self._kept.pop(inode, None)
                self._kept[inode] = (grant, now + (ttl_s / 2 if grant else min(DENIED_KEEP_S, ttl_s / 2)))
        while len(self._kept) > READ_GRANTS_MAX:
            del self._kept[next(iter(self._kept))]
        for i, inode in enumerate(inodes):
            fut = self._asking.pop(inode, None)
            if fut is not None and not fut.done():
                fut.set_result(got[i] if i < len(got) else b"")

    def _proof(self, inode: int) -> bytes:
        kept = self._kept.get(inode)
        return kept[0] if kept is not None and kept[0] else self._proofs.get(inode, b"")

    def note(self, inode: int, grant: bytes) -> None:
        """Keep a grant meta put into an open / READ / READ_MANY reply (no round trip of its own)."""
        if not grant:
            return
        left_s = grants.expires_at_s(grant) - time.time()
        if left_s <= 0:
            return
        self._kept.pop(inode, None)
        self._kept[inode] = (grant, self.monotonic() + left_s / 2)
        while len(self._kept) > READ_GRANTS_MAX:
            del self._kept[next(iter(self._kept))]

    def drop(self, inode: int) -> None:
        """Storage refused the kept grant: not sent again, but kept as the proof a renewal shows."""
        kept = self._kept.pop(inode, None)
        if kept is not None and kept[0]:
            self._proofs[inode] = kept[0]
            while len(self._proofs) > READ_GRANTS_MAX:
                del self._proofs[next(iter(self._proofs))]

    def __len__(self) -> int:
        return len(self._kept)

    def __repr__(self) -> str:
        return f"ReadGrants(kept={len(self._kept)} fetches={self.fetches_total})"


def meta_fetcher(meta: object) -> FetchMany:
    """``fetch_many`` through a ``MetaClient`` (READ_GRANTS; failover and retries are its own)."""
    from loomfs.wire.grants import READ_GRANTS, ReadGrantsReq

    async def fetch_many(inodes: list[int], proofs: list[bytes]) -> tuple[list[bytes], float]:
        rsp = await meta.call(READ_GRANTS, ReadGrantsReq(inodes=inodes, proofs=proofs))  # type: ignore[attr-defined]
        return list(rsp.grants), float(rsp.ttl_s)

    return fetch_many
