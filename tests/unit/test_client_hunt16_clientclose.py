"""Hunt 16: a file still open when its client closes is closed by the client; a write error
met then is raised by the file's own close, not only logged."""

from __future__ import annotations

from typing import Any

import pytest
from test_client_support import CHUNK, make_client

from loomfs.client.core import AsyncClient
from loomfs.client.sync import LoomFS


def test_a_write_error_met_when_the_client_closes_the_file_is_raised_by_its_close() -> None:
    made: list[Any] = []

    async def factory() -> AsyncClient:
        client, meta, storage = make_client()
        made.append((client, meta, storage))
        return client

    fs = LoomFS("unused:1", client_factory=factory)
    try:
        f = fs.open("/late", "wb")
        made[0][2].fail_writes = True
        f.write(b"z" * (CHUNK + 5))
    finally:
        fs.close()  # closes the open file: its write fails there
    with pytest.raises(OSError, match="disk on fire"):
        f.close()
    f.close()  # raised once; the file object is closed
    assert f.closed


def test_a_file_closed_cleanly_by_its_client_closes_quietly() -> None:
    async def factory() -> AsyncClient:
        return make_client()[0]

    fs = LoomFS("unused:1", client_factory=factory)
    try:
        f = fs.open("/ok", "wb")
        f.write(b"fine")
    finally:
        fs.close()
    f.close()
    assert f.closed
