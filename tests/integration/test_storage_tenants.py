"""Storage confines tenants (issue 13; storage/tenantcheck.py), over real processes with auth on:
a tenant's token that calls storage directly with another tenant's chunk ids (read, listing,
write, removal) is refused EACCES and the refusal is logged; its own chunks are served, and its
ordinary client reads and writes work."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import crc32c
import pytest

import loomfs
from loomfs.config import ClientConfig, RpcConfig
from loomfs.errors import LoomError
from loomfs.net.auth import AuthConfig
from loomfs.net.credentials import create_token, load_secret_file, load_token_file, write_token_file
from loomfs.net.rpc import RpcClient
from loomfs.net.tcp import TcpTransport
from loomfs.net.transport import Address
from loomfs.testing import LocalCluster
from loomfs.wire import meta as wmeta
from loomfs.wire.storage import (
    QUERY_CHUNKS,
    READ,
    REMOVE_CHUNKS,
    WRITE,
    ChunkId,
    QueryChunksReq,
    ReadReq,
    RemoveChunksReq,
    WriteReq,
)
from loomfs.wire.types import NodeKind

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
CHUNK_BYTES = 4 << 20  # the default layout's chunk size


@pytest.fixture()
def token(cluster: LocalCluster, tmp_path: Path) -> Callable[..., Path]:
    def make(uid: int, gid: int, tenant: str = "") -> Path:
        cred = create_token(load_secret_file(cluster.secret_path), uid=uid, gid=gid, tenant=tenant, ttl_s=600,
                            now_s=time.time())
        path = tmp_path / f"token-{secrets.token_hex(4)}"
        write_token_file(path, cred)
        return path

    return make


@pytest.fixture()
def clients() -> Iterator[list[loomfs.LoomFS]]:
    opened: list[loomfs.LoomFS] = []
    yield opened
    for fs in opened:
        fs.close()


def _raw(token_file: Path, calls: Callable[[RpcClient], Any]) -> Any:
    """Run ``calls(rpc)`` with an RPC client proving ``token_file`` (a hostile client: no meta)."""
    async def go() -> Any:
        rpc = RpcClient(TcpTransport(auth=AuthConfig(credential=load_token_file(token_file))), call_timeout_s=10.0)
        try:
            return await calls(rpc)
        finally:
            await rpc.close()

    return asyncio.run(go())


def _errno_of(coro_fn: Callable[[RpcClient], Any], token_file: Path) -> int:
    async def attempt(rpc: RpcClient) -> int:
        try:
            await coro_fn(rpc)
        except LoomError as exc:
            return exc.errno or -1
        return 0

    return int(_raw(token_file, attempt))


def test_tenant_cannot_touch_another_tenants_chunks(cluster: LocalCluster, fs: loomfs.LoomFS,
                                                    token: Callable[..., Path],
                                                    clients: list[loomfs.LoomFS]) -> None:
    names = [f"st{secrets.token_hex(4)}" for _ in range(2)]
    for n in names:
        fs.run(fs.client.meta.call(wmeta.TENANT_CREATE, wmeta.TenantCreateReq(name=n, uid=1000, gid=1000)))
    tok_a, tok_b, tok_shared = token(1000, 1000, names[0]), token(1000, 1000, names[1]), token(1000, 1000)
    a = loomfs.connect(str(cluster.root), config=ClientConfig(rpc=RpcConfig(token_file=str(tok_a))))
    clients.append(a)
    data = os.urandom(3 << 20)  # past the inline limit: in chunks on storage
    with a.open("/big", "wb") as f:
        f.write(data)
    assert a.cat("/big") == data  # the tenant's own reads through storage's check
    ino = a.stat("/big").st_ino
    chunks = cluster.chunks_of(ino)
    assert chunks, "the file has chunks on storage"
    routing = cluster.routing()
    target_id, meta = chunks[0]
    assert meta.chunk is not None
    t = next(t for t in routing.targets if t.target_id == target_id)
    node = next(n for n in routing.nodes if n.node_id == t.node_id)
    addr = Address(node.host, node.port)
    chunk = ChunkId(inode=ino, index=meta.chunk.index)
    read = ReadReq(chain_id=t.chain_id, chain_version=next(c.version for c in routing.chains
                                                             if c.chain_id == t.chain_id),
                   chunk=chunk, length=meta.length, target_id=target_id)

    async def do_read(rpc: RpcClient) -> bytes:
        # storage also wants meta's read grant (storage/grantcheck.py): meta's READ of the path
        # gives one to a caller that may read it; the tenant check comes first at storage
        meta_node = next(n for n in routing.nodes if n.kind == NodeKind.META)
        try:
            got = (await rpc.call(Address(meta_node.host, meta_node.port), wmeta.READ, wmeta.PathReq(path="/big"))).body
            grant = got.read_grant
        except LoomError:
            grant = b""  # (another tenant: no /big there)
        return bytes((await rpc.call(addr, READ, dataclasses.replace(read, grant=grant))).payload)

    # the owning tenant, by raw RPC: served (the chunk's bytes are the file's)
    got = _raw(tok_a, do_read)
    start = meta.chunk.index * CHUNK_BYTES
    assert got == data[start:start + meta.length] and len(got) == meta.length > 0
    # another tenant and a tenant-less user: refused, whatever they call
    evil = b"evil"
    write = WriteReq(chain_id=t.chain_id, chain_version=read.chain_version, chunk=chunk, offset=0, length=len(evil),
                     chunk_size=CHUNK_BYTES, data_crc=crc32c.crc32c(evil))
    refused: list[Callable[[RpcClient], Any]] = [
        do_read,
        lambda rpc: rpc.call(addr, QUERY_CHUNKS, QueryChunksReq(target_id=target_id, inode=ino)),
        lambda rpc: rpc.call(addr, QUERY_CHUNKS, QueryChunksReq(target_id=target_id)),  # the whole target
        lambda rpc: rpc.call(addr, WRITE, write, payload=evil),
        lambda rpc: rpc.call(addr, REMOVE_CHUNKS, RemoveChunksReq(chain_id=t.chain_id,
                                                                  chain_version=read.chain_version, inode=ino)),
    ]
    for who in (tok_b, tok_shared):
        for i, call in enumerate(refused):
            assert _errno_of(call, who) == errno.EACCES, (who.name, i)
    assert a.cat("/big") == data  # untouched
    # refusals are logged by the storage node, with the token
    log = Path(cluster.services[f"storage{node.node_id}"].log_path).read_text(errors="replace")
    b_id = load_token_file(tok_b).claims.token_id
    assert f"outside tenant {names[1]!r} (token {b_id})" in log
