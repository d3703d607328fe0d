"""The CLI with tokens other than the cluster's admin token (issue 13): ``--token-file`` before
or after the command (and $LOOMFS_TOKEN_FILE) names the credential every command proves,
including admin commands that never resolve a path; a read-only token cannot change the
namespace, a user token meets POSIX permissions, a non-admin token cannot drain."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import loomfs
from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _loomfs(cluster: LocalCluster, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "LOOMFS_TOKEN_FILE"}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "loomfs.cli.main", "--dir", str(cluster.root), *args],
                          capture_output=True, text=True, env=full_env, timeout=120)


def _token(cluster: LocalCluster, out: Path, *flags: str) -> Path:
    r = _loomfs(cluster, "admin", "token", "create", "--uid", "1000", "--gid", "1000", *flags, "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert out.stat().st_mode & 0o077 == 0  # a credential is private to its owner
    return out


def test_token_file_option_everywhere(cluster: LocalCluster, fs: loomfs.LoomFS, base: str, tmp_path: Path) -> None:
    ro = _token(cluster, tmp_path / "ro.token", "--read-only")
    user = _token(cluster, tmp_path / "user.token")
    fs.mkdir(f"{base}/root_only")
    fs.chmod(f"{base}/root_only", 0o700)
    fs.mkdir(f"{base}/shared")
    fs.chmod(f"{base}/shared", 0o777)

    # a read-only token: reads work, changes are refused with EPERM (before the command, or after it)
    assert _loomfs(cluster, "--token-file", str(ro), "ls", base).returncode == 0
    r = _loomfs(cluster, "mkdir", f"{base}/shared/ro_try", "--token-file", str(ro))
    assert r.returncode == 1 and "WRITE right" in r.stderr, r.stderr
    assert not fs.exists(f"{base}/shared/ro_try")

    # a user token (uid 1000): POSIX permissions decide, and what it makes is owned by uid 1000
    r = _loomfs(cluster, "mkdir", f"{base}/root_only/x", "--token-file", str(user))
    assert r.returncode == 1 and "Permission denied" in r.stderr, r.stderr
    r = _loomfs(cluster, "mkdir", f"{base}/shared/mine", "--token-file", str(user))
    assert r.returncode == 0, r.stderr
    st = fs.stat(f"{base}/shared/mine")
    assert (st.st_uid, st.st_gid) == (1000, 1000)

    # admin commands prove the token too: a user token may list nodes but not drain one
    assert _loomfs(cluster, "admin", "nodes", "--token-file", str(user)).returncode == 0
    r = _loomfs(cluster, "admin", "drain", "1", "--token-file", str(user))
    assert r.returncode == 1 and "ADMIN right" in r.stderr, r.stderr
    r = _loomfs(cluster, "admin", "drain", "1", env={"LOOMFS_TOKEN_FILE": str(ro)})
    assert r.returncode == 1 and "ADMIN right" in r.stderr, r.stderr

    # a token that is not a token is refused with a clear message, not a traceback
    bogus = tmp_path / "bogus.token"
    bogus.write_text("{}")
    bogus.chmod(0o600)
    r = _loomfs(cluster, "ls", base, "--token-file", str(bogus))
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr


def test_revoke_from_the_cli(cluster: LocalCluster, fs: loomfs.LoomFS, base: str, tmp_path: Path) -> None:
    """``loomfs admin token revoke FILE`` with the cluster's admin token (the command finds it
    from --dir like every admin command); the revoked token is then refused, and the CLI says
    'Permission denied', not that mgmtd is unreachable."""
    user = _token(cluster, tmp_path / "user.token")
    assert _loomfs(cluster, "ls", base, "--token-file", str(user)).returncode == 0
    r = _loomfs(cluster, "admin", "token", "revoke", str(user))
    assert r.returncode == 0 and "revoked" in r.stdout, r.stderr
    deadline = time.monotonic() + 30  # services poll mgmtd's list every few seconds
    while True:
        r = _loomfs(cluster, "ls", base, "--token-file", str(user))
        if r.returncode != 0:
            break
        assert time.monotonic() < deadline, "the revoked token is still accepted"
        time.sleep(0.5)
    assert "Permission denied" in r.stderr and "revoked" in r.stderr, r.stderr
