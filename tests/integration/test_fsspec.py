"""``loom://`` through fsspec against a real cluster: URLs and the entry point, byte ranges,
batch calls, listings, errors, renames, file objects, transactions, transfers, the
async API from another loop, fork/spawn/pickle."""

from __future__ import annotations

import asyncio
import collections
import datetime
import errno
import multiprocessing
import os
import pickle
from collections.abc import Iterator
from typing import Any

import fsspec
import pytest

import loomfs
from loomfs.fsspec import LoomFileSystem, close_clients
from loomfs.fsspec import _urls as urls
from loomfs.testing import LocalCluster

MiB = 1 << 20


@pytest.fixture(scope="module", autouse=True)
def _close_shared_clients() -> Iterator[None]:
    """The fsspec layer's shared clients end with this module, before the cluster does."""
    yield
    close_clients()


@pytest.fixture()
def lfs(cluster: LocalCluster) -> LoomFileSystem:
    return LoomFileSystem(cluster.mgmtd_address)


class Calls:
    """Counts the client's RPCs by method name (an RpcClient observer)."""

    def __init__(self) -> None:
        self.n: collections.Counter[str] = collections.Counter()

    def on_call(self, side: str, method: str, *rest: Any) -> None:
        self.n[method] += 1


@pytest.fixture()
def calls(lfs: LoomFileSystem) -> Iterator[Calls]:
    c = Calls()
    observers = lfs.core.rpc.observers  # type: ignore[union-attr]
    observers.append(c)
    yield c
    observers.remove(c)


# --- URLs and the entry point --------------------------------------------------------------


@pytest.mark.parametrize(("url", "path", "options"), [
    ("loom://127.0.0.1:9000/a/b", "/a/b", {"cluster": "127.0.0.1:9000"}),
    ("loom://h1:1,h2:2/a", "/a", {"cluster": "h1:1,h2:2"}),
    ("loom://127.0.0.1:9000", "/", {"cluster": "127.0.0.1:9000"}),
    ("loom:///a/b/", "/a/b", {}),
    ("loom://a/b", "/a/b", {}),  # "loom:///a/b" after a URL join folded its empty authority
    ("/a//b/", "/a/b", {}),
    ("a/b", "/a/b", {}),
    ("/", "/", {}),
    ("loom:///data/*.parquet", "/data/*.parquet", {}),
])
def test_url_parsing(url: str, path: str, options: dict[str, str]) -> None:
    assert LoomFileSystem._strip_protocol(url) == path
    assert LoomFileSystem._get_kwargs_from_urls(url) == options


def test_entry_point_open_and_instances(cluster: LocalCluster, base: str) -> None:
    addr = cluster.mgmtd_address
    assert fsspec.get_filesystem_class("loom") is LoomFileSystem
    a = fsspec.filesystem("loom", cluster=addr)
    assert isinstance(a, LoomFileSystem)
    assert fsspec.filesystem("loom", cluster=addr) is a  # cached per options
    b = LoomFileSystem(addr, auto_mkdir=False)
    assert b is not a and b.loom is a.loom  # one client per cluster
    url = f"loom://{addr}{base}/x.txt"
    with fsspec.open(url, "w") as f:
        f.write("héllo\n")
    with fsspec.open(url, "rt", encoding="utf-8") as f:
        assert f.read() == "héllo\n"
    fs, path = fsspec.core.url_to_fs(url)
    assert fs is a and path == f"{base}/x.txt"
    assert a.unstrip_protocol(path) == url
    assert fsspec.open(url, "rb").fs is a


