"""TLS on every connection of a real cluster (issue 13 item 1): services and clients speak TLS
with a CA-signed certificate for 127.0.0.1, tokens still authenticate; a plain-TCP peer and a
client that does not trust the CA get nothing."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import loomfs
from loomfs.errors import ConnectionFailed, LoomError
from loomfs.net.auth import AuthConfig, tls_contexts
from loomfs.net.credentials import load_token_file
from loomfs.net.rpc import RpcClient
from loomfs.net.tcp import TcpTransport
from loomfs.net.transport import Address
from loomfs.testing import LocalCluster
from loomfs.testing.certs import make_cert_set, openssl_available
from loomfs.wire import mgmtd as wm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180),
              pytest.mark.skipif(not openssl_available(), reason="needs the openssl command for certificates")]


@pytest.fixture(scope="module")
def tls_cluster() -> Iterator[LocalCluster]:
    root = Path(tempfile.mkdtemp(prefix="loomfs-it-tls-"))
    c = LocalCluster(root, storage_nodes=2, targets_per_node=1, replicas=2, tls=True)
    try:
        c.start(timeout_s=60)
        yield c
    finally:
        c.stop()


async def _routing(auth: AuthConfig | None, address: str) -> object:
    rpc = RpcClient(TcpTransport(auth=auth), connect_timeout_s=2.0, call_timeout_s=3.0)
    try:
        return (await rpc.call(Address.parse(address), wm.GET_ROUTING, wm.GetRoutingReq(), retry=False)).body
    finally:
        await rpc.close()


def test_files_move_over_tls_and_plain_or_untrusting_peers_get_nothing(tls_cluster: LocalCluster,
                                                                        tmp_path: Path) -> None:
    c = tls_cluster
    data = os.urandom(3 << 20)  # chunked: through the storage chain (storage -> storage in TLS too)
    with loomfs.connect(str(c.root)) as fs:
        with fs.open("/tls.bin", "wb") as f:
            f.write(data)
        with fs.open("/tls.bin", "rb") as f:
            assert f.read() == data
    token = load_token_file(c.token_path)
    with pytest.raises((ConnectionFailed, LoomError)):  # plain TCP to a TLS port
        asyncio.run(_routing(AuthConfig(credential=token), c.mgmtd_address))
    other = make_cert_set(tmp_path / "other")  # a client trusting another CA refuses the server
    _, untrusting = tls_contexts("", "", other.ca_file)
    with pytest.raises(ConnectionFailed, match="TLS|certificate"):
        asyncio.run(_routing(AuthConfig(credential=token, tls_client=untrusting), c.mgmtd_address))
    assert asyncio.run(_routing(c.client_auth(), c.mgmtd_address)) is not None
