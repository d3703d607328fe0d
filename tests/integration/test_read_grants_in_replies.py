"""Meta puts a read grant into the replies that checked the caller's r on a chunked file (OPEN
for reading, READ, READ_MANY); the client keeps it for its chunk READs, so a cold read of a
chunked file pays no READ_GRANTS round trip first. Inline files and admins get none."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import loomfs
from loomfs.client.readgrants import ReadGrants
from loomfs.config import ClientConfig, RpcConfig
from loomfs.net.credentials import create_token, load_secret_file, rights_for, write_token_file
from loomfs.testing import LocalCluster
from loomfs.wire import meta as wmeta
from loomfs.wire import meta_batch as wb

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_read_grants_come_with_read_replies(cluster: LocalCluster, fs: loomfs.LoomFS, base: str,
                                            tmp_path: Path) -> None:
    fs.chmod(base, 0o755)
    big = os.urandom(200 << 10)  # over the inline limit: chunked
    fs.pipe(f"{base}/big", big)
    fs.pipe(f"{base}/small", b"inline")
    fs.chmod(f"{base}/big", 0o644)
    fs.chmod(f"{base}/small", 0o644)
    cred = create_token(load_secret_file(cluster.secret_path), uid=1000, gid=1000, rights=rights_for(),
                        ttl_s=600, now_s=time.time())
    write_token_file(tmp_path / "token", cred)
    user = loomfs.connect(str(cluster.root), config=ClientConfig(rpc=RpcConfig(token_file=str(tmp_path / "token"))))
    try:
        client = user.client
        ino = user.stat(f"{base}/big").st_ino
        rsp = user.run(client.meta.call(wmeta.READ, wmeta.PathReq(path=f"{base}/big")))
        assert rsp.read_grant and rsp.data is None
        small = user.run(client.meta.call(wmeta.READ, wmeta.PathReq(path=f"{base}/small")))
        assert small.read_grant == b"" and small.data == b"inline"
        opened = user.run(client.meta.open(f"{base}/big", os.O_RDONLY, 0, client.client_id, 0))
        assert opened.read_grant
        many = user.run(client.meta.call_full(wb.READ_MANY, wb.PathsReq(paths=[f"{base}/small", f"{base}/big"])))
        assert [c.index for c in many.body.chunked] == [1] and len(many.body.read_grants) == 1
        assert many.body.read_grants[0]
        kept = client.storage.read_grants
        assert isinstance(kept, ReadGrants)
        assert user.cat(f"{base}/big") == big  # the READ reply's grant is kept for the chunk READs
        assert kept.get(ino)
        admin = fs.run(fs.client.meta.call(wmeta.READ, wmeta.PathReq(path=f"{base}/big")))
        assert admin.read_grant == b""  # storage lets admins through
    finally:
        user.close()
