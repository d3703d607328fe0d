"""PyTorch datasets on a real cluster with real DataLoaders: every sample exactly once per epoch
with 0 and 4 workers and with 2 ranks x 2 workers, fork and spawn workers, persistent workers,
DistributedSampler, resuming mid-epoch, random access by key, and bad input (missing files,
truncated tar, corrupt TFRecord CRC) reported with the shard and offset."""

from __future__ import annotations

import pickle
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

import loomfs
from loomfs.client.sync import resolve_mgmtd
from loomfs.shards import (
    Manifest,
    RecordWriter,
    ShardCorrupt,
    ShardError,
    ShardIndex,
    ShardTruncated,
    pack,
)
from loomfs.shards.store import LoomStore, close_clients
from loomfs.testing import LocalCluster
from loomfs.torch import LoomFileDataset, LoomShardDataset

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module", autouse=True)
def _close_shared_clients() -> Iterator[None]:
    """The datasets' per-process clients go with this module (not at exit, after the cluster)."""
    yield
    close_clients()

N_FILES = 240
N_RECORDS = 6 * 40
BIG_EVERY = 97  # every 97th file is 100 KiB: over the inline limit, read from storage chunks


def first_int(data: bytes) -> int:
    """The sample number each test file starts with (a picklable transform)."""
    return int.from_bytes(data[:4], "little")


