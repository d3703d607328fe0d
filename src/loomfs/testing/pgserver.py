"""A private PostgreSQL server for tests and ``loomfs local up``: initdb into a directory,
``pg_ctl start`` on a free TCP port of 127.0.0.1 with its unix socket in that directory,
``stop()`` at the end.

The binaries come from ``$LOOMFS_PG_BIN``, ``pg_config --bindir``, the newest
``/usr/lib/postgresql/*/bin`` (Debian), or ``PATH``. PostgreSQL refuses to run as root: as
root the server runs as the ``postgres`` user (Debian's package creates it) through
``runuser``, and the directory is handed to that user.

Tuned for tests: ``fsync=off`` (a crash of the machine loses the test database, nothing
else), small shared buffers, no logging collector. The URL it hands out names the
socket directory (``postgresql://loomfs@/loomfs?host=DIR&port=PORT``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path

SUPERUSER = "loomfs"
DATABASE = "loomfs"


class PgUnavailable(RuntimeError):
    """No PostgreSQL binaries here (``scripts/test.sh`` installs the Debian packages)."""


def find_bindir() -> Path:
    env = os.environ.get("LOOMFS_PG_BIN")
    if env:
        return Path(env)
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True)
            d = Path(out.stdout.strip())
            if (d / "initdb").exists():
                return d
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if debian:
        return Path(debian[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(os.path.realpath(initdb)).parent
    raise PgUnavailable("PostgreSQL binaries not found (apt-get install postgresql)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One private server. ``start()`` then ``url()``; ``stop()`` (or the context manager)."""

    def __init__(self, root: str | Path, *, port: int = 0, max_connections: int = 200):
        self.root = Path(root).absolute()
        self.data_dir = self.root / "data"
        self.socket_dir = self.root  # short path: unix socket names are limited to ~107 bytes
        self.port = port or free_port()
        self.max_connections = max_connections
        self.bindir = find_bindir()
        self._run_as: str | None = "postgres" if os.geteuid() == 0 else None

    # --- commands -------------------------------------------------------------------------

    def _cmd(self, argv: list[str]) -> list[str]:
        if self._run_as is None:
            return argv
        return ["runuser", "-u", self._run_as, "--", *argv]

    def _run(self, argv: list[str], timeout_s: float = 60.0) -> None:
        r = subprocess.run(self._cmd(argv), capture_output=True, text=True, timeout=timeout_s)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")

    def _own(self) -> None:
        if self._run_as is None:
            return
        pw = pwd.getpwnam(self._run_as)
        for dirpath, _, files in os.walk(self.root):
            os.chown(dirpath, pw.pw_uid, pw.pw_gid)
            for f in files:
                os.chown(os.path.join(dirpath, f), pw.pw_uid, pw.pw_gid)

    # --- lifecycle ------------------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> PgServer:
        self.root.mkdir(parents=True, exist_ok=True)
        if self._run_as is not None:
            # the server user must reach the directory through its parents
            for p in [self.root, *self.root.parents]:
                with contextlib.suppress(OSError):
                    if p.stat().st_mode & 0o001 == 0 and str(p).startswith(("/tmp", "/var/tmp")):
                        os.chmod(p, p.stat().st_mode | 0o011)
        if not (self.data_dir / "PG_VERSION").exists():
            self._own()
            self._run([str(self.bindir / "initdb"), "-D", str(self.data_dir), "-U", SUPERUSER,
                       "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"], timeout_s)
        opts = (
            f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1 "
            f"-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            f"-c shared_buffers=64MB -c max_connections={self.max_connections} "
            "-c max_pred_locks_per_transaction=256 -c deadlock_timeout=100ms"
        )
        self._own()
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.root / "server.log"),
                   "-o", opts, "-w", "-t", str(int(timeout_s)), "start"], timeout_s + 10)
        self._wait_ready(timeout_s)
        with contextlib.suppress(RuntimeError):  # exists already (a restart of the same directory)
            self._run([str(self.bindir / "createdb"), "-h", str(self.socket_dir), "-p", str(self.port),
                       "-U", SUPERUSER, DATABASE], timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            r = subprocess.run([str(self.bindir / "pg_isready"), "-h", str(self.socket_dir), "-p", str(self.port)],
                               capture_output=True)
            if r.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL in {self.root} not ready after {timeout_s}s")
            time.sleep(0.05)

    def url(self, database: str = DATABASE, **params: str) -> str:
        q = "&".join([f"host={self.socket_dir}", f"port={self.port}", *(f"{k}={v}" for k, v in params.items())])
        return f"postgresql://{SUPERUSER}@/{database}?{q}"

    def tcp_url(self, database: str = DATABASE) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def stop(self, mode: str = "fast", timeout_s: float = 60.0) -> None:
        if not (self.data_dir / "postmaster.pid").exists():
            return
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-m", mode, "-w",
                   "-t", str(int(timeout_s)), "stop"], timeout_s + 10)

    def __enter__(self) -> PgServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"PgServer({self.root} port={self.port})"
