"""Scrub and rebuild of erasure-coded files: every fragment of every stripe checked.

``scrub_file`` reads each stripe's k+m fragments whole, checks headers and CRC32C, decodes the
newest complete version and (``repair=True``) rewrites every fragment that is absent (e.g. on
an empty spare mgmtd swapped in for a dead target: the rebuild), corrupt or of another version,
and completes an overwrite that was cut short. After a repairing pass over a file whose
servers all answer, the file is back at full redundancy (k+m good fragments per stripe).
``unhealthy_chains`` names the chains that still hold a fragment not known good after the pass
(unreachable, or bad and not repaired): the background rebuild in meta
(``loomfs.meta.ec_rebuild``) counts a file rebuilt onto a chain once that chain is not among them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loomfs.client.ec_file import STATS
from loomfs.client.ec_io import FragmentIO
from loomfs.client.ec_stripe import repair_fragments, resolve, stripe_buffer_bytes
from loomfs.client.storage_client import StorageClient
from loomfs.ec.codec import make_codec
from loomfs.errors import LoomError
from loomfs.wire.types import Attr


@dataclass
class ScrubReport:
    path: str
    stripes: int = 0
    bad_fragments: int = 0  # absent, corrupt or stale (found)
    repaired_fragments: int = 0
    unreachable_fragments: int = 0  # their server did not answer: not checked
    lost_stripes: int = 0  # fewer than k good fragments: EIO on read
    unhealthy_chains: set[int] = field(default_factory=set)  # chains with a fragment not known good

    @property
    def full_redundancy(self) -> bool:
        return not (self.bad_fragments - self.repaired_fragments or self.unreachable_fragments or self.lost_stripes)


async def scrub_file(storage: StorageClient, path: str, attr: Attr, *, repair: bool) -> ScrubReport:
    lay = attr.layout
    if lay is None or not lay.ec_k:
        raise LoomError(f"{path}: not an erasure-coded file", path=path)
    io = FragmentIO(storage, lay, attr.inode)
    g = io.geometry
    codec = make_codec(g.k, g.m)
    rep = ScrubReport(path)
    buf = bytearray(stripe_buffer_bytes(g))
    for s in range(g.stripes(attr.size)):
        rep.stripes += 1
        try:
            res = await resolve(io, codec, STATS, s, buf, repair=False, full=True)
        except LoomError:
            rep.lost_stripes += 1
            rep.unhealthy_chains.update(io.chain_of(g.chunk_index(s, j)) for j in range(g.width))
            continue
        if res is None:
            continue  # a hole
        rep.bad_fragments += len(res.bad)
        rep.unreachable_fragments += len(res.unreachable)
        unhealthy = list(res.unreachable)
        if repair and (res.bad or res.from_shadow):
            done = await repair_fragments(io, STATS, s, buf, res)
            rep.repaired_fragments += len(done)
            # one not rewritten (failed, or written since it was read): looked at again later
            unhealthy += [j for j in res.bad if j not in done]
        else:
            unhealthy += res.bad
        rep.unhealthy_chains.update(io.chain_of(g.chunk_index(s, j)) for j in unhealthy)
    return rep