def test_cluster_from_env_or_the_one_in_use(cluster: LocalCluster, lfs: LoomFileSystem, base: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    lfs.pipe_file(f"{base}/e", b"env")
    monkeypatch.setenv("LOOMFS_CLUSTER", str(cluster.root))  # a local cluster directory
    env_fs = LoomFileSystem(skip_instance_cache=True)
    assert env_fs.mgmtd == cluster.mgmtd_address and env_fs.loom is lfs.loom
    with fsspec.open(f"loom://{base}/e", "rb", skip_instance_cache=True) as f:  # folded URL
        assert f.read() == b"env"
    monkeypatch.delenv("LOOMFS_CLUSTER")
    key = (cluster.mgmtd_address, "", "")
    monkeypatch.setattr(urls, "_clients", {key: lfs.loom})
    assert urls.resolve_cluster(None) == cluster.mgmtd_address  # the one this process uses
    monkeypatch.setattr(urls, "_clients", {key: lfs.loom, ("10.0.0.1:1", "", ""): lfs.loom})
    with pytest.raises(ValueError, match="several"):
        urls.resolve_cluster(None)
    monkeypatch.setattr(urls, "_clients", {})
    with pytest.raises(ValueError, match="LOOMFS_CLUSTER"):
        LoomFileSystem(skip_instance_cache=True)


# --- reading ---------------------------------------------------------------------------------


def test_cat_file_ranges(lfs: LoomFileSystem, base: str) -> None:
    small = bytes(range(256)) * 4
    big = os.urandom(9 * MiB + 123)  # three chunks of 4 MiB
    lfs.pipe({f"{base}/small": small, f"{base}/big": big})
    cs = 4 * MiB
    for data, name in ((small, "small"), (big, "big")):
        p = f"{base}/{name}"
        n = len(data)
        assert lfs.cat_file(p) == data
        for start, end in [(None, None), (0, 10), (5, -5), (-100, None), (None, 7), (cs - 10, cs + 10),
                           (1, 2 * cs + 1), (n + 5, None), (10, 5), (0, n + 100)]:
            assert lfs.cat_file(p, start, end) == data[start:end], (name, start, end)
        assert lfs.read_block(p, 3, 11) == data[3:14]
    with lfs.open(f"{base}/big", "rb") as f:
        assert f.size == len(big)
        f.seek(cs - 3)
        buf = bytearray(10)
        assert f.readinto(buf) == 10 and buf == big[cs - 3 : cs + 7]
        assert f.tell() == cs + 7
        f.seek(-4, os.SEEK_END)
        assert f.read() == big[-4:]


def test_cat_many_is_one_batch(lfs: LoomFileSystem, base: str, calls: Calls) -> None:
    files = {f"{base}/d/f{i:03d}": f"content {i}".encode() * (i + 1) for i in range(200)}
    files[f"{base}/d/big"] = os.urandom(5 * MiB)
    lfs.pipe(files)
    small = [p for p in files if not p.endswith("big")]
    calls.n.clear()
    assert lfs.cat(small) == {p: files[p] for p in small}
    # meta and storage both name a method "read": with small files only, any is meta's
    assert calls.n["read_many"] == 1 and calls.n["read"] == 0 and calls.n["open"] == 0, calls.n
    assert lfs.cat(list(files)) == files
    assert lfs.cat(f"{base}/d/f00*") == {p: v for p, v in files.items() if "/f00" in p}
    assert lfs.cat(f"{base}/d", recursive=True) == files  # files only, no directory entries
    missing = f"{base}/d/nope"
    with pytest.raises(FileNotFoundError):
        lfs.cat([f"{base}/d/f000", missing])
    out = lfs.cat([f"{base}/d/f000", missing], on_error="return")
    assert isinstance(out[missing], FileNotFoundError)
    assert lfs.cat([f"{base}/d/f000", missing], on_error="omit") == {f"{base}/d/f000": files[f"{base}/d/f000"]}
    assert lfs.cat(f"{base}/d/f001") == files[f"{base}/d/f001"]  # one path: its bytes


def test_cat_ranges(lfs: LoomFileSystem, base: str, calls: Calls) -> None:
    files = {f"{base}/r/{i}": os.urandom(1000 + i) for i in range(100)}
    big = os.urandom(6 * MiB)
    files[f"{base}/r/big"] = big
    lfs.pipe(files)
    paths = list(files) + [f"{base}/r/big", f"{base}/r/missing"]
    starts = [i % 7 for i in range(len(files))] + [4 * MiB - 5, 0]
    ends = [-(i % 5) or None for i in range(len(files))] + [4 * MiB + 5, 10]
    out = lfs.cat_ranges(paths, starts, ends)
    for p, s, e, r in zip(paths[:-1], starts, ends, out, strict=False):
        assert r == files[p][s:e]
    assert isinstance(out[-1], FileNotFoundError)
    calls.n.clear()
    small = paths[:100]
    assert lfs.cat_ranges(small, 1, -1) == [files[p][1:-1] for p in small]
    assert calls.n["stat_many"] == 1 and calls.n["read_many"] == 1, calls.n
    assert calls.n["read"] == 0 and calls.n["open"] == 0, calls.n
    with pytest.raises(FileNotFoundError):
        lfs.cat_ranges(paths, starts, ends, on_error="raise")
    # many ranges of one file: one open, the reads concurrent
    one = [f"{base}/r/big"] * 5
    assert lfs.cat_ranges(one, [0, MiB, 3 * MiB, 5 * MiB, -10], [10, 2 * MiB, 5 * MiB, None, None]) == [
        big[0:10], big[MiB : 2 * MiB], big[3 * MiB : 5 * MiB], big[5 * MiB :], big[-10:]]


# --- writing ---------------------------------------------------------------------------------


def test_pipe_many_creates_parents(lfs: LoomFileSystem, base: str, calls: Calls) -> None:
    files = {f"{base}/p/{i % 3}/deep/{i}": str(i).encode() for i in range(60)}
    calls.n.clear()
    lfs.pipe(files)
    assert calls.n["put_many"] >= 2 and calls.n["open"] == 0, calls.n  # a retry after makedirs
    assert lfs.cat(list(files)) == files
    lfs.pipe_file(f"{base}/p/new/dir/one", b"1")
    assert lfs.cat_file(f"{base}/p/new/dir/one") == b"1"
    with pytest.raises(FileExistsError):
        lfs.pipe_file(f"{base}/p/new/dir/one", b"2", mode="create")
    strict = LoomFileSystem(lfs.mgmtd, auto_mkdir=False)
    with pytest.raises(FileNotFoundError):
        strict.pipe_file(f"{base}/p/absent/x", b"1")
    with pytest.raises(FileNotFoundError):
        with strict.open(f"{base}/p/absent/y", "wb") as f:
            f.write(b"1")
    lfs.touch(f"{base}/p/t")
    assert lfs.cat_file(f"{base}/p/t") == b""
    lfs.pipe_file(f"{base}/p/t", b"keep")
    lfs.touch(f"{base}/p/t", truncate=False)
    assert lfs.cat_file(f"{base}/p/t") == b"keep"


def test_open_modes_and_file_object(lfs: LoomFileSystem, base: str) -> None:
    p = f"{base}/o/file"
    part = os.urandom(3 * MiB)
    with lfs.open(p, "wb") as f:
        f.write(part)
        f.write(part)
        assert f.tell() == 6 * MiB
    assert lfs.size(p) == 6 * MiB
    with lfs.open(p, "ab") as f:
        f.write(b"tail")
    with lfs.open(p, "rb") as f:
        assert f.size == 6 * MiB + 4 and f.details["size"] == f.size and f.readable() and not f.writable()
        assert f.read(10) == part[:10] and f.loc == 10
        f.seek(6 * MiB)
        assert f.read() == b"tail"
    with pytest.raises(FileExistsError):
        lfs.open(p, "xb")
    t = f"{base}/o/text"
    with lfs.open(t, "w", encoding="utf-8") as f:
        f.write("one\ntwo\nthree")
    with lfs.open(t, "r") as f:
        assert list(f) == ["one\n", "two\n", "three"]
    with lfs.open(t, "rb") as f:
        assert f.readline() == b"one\n" and f.readuntil(b"e") == b"two\nthre"


def test_transaction_is_all_or_nothing(lfs: LoomFileSystem, base: str) -> None:
    a, b = f"{base}/tx/a", f"{base}/tx/b"
    with lfs.transaction:
        with lfs.open(a, "wb") as f:
            f.write(b"A" * 100)
        with lfs.open(b, "wb") as f:
            f.write(b"B" * 100)
        assert not lfs.exists(a) and not lfs.exists(b)  # invisible until commit
    assert lfs.cat([a, b]) == {a: b"A" * 100, b: b"B" * 100}
    with pytest.raises(RuntimeError):
        with lfs.transaction:
            with lfs.open(f"{base}/tx/c", "wb") as f:
                f.write(b"C")
            raise RuntimeError("abort")
    assert lfs.ls(f"{base}/tx", detail=False) == [a, b]  # nothing of the aborted one left


def test_put_get_copy_big_and_trees(lfs: LoomFileSystem, base: str, tmp_path: Any) -> None:
    data = os.urandom(40 * MiB + 7)  # two transfer blocks
    src = tmp_path / "big"
    src.write_bytes(data)
    lfs.put(str(src), f"{base}/x/big")
    assert lfs.size(f"{base}/x/big") == len(data)
    lfs.get(f"{base}/x/big", str(tmp_path / "back"))
    assert (tmp_path / "back").read_bytes() == data
    lfs.cp(f"{base}/x/big", f"{base}/x/copy")
    assert lfs.cat_file(f"{base}/x/copy", 20 * MiB, 20 * MiB + 100) == data[20 * MiB : 20 * MiB + 100]
    assert lfs.ukey(f"{base}/x/copy") != lfs.ukey(f"{base}/x/big")
    tree = tmp_path / "tree"
    for rel in ("a.txt", "sub/b.txt", "sub/deeper/c.txt"):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(rel.encode())
    lfs.put(str(tree), f"{base}/x/tree", recursive=True)
    assert lfs.find(f"{base}/x/tree") == [f"{base}/x/tree/{r}" for r in ("a.txt", "sub/b.txt", "sub/deeper/c.txt")]
    lfs.get(f"{base}/x/tree", str(tmp_path / "tree2"), recursive=True)
    assert (tmp_path / "tree2" / "sub" / "deeper" / "c.txt").read_bytes() == b"sub/deeper/c.txt"
    with open(tmp_path / "obj", "wb") as out:
        lfs.get_file(f"{base}/x/tree/a.txt", out)
    assert (tmp_path / "obj").read_bytes() == b"a.txt"


# --- the namespace ---------------------------------------------------------------------------


def test_listing_info_find_walk(lfs: LoomFileSystem, base: str) -> None:
    lfs.pipe({f"{base}/l/a": b"1", f"{base}/l/s/b": b"22", f"{base}/l/s/t/c": b"333"})
    lfs.mkdir(f"{base}/l/empty")
    ls = lfs.ls(f"{base}/l")
    assert [(i["name"], i["type"], i["size"]) for i in ls] == [
        (f"{base}/l/a", "file", 1), (f"{base}/l/empty", "directory", 0), (f"{base}/l/s", "directory", 0)]
    assert all(isinstance(i["mtime"], float) and i["islink"] is False for i in ls)
    assert lfs.ls(f"{base}/l", detail=False) == [i["name"] for i in ls]
    assert lfs.ls(f"{base}/l/a")[0]["name"] == f"{base}/l/a"  # a file lists as itself
    info = lfs.info(f"{base}/l/s/t/c")
    assert info["type"] == "file" and info["size"] == 3 and info["inode"] > 0
    assert lfs.info("/")["type"] == "directory"
    assert lfs.exists(f"{base}/l/a") and not lfs.exists(f"{base}/l/zz") and not lfs.exists(f"{base}/l/a/x")
    assert lfs.isdir(f"{base}/l/s") and not lfs.isdir(f"{base}/l/a") and lfs.isfile(f"{base}/l/a")
    assert lfs.sizes([f"{base}/l/a", f"{base}/l/s/b"]) == [1, 2]
    files = [f"{base}/l/a", f"{base}/l/s/b", f"{base}/l/s/t/c"]
    assert lfs.find(f"{base}/l") == files
    assert lfs.find(f"{base}/l", maxdepth=1) == files[:1]
    assert lfs.find(f"{base}/l", withdirs=True) == sorted(
        files + [f"{base}/l", f"{base}/l/empty", f"{base}/l/s", f"{base}/l/s/t"])
    assert lfs.find(f"{base}/l/a") == [f"{base}/l/a"] and lfs.find(f"{base}/nothing") == []
    assert set(lfs.find(f"{base}/l", detail=True)) == set(files)
    assert list(lfs.walk(f"{base}/l")) == [
        (f"{base}/l", ["empty", "s"], ["a"]), (f"{base}/l/empty", [], []),
        (f"{base}/l/s", ["t"], ["b"]), (f"{base}/l/s/t", [], ["c"])]
    assert [w[0] for w in lfs.walk(f"{base}/l", topdown=False)][-1] == f"{base}/l"
    assert lfs.glob(f"{base}/l/**/c") == [f"{base}/l/s/t/c"]
    assert lfs.glob(f"{base}/l/*") == [f"{base}/l/a", f"{base}/l/empty", f"{base}/l/s"]
    assert lfs.du(f"{base}/l") == 6 and lfs.du(f"{base}/l", total=False)[f"{base}/l/s/b"] == 2
    with pytest.raises(FileExistsError):
        lfs.mkdir(f"{base}/l/s")
    lfs.makedirs(f"{base}/l/s", exist_ok=True)


def test_errors_are_builtin_oserrors(lfs: LoomFileSystem, base: str) -> None:
    lfs.pipe_file(f"{base}/e/f", b"x")
    missing = f"{base}/e/missing"
    for call in (lfs.cat_file, lfs.info, lfs.ls, lfs.open, lfs.size, lfs.rm_file, lfs.modified):
        with pytest.raises(FileNotFoundError):
            call(missing)
    with pytest.raises(FileNotFoundError):
        lfs.get(missing, "/tmp/never-written")
    for call in (lfs.cat_file, lfs.open):
        with pytest.raises(IsADirectoryError):
            call(f"{base}/e")
    with pytest.raises(NotADirectoryError):
        lfs.ls(f"{base}/e/f/under")
    with pytest.raises(OSError) as exc:
        lfs.rmdir(f"{base}/e")
    assert exc.value.errno == errno.ENOTEMPTY
    with pytest.raises(IsADirectoryError):
        lfs.rm(f"{base}/e")


def test_rm_batches(lfs: LoomFileSystem, base: str, calls: Calls) -> None:
    files = {f"{base}/rm/{i}": b"x" for i in range(100)}
    lfs.pipe(files)
    lfs.pipe({f"{base}/rm/sub/a": b"", f"{base}/rm/sub/deep/b": b"", f"{base}/rm2/c": b""})
    calls.n.clear()
    lfs.rm(list(files)[:50])
    assert calls.n["unlink_many"] == 1 and calls.n["unlink"] == 0, calls.n
    lfs.rm(f"{base}/rm/9*")
    assert len(lfs.ls(f"{base}/rm")) == 100 - 50 - 10 + 1
    lfs.rm([f"{base}/rm/sub", f"{base}/rm2"], recursive=True)
    assert not lfs.exists(f"{base}/rm/sub") and not lfs.exists(f"{base}/rm2")
    lfs.rm(f"{base}/rm", recursive=True)
    assert not lfs.exists(f"{base}/rm")


def test_mv_is_a_rename(lfs: LoomFileSystem, base: str) -> None:
    lfs.pipe({f"{base}/m/a": b"a", f"{base}/m/dir/x": b"x", f"{base}/m/dir/y/z": b"z",
              f"{base}/m/g1": b"1", f"{base}/m/g2": b"2"})
    ino = lfs.info(f"{base}/m/a")["inode"]
    lfs.mv(f"{base}/m/a", f"{base}/m/b")
    assert lfs.info(f"{base}/m/b")["inode"] == ino and not lfs.exists(f"{base}/m/a")
    lfs.makedirs(f"{base}/m/into")
    lfs.mv(f"{base}/m/b", f"{base}/m/into")  # into an existing directory
    assert lfs.cat_file(f"{base}/m/into/b") == b"a"
    lfs.mv(f"{base}/m/into/b", f"{base}/m/new/")  # trailing '/': a directory, made
    assert lfs.cat_file(f"{base}/m/new/b") == b"a"
    dino = lfs.info(f"{base}/m/dir")["inode"]
    lfs.mv(f"{base}/m/dir", f"{base}/m/moved/dir2", recursive=True)
    assert lfs.info(f"{base}/m/moved/dir2")["inode"] == dino
    assert lfs.cat_file(f"{base}/m/moved/dir2/y/z") == b"z"
    lfs.mv(f"{base}/m/g*", f"{base}/m/gs")
    assert lfs.ls(f"{base}/m/gs", detail=False) == [f"{base}/m/gs/g1", f"{base}/m/gs/g2"]
    with pytest.raises(FileNotFoundError):
        lfs.mv(f"{base}/m/none", f"{base}/m/other")
    with pytest.raises(FileNotFoundError):  # as fsspec's local filesystem, without auto_mkdir
        LoomFileSystem(lfs.mgmtd, auto_mkdir=False).mv(f"{base}/m/new/b", f"{base}/m/no/such/b")


def test_symlinks_report_their_target(lfs: LoomFileSystem, fs: loomfs.LoomFS, base: str) -> None:
    lfs.pipe({f"{base}/s/file": b"12345", f"{base}/s/dir/x": b"x"})
    fs.symlink(f"{base}/s/file", f"{base}/s/lf")
    fs.symlink(f"{base}/s/dir", f"{base}/s/ld")
    info = lfs.info(f"{base}/s/lf")
    assert info["type"] == "file" and info["islink"] and info["size"] == 5
    assert info["destination"] == f"{base}/s/file"
    by_name = {i["name"].rsplit("/", 1)[-1]: i for i in lfs.ls(f"{base}/s")}
    assert by_name["ld"]["type"] == "directory" and by_name["ld"]["islink"]
    assert lfs.cat_file(f"{base}/s/lf") == b"12345"
    assert lfs.find(f"{base}/s") == [f"{base}/s/dir/x", f"{base}/s/file", f"{base}/s/lf"]  # not into ld


def test_checksum_and_modified(lfs: LoomFileSystem, base: str) -> None:
    p = f"{base}/c"
    lfs.pipe_file(p, b"one")
    before = lfs.checksum(p), lfs.ukey(p)
    assert lfs.checksum(p) == before[0]
    lfs.pipe_file(p, b"two!")
    assert lfs.checksum(p) != before[0] and lfs.ukey(p) != before[1]
    now = datetime.datetime.now(datetime.UTC)
    assert abs((lfs.modified(p) - now).total_seconds()) < 60


# --- the async API, threads, processes --------------------------------------------------------


def test_asynchronous_from_another_loop(cluster: LocalCluster, base: str) -> None:
    afs = LoomFileSystem(cluster.mgmtd_address, asynchronous=True, skip_instance_cache=True)

    async def main() -> None:
        assert asyncio.get_running_loop() is not afs.loop  # every call hops to the client's loop
        await afs._pipe_file(f"{base}/as/a", b"async")
        assert await afs._cat_file(f"{base}/as/a", 1, 3) == b"sy"
        assert await afs._cat([f"{base}/as/a"]) == {f"{base}/as/a": b"async"}
        assert [i["name"] for i in await afs._ls(f"{base}/as")] == [f"{base}/as/a"]
        assert (await afs._info(f"{base}/as/a"))["size"] == 5
        assert await afs._find(base + "/as") == [f"{base}/as/a"]
        f = await afs.open_async(f"{base}/as/b", "wb")
        async with f:
            await f.write(b"streamed")
        g = await afs.open_async(f"{base}/as/b")
        assert g.size == 8 and await g.read() == b"streamed"
        await g.close()
        names = await asyncio.gather(*(afs._exists(f"{base}/as/{n}") for n in "abc"))
        assert names == [True, True, False]

    asyncio.run(main())


def test_blocking_call_on_the_loop_thread_refused(lfs: LoomFileSystem) -> None:
    async def inner() -> Any:
        return lfs.ls("/")  # would deadlock: the loop waits for itself

    with pytest.raises(RuntimeError, match="loomfs-io"):
        lfs.loom.run(inner())


def test_from_client_and_pickle(fs: loomfs.LoomFS, lfs: LoomFileSystem, base: str) -> None:
    mine = LoomFileSystem.from_client(fs)
    assert mine.core is fs.client and mine.loom is fs
    mine.pipe_file(f"{base}/fc", b"shared core")
    assert lfs.cat_file(f"{base}/fc") == b"shared core"
    back = pickle.loads(pickle.dumps(mine))
    assert back.mgmtd == lfs.mgmtd and back.loom is lfs.loom  # rebuilt from the cluster address
    assert pickle.loads(pickle.dumps(lfs)).loom is lfs.loom


def _child_reads_and_writes(fs: LoomFileSystem, src: str, dst: str) -> None:
    data = fs.cat_file(src)
    fs.pipe_file(dst, data[::-1])
    fs.loom.close()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_other_processes(lfs: LoomFileSystem, base: str, method: str) -> None:
    """A forked child starts its own loop and client on first use; a spawned one gets the
    filesystem by pickle and connects by address."""
    lfs.pipe_file(f"{base}/proc/in", b"abcdef")
    ctx = multiprocessing.get_context(method)
    child = ctx.Process(target=_child_reads_and_writes, args=(lfs, f"{base}/proc/in", f"{base}/proc/out"))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert lfs.cat_file(f"{base}/proc/out") == b"fedcba"
    assert lfs.cat_file(f"{base}/proc/in") == b"abcdef"  # the parent's client still works
