"""A storage target whose disk was replaced (its directory wiped while the process was down)
comes back with a new format id: it is resynced from the chain, never served as the chain's
copy; with no other member holding the chain's data, the chain serves nothing (reads fail)
until one returns, and then everything acknowledged before is there."""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_mgmtd_ectables15_cluster import _admin

import loomfs
from loomfs.config import ClientConfig, RpcConfig
from loomfs.storage.diskident import read_format_id
from loomfs.testing import LocalCluster
from loomfs.wire.types import RoutingInfo, TargetState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

S = TargetState


@pytest.fixture(scope="module")
def c3() -> Iterator[LocalCluster]:
    root = tempfile.mkdtemp(prefix="loomfs-it-diskid-")
    c = LocalCluster(root, storage_nodes=3, targets_per_node=1, replicas=3, lease_s=2.0,
                     heartbeat_interval_s=0.5, gc_delay_s=1.0)
    try:
        c.start(timeout_s=60)
        yield c
    finally:
        c.stop()
    shutil.rmtree(root, ignore_errors=True)


def _target_dir(c: LocalCluster, name: str) -> Path:
    return Path(c.services[name].dir, "target1")


def _state(r: RoutingInfo, target_id: int) -> int:
    return next(t.state for t in r.targets if t.target_id == target_id)


def _wipe(c: LocalCluster, name: str) -> str:
    """Kill the node, replace its disk (an empty directory), start it again."""
    d = _target_dir(c, name)
    old = read_format_id(d)
    c.kill_service(name)
    shutil.rmtree(d)
    d.mkdir()
    c.start_service(name)
    return old


def _wait_log(c: LocalCluster, text: str, timeout_s: float = 30.0, after: int = 0) -> int:
    """Wait until mgmtd's log shows an error line with ``text`` (past offset ``after``)."""
    log = Path(c.services["mgmtd"].log_path)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        body = log.read_text(errors="replace")
        at = body.find(text, after)
        if at >= 0 and "came back with another disk" in body[at:at + 300]:
            return at + len(text)
        time.sleep(0.1)
    raise AssertionError(f"mgmtd never logged {text!r}")


def test_a_wiped_target_is_resynced_not_served_empty(c3: LocalCluster) -> None:
    fs = loomfs.connect(str(c3.root))
    data = os.urandom((2 << 20) + 123)
    with fs.open("/keep.bin", "wb") as f:
        f.write(data)
    inode = fs.stat("/keep.bin").st_ino
    tid = c3.services["storage1"].node_id * 1000 + 1
    assert sum(1 for t, _ in c3.chunks_of(inode) if t == tid) == 1
    old = _wipe(c3, "storage1")
    _wait_log(c3, f"target {tid} (node 1, chain")  # mgmtd saw the new disk at its registration
    new = read_format_id(_target_dir(c3, "storage1"))
    assert new and new != old
    c3.wait_routing(c3.fully_replicated, 60, "the wiped target resynced")
    # resynced: its copy is the chain's, not an empty disk
    held = {t: (m.commit_ver, m.length, m.crc) for t, m in c3.chunks_of(inode)}
    assert len(held) == 3 and len(set(held.values())) == 1, held
    assert hashlib.sha256(fs.cat("/keep.bin")).digest() == hashlib.sha256(data).digest()
    fs.close()


def test_an_empty_target_alone_serves_nothing(c3: LocalCluster) -> None:
    fs = loomfs.connect(str(c3.root))
    data = os.urandom((1 << 20) + 77)
    with fs.open("/alone.bin", "wb") as f:
        f.write(data)
    tid = c3.services["storage1"].node_id * 1000 + 1
    others = ["storage2", "storage3"]
    for name in others:
        c3.kill_service(name)
    c3.wait_routing(lambda r: _state(r, tid) == S.SERVING
                    and all(_state(r, c3.services[n].node_id * 1000 + 1) == S.OFFLINE for n in others),
                    30, "storage1 serving alone")
    seen = Path(c3.services["mgmtd"].log_path).stat().st_size
    _wipe(c3, "storage1")
    _wait_log(c3, f"target {tid} (node 1, chain", after=seen)
    # it served alone: the chain's newest copy is gone with its disk; it stays lastsrv, blank
    # (the loss's marker), never serving
    r = c3.wait_routing(lambda r: _state(r, tid) == S.LASTSRV, 30, "the empty target waiting")
    chain = next(ch for ch in r.chains if tid in ch.targets)
    assert not [t for t in chain.targets if _state(r, t) == S.SERVING]
    # reads fail (the chain has no serving member): never the empty disk's "no chunk" as zeros
    quick = loomfs.connect(str(c3.root), config=ClientConfig(rpc=RpcConfig(call_timeout_s=3.0)))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(quick.cat, "/alone.bin")
        with pytest.raises(OSError):
            fut.result(timeout=120)
    quick.close()
    # the members behind it return: mgmtd cannot know whether writes were acknowledged while the
    # lost one served alone, so none of them is served in its place (review, session 15) until
    # an operator accepts the loss; then the first serves, and the empty one resyncs from it
    for name in others:
        c3.start_service(name)
    for name in others:
        c3.wait_listening(name, 30)
    r = c3.wait_routing(lambda r: all(_state(r, c3.services[n].node_id * 1000 + 1) == S.WAITING for n in others),
                        60, "the members behind it back, waiting")
    assert not [t for t in chain.targets if _state(r, t) == S.SERVING]
    ok = _admin(c3, "chain", "accept-loss", str(chain.chain_id), "--yes-lose-data")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    c3.wait_routing(c3.fully_replicated, 90, "the chain whole again")
    assert fs.cat("/alone.bin") == data  # written before the others went down: they hold it
    assert hashlib.sha256(fs.cat("/keep.bin")).digest() != b""  # the first test's file is intact too
    fs.close()
