"""``loomfs.connect(DIR)`` with a local cluster directory finds the cluster's admin token
(auth is on in such clusters), unless a token is named by the config or $LOOMFS_TOKEN_FILE."""

from __future__ import annotations

import pytest

import loomfs
from loomfs.client.sync import with_cluster_token
from loomfs.config import ClientConfig, RpcConfig
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_a_cluster_directory_brings_its_token(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOMFS_TOKEN_FILE", raising=False)
    monkeypatch.delenv("LOOMFS_CLUSTER", raising=False)
    root = str(cluster.root)
    cfg = with_cluster_token(root, None)
    assert cfg is not None and cfg.rpc.token_file == str(cluster.token_path)
    mine = ClientConfig(rpc=RpcConfig(token_file="/elsewhere/token"))
    assert with_cluster_token(root, mine) is mine  # the caller's token wins
    assert with_cluster_token(cluster.mgmtd_address, None) is None  # an address, not a directory
    fs = loomfs.connect(root)
    try:
        assert fs.isdir("/")
    finally:
        fs.close()
    monkeypatch.setenv("LOOMFS_TOKEN_FILE", str(cluster.token_path))
    assert with_cluster_token(root, None) is None  # $LOOMFS_TOKEN_FILE names it already
