"""get_many that raises leaves the caller's ``into=`` buffers alone afterwards (reviewer
finding F2): a buffer too small fails before any value read is issued, and a failure in a
later meta group cancels the reads of the groups before it and waits for them, so none lands
in a caller's buffer after the call has raised."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import loomfs
from loomfs.errors import InvalidArgument
from loomfs.kvcache import KVCache
from loomfs.net.faults import ENV_VAR, Rule, write_rules
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
VALUE = 2 << 20  # two values fill a 4 MiB chunk: one whole-chunk read scattered into both buffers
STORAGE_DELAY_MS = 300  # every frame this test's client sends to storage waits this long
WATCH_S = 1.5  # a read still running would have landed by then (delay + a 4 MiB read)


class ReadsIssued:
    """Counts the chunk reads a client's storage client is asked for (the real reads run)."""

    def __init__(self, fs: loomfs.LoomFS, monkeypatch: pytest.MonkeyPatch):
        self.n = 0
        store = fs.client.storage
        for name in ("read_chunk", "read_chunk_crc"):
            monkeypatch.setattr(store, name, self._counted(getattr(store, name)))

    def _counted(self, real: Callable[..., Any]) -> Callable[..., Any]:
        async def read(*args: Any, **kw: Any) -> Any:
            self.n += 1
            return await real(*args, **kw)

        return read


def _unchanged_for(bufs: list[bytearray], seconds: float) -> list[int]:
    """Indexes of buffers that changed within ``seconds`` (polled; returns once one has)."""
    before = [bytes(b) for b in bufs]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        changed = [i for i, b in enumerate(bufs) if b != before[i]]
        if changed:
            return changed
        time.sleep(0.002)
    return []


@pytest.fixture()
def kv_dir(fs: loomfs.LoomFS, base: str) -> str:
    path = f"{base}/kv"
    fs.makedirs(path, exist_ok=True)
    fs.set_layout(path, chunk_size=4 << 20)
    return path


def _put(fs: loomfs.LoomFS, kv_dir: str, n: int) -> dict[bytes, bytes]:
    values = {b"h%d" % i: os.urandom(VALUE) for i in range(n)}
    with KVCache(fs, kv_dir, background_interval_s=0, segment_chunk_bytes=0) as kv:  # the prefix's 4 MiB
        kv.put_many(values)
    return values


def test_a_buffer_too_small_fails_before_any_read(fs: loomfs.LoomFS, kv_dir: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    values = _put(fs, kv_dir, 4)
    reads = ReadsIssued(fs, monkeypatch)
    with KVCache(fs, kv_dir, background_interval_s=0, segment_chunk_bytes=0) as kv:
        for _ in range(3):
            bufs = [bytearray(VALUE), bytearray(VALUE), bytearray(10)]
            with pytest.raises(InvalidArgument):
                kv.get_many([b"h0", b"h1", b"h2"], into=bufs)
            assert reads.n == 0  # not one value read issued
            assert _unchanged_for(bufs, 0.3) == []
            assert bufs == [bytearray(VALUE), bytearray(VALUE), bytearray(10)]
        bufs = [bytearray(VALUE) for _ in range(3)]  # the same get with room: the reads do run
        got = kv.get_many([b"h0", b"h1", b"h2"], into=bufs)
        assert [bytes(g) for g in got] == [values[b"h0"], values[b"h1"], values[b"h2"]] and reads.n > 0


@pytest.fixture()
def slow_fs(cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[loomfs.LoomFS]:
    """A client whose frames to every storage node wait ``STORAGE_DELAY_MS`` (the fault-
    injection hooks, in this process only): a value read is in flight for that long."""
    rules = tmp_path / "faults.json"
    write_rules(rules, [Rule(s.address, "delay", STORAGE_DELAY_MS)
                        for s in cluster.services.values() if s.kind == "storage"])
    monkeypatch.setenv(ENV_VAR, str(rules))
    client = loomfs.connect(str(cluster.root))
    monkeypatch.delenv(ENV_VAR)
    yield client
    client.close()


def _no_memory(info: Any) -> Any:
    raise RuntimeError(f"allocator: no memory for {info.nbytes} bytes")


@pytest.mark.parametrize("last", ["too_small", "allocator_fails"])
def test_a_failure_in_a_later_group_leaves_no_read_running(fs: loomfs.LoomFS, slow_fs: loomfs.LoomFS, kv_dir: str,
                                                           monkeypatch: pytest.MonkeyPatch, last: str) -> None:
    """Keys asked of meta in groups of two: the values of the first groups are being read
    (slowly) when the last group's entries come and its ``into=`` fails. get_many raises;
    nothing lands in the other buffers afterwards."""
    from loomfs.kvcache import _get

    monkeypatch.setattr(_get, "META_GROUP_KEYS", 2)
    n = 8
    values = _put(fs, kv_dir, n)
    reads = ReadsIssued(slow_fs, monkeypatch)
    keys = list(values)
    mid_batch = 0  # trials where reads were under way when the failure came
    with KVCache(slow_fs, kv_dir, background_interval_s=0, segment_chunk_bytes=0) as kv:
        for _ in range(4):
            bufs = [bytearray(VALUE) for _ in range(n - 1)]
            into: list[Any] = [*bufs, bytearray(10) if last == "too_small" else _no_memory]
            issued = reads.n
            with pytest.raises(InvalidArgument if last == "too_small" else RuntimeError):
                kv.get_many(keys, into=into)
            mid_batch += reads.n > issued
            changed = _unchanged_for(bufs, WATCH_S)
            assert changed == [], f"buffers {changed} written after get_many raised"
        assert mid_batch > 0, "no trial had value reads in flight when the last group failed"
        got = kv.get_many(keys)  # the slow client does read the values
        assert [bytes(g) for g in got] == list(values.values())
