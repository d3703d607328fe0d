"""Test and local-deployment helpers: LocalCluster (real processes on 127.0.0.1)."""

from loomfs.testing.cluster import LocalCluster, ServiceProc

__all__ = ["LocalCluster", "ServiceProc"]
