"""meta's CPU per request, end to end inside the process: ``python -m loomfs.bench.metacost``.

The request frames of a blocking client's stat, cold read (READ) and small put (OPEN with
the bytes) are fed to meta's real ``RpcServer`` (``MetaService`` over a ``Namespace`` on a
SQLite file in WAL mode, ``service.conflict_retrying`` as ``meta.server`` builds it) through a
``FrameProtocol`` whose transport only counts the replies: framing, admission, dispatch,
identity, permission checks, the store and the reply's encoding, no sockets. It prints CPU
microseconds per request (best of ``--rounds``), as TRUSTED (no auth), as an admin token's
identity (uid 0) and as uid 1000 (every permission check). Pin it (``taskset -c 1``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from typing import Any, cast

from loomfs.common.identity import TRUSTED, Identity, Right
from loomfs.meta.batch_service import BatchService
from loomfs.meta.ops.namespace import Namespace
from loomfs.meta.perm_cost import _OneChain
from loomfs.meta.service import MetaService, conflict_retrying
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.net.protocol import FrameProtocol
from loomfs.net.rpc import RpcServer
from loomfs.wire import frame as fr
from loomfs.wire import meta as w
from loomfs.wire import meta_batch as wb
from loomfs.wire.message import Message, Method
from loomfs.wire.types import Layout

KINDS = ("stat", "read", "put", "create", "read_many", "stat_many")
BATCH_FILES = 100  # paths per READ_MANY / STAT_MANY (as the bench sends them)


class _CountingTransport:
    """Enough of an asyncio transport for ``FrameProtocol``: replies are counted, not sent."""

    def __init__(self) -> None:
        self.writes = 0
        self.answered: asyncio.Future[None] | None = None  # set by the next reply

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def set_write_buffer_limits(self, high: int = 0, low: int = 0) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.writes += 1
        if self.answered is not None and not self.answered.done():
            self.answered.set_result(None)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False


def request_frame(m: Method, req: Message, rid: int) -> bytes:
    return fr.encode(fr.KIND_REQUEST, fr.Header(m.service, m.method, rid, 10_000, 0, "", req.to_wire()))


async def measure(files: int, rounds: int, kinds: tuple[str, ...] = KINDS, *,
                  metrics: bool = False, eager: bool = True) -> dict[tuple[str, str], float]:
    tmp = tempfile.mkdtemp(prefix="loomfs-metacost-")
    store = SqliteStore(os.path.join(tmp, "meta.db"))
    ns = Namespace(store, routing=cast(Any, _OneChain()), rng=random.Random(1),
                   default_layout=Layout(table_id=1, inline_max_bytes=65536))
    await ns.init()
    await ns.mkdir("/d1/d2/d3", parents=True, mode=0o777)
    live = conflict_retrying(ns)
    server = RpcServer("meta", cast(Any, None), eager=eager)  # as meta.server builds it on SQLite
    server.add_service(MetaService(live))
    server.add_service(BatchService(live))
    if metrics:  # as meta.server does: RPC observers and timed store transactions
        from loomfs.metrics import instrument_meta_store, start_service_metrics

        served = await start_service_metrics("meta", server, None, port=-1)
        instrument_meta_store(store, served.registry)
    proto = FrameProtocol(server._new_connection)  # noqa: SLF001  (the server's own sink factory)
    tr = _CountingTransport()
    proto.connection_made(cast(Any, tr))
    conn = cast(Any, proto.sink)
    paths = [f"/d1/d2/d3/f{i:05d}" for i in range(files)]
    data = os.urandom(4096)
    put = os.O_CREAT | os.O_WRONLY | os.O_TRUNC
    for p in paths:
        await ns.open(p, put, mode=0o666, data=data)
    rid = [0]

    def frames(kind: str) -> list[bytes]:
        out = []
        if kind in ("read_many", "stat_many"):
            m = wb.READ_MANY if kind == "read_many" else wb.STAT_MANY
            for i in range(0, len(paths), BATCH_FILES):
                rid[0] += 1
                out.append(request_frame(m, wb.PathsReq(paths=paths[i : i + BATCH_FILES]), rid[0]))
            return out
        for p in paths:
            rid[0] += 1
            if kind == "stat":
                out.append(request_frame(w.STAT, w.PathReq(path=p, follow_symlinks=True), rid[0]))
            elif kind == "read":
                out.append(request_frame(w.READ, w.PathReq(path=p), rid[0]))
            else:  # put: a new file each time (create), or the file again (O_TRUNC)
                q = f"{p}.{rid[0]}" if kind == "create" else p
                out.append(request_frame(w.OPEN, w.OpenReq(path=q, flags=put, mode=0o644, client_id=7,
                                                           data=data, data_crc=fr.crc(data)), rid[0]))
        return out

    def feed(f: bytes) -> None:
        dest = proto.get_buffer(len(f))
        dest[: len(f)] = f
        proto.buffer_updated(len(f))

    best: dict[tuple[str, str], float] = {}
    who_list = [("trusted", TRUSTED), ("uid0", Identity(uid=0, gid=0, rights=Right.ADMIN | Right.WRITE, token_id="t0")),
                ("uid1000", Identity(uid=1000, gid=1000, rights=Right.WRITE, token_id="t1"))]
    loop = asyncio.get_running_loop()
    try:
        for _ in range(rounds):
            for who_name, who in who_list:
                conn.identity = who
                for kind in kinds:
                    batch = frames(kind)
                    t0 = time.process_time()
                    for f in batch:
                        answered = tr.answered = loop.create_future()
                        loop.call_soon(feed, f)  # from a loop callback, as a socket's bytes arrive (no task)
                        await answered
                    us = (time.process_time() - t0) / files * 1e6
                    best[(kind, who_name)] = min(best.get((kind, who_name), us), us)
    finally:
        await store.close()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--metrics", action="store_true", help="with meta's Prometheus instrumentation")
    ap.add_argument("--no-eager", action="store_true", help="a Task per request (RpcServer(eager=False))")
    ap.add_argument("--only", default="", help="comma list of kinds (default all: stat,read,put,create)")
    args = ap.parse_args()
    kinds = tuple(args.only.split(",")) if args.only else KINDS
    best = asyncio.run(measure(args.files, args.rounds, kinds, metrics=args.metrics, eager=not args.no_eager))
    for kind in kinds:
        print(f"{kind:5s} " + "   ".join(f"{who} {best[(kind, who)]:6.1f} us" for who in ("trusted", "uid0", "uid1000")))


if __name__ == "__main__":
    main()
