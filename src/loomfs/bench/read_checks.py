"""What storage's per-read checks cost: server-side CPU of one READ handler call (a 4 KiB read
of a chunk in a memory engine, no sockets, no disk), pinned to one CPU, for

* ``none``: a privileged caller (services, admins, auth off): no check;
* ``tenant``: a tenant's token: the tenant check (``storage/tenantcheck.py``);
* ``tenant+grant``: and an HMAC-SHA256 read grant (``common.grants``) verified on every read;
* ``tenant+grant cached``: and the grant verified once, then a (token, inode) -> expiry look-up;
* ``tenant+ReadGrantCheck``: the shipped check (``storage/grantcheck.py``), inside the handler,
  after its first verify (what every later read of an inode by a token pays).

    python -m loomfs.bench.read_checks [--reads N] [--rounds R]

Rounds alternate the modes; the best (lowest) of the rounds is reported per mode, in CPU
microseconds per read (``time.process_time``), with the difference from ``none``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable

import crc32c

from loomfs.common import grants
from loomfs.common.identity import SERVICE, TENANT_SHIFT, Identity
from loomfs.errors import StatusError
from loomfs.net.rpc import CallContext, Reply, RpcClient
from loomfs.net.sim import SimNetwork
from loomfs.storage.engine.memory import MemoryEngine
from loomfs.storage.grantcheck import ReadGrantCheck
from loomfs.storage.service import StorageService
from loomfs.storage.target import StorageTarget, target_id_for
from loomfs.storage.tenantcheck import TenantCheck
from loomfs.testing.routing import StaticRouting
from loomfs.wire.status import Status
from loomfs.wire.storage import ChunkId, ReadReq, WriteReq
from loomfs.wire.types import ChainInfo, NodeInfo, NodeKind, RoutingInfo, TargetInfo, TargetState

MODES = ("none", "tenant", "tenant+grant", "tenant+grant cached", "tenant+ReadGrantCheck")
TID = target_id_for(1, 0)
INODE = 2 << TENANT_SHIFT | 5
CHUNK_BYTES = 64 << 10
READ_BYTES = 4 << 10
KEY = b"k" * 32


class _GrantReads:
    """A read-grant check as storage would run it (verify every time, or once per token+inode)."""

    def __init__(self, cached: bool):
        self.cached = cached
        self.seen: dict[tuple[str, int], int] = {}

    def check(self, identity: Identity, grant: bytes, inode: int, now_s: float) -> None:
        if self.cached:
            until = self.seen.get((identity.token_id, inode))
            if until is not None and now_s <= until:
                return
        try:
            grants.verify(KEY, grant, inode, identity.token_id, now_s)
        except grants.GrantError as exc:
            raise StatusError(Status.EACCES, exc.reason) from None
        if self.cached:
            self.seen[(identity.token_id, inode)] = int(grants.expires_at_s(grant))


def _pin() -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})


async def _setup() -> StorageService:
    routing = StaticRouting(RoutingInfo(
        version=1, nodes=[NodeInfo(node_id=1, kind=NodeKind.STORAGE, host="n1", port=9000)],
        targets=[TargetInfo(target_id=TID, node_id=1, chain_id=1, state=TargetState.SERVING)],
        chains=[ChainInfo(chain_id=1, version=1, targets=[TID])]))
    svc = StorageService([StorageTarget(TID, MemoryEngine())], routing, RpcClient(SimNetwork(seed=1).transport("n1")))

    async def resolve(name: str) -> int | None:
        return 2

    svc.tenant_check = TenantCheck(resolve)
    data = os.urandom(CHUNK_BYTES)
    req = WriteReq(chain_id=1, chain_version=1, chunk=ChunkId(inode=INODE), length=len(data),
                   chunk_size=CHUNK_BYTES, data_crc=crc32c.crc32c(data))
    await svc.write(req, CallContext(memoryview(data), 1, "bench", None, crc32c.crc32c(data), SERVICE))
    return svc


async def _round(svc: StorageService, mode: str, reads: int) -> float:
    ident = SERVICE if mode == "none" else Identity(uid=1000, gid=1000, tenant="t", token_id="0123456789abcdef")
    check: Callable[[Identity, bytes, int, float], None] | None = None
    if mode.startswith("tenant+grant"):
        check = _GrantReads(cached=mode.endswith("cached")).check
    grant = grants.mint(KEY, INODE, ident.token_id, time.time() + 3600)
    svc.read_grants = ReadGrantCheck(KEY if mode == "tenant+ReadGrantCheck" else None, required=True)
    if mode == "tenant+ReadGrantCheck":
        svc.read_grants.check(ident, grant, INODE)  # the first read's verify; the rest hit the table
    req = ReadReq(chain_id=1, chain_version=1, chunk=ChunkId(inode=INODE), offset=4096, length=READ_BYTES,
                  target_id=TID)
    ctx = CallContext(memoryview(b""), 1, "bench", None, 0, ident)
    now_s = time.time()
    start = time.process_time()
    for _ in range(reads):
        if check is not None:
            check(ident, grant, INODE, now_s)
        rsp = await svc.read(req, ctx)
        assert isinstance(rsp, Reply) and rsp.on_sent is not None
        rsp.on_sent()
    return (time.process_time() - start) / reads * 1e6


def _alone(svc: StorageService, reads: int) -> dict[str, float]:
    """Each check on its own (no read), CPU us per call: steadier than the differences above."""
    ident = Identity(uid=1000, gid=1000, tenant="t", token_id="0123456789abcdef")
    grant = grants.mint(KEY, INODE, ident.token_id, time.time() + 3600)
    now_s = time.time()
    inodes = (INODE,)
    tenant, hmac_once, cached = svc.tenant_check, _GrantReads(cached=False), _GrantReads(cached=True)
    shipped = ReadGrantCheck(KEY, required=True)
    out: dict[str, float] = {}
    for name, fn in (("tenant check", lambda: ident.privileged or tenant.check(ident, inodes, "read")),
                     ("grant HMAC verify", lambda: hmac_once.check(ident, grant, INODE, now_s)),
                     ("grant cached", lambda: cached.check(ident, grant, INODE, now_s)),
                     ("ReadGrantCheck, kept", lambda: shipped.check(ident, grant, INODE)),
                     ("empty call", lambda: None)):
        start = time.process_time()
        for _ in range(reads):
            fn()
        out[name] = (time.process_time() - start) / reads * 1e6
    return out


async def _main(reads: int, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    svc = await _setup()
    best = dict.fromkeys(MODES, float("inf"))
    alone: dict[str, float] = {}
    for _ in range(rounds):
        for mode in MODES:
            best[mode] = min(best[mode], await _round(svc, mode, reads))
        for k, v in _alone(svc, reads * 5).items():
            alone[k] = min(alone.get(k, float("inf")), v)
    await svc.rpc.close()
    return best, alone


def run(reads: int = 20_000, rounds: int = 5) -> tuple[dict[str, float], dict[str, float]]:
    _pin()
    return asyncio.run(_main(reads, rounds))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reads", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    best, alone = run(args.reads, args.rounds)
    base = best["none"]
    print(f"storage READ handler, {READ_BYTES} B of a {CHUNK_BYTES} B chunk, CPU us per read "
          f"(best of {args.rounds} x {args.reads}, pinned):")
    for mode in MODES:
        print(f"  {mode:22s} {best[mode]:7.2f} us  ({best[mode] - base:+.2f} us, x{best[mode] / base:.3f})")
    print("each check alone (a lambda around it; 'empty call' is that lambda's own cost), CPU us per call:")
    for name, us in alone.items():
        print(f"  {name:22s} {us:7.3f} us")


if __name__ == "__main__":
    main()
