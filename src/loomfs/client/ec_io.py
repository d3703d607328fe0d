"""Fragment I/O for erasure-coded files: fragments are ordinary chunks on single-replica chains.

Writes go through ``StorageClient.write_chunk`` (CRAQ head = tail here; routing-aware retries
until the call deadline), so a stripe is acknowledged only when every fragment committed.
Reads are *fast-fail*: one try at the chain's serving target (one more after a routing
refresh when routing was stale); a dead server, a corrupt chunk (CHECKSUM_MISMATCH), a hung
call past ``timeout_s`` raise ``FragmentUnavailable`` at once, and the stripe reader decodes
from other fragments instead of waiting for the storage client's retry deadline.
"""

from __future__ import annotations

import dataclasses
import logging

from loomfs.client.storage_client import (
    GRANT_REFUSED,
    READ_REQ_HAS_GRANT,
    StorageClient,
    read_req,
    zero_fill,
)
from loomfs.ec.stripe import HEADER_BYTES, Geometry
from loomfs.errors import LoomError
from loomfs.wire.status import Status
from loomfs.wire.storage import READ, ChunkId, ReadRsp
from loomfs.wire.types import Layout

logger = logging.getLogger(__name__)

FRAGMENT_READ_TIMEOUT_S = 5.0
_REFRESH = frozenset({Status.STALE_CHAIN_VERSION, Status.UNKNOWN_TARGET, Status.TARGET_NOT_SERVING,
                      Status.CHAIN_UNAVAILABLE, Status.NOT_HEAD})


class FragmentUnavailable(LoomError):
    """A fragment could not be read now (dead or hung server, corrupt chunk, no serving target)."""

    corrupt = False  # the server is up but its copy failed its CRC (rewrite it)


class FragmentIO:
    """The k+m chains of one EC file and calls on its fragment chunks."""

    def __init__(self, storage: StorageClient, layout: Layout, inode: int, *,
                 read_timeout_s: float = FRAGMENT_READ_TIMEOUT_S):
        if not layout.ec_k or len(layout.chains) != layout.ec_k + layout.ec_m:
            raise LoomError(f"inode {inode}: not an EC layout with k+m chains: {layout}")
        self.storage = storage
        self.layout = layout
        self.inode = inode
        self.geometry = Geometry(layout.ec_k, layout.ec_m, layout.chunk_size)
        # what storage sees: chunks of payload + trailer bytes, chunk i on chains[i % (k+m)]
        self.chunk_layout = dataclasses.replace(layout, chunk_size=layout.chunk_size + HEADER_BYTES)
        self.read_timeout_s = read_timeout_s
        self.reads_failed_total = 0

    def chain_of(self, index: int) -> int:
        """The chain of fragment chunk ``index`` (as the storage client routes it)."""
        return self.layout.chains[index % len(self.layout.chains)]

    async def write(self, index: int, data: memoryview, *, exact: bool = False, if_ver_le: int = -1) -> None:
        """Write one whole fragment chunk (payload + trailer) at chunk ``index`` (``exact``: then
        cut the chunk to that length, in case an older content was longer: repairs).
        ``if_ver_le`` >= 0 (a repair): only if the chunk is no newer than that version, and the
        cut only if nothing was written after this write (VERSION_MISMATCH otherwise)."""
        ver = await self.storage.write_chunk(self.chunk_layout, self.inode, index, 0, data, if_ver_le=if_ver_le)
        if exact:
            await self.storage.truncate_chunk(self.chunk_layout, self.inode, index, len(data),
                                              if_ver_le=ver if if_ver_le >= 0 else -1)

    async def head_version(self, index: int) -> int:
        """The newest version (committed or pending) of chunk ``index`` at its chain's head
        (0: none)."""
        vers = await self.storage.head_versions(self.chain_of(index), self.inode, index, index + 1)
        return vers.get(index, 0)

    async def remove_all(self, index_begin: int, index_end: int) -> None:
        await self.storage.remove_chunks(self.chunk_layout, self.inode, index_begin, index_end, keep_versions=True)

    async def remove_one(self, index: int) -> None:
        """Remove chunk ``index`` on its own chain only (``remove_all`` asks every chain)."""
        lay = dataclasses.replace(self.chunk_layout, chains=[self.chain_of(index)])
        await self.storage.remove_chunks(lay, self.inode, index, index + 1, keep_versions=True)

    def down(self, index: int) -> bool:
        """Whether chunk ``index``'s chain has no serving target in the cached routing."""
        rc = self.storage.routing
        return rc.has_routing and not rc.current.serving_targets(self.chain_of(index))

    async def read(self, index: int, offset: int, length: int, into: memoryview) -> int | None:
        """Read ``length`` bytes at ``offset`` of chunk ``index`` into ``into[:length]`` (what the
        chunk does not have there is zeroed). Returns the chunk's whole length, None if the chunk
        does not exist. Raises FragmentUnavailable."""
        into = into[:length]
        chain_id = self.chain_of(index)
        sc = self.storage
        grant = await sc.read_grant(self.inode)
        grant_renewed = False
        attempt = 0
        while attempt < 2:
            try:
                routing = await sc.routing.get() if attempt == 0 else await sc.routing.refresh(min_version=0)
                targets = routing.serving_targets(chain_id)
                if not targets:
                    raise FragmentUnavailable(f"chain {chain_id} has no serving target")
                target = targets[-1]
                req = read_req(grant, chain_id=chain_id, chain_version=routing.chain(chain_id).version,
                               chunk=ChunkId(inode=self.inode, index=index), offset=offset, length=length,
                               target_id=target)
                rsp = await sc.rpc.call(routing.address_of(target), READ, req, recv_into=into,
                                        timeout_s=self.read_timeout_s, retry=False)
            except FragmentUnavailable:
                self.reads_failed_total += 1
                raise
            except (TimeoutError, LoomError, OSError) as exc:
                st = getattr(exc, "status", None)
                if (st in GRANT_REFUSED and not grant_renewed and READ_REQ_HAS_GRANT
                        and sc.read_grants.fetch_many is not None):
                    grant_renewed = True  # storage wants a (fresh) read grant: once more with one
                    sc.read_grants.drop(self.inode)
                    try:
                        grant = await sc.read_grants.fetch(self.inode)
                    except (LoomError, OSError):
                        grant = b""  # meta could not say: this fragment is unavailable, as before
                    if grant:
                        continue
                if attempt == 0 and st in _REFRESH:
                    attempt += 1
                    continue
                self.reads_failed_total += 1
                err = FragmentUnavailable(f"fragment chunk {self.inode}:{index} on chain {chain_id}: {exc}")
                err.corrupt = st is Status.CHECKSUM_MISMATCH
                raise err from exc
            body: ReadRsp = rsp.body
            if not body.exists:
                zero_fill(into)
                return None
            n = len(rsp.payload)
            if n > length:
                raise FragmentUnavailable(f"chunk {self.inode}:{index}: {n} > {length} bytes")
            if n and rsp.payload.obj is not into.obj:
                into[:n] = rsp.payload
            if n < length:
                zero_fill(into[n:])
            return body.chunk_length
        raise FragmentUnavailable(f"chunk {self.inode}:{index}: routing stayed stale")  # pragma: no cover

    def __repr__(self) -> str:
        g = self.geometry
        return f"FragmentIO(inode={self.inode} {g.k}+{g.m} cs={g.chunk_size} chains={self.layout.chains})"
