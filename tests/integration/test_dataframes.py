"""pandas, pyarrow and Hugging Face datasets reading and writing ``loom://`` URLs."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from pyarrow.fs import FSSpecHandler, PyFileSystem

from loomfs.fsspec import LoomFileSystem, close_clients
from loomfs.fsspec import _urls as urls
from loomfs.testing import LocalCluster


@pytest.fixture(scope="module", autouse=True)
def _close_shared_clients() -> Iterator[None]:
    """The fsspec layer's shared clients end with this module, before the cluster does."""
    yield
    close_clients()


@pytest.fixture()
def url(cluster: LocalCluster, base: str) -> str:
    """This test's directory as a loom:// URL."""
    return f"loom://{cluster.mgmtd_address}{base}"


@pytest.fixture()
def lfs(cluster: LocalCluster) -> LoomFileSystem:
    return LoomFileSystem(cluster.mgmtd_address)


def frame(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "id": np.arange(n, dtype=np.int64),
        "x": rng.random(n),
        "label": [f"item-{i % 17}" for i in range(n)],
    })


def test_pandas_parquet_csv_json(url: str, lfs: LoomFileSystem, base: str) -> None:
    df = frame(20_000)
    df.to_parquet(f"{url}/t.parquet", row_group_size=4_000)
    pd.testing.assert_frame_equal(pd.read_parquet(f"{url}/t.parquet"), df)
    pd.testing.assert_frame_equal(pd.read_parquet(f"{url}/t.parquet", columns=["x"]), df[["x"]])
    df.to_csv(f"{url}/csv/t.csv.gz", index=False)  # text mode and compression through fsspec
    pd.testing.assert_frame_equal(pd.read_csv(f"{url}/csv/t.csv.gz"), df)
    df.head(100).to_json(f"{url}/t.jsonl", orient="records", lines=True)
    pd.testing.assert_frame_equal(pd.read_json(f"{url}/t.jsonl", orient="records", lines=True), df.head(100))
    assert lfs.ls(base, detail=False) == [f"{base}/csv", f"{base}/t.jsonl", f"{base}/t.parquet"]


def test_pyarrow_dataset_over_a_directory(url: str, lfs: LoomFileSystem, base: str) -> None:
    parts = [frame(3_000, seed=i).assign(id=np.arange(3_000) + 3_000 * i) for i in range(4)]
    for i, part in enumerate(parts):
        part.to_parquet(f"{url}/parts/part-{i}.parquet")
    pfs = PyFileSystem(FSSpecHandler(lfs))
    dataset = ds.dataset(f"{base}/parts", filesystem=pfs, format="parquet")
    assert sorted(f.rsplit("/", 1)[-1] for f in dataset.files) == [f"part-{i}.parquet" for i in range(4)]
    table = dataset.to_table()
    assert table.num_rows == 12_000
    assert sorted(table.column("id").to_pylist()) == list(range(12_000))
    picked = dataset.to_table(columns=["id"], filter=ds.field("label") == "item-3")
    assert picked.num_rows == sum(int((p["label"] == "item-3").sum()) for p in parts)
    # and back out: a partitioned dataset written through the same filesystem
    ds.write_dataset(table, f"{base}/by_label", filesystem=pfs, format="parquet",
                     partitioning=["label"], partitioning_flavor="hive")
    assert len(lfs.ls(f"{base}/by_label")) == 17
    again = ds.dataset(f"{base}/by_label", filesystem=pfs, format="parquet", partitioning="hive").to_table()
    assert again.num_rows == 12_000
    # pandas over the directory URL, and pyarrow.parquet straight from a file object
    assert len(pd.read_parquet(f"{url}/parts")) == 12_000
    with lfs.open(f"{base}/parts/part-2.parquet", "rb") as f:
        assert pq.read_table(f).equals(pa.Table.from_pandas(parts[2], preserve_index=False))


@pytest.fixture()
def no_internet(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any connection that is not to loopback fails the test (HF must not try the Hub)."""
    real = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else address
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise AssertionError(f"network access to {address!r} during a test")
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    yield


@pytest.fixture()
def hf(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, no_internet: None) -> Any:
    import datasets

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf" / "datasets")
    return datasets


def test_hf_datasets_streaming_offline(url: str, hf: Any, cluster: LocalCluster,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Streaming reads the Parquet files from LoomFS as they are consumed (no local copy);
    it works with the Hub switched off. HF rebuilds each file's URL as "loom://" + path
    (no cluster in it): that reaches the one cluster this process uses."""
    in_use = {k: v for k, v in urls._clients.items() if k[0] == cluster.mgmtd_address}
    monkeypatch.setattr(urls, "_clients", in_use)  # other test modules' clusters aside
    monkeypatch.delenv("LOOMFS_CLUSTER", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(hf.config, "HF_HUB_OFFLINE", True)
    for i in range(3):
        frame(500, seed=i).assign(id=np.arange(500) + 500 * i).to_parquet(f"{url}/hf/train-{i}.parquet")
    stream = hf.load_dataset("parquet", data_files=f"{url}/hf/*.parquet", split="train", streaming=True)
    rows = list(stream)
    assert sorted(r["id"] for r in rows) == list(range(1_500))
    assert set(rows[0]) == {"id", "x", "label"}


def test_hf_datasets_load_and_cache(url: str, hf: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default (non-streaming) load copies the files into the datasets cache first,
    which HF refuses in offline mode for any remote URL; so the Hub stays on here and the
    no_internet guard makes sure nothing but loopback is reached."""
    monkeypatch.setattr(hf.config, "HF_HUB_OFFLINE", False)
    df = frame(2_000)
    df.iloc[:1_000].to_parquet(f"{url}/hf2/train.parquet")
    df.iloc[1_000:].to_parquet(f"{url}/hf2/test.parquet")
    loaded = hf.load_dataset("parquet", data_files={"train": f"{url}/hf2/train.parquet",
                                                    "test": f"{url}/hf2/test.parquet"},
                             cache_dir=str(tmp_path / "cache"),
                             storage_options={"cluster": url.split("/")[2]})  # said explicitly
    assert loaded["train"].num_rows == 1_000 and loaded["test"].num_rows == 1_000
    assert sorted(list(loaded["train"]["id"]) + list(loaded["test"]["id"])) == list(range(2_000))
