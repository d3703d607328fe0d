"""Root squash end to end (issue 13 item 2): a meta server started with ``root_squash = true``
(LocalCluster's ``meta_config``) treats uid 0 from a token without ADMIN as nobody (65534);
the cluster's admin token stays root."""

from __future__ import annotations

import errno
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import loomfs
from loomfs.config import ClientConfig, RpcConfig
from loomfs.net.credentials import create_token, load_secret_file, write_token_file
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def squashed() -> Iterator[LocalCluster]:
    root = tempfile.mkdtemp(prefix="loomfs-it-squash-")
    c = LocalCluster(root, storage_nodes=1, replicas=1, meta_config={"root_squash": True})
    try:
        c.start(timeout_s=60)
        yield c
    finally:
        c.stop()
    shutil.rmtree(root, ignore_errors=True)


def test_root_token_without_admin_acts_as_nobody(squashed: LocalCluster, tmp_path: Path) -> None:
    admin = loomfs.connect(str(squashed.root))
    cred = create_token(load_secret_file(squashed.secret_path), uid=0, gid=0, ttl_s=600, now_s=time.time())
    write_token_file(tmp_path / "root.token", cred)
    root = loomfs.connect(str(squashed.root), config=ClientConfig(rpc=RpcConfig(token_file=str(tmp_path / "root.token"))))
    try:
        admin.mkdir("/sq", mode=0o777)
        admin.chmod("/sq", 0o777)
        with admin.open("/sq/secret", "wb") as f:
            f.write(b"root only")
        admin.chmod("/sq/secret", 0o600)
        assert admin.stat("/sq/secret").st_uid == 0
        # uid 0 without ADMIN: nobody's rights, and what it makes is nobody's
        assert root.stat("/sq/secret").st_uid == 0
        with pytest.raises(PermissionError) as ei:
            root.cat("/sq/secret")
        assert ei.value.errno == errno.EACCES
        with pytest.raises(PermissionError):
            root.chmod("/sq/secret", 0o666)
        with root.open("/sq/mine", "wb") as f:
            f.write(b"squashed")
        st = root.stat("/sq/mine")
        assert (st.st_uid, st.st_gid) == (65534, 65534)
        root.mkdir("/sq/dir")
        assert admin.stat("/sq/dir").st_uid == 65534
        # the admin token (uid 0 with ADMIN) is not squashed
        assert admin.cat("/sq/secret") == b"root only"
        with admin.open("/sq/admins", "wb") as f:
            f.write(b"x")
        assert admin.stat("/sq/admins").st_uid == 0
    finally:
        root.close()
        admin.close()
