"""``loomfs pack`` / ``loomfs unpack`` on a real cluster: local files -> LoomFS shards -> local
files again, a LoomFS glob into TFRecord shards that the ``tfrecord`` package reads, and the
errors a user sees for bad arguments and bad shards."""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tfrecord.reader import tfrecord_loader

import loomfs
from loomfs.cli.main import main
from loomfs.shards import Manifest, ShardIndex
from loomfs.shards.store import LoomStore, close_clients
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module", autouse=True)
def _close_shared_clients() -> Iterator[None]:
    """The datasets' per-process clients go with this module (not at exit, after the cluster)."""
    yield
    close_clients()


def local_tree(root: Path, n: int) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for i in range(n):
        rel = f"class{i % 3}/img{i:04d}"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        for ext, data in (("jpg", os.urandom(200 + (i * 131) % 5000)), ("cls", str(i % 3).encode())):
            (root / f"{rel}.{ext}").write_bytes(data)
            files[f"{rel}.{ext}"] = data
    return files


def read_tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_pack_local_to_loomfs_and_unpack_back(cluster: LocalCluster, fs: loomfs.LoomFS, base: str,
                                              tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = local_tree(tmp_path / "src", 90)
    rc = main(["-C", str(cluster.root), "pack", str(tmp_path / "src"), f"loom:{base}/ds", "--shard-size", "64K"])
    out = capsys.readouterr().out
    assert rc == 0 and "packed 90 samples into" in out and f"loom://{base}/ds" in out
    m = Manifest.load(LoomStore(str(cluster.root)), f"{base}/ds")
    assert m.samples == 90 and len(m.shards) >= 4 and m.format == "tar" and m.keys_sorted
    names = fs.listdir(f"{base}/ds")
    assert "index.json" in names and not [n for n in names if n.endswith(".partial")]
    # a shard is an ordinary tar file, its .idx points at each sample
    fs.get(f"{base}/ds/{m.shards[1].name}", tmp_path / "one.tar")
    with tarfile.open(tmp_path / "one.tar") as t:
        members = t.getnames()
    assert len(members) == 2 * m.shards[1].samples
    idx = ShardIndex.decode("idx", fs.cat(f"{base}/ds/{m.shards[1].name}.idx"))
    assert idx.key(0) == m.shards[1].first_key and members[0].startswith(idx.key(0) + ".")
    # back to local files
    rc = main(["-C", str(cluster.root), "unpack", f"loom:{base}/ds", str(tmp_path / "back")])
    assert rc == 0 and "unpacked 90 samples" in capsys.readouterr().out
    assert read_tree(tmp_path / "back") == files
    # and from LoomFS to LoomFS
    assert main(["-C", str(cluster.root), "unpack", f"loom:{base}/ds", f"loom:{base}/again"]) == 0
    assert fs.cat(f"{base}/again/class2/img0005.jpg") == files["class2/img0005.jpg"]


def test_pack_loomfs_glob_to_tfrecord(cluster: LocalCluster, fs: loomfs.LoomFS, base: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    fs.makedirs(f"{base}/raw/a")
    fs.makedirs(f"{base}/raw/b")
    items = {f"{base}/raw/{'ab'[i % 2]}/{i:03d}.{ext}": f"{ext}-{i}".encode() * 50
             for i in range(40) for ext in ("txt", "json")}
    assert all(e is None for e in fs.put_many(items))
    mgmtd = loomfs.client.sync.resolve_mgmtd(str(cluster.root))
    rc = main(["--mgmtd", mgmtd, "pack", f"loom:{base}/raw/*/*.txt", f"loom://{mgmtd}{base}/tfr",
               "--format", "tfrecord", "--shard-size", "2K"])
    assert rc == 0, capsys.readouterr()
    m = Manifest.load(LoomStore(mgmtd), f"{base}/tfr")
    assert m.format == "tfrecord" and m.samples == 40 and all(s.name.endswith(".tfrecord") for s in m.shards)
    # TensorFlow's framing: the tfrecord package reads the shards as written
    got = []
    for s in m.shards:
        fs.get(f"{base}/tfr/{s.name}", tmp_path / s.name)
        got += [(bytes(ex["__key__"]).decode(), bytes(ex["txt"]))
                for ex in tfrecord_loader(str(tmp_path / s.name), None, {"__key__": "byte", "txt": "byte"})]
    assert got == [(f"{'ab'[i % 2]}/{i:03d}", f"txt-{i}".encode() * 50) for i in sorted(range(40), key=lambda i: (i % 2, i))]


def test_pack_errors(cluster: LocalCluster, fs: loomfs.LoomFS, base: str, tmp_path: Path,
                     capsys: pytest.CaptureFixture[str]) -> None:
    root = str(cluster.root)
    local_tree(tmp_path / "src", 3)
    assert main(["-C", root, "pack", str(tmp_path / "src"), f"loom:{base}/ds"]) == 0
    capsys.readouterr()
    assert main(["-C", root, "pack", str(tmp_path / "src"), f"loom:{base}/ds"]) == 1
    assert "a packed dataset is already there" in capsys.readouterr().err
    assert main(["-C", root, "pack", str(tmp_path / "nowhere"), f"loom:{base}/x"]) == 1
    assert "nowhere: No such file or directory" in capsys.readouterr().err
    assert main(["-C", root, "pack", f"loom:{base}/missing", f"loom:{base}/x"]) == 1
    assert f"{base}/missing" in capsys.readouterr().err
    assert main(["-C", root, "pack", str(tmp_path / "src"), f"loom:{base}/y", "--shard-size", "lots"]) == 2
    assert "bad --shard-size" in capsys.readouterr().err
    # a shard cut short: unpack names it and the offset
    data = fs.cat(f"{base}/ds/shard-000000.tar")
    fs.pipe(f"{base}/ds/shard-000000.tar", data[:2000])
    assert main(["-C", root, "unpack", f"loom:{base}/ds", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert f"{base}/ds/shard-000000.tar at byte 1024: tar member 'class0/img0000.jpg'" in err, err
