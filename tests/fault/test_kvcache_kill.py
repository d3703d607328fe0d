"""KVCache under kill -9 of a storage server mid-put: a get returns an old value, a new one or
a miss, never bytes that were not put."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from faultkit import LEASE_S, start_cluster

import loomfs
from loomfs.kvcache import KVCache
from loomfs.testing import LocalCluster
from loomfs.wire.types import TargetState

pytestmark = [pytest.mark.integration]


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    """Collect what a test's dead connections and clients leave now: finalizers run later, from
    inside an unrelated ast.parse, trip CPython 3.11.7's "AST constructor recursion depth
    mismatch" (pytest-dev/pytest#10874)."""
    yield
    gc.collect()
KEYS = [b"key%02d" % i for i in range(24)]
VALUE_BYTES = 192 << 10


def _value(key: bytes, version: int) -> bytes:
    return np.random.default_rng([int.from_bytes(key, "big"), version]).bytes(VALUE_BYTES)


def _version_of(key: bytes, got: object, versions_max: int) -> int:
    """Which version ``got`` is (-1: none of them: garbage)."""
    data = bytes(got)  # type: ignore[call-overload]
    for v in range(versions_max, -1, -1):
        if data == _value(key, v):
            return v
    return -1


@pytest.mark.timeout(180)
def test_storage_killed_mid_put_never_garbage(make_cluster: list[LocalCluster], seed: int) -> None:
    c = start_cluster("kvkill")
    make_cluster.append(c)
    fs = loomfs.connect(str(c.root))
    kv = KVCache(fs, "/kv", background_interval_s=0)
    try:
        kv.put_many([(k, _value(k, 0)) for k in KEYS])
        attempted = [0]  # the highest version a put was started for
        put_errors: list[BaseException] = []
        bad: list[tuple[bytes, int]] = []
        stop = threading.Event()

        def writer() -> None:
            version = 0
            while not stop.is_set():
                version += 1
                attempted[0] = version
                try:
                    kv.put_many([(k, _value(k, version)) for k in KEYS])
                except OSError as exc:
                    put_errors.append(exc)

        def reader() -> None:
            while not stop.is_set():
                for k, got in zip(KEYS, kv.get_many(KEYS), strict=True):
                    if got is not None and _version_of(k, got, attempted[0]) < 0:
                        bad.append((k, len(got)))

        threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while attempted[0] < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        c.kill_service("storage2")
        lost = [t.target_id for t in c.routing().targets if t.node_id == c.services["storage2"].node_id]
        c.wait_routing(lambda r: all(t.state != TargetState.SERVING for t in r.targets if t.target_id in lost),
                       10 * LEASE_S, "the dead node's targets leaving service")
        before = attempted[0]
        deadline = time.monotonic() + 60
        while attempted[0] < before + 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # puts go on over the reconfigured chains
        stop.set()
        for t in threads:
            t.join(60)
        print(f"[fault] kvcache: {attempted[0]} put rounds, {len(put_errors)} failed, seed {seed}")
        assert bad == []
        assert attempted[0] >= before + 3, "puts did not resume after the chain was reconfigured"
        final = kv.get_many(KEYS)
        versions = [_version_of(k, g, attempted[0]) if g is not None else None for k, g in zip(KEYS, final, strict=True)]
        assert all(v is not None and v >= 0 for v in versions), versions  # every key: a value that was put
        assert kv.stats.corrupt == 0 or put_errors  # CRC misses only where a put failed
    finally:
        kv.close()
        fs.close()


@pytest.mark.timeout(180)
def test_storage_unreachable_get_is_a_miss(make_cluster: list[LocalCluster]) -> None:
    """Every storage server hung: a get whose entry meta still answers ends in a miss after
    the client's call timeout (the engine recomputes), not an exception; resumed, it hits."""
    from loomfs.config import ClientConfig, RpcConfig

    c = start_cluster("kvhung")
    make_cluster.append(c)
    fs = loomfs.LoomFS(str(c.root), config=ClientConfig(rpc=RpcConfig(call_timeout_s=2.0)))
    kv = KVCache(fs, "/kv", background_interval_s=0)
    try:
        kv.put_many([(k, _value(k, 0)) for k in KEYS[:4]])
        storage = [n for n in c.services if n.startswith("storage")]
        for name in storage:
            c.pause_service(name)
        try:
            assert kv.get_many(KEYS[:4]) == [None] * 4
            assert kv.stats.read_errors >= 1
        finally:
            for name in storage:
                c.resume_service(name)
        deadline = time.monotonic() + 60
        got = kv.get(KEYS[0])
        while got is None and time.monotonic() < deadline:
            time.sleep(0.2)
            got = kv.get(KEYS[0])
        assert got is not None, "no hit after the storage servers resumed"
        assert bytes(got) == _value(KEYS[0], 0)
    finally:
        kv.close()
        fs.close()
