"""Fixtures every test directory may use: a private PostgreSQL server (issue 12).

``pg_server``: one server for the whole session (initdb into a temporary directory, its own
port and unix socket directory; stopped at the end). ``pg_url``: a metastore URL on it with
a fresh schema, so each test starts from an empty namespace. No skip when PostgreSQL is
missing: ``scripts/test.sh`` installs it, and a run without it fails here, loudly.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from loomfs.testing.pgserver import PgServer

_schemas = itertools.count(1)


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    server = PgServer(tmp_path_factory.mktemp("pg")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    return pg_server.url(schema=f"t{os.getpid()}_{next(_schemas)}")
