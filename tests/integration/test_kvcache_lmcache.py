"""The LMCache storage plugin against a real cluster, built as LMCache's plugin launcher builds
it (``backend_class(config=, dst_device=, metadata=, local_cpu_backend=, loop=)``), with the
interface double when lmcache is not installed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from loomfs.kvcache import lmcache as plugin
from loomfs.kvcache._lmcache_iface import (
    CacheEngineKey,
    CPUAllocator,
    EngineConfig,
    TensorMemoryObj,
)
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture()
def backend(cluster: LocalCluster, base: str) -> Iterator[plugin.LoomFSBackend]:
    config = EngineConfig(extra_config={"loomfs.cluster": str(cluster.root), "loomfs.prefix": f"{base}/lmc",
                                        "loomfs.index_cache_s": 0.0})
    b = plugin.LoomFSBackend(config=config, dst_device="cpu", metadata=None, local_cpu_backend=CPUAllocator(),
                             loop=None)
    yield b
    b.close()


def _chunk(i: int) -> TensorMemoryObj:
    g = torch.Generator().manual_seed(i)
    return TensorMemoryObj(torch.randn(2, 4, 16, 64, generator=g).to(torch.bfloat16))  # [2, layers, tokens, hidden]


def test_put_contains_get_remove(backend: plugin.LoomFSBackend) -> None:
    keys = [CacheEngineKey("tiny", 1, 0, h) for h in (11, 22, 33, 44)]
    objs = [_chunk(i) for i in range(3)]
    done: list[CacheEngineKey] = []
    futures = backend.batched_submit_put_task(keys[:3], objs, on_complete_callback=done.append)
    assert futures is not None
    for f in futures:
        f.result(60)
    assert done == keys[:3] and not backend.exists_in_put_tasks(keys[0])
    assert all(o.get_ref_count() == 1 for o in objs)  # held while stored, released after
    assert backend.contains(keys[0]) and not backend.contains(keys[3])
    assert backend.batched_contains([keys[0], keys[1], keys[3], keys[2]]) == 2  # a prefix count
    alloc = backend.get_allocator_backend()
    got = backend.batched_get_blocking([keys[1], keys[3], keys[0]])
    assert got[1] is None
    for g, o in ((got[0], objs[1]), (got[2], objs[0])):
        assert torch.equal(g.tensor, o.tensor) and g.get_dtype() == torch.bfloat16
        assert g.get_shape() == o.get_shape() and id(g) in alloc.live  # allocated by LMCache's allocator
    assert len(alloc.live) == 2  # the miss allocated nothing (or gave it back)
    assert backend.pin(keys[2]) and backend.unpin(keys[2]) and not backend.pin(keys[3])
    assert backend.remove(keys[0]) and backend.get_blocking(keys[0]) is None
    assert backend.batched_remove([keys[1], keys[3]]) == 1


def test_async_methods(backend: plugin.LoomFSBackend) -> None:
    import asyncio

    keys = [CacheEngineKey("tiny", 1, 0, h) for h in range(5)]

    async def go() -> tuple[int, list[object]]:
        await backend.async_batched_submit_put_task(keys[:3], [_chunk(i) for i in range(3)])
        hits = await backend.batched_async_contains("req1", keys)
        objs = await backend.batched_get_non_blocking("req1", keys)
        return hits, objs

    hits, objs = asyncio.run(go())
    assert hits == 3 and len(objs) == 3
    assert torch.equal(objs[2].tensor, _chunk(2).tensor)  # type: ignore[attr-defined]


def test_example_model_reuses_cached_prefix(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    """examples/kvcache_lmcache_model.py: the second and third prompts load the 512-token prefix
    from LoomFS and their logits match a full prefill (the example asserts both)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "kvcache_lmcache_model.py"
    spec = importlib.util.spec_from_file_location("kvcache_lmcache_model", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(str(cluster.root))
    out = capsys.readouterr().out
    assert "request 1: 536 tokens, 512 from LoomFS" in out and out.count("match a full prefill: True") == 3


def test_full_allocator_is_a_miss(backend: plugin.LoomFSBackend) -> None:
    key = CacheEngineKey("tiny", 1, 0, 99)
    for f in backend.batched_submit_put_task([key], [_chunk(9)]) or []:
        f.result(60)

    class Full:
        def allocate(self, *args: object, **kw: object) -> None:
            return None  # LMCache's CPU pool is exhausted

    backend.local_cpu_backend = Full()
    assert backend.get_blocking(key) is None


def test_failed_batched_get_gives_back_its_allocations(backend: plugin.LoomFSBackend,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A get_many that raises part-way (the second meta group's READ_MANY fails after the first
    group's values were allocated) releases every MemoryObj it allocated."""
    import asyncio

    from loomfs.kvcache import _get

    keys = [CacheEngineKey("leak", 1, 0, h) for h in range(_get.META_GROUP_KEYS + 8)]  # two meta groups
    for f in backend.batched_submit_put_task(keys, [TensorMemoryObj(torch.full((2, 1, 4, 8), float(i)))
                                                    for i in range(len(keys))]):
        f.result(60)
    alloc = backend.get_allocator_backend()
    live_before = len(alloc.live)
    orig = _get.read_entries
    calls: list[int] = []
    first_answered = asyncio.Event()

    async def second_fails(client: object, paths: list[str], decode: object) -> object:
        calls.append(len(paths))
        if len(calls) == 1:
            out = await orig(client, paths, decode)  # type: ignore[arg-type]
            first_answered.set()  # its values are allocated before its task yields again
            return out
        await first_answered.wait()
        raise ConnectionError("meta unreachable")

    monkeypatch.setattr(_get, "read_entries", second_fails)
    with pytest.raises(ConnectionError):
        backend.batched_get_blocking(keys)
    assert len(calls) == 2
    assert len(alloc.live) == live_before