def key_of(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


def file_bytes(i: int) -> bytes:
    size = 100 << 10 if i % BIG_EVERY == 5 else 100 + (i * 37) % 3000
    return i.to_bytes(4, "little") + bytes([i % 251]) * (size - 4)


@dataclass
class Data:
    address: str
    files: str  # a directory of N_FILES files in 4 subdirectories
    wds: str  # the files packed as tar shards (with the index)
    tfr: str  # ... as TFRecord shards
    rec: str  # .rec files without an index
    keys: list[str]


@pytest.fixture(scope="module")
def data(cluster: LocalCluster) -> Iterator[Data]:
    address = str(cluster.root)
    fs = loomfs.connect(address)
    top = "/torch_datasets"
    if fs.exists(top):
        fs.rmtree(top)
    for c in range(4):
        fs.makedirs(f"{top}/files/c{c}", exist_ok=True)
    items = {f"{top}/files/c{i % 4}/{i:05d}.bin": file_bytes(i) for i in range(N_FILES)}
    assert all(e is None for e in fs.put_many(items))
    store = LoomStore(address)
    pack(store, f"{top}/files", store, f"{top}/wds", fmt="tar", shard_bytes=64 << 10)
    pack(store, f"{top}/files", store, f"{top}/tfr", fmt="tfrecord", shard_bytes=96 << 10)
    fs.makedirs(f"{top}/rec")
    for s in range(6):
        with fs.open(f"{top}/rec/part-{s}.rec", "wb") as f:
            w = RecordWriter(f)
            for j in range(40):
                w.write((s * 40 + j).to_bytes(4, "little") + b"r" * j)
    keys = sorted(f"c{i % 4}/{i:05d}" for i in range(N_FILES))
    yield Data(address, f"{top}/files", f"{top}/wds", f"{top}/tfr", f"{top}/rec", keys)
    fs.close()


def shard_ds(data: Data, kind: str, **kw: Any) -> LoomShardDataset:
    return LoomShardDataset(getattr(data, kind), address=data.address, **kw)


def ids_of(kind: str, batches: list[Any]) -> list[Any]:
    """Sample identities from collated batches: keys for packed shards, numbers for .rec."""
    out: list[Any] = []
    for b in batches:
        if kind == "rec":
            out.extend(first_int(bytes(x)) for x in b["data"])
        else:
            out.extend(b["__key__"])
    return out


def expected(data: Data, kind: str) -> list[Any]:
    return list(range(N_RECORDS)) if kind == "rec" else data.keys


def drain_failing(dl: DataLoader[Any]) -> None:
    """Iterate a loader whose worker raises: shut its workers down here (torch's own cleanup of
    an iterator left behind by an error waits 5 s for the worker)."""
    it = iter(dl)
    try:
        list(it)
    finally:
        it._shutdown_workers()  # type: ignore[attr-defined]


def once_each(got: list[Any], want: list[Any]) -> None:
    dup = [k for k, n in Counter(got).items() if n > 1]
    assert not dup, f"duplicates: {dup[:5]}"
    assert sorted(got) == sorted(want), f"missing: {sorted(set(want) - set(got))[:5]}"


# --- LoomFileDataset ------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 4])
def test_file_dataset_every_file_once(data: Data, workers: int) -> None:
    ds = LoomFileDataset(data.files, address=data.address, transform=first_int)
    assert len(ds) == N_FILES
    dl = DataLoader(ds, batch_size=16, shuffle=True, num_workers=workers)
    got = [int(x) for batch in dl for x in batch]
    once_each(got, list(range(N_FILES)))
    assert got != sorted(got)  # random order


def test_file_dataset_batch_is_one_read_many(data: Data, monkeypatch: pytest.MonkeyPatch) -> None:
    ds = LoomFileDataset(f"loom://{resolve_mgmtd(data.address)}{data.files}/c1/*.bin", with_path=True)
    assert len(ds) == N_FILES // 4
    calls: list[int] = []
    real = LoomStore.read_many

    def counting(self: LoomStore, paths: list[str]) -> list[bytes | OSError]:
        calls.append(len(paths))
        return real(self, paths)

    monkeypatch.setattr(LoomStore, "read_many", counting)
    batches = list(DataLoader(ds, batch_size=16, num_workers=0, collate_fn=list))
    assert calls == [16, 16, 16, 12]
    path, body = batches[0][0]
    assert path == f"{data.files}/c1/00001.bin" and body == file_bytes(1)
    assert ds[-1][1] == file_bytes(N_FILES - 3)


def test_file_dataset_with_distributed_sampler_2_ranks_x_2_workers(data: Data) -> None:
    ds = LoomFileDataset(data.files, address=data.address, transform=first_int)
    got: list[int] = []
    per_rank = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=3)
        sampler.set_epoch(1)
        dl = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2)
        mine = [int(x) for batch in dl for x in batch]
        per_rank.append(len(mine))
        got += mine
    assert per_rank == [N_FILES // 2, N_FILES // 2]
    once_each(got, list(range(N_FILES)))


def test_file_dataset_pickles_without_a_client(data: Data) -> None:
    ds = LoomFileDataset(data.files, address=data.address, transform=first_int)
    assert ds[3] == 12  # c0/00012: the client is up in this process
    blob = pickle.dumps(ds)
    assert b"LoomFS" not in blob and len(blob) < 20_000
    back = pickle.loads(blob)
    assert back[7] == 28 and len(back) == N_FILES


# --- LoomShardDataset ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,workers", [("wds", 0), ("wds", 4), ("tfr", 4), ("rec", 0), ("rec", 4)])
def test_shard_dataset_every_sample_once(data: Data, kind: str, workers: int) -> None:
    ds = shard_ds(data, kind, shuffle=True, shuffle_buffer=50, seed=1)
    dl = DataLoader(ds, batch_size=10, num_workers=workers)
    got = ids_of(kind, list(dl))
    once_each(got, expected(data, kind))
    if kind != "rec":
        assert len(ds) == N_FILES


@pytest.mark.parametrize("kind", ["wds", "tfr", "rec"])
def test_shard_dataset_2_ranks_x_2_workers(data: Data, kind: str) -> None:
    got: list[Any] = []
    for rank in range(2):
        ds = shard_ds(data, kind, rank=rank, world_size=2, shuffle=kind != "tfr")
        ds.set_epoch(2)
        mine = ids_of(kind, list(DataLoader(ds, batch_size=7, num_workers=2)))
        if kind != "rec":
            assert len(mine) == len(ds) == N_FILES // 2  # split by sample: even ranks
        got += mine
    once_each(got, expected(data, kind))


def test_shard_fields_and_tfrecord_features(data: Data) -> None:
    tar = next(iter(shard_ds(data, "wds")))
    tfr = next(iter(shard_ds(data, "tfr")))
    assert tar["__key__"] == tfr["__key__"] == data.keys[0]
    assert tar["bin"] == tfr["bin"] == file_bytes(0)
    assert tar["__url__"].startswith("loom://") and tar["__url__"].endswith("shard-000000.tar")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_start_methods(data: Data, method: str) -> None:
    ds = shard_ds(data, "wds", shuffle=True)
    got = ids_of("wds", list(DataLoader(ds, batch_size=16, num_workers=2, multiprocessing_context=method)))
    once_each(got, data.keys)
    files = LoomFileDataset(data.files, address=data.address, with_path=True)
    dl = DataLoader(files, batch_size=32, shuffle=True, num_workers=1, multiprocessing_context=method)
    paths = [p for batch in dl for p in batch[0]]
    once_each(paths, [files.paths[i] for i in range(N_FILES)])


def test_persistent_workers_move_to_the_next_epoch(data: Data) -> None:
    ds = shard_ds(data, "wds", shuffle=True, shuffle_buffer=30)
    dl = DataLoader(ds, batch_size=12, num_workers=2, persistent_workers=True)
    orders = []
    for epoch in range(3):
        ds.set_epoch(epoch)  # does not reach persistent workers; they advance on their own
        got = ids_of("wds", list(dl))
        once_each(got, data.keys)
        orders.append(got)
    assert len({tuple(o) for o in orders}) == 3
    # the same epochs without persistent workers, set_epoch each time: the same orders
    for epoch in range(3):
        ds.set_epoch(epoch)
        assert ids_of("wds", list(DataLoader(ds, batch_size=12, num_workers=2))) == orders[epoch]


@pytest.mark.parametrize("kind", ["wds", "rec"])
def test_resume_mid_epoch_from_state_dict(data: Data, kind: str) -> None:
    """The StatefulDataLoader protocol in one process: state_dict after some batches, a new
    dataset load_state_dict()s it and continues exactly where the first one was."""
    def make() -> LoomShardDataset:
        ds = shard_ds(data, kind, shuffle=True, shuffle_buffer=25, seed=9, rank=1, world_size=2)
        ds.set_epoch(4)
        return ds

    full = ids_of(kind, list(DataLoader(make(), batch_size=8)))
    first = make()
    it = iter(DataLoader(first, batch_size=8))
    head = ids_of(kind, [next(it) for _ in range(5)])
    state = first.state_dict()
    assert state["epoch"] == 4 and state["yielded"] == {1: 40}
    del it
    resumed = LoomShardDataset(getattr(data, kind), address=data.address, shuffle=True, shuffle_buffer=25,
                               seed=9, rank=1, world_size=2)
    resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
    tail = ids_of(kind, list(DataLoader(resumed, batch_size=8)))
    assert head + tail == full


def test_resume_with_torchdata_stateful_dataloader(data: Data) -> None:
    """torchdata's StatefulDataLoader with 2 workers: its state_dict after some batches, given
    to a new loader over a new dataset, delivers exactly the rest of the epoch in order."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader() -> StatefulDataLoader:
        ds = shard_ds(data, "wds", shuffle=True, shuffle_buffer=20, seed=3)
        ds.set_epoch(2)
        return StatefulDataLoader(ds, batch_size=6, num_workers=2)

    full = ids_of("wds", list(loader()))
    once_each(full, data.keys)
    first = loader()
    head: list[Any] = []
    state: dict[str, Any] = {}
    for batch in first:
        head += batch["__key__"]
        if len(head) == 42:
            state = first.state_dict()  # the job checkpoints here, then dies
            break
    resumed = loader()
    resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
    assert head + ids_of("wds", list(resumed)) == full


def test_resume_plain_dataloader_with_workers(data: Data) -> None:
    """A restarted job with a plain DataLoader (2 workers): state_after(samples seen) gives the
    state; the new loader delivers exactly the rest of the epoch, in the same order."""
    def make() -> LoomShardDataset:
        ds = shard_ds(data, "wds", shuffle=True, shuffle_buffer=20, seed=5)
        ds.set_epoch(7)
        return ds

    def loader(ds: LoomShardDataset) -> DataLoader[Any]:
        return DataLoader(ds, batch_size=6, num_workers=2)

    full = ids_of("wds", list(loader(make())))
    once_each(full, data.keys)
    head: list[Any] = []
    for batch in loader(make()):
        head += batch["__key__"]
        if len(head) == 66:
            break  # the job dies here
    restarted = make()
    restarted.load_state_dict(restarted.state_after(66, num_workers=2, batch_size=6, epoch=7))
    tail = ids_of("wds", list(loader(restarted)))
    assert head + tail == full
    restarted.set_epoch(8)  # the next epoch is whole again (the workers got the state, not this copy)
    once_each(ids_of("wds", list(loader(restarted))), data.keys)


def test_random_access_by_key(data: Data) -> None:
    for kind in ("wds", "tfr"):
        ds = shard_ds(data, kind, transform=None)
        s = ds.get("c3/00123")
        assert s["__key__"] == "c3/00123" and s["bin"] == file_bytes(123)
        many = ds.get_many(["c0/00200", "c1/00005", "c0/00000"])
        assert [m["bin"] for m in many] == [file_bytes(200), file_bytes(5), file_bytes(0)]
        with pytest.raises(KeyError):
            ds.get("c9/nope")
    with pytest.raises(ValueError, match="needs the packer's index"):
        shard_ds(data, "rec").get("part-0/1")


def test_shard_dataset_pickles_without_a_client(data: Data) -> None:
    ds = shard_ds(data, "wds")
    ds.get(data.keys[0])  # loads an index and the client here
    blob = pickle.dumps(ds)
    assert b"LoomFS" not in blob and len(blob) < 20_000
    assert sum(1 for _ in pickle.loads(blob)) == N_FILES


def test_gloo_process_group_gives_rank_and_world(data: Data, tmp_path: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        ds = shard_ds(data, "wds")
        assert ds.rank_world() == (0, 1) and len(ds) == N_FILES
        once_each(ids_of("wds", list(DataLoader(ds, batch_size=32, num_workers=2))), data.keys)
    finally:
        dist.destroy_process_group()


# --- bad input ------------------------------------------------------------------------------------


def test_missing_file_is_named(data: Data, fs: loomfs.LoomFS, base: str) -> None:
    fs.pipe(f"{base}/a.bin", b"a")
    ds = LoomFileDataset([f"{base}/a.bin", f"{base}/gone.bin"], address=data.address)
    with pytest.raises(FileNotFoundError, match=r"gone.bin") as e:
        list(DataLoader(ds, batch_size=2))
    assert "LoomFileDataset item 1" in str(e.value)
    with pytest.raises(FileNotFoundError, match="gone.bin"):
        ds[1]
    with pytest.raises(FileNotFoundError, match="gone.bin"):  # re-raised from the worker
        drain_failing(DataLoader(ds, batch_size=2, num_workers=1))


def _copy(fs: loomfs.LoomFS, src: str, dst: str, cut: int | None = None, flip: int | None = None) -> None:
    data = bytearray(fs.cat(src))
    if flip is not None:
        data[flip] ^= 0x01
    fs.pipe(dst, bytes(data[:cut] if cut is not None else data))


def test_truncated_tar_names_shard_and_offset(data: Data, fs: loomfs.LoomFS, base: str) -> None:
    src = f"{data.wds}/shard-000001.tar"
    _copy(fs, src, f"{base}/shard-000000.tar")
    _copy(fs, src, f"{base}/shard-000001.tar", cut=20_000)
    ds = LoomShardDataset(base, address=data.address)
    with pytest.raises(ShardTruncated, match=rf"loom://.*{base}/shard-000001.tar at byte \d+: tar member") as e:
        list(ds)
    assert e.value.offset is not None and 0 < e.value.offset < 20_000


def test_shard_shorter_than_its_index(data: Data, fs: loomfs.LoomFS, base: str) -> None:
    """A shard cut exactly between samples parses cleanly; the index's count catches it."""
    for name in ("index.json", "shard-000000.tar", "shard-000000.tar.idx", "shard-000001.tar.idx"):
        _copy(fs, f"{data.wds}/{name}", f"{base}/{name}")
    manifest = Manifest.load(LoomStore(data.address), data.wds)
    idx = ShardIndex.decode("i", fs.cat(f"{data.wds}/shard-000001.tar.idx"))
    cut = idx.offsets[3]
    _copy(fs, f"{data.wds}/shard-000001.tar", f"{base}/shard-000001.tar", cut=cut)
    for name in [s.name for s in manifest.shards[2:]]:  # the rest stay as they are
        _copy(fs, f"{data.wds}/{name}", f"{base}/{name}")
    with pytest.raises(ShardError, match=rf"shard-000001.tar at byte {cut}: holds 3 samples where its index says"):
        list(LoomShardDataset(base, address=data.address))


def test_corrupt_tfrecord_crc_names_shard_and_offset(data: Data, fs: loomfs.LoomFS, base: str) -> None:
    idx = ShardIndex.decode("i", fs.cat(f"{data.tfr}/shard-000000.tfrecord.idx"))
    rec = idx.offsets[2]
    _copy(fs, f"{data.tfr}/shard-000000.tfrecord", f"{base}/x.tfrecord", flip=rec + 12 + 20)
    with pytest.raises(ShardCorrupt, match=rf"x.tfrecord at byte {rec}: TFRecord data CRC mismatch"):
        list(LoomShardDataset(f"{base}/*.tfrecord", address=data.address))
    with pytest.raises(ShardCorrupt, match=rf"x.tfrecord at byte {rec}: TFRecord data CRC mismatch"):
        drain_failing(DataLoader(LoomShardDataset(f"{base}/*.tfrecord", address=data.address), num_workers=1))


def test_missing_shard_is_named(data: Data, fs: loomfs.LoomFS, base: str) -> None:
    for name in ("index.json", "shard-000000.tar"):
        _copy(fs, f"{data.wds}/{name}", f"{base}/{name}")
    ds = LoomShardDataset(base, address=data.address)
    with pytest.raises(FileNotFoundError, match="shard-000001.tar"):
        list(ds)
    with pytest.raises(FileNotFoundError, match=rf"no files match .*{base}/\*.rec"):
        LoomShardDataset(f"{base}/*.rec", address=data.address)
    assert torch.utils.data.get_worker_info() is None
