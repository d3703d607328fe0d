"""Fault-injection fixtures: real clusters on 127.0.0.1 with short leases, a seeded workload."""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator

import pytest
from faultkit import dump_logs

from loomfs.testing import LocalCluster


@pytest.fixture()
def seed(request: pytest.FixtureRequest) -> int:
    value = int(os.environ.get("LOOMFS_FAULT_SEED", random.randrange(1 << 30)))
    print(f"\n[fault] {request.node.name}: seed={value} (rerun with LOOMFS_FAULT_SEED={value})")
    return value


@pytest.fixture()
def make_cluster(request: pytest.FixtureRequest) -> Iterator[list[LocalCluster]]:
    """A list the test appends its clusters to (via start_cluster); stopped afterwards,
    logs printed when the test failed."""
    made: list[LocalCluster] = []
    yield made
    failed = getattr(request.node, "_fault_failed", False)
    for c in made:
        for name in list(c.services):
            c.resume_service(name)
        c.stop()
        if failed:
            dump_logs(c)
        else:
            shutil.rmtree(c.root, ignore_errors=True)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    outcome = yield
    if outcome.get_result().failed:
        item._fault_failed = True
