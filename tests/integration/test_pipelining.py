"""Pipelining (issue 16 item 3) on a real cluster: many threads of one blocking client keep
many calls in flight at once, and meta commits concurrent creates in groups (one fsync for
many, ``synchronous=FULL``), while reads go on. The meta server runs in this process here
(the same ``serve`` the meta process runs, with mgmtd and storage as processes) so the test
can read its store's commit counters."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import loomfs
from loomfs.config import MetaConfig, load
from loomfs.meta import server as meta_server
from loomfs.meta.store.base import MetaStore
from loomfs.meta.store.sqlite import SqliteStore
from loomfs.net import auth
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

THREADS = 16
FILES_PER_THREAD = 25


class InProcessMeta:
    """``loomfs.meta.server.serve`` on a loop thread of this process; ``store`` is its store."""

    def __init__(self, config: MetaConfig, monkeypatch: pytest.MonkeyPatch):
        self.config = config
        self.store: SqliteStore | None = None
        real_open = MetaStore.open.__func__  # type: ignore[attr-defined]

        def capture(cls: type[MetaStore], url: str, **options: Any) -> MetaStore:
            store = real_open(cls, url, **options)
            if isinstance(store, SqliteStore):
                self.store = store
            return store

        monkeypatch.setattr(MetaStore, "open", classmethod(capture))
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name="test-meta", daemon=True)
        self.task: asyncio.Task[None] | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def main() -> None:
            ready = asyncio.Event()
            self.task = asyncio.current_task()  # type: ignore[assignment]
            waiter = asyncio.ensure_future(ready.wait())
            waiter.add_done_callback(lambda _: self.ready.set())
            await meta_server.serve(self.config, ready=ready)

        try:
            self.loop.run_until_complete(main())
        except asyncio.CancelledError:
            pass
        finally:
            self.loop.close()

    def start(self) -> None:
        self.thread.start()
        assert self.ready.wait(60), "the in-process meta did not come up"

    def stop(self) -> None:
        if self.task is not None:
            self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(30)


@pytest.fixture()
def full_sync_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LocalCluster, InProcessMeta]]:
    root = tempfile.mkdtemp(prefix="loomfs-it-pipelining-")
    cluster = LocalCluster(root, storage_nodes=2, replicas=2, targets_per_node=1,
                           extra_env={"LOOMFS_META_SQLITE_SYNCHRONOUS": "FULL"})
    cluster.start(timeout_s=60)
    meta: InProcessMeta | None = None
    try:
        proc = cluster.services["meta1"]
        cluster.stop_service("meta1")
        config = load(MetaConfig, proc.config_path, sqlite_synchronous="FULL")
        # the credentials service_main would give the meta process (the cluster secret), for this
        # test only: the test's own clients then prove the secret too
        monkeypatch.setattr(auth, "_process", auth.from_rpc_config(config.rpc, name="meta"))
        monkeypatch.setattr(auth, "_process_set", True)
        meta = InProcessMeta(config, monkeypatch)
        meta.start()
        yield cluster, meta
    finally:
        if meta is not None:
            meta.stop()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def _in_threads(n: int, work: Any) -> None:
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            work(k)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    if errors:
        raise errors[0]


def test_concurrent_creates_share_commits_and_reads_go_on(
    full_sync_cluster: tuple[LocalCluster, InProcessMeta],
) -> None:
    cluster, meta = full_sync_cluster
    fs = loomfs.connect(str(cluster.root))
    try:
        fs.makedirs("/pl/r", exist_ok=True)
        fs.pipe("/pl/r/known", b"known bytes")
        for k in range(THREADS):
            fs.makedirs(f"/pl/t{k}", exist_ok=True)
        store = meta.store
        assert store is not None and store.synchronous == "FULL"
        commits0, groups0 = store.commits, store.groups

        def writer(k: int) -> None:
            for i in range(FILES_PER_THREAD):
                fs.pipe(f"/pl/t{k}/f{i}", f"{k}:{i}".encode() * 10)
                if i % 5 == 0:  # reads interleave with the commits of the others
                    assert fs.stat("/pl/r/known").st_size == 11
                    assert fs.cat("/pl/r/known") == b"known bytes"

        _in_threads(THREADS, writer)
        creates = THREADS * FILES_PER_THREAD
        commits, groups = store.commits - commits0, store.groups - groups0
        assert commits >= creates
        # sixteen writers in flight at once: their creates share COMMITs (one fsync each)
        assert groups <= commits // 2, f"{commits} write transactions took {groups} commits"

        def checker(k: int) -> None:
            names = sorted(fs.listdir(f"/pl/t{k}"))
            assert names == sorted(f"f{i}" for i in range(FILES_PER_THREAD))
            for i in range(0, FILES_PER_THREAD, 3):
                assert fs.cat(f"/pl/t{k}/f{i}") == f"{k}:{i}".encode() * 10

        _in_threads(THREADS, checker)
    finally:
        fs.close()


def test_many_threads_stat_through_their_own_sockets(
    full_sync_cluster: tuple[LocalCluster, InProcessMeta],
) -> None:
    """The blocking stat path is per thread (a socket each, no shared lock): every thread's
    answers are its own, including errors, while another thread creates files."""
    cluster, _meta = full_sync_cluster
    fs = loomfs.connect(str(cluster.root))
    try:
        fs.makedirs("/st", exist_ok=True)
        for k in range(8):
            fs.pipe(f"/st/f{k}", b"x" * (k + 1))
        fs.stat("/st")  # picks the meta server
        fast = fs._fast
        assert fast is not None
        before = fast.calls

        def work(k: int) -> None:
            if k == 8:
                for i in range(50):
                    fs.pipe(f"/st/new{i}", b"y")
                return
            for i in range(200):
                assert fs.stat(f"/st/f{k}").st_size == k + 1
                if i % 50 == 0:
                    with pytest.raises(FileNotFoundError):
                        fs.stat(f"/st/missing{k}")

        _in_threads(9, work)
        assert fast.calls - before >= 8 * 200  # all of them went the caller-thread way
    finally:
        fs.close()


def test_fast_path_gives_up_on_a_silent_meta_within_its_timeout() -> None:
    """The caller-thread socket keeps its deadline in the kernel (no poll per call): a meta
    that accepts and never answers makes the call fall back (``Unavailable``), in time."""
    import socket
    import time

    from loomfs.client.fastpath import SyncMetaPath, Unavailable
    from loomfs.net.transport import Address
    from loomfs.wire import meta as wmeta

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)

        class Meta:
            _preferred = Address("127.0.0.1", srv.getsockname()[1])

        fast = SyncMetaPath(Meta(), timeout_s=0.3)
        t0 = time.monotonic()
        with pytest.raises(Unavailable):
            fast.call(wmeta.STAT, wmeta.PathReq(path="/x"))
        assert 0.2 < time.monotonic() - t0 < 5.0
        assert fast.fallbacks == 1
        fast.close()
