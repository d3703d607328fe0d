"""fsck on a cluster with tenants (issue 13): a tenant's tree hangs off its own root, which the
walk from "/" never reaches, so fsck asks meta which candidate inodes it still holds
(``INODES_LIVE``) before calling chunks orphans. ``--repair`` must never remove a tenant's file."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest

import loomfs
from loomfs.cli.fsck import fsck
from loomfs.config import ClientConfig, RpcConfig
from loomfs.net.credentials import create_token, load_secret_file, rights_for, write_token_file
from loomfs.testing import LocalCluster
from loomfs.wire import meta as wmeta

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_fsck_repair_keeps_tenants_files(cluster: LocalCluster, fs: loomfs.LoomFS, tmp_path: Path) -> None:
    name = f"t{secrets.token_hex(4)}"
    fs.run(fs.client.meta.call(wmeta.TENANT_CREATE, wmeta.TenantCreateReq(name=name, uid=1000, gid=1000)))
    cred = create_token(load_secret_file(cluster.secret_path), uid=1000, gid=1000, tenant=name,
                        rights=rights_for(), ttl_s=600, now_s=time.time())
    token = tmp_path / "tenant.token"
    write_token_file(token, cred)
    tenant = loomfs.connect(str(cluster.root), config=ClientConfig(rpc=RpcConfig(token_file=str(token))))
    try:
        data = secrets.token_bytes(300_000)  # past the inline limit: the bytes live in chunks
        tenant.pipe("/big", data)
        ino = tenant.stat("/big").st_ino
        assert not fs.exists("/big") or fs.stat("/big").st_ino != ino

        rep = fsck(fs, None, cluster.routing(), repair=True, grace_s=0.1)
        assert ino not in rep.orphans, "a tenant's file was taken for an orphan"
        assert rep.held_elsewhere.get(ino, 0) >= 1, rep.held_elsewhere
        assert tenant.cat("/big") == data  # nothing of it was removed

        # a truly orphaned chunk is still found and removed next to it
        layout = fs.attr("/").layout
        placed = tenant.attr("/big").layout
        assert placed is not None and layout is not None
        orphan = (1 << 40) + 424242
        fs.run(fs.client.storage.write_chunk(placed, orphan, 0, 0, memoryview(b"x" * 100)))
        rep = fsck(fs, None, cluster.routing(), repair=True, grace_s=0.1)
        assert orphan in rep.orphans and rep.removed >= 1
        assert tenant.cat("/big") == data
    finally:
        tenant.close()
