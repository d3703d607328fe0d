"""Fixtures every test directory may use: a private PostgreSQL server (issue 12).

``pg_server``: one server for the whole session (initdb into a temporary directory, its own
port and unix socket directory; stopped at the end). ``pg_url``: a metastore URL on it with
a fresh schema, so each test starts from an empty namespace. No skip when PostgreSQL is
missing: ``scripts/test.sh`` installs it, and a run without it fails here, loudly.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from loomfs.testing.pgserver import PgServer

# Property tests check behaviour, not speed: on a loaded 2-core CI machine one example can take
# far longer than hypothesis's default 200 ms deadline, which then fails (or "flakes") a correct
# test. No deadline, and no too-slow health check; a test that wants one sets its own.
settings.register_profile("loomfs", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "loomfs"))

_schemas = itertools.count(1)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    # not under pytest's temporary directory: pytest makes pytest-of-USER private again at
    # every start (another run meanwhile), and as root the server runs as user postgres
    root = tempfile.mkdtemp(prefix="loomfs-pg-", dir="/tmp" if os.path.isdir("/tmp") else None)
    os.chmod(root, 0o755)
    server = PgServer(root)
    try:
        server.start()
        yield server
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    return pg_server.url(schema=f"t{os.getpid()}_{next(_schemas)}")
