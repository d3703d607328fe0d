"""Review of e0b923a for erasure-coded files: a failed stripe write was kept as one offset
(``_failed_at``) that no later write of the range cleared, while fsync and close raised for as
long as it capped the length; stripes now keep failed ranges as chunks do (``_note_failed`` /
``_note_written``). The fakes of test_ec_write_gaps under a real AsyncFile."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_client_support import make_client
from test_ec_write_gaps import FakeIO, G, K, M

from loomfs.client.ec_file import EcFileIO
from loomfs.ec.codec import make_codec


def _ec_file(f: Any, io: FakeIO) -> EcFileIO:
    e = object.__new__(EcFileIO)
    e.file = f
    e.io = io  # type: ignore[assignment]
    e.geometry = G
    e.codec = make_codec(K, M)
    e._cur = None
    e._last = {}
    e._inflight = asyncio.Semaphore(4)
    e.verify = False
    f._ec = e
    return e


def test_an_ec_stripe_written_again_after_a_failure_counts_and_fsync_passes() -> None:
    """A stripe write of a new EC file fails (more fragments down than the code loses), fsync
    raises it; the fragments come back and the program writes the range again: that write
    goes through, so fsync and close must succeed with the bytes in the length (the chunk
    path does since e0b923a). The EC path kept the failed offset for good: every later fsync
    and close raise EIO and the file closes empty."""

    async def main() -> None:
        client, meta, storage = make_client()
        f = await client.open("/e", "w+b")
        io = FakeIO()
        _ec_file(f, io)
        io.down_slots = {0, 1, 2}
        data = b"a" * G.stripe_bytes  # one whole stripe (written again without loading it)
        await f.write(data)
        with pytest.raises(OSError):
            await f.fsync()
        io.down_slots = set()
        await f.seek(0)
        await f.write(data)  # written again: goes through
        await f.fsync()
        await f.close()
        assert meta.nodes["/e"].size == len(data)

    asyncio.run(main())
