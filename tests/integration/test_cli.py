"""The CLI as a newcomer uses it: local up/status/down, put/get/cat/ls/stat/mv/rm, admin."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from loomfs.testing.cluster import find_base_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _loomfs(*args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loomfs.cli.main", *args], capture_output=True, text=True,
                          env=env, check=check, timeout=120)


def test_cli_end_to_end(tmp_path) -> None:  # type: ignore[no-untyped-def]
    d = str(tmp_path / "cl")
    port = find_base_port(30)
    env = dict(os.environ, LOOMFS_CLUSTER=d)
    try:
        up = _loomfs("local", "up", "--dir", d, "--base-port", str(port), "--gc-delay-s", "1", env=env)
        assert "mgmtd" in up.stdout
        st = json.loads(_loomfs("local", "status", "--json", env=env).stdout)
        assert {s["name"] for s in st["services"]} == {"mgmtd", "meta1", "storage1", "storage2", "storage3"}
        assert all(s["state"] == "running" and s["pid"] > 0 for s in st["services"])
        src = tmp_path / "in.bin"
        src.write_bytes(os.urandom(3 << 20))
        _loomfs("mkdir", "-p", "/x/y", env=env)
        _loomfs("put", str(src), "/x/y/in.bin", env=env)
        assert "in.bin" in _loomfs("ls", "/x/y", env=env).stdout
        assert "3145728" in _loomfs("stat", "/x/y/in.bin", env=env).stdout
        out = tmp_path / "out.bin"
        _loomfs("get", "/x/y/in.bin", str(out), env=env)
        assert out.read_bytes() == src.read_bytes()
        cat = subprocess.run([sys.executable, "-m", "loomfs.cli.main", "cat", "/x/y/in.bin"], capture_output=True,
                             env=env, check=True, timeout=60)
        assert cat.stdout == src.read_bytes()
        _loomfs("mv", "/x/y/in.bin", "/x/moved.bin", env=env)
        missing = _loomfs("stat", "/x/y/in.bin", env=env, check=False)
        assert missing.returncode == 1 and "No such file" in missing.stderr
        _loomfs("rm", "-r", "/x", env=env)
        nodes = json.loads(_loomfs("admin", "nodes", "--json", env=env).stdout)
        assert sum(1 for n in nodes if n["kind"] == "storage") == 3
        chains = json.loads(_loomfs("admin", "chains", "--json", env=env).stdout)
        assert len(chains) == 2  # 3 nodes x 2 targets / 3 replicas
        targets = json.loads(_loomfs("admin", "targets", "--json", env=env).stdout)
        assert len(targets) == 6 and all(t["state"] == "serving" for t in targets)
        # every target reports its scrubber (issue 15 item 7; heartbeats carry it)
        assert all(t["scrub"] is not None and t["scrub"]["interval_s"] > 0 for t in targets)
        _loomfs("mkdir", "/lay", env=env)
        _loomfs("layout", "set", "/lay", "--chunk-size", "1M", "--stripe", "1", env=env)
        assert "chunk_size=1.0 MiB" in _loomfs("layout", "get", "/lay", env=env).stdout
        demo = _loomfs("demo", "--shards", "4", "--shard-size", "1M", "--checkpoint-size", "8M", env=env)
        assert "verified" in demo.stdout
        pids = [s["pid"] for s in st["services"]]
    finally:
        _loomfs("local", "down", "--dir", d, env=env, check=False)
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    st = json.loads(_loomfs("local", "status", "--json", env=env, check=False).stdout)
    assert all(s["state"] == "stopped" for s in st["services"])
