"""Hosts on one machine: Linux network namespaces on a private bridge (issue 12 item 4).

``NetnsLab`` makes a bridge ``lf<run>b`` in the root namespace with the first address of a
free private /24 (``10.77.X.1``: the "host side", where a test process or a PostgreSQL
server on this machine is reached), and one namespace ``lfs-<run>-<name>`` per host, joined
by a veth pair (``lf<run>h<i>`` on the bridge, ``eth0`` inside) with its own address
(``10.77.X.10+i``) and loopback up. Processes run inside with ``ip netns exec`` (which
execs: the pid we hold is the program's). A host can be killed (SIGKILL to every process
in it), paused (SIGSTOP) and resumed, cut off (its veth set down: packets to and from it
vanish, connects time out, nothing is refused) and healed.

Everything is removed by ``close()`` (also from ``__exit__`` and, as a last resort, at
interpreter exit). ``<run>`` is random; the lab holds an flock on
``/run/lock/loomfs-netns-<run>.lock`` while it lives (the kernel drops it when its process
dies, even by SIGKILL), so ``cleanup_leftovers()`` (called by every new lab) removes what a
dead lab left and nothing of a live one, whichever run or PID namespace it came from. Needs root (CAP_NET_ADMIN) and ``ip`` from iproute2. No traffic
leaves the machine: the bridge has no uplink and the subnet is private.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

NS_PREFIX = "lfs-"  # namespaces: lfs-<run>-<host>
NS_RE = re.compile(r"^lfs-([0-9a-f]{2,7})-[a-z0-9]{1,20}$")
LINK_RE = re.compile(r"^lf([0-9a-f]{2,7})(b|h\d{1,3})$")  # bridges lf<run>b, veths lf<run>h<i>
SUBNET_FIRST = "10.77"  # /24s 10.77.0.0 .. 10.77.255.0, the first free one per lab
# while any lab exists, the whole /16 is unreachable in the root namespace except through a
# lab's bridge (its /24 is more specific): a client still calling a closed lab's address
# gets EHOSTUNREACH instead of its packets leaving the machine by the default route
SAFETY_ROUTE = f"{SUBNET_FIRST}.0.0/16"
HOST_OFFSET = 10  # host i gets .10+i; .1 is the bridge (the root namespace)
HOSTS_MAX = 240
LOCK_DIR = "/run/lock"  # (else /tmp) loomfs-netns.lock: subnet choice and sweeps; loomfs-netns-<run>.lock: a live lab


class NetnsUnavailable(RuntimeError):
    """Not root, or no ``ip`` (iproute2) here."""


CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21  # links and addresses; mounting /run/netns/<name>


def available() -> str:
    """'' when labs can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN)"
    if shutil.which("ip") is None:
        return "`ip` not found (apt-get install iproute2)"
    try:  # root in an unprivileged container lacks them: ip netns add would fail
        status = Path("/proc/self/status").read_text()
        cap_eff = int(next(x.split()[1] for x in status.splitlines() if x.startswith("CapEff:")), 16)
    except (OSError, StopIteration, ValueError):
        return ""
    missing = [n for n, bit in (("CAP_NET_ADMIN", CAP_NET_ADMIN), ("CAP_SYS_ADMIN", CAP_SYS_ADMIN))
               if not cap_eff >> bit & 1]
    return f"network namespaces need {' and '.join(missing)} (an unprivileged container?)" if missing else ""


def _ip(*args: str, check: bool = True, timeout_s: float = 20.0) -> str:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout_s)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def _lock_dir() -> str:
    return LOCK_DIR if os.path.isdir(LOCK_DIR) else "/tmp"


def _run_lock_path(run_id: str) -> str:
    return os.path.join(_lock_dir(), f"loomfs-netns-{run_id}.lock")


def _run_alive(run_id: str) -> bool:
    """Whether the lab ``run_id`` still lives: its process holds the run's lock file."""
    try:
        fd = os.open(_run_lock_path(run_id), os.O_RDWR)
    except OSError:
        return False  # no lock file: no live lab made it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        with contextlib.suppress(OSError):
            os.unlink(_run_lock_path(run_id))
        return False
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Serialises subnet choice and leftover cleanup between labs of concurrent test runs."""
    with open(os.path.join(_lock_dir(), "loomfs-netns.lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def namespace_pids(netns: str) -> list[int]:
    out = _ip("netns", "pids", netns, check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def _kill_namespace(netns: str, timeout_s: float = 10.0, popen_pids: frozenset[int] = frozenset()) -> None:
    """SIGKILL every process in ``netns`` (a stopped one too) and wait until they are gone.
    ``popen_pids`` (children a ``Popen`` holds) are not reaped here: their ``Popen`` must get
    the status (reaped behind its back it reports returncode 0, not -9)."""
    end = time.monotonic() + timeout_s
    while True:
        pids = namespace_pids(netns)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if pid in popen_pids:
                continue
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        if time.monotonic() > end:
            raise RuntimeError(f"processes {pids} in {netns} survive SIGKILL")
        time.sleep(0.02)


def cleanup_leftovers(*, all_runs: bool = False) -> list[str]:
    """Remove namespaces and links of labs whose owner process is gone (every lab's with
    ``all_runs``). Returns what was removed."""
    with _locked():
        return _cleanup_leftovers(all_runs)


def _cleanup_leftovers(all_runs: bool) -> list[str]:
    removed: list[str] = []
    for line in _ip("netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        m = NS_RE.match(name)
        if m is None:  # not a lab's
            continue
        if all_runs or not _run_alive(m.group(1)):
            with contextlib.suppress(RuntimeError):
                _kill_namespace(name)
            _ip("netns", "del", name, check=False)
            removed.append(name)
    for line in _ip("-o", "link", "show", check=False).splitlines():
        parts = line.split(":", 2)
        if len(parts) < 2:
            continue
        link = parts[1].strip().split("@", 1)[0]
        m = LINK_RE.match(link)
        if m and (all_runs or not _run_alive(m.group(1))):
            _ip("link", "del", link, check=False)
            removed.append(link)
    if removed:
        logger.warning("netns: removed leftovers %s", removed)
    _drop_safety_route_if_unused()
    return removed


def _bridges() -> list[str]:
    out = _ip("-o", "link", "show", "type", "bridge", check=False)
    names = [line.split(":", 2)[1].strip() for line in out.splitlines() if line.count(":") >= 2]
    return [n for n in names if (m := LINK_RE.match(n)) and m.group(2) == "b"]


def _drop_safety_route_if_unused() -> None:
    """(Under the lock.) The /16 safety route goes with the last lab's bridge."""
    if not _bridges():
        _ip("route", "del", "unreachable", SAFETY_ROUTE, check=False)


def _stopped(pid: int) -> bool | None:
    """Whether ``pid`` is stopped (state T); None when it is gone (or a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][:1]
    except (OSError, IndexError):
        return None
    return None if state in ("Z", "X") else state in ("T", "t")


def _wait_states(pids: list[int], *, stopped: bool, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while True:
        waiting = [p for p in pids if _stopped(p) not in (None, stopped)]
        if not waiting:
            return
        if time.monotonic() > end:
            raise RuntimeError(f"processes {waiting} not {'stopped' if stopped else 'running'} "
                               f"after {timeout_s:.0f}s")
        time.sleep(0.002)


@dataclass
class Host:
    """One network namespace with one address on the lab's bridge."""

    name: str
    index: int
    netns: str
    address: str
    veth: str  # the root-namespace end, on the bridge
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    cut_off: bool = False
    paused: bool = False

    def __repr__(self) -> str:
        flags = "".join([" cut" if self.cut_off else "", " paused" if self.paused else ""])
        return f"Host({self.name} {self.address} {self.netns}{flags})"


class NetnsLab:
    """A bridge and its hosts. ``with NetnsLab() as lab: h = lab.add_host("storage1")``."""

    def __init__(self) -> None:
        why = available()
        if why:
            raise NetnsUnavailable(why)
        self.run_id = secrets.token_hex(4)[:7]
        self._run_lock = -1  # held while this lab lives (taken in _up, under the sweepers' lock)
        self.bridge = f"lf{self.run_id}b"
        self.subnet = ""  # "10.77.X" once up
        self.hosts: dict[str, Host] = {}
        self._closed = False
        self._up()
        atexit.register(self.close)

    # ---- set up ---------------------------------------------------------------------------
    def _up(self) -> None:
        with _locked():
            # a sweeper able to take this lock knows the lab is dead; sweeps hold _locked()
            self._run_lock = os.open(_run_lock_path(self.run_id), os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._run_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _cleanup_leftovers(False)
            used = set(re.findall(rf"inet {re.escape(SUBNET_FIRST)}\.(\d+)\.", _ip("-4", "-o", "addr", "show")))
            free = [x for x in range(256) if str(x) not in used]
            if not free:
                raise RuntimeError(f"no free /24 left in {SUBNET_FIRST}.0.0/16")
            self.subnet = f"{SUBNET_FIRST}.{free[0]}"
            try:
                _ip("route", "replace", "unreachable", SAFETY_ROUTE)
                _ip("link", "add", self.bridge, "type", "bridge")
                _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
                _ip("link", "set", self.bridge, "up")
            except BaseException:
                _ip("link", "del", self.bridge, check=False)
                _drop_safety_route_if_unused()
                self._closed = True
                self._release_run_lock()
                raise
        logger.info("netns lab %s: bridge %s on %s.0/24", self.run_id, self.bridge, self.subnet)

    @property
    def gateway(self) -> str:
        """The bridge's address in the root namespace (this process, a PostgreSQL here)."""
        return f"{self.subnet}.1"

    def add_host(self, name: str) -> Host:
        if name in self.hosts:
            raise ValueError(f"host {name} exists")
        if not re.fullmatch(r"[a-z0-9]{1,20}", name):
            raise ValueError(f"host name {name!r}: 1-20 of a-z 0-9")
        index = len(self.hosts) + 1
        if index > HOSTS_MAX:
            raise ValueError(f"at most {HOSTS_MAX} hosts")
        h = Host(name, index, f"{NS_PREFIX}{self.run_id}-{name}", f"{self.subnet}.{HOST_OFFSET + index}",
                 f"lf{self.run_id}h{index}")
        self.hosts[name] = h  # before creating anything: close() removes what exists of it
        peer = f"lf{self.run_id}p{index}"
        _ip("netns", "add", h.netns)
        _ip("link", "add", h.veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", h.netns)
        inside = ["netns", "exec", h.netns, "ip"]
        _ip(*inside, "link", "set", peer, "name", "eth0")
        _ip(*inside, "addr", "add", f"{h.address}/24", "dev", "eth0")
        _ip(*inside, "link", "set", "eth0", "up")
        _ip(*inside, "link", "set", "lo", "up")
        _ip("link", "set", h.veth, "master", self.bridge)
        _ip("link", "set", h.veth, "up")
        return h

    # ---- processes ------------------------------------------------------------------------
    def command(self, host: Host | str, argv: list[str]) -> list[str]:
        """``argv`` run inside ``host`` (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self._host(host).netns, *argv]

    def popen(self, host: Host | str, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        h = self._host(host)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("start_new_session", True)
        proc: subprocess.Popen[bytes] = subprocess.Popen(self.command(h, argv), **kwargs)
        h.procs.append(proc)
        return proc

    def run(self, host: Host | str, argv: list[str], timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(host, argv), capture_output=True, text=True, timeout=timeout_s)

    def pids(self, host: Host | str) -> list[int]:
        return namespace_pids(self._host(host).netns)

    # ---- faults ---------------------------------------------------------------------------
    def kill(self, host: Host | str) -> None:
        """SIGKILL every process on the host (a power cut); its network stays."""
        h = self._host(host)
        _kill_namespace(h.netns, popen_pids=frozenset(p.pid for p in h.procs))
        for p in h.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5.0)
        h.procs = [p for p in h.procs if p.poll() is None]
        h.paused = False

    def pause(self, host: Host | str, timeout_s: float = 10.0) -> None:
        """SIGSTOP every process on the host (a hung machine) until ``resume``; returns once
        each one is stopped (the signal lands asynchronously, on another CPU maybe)."""
        h = self._host(host)
        pids = self.pids(h)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        h.paused = True
        _wait_states(pids, stopped=True, timeout_s=timeout_s)

    def resume(self, host: Host | str, timeout_s: float = 10.0) -> None:
        h = self._host(host)
        pids = self.pids(h)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        h.paused = False
        _wait_states(pids, stopped=False, timeout_s=timeout_s)

    def cut(self, host: Host | str) -> None:
        """Cut the host off (its cable pulled): every packet to or from it is dropped."""
        h = self._host(host)
        _ip("link", "set", h.veth, "down")
        h.cut_off = True

    def heal(self, host: Host | str) -> None:
        h = self._host(host)
        _ip("link", "set", h.veth, "up")
        h.cut_off = False

    # ---- tear down ------------------------------------------------------------------------
    def close(self) -> None:
        """Kill every process on every host, remove the namespaces, the veths and the
        bridge. Idempotent; goes on past errors and raises the first at the end."""
        if self._closed:
            return
        self._closed = True
        first: BaseException | None = None
        for h in self.hosts.values():
            try:
                if Path("/run/netns", h.netns).exists():
                    self.resume(h)  # a stopped process dies of SIGKILL too, but its children wait
                    _kill_namespace(h.netns, popen_pids=frozenset(p.pid for p in h.procs))
                for p in h.procs:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(timeout=5.0)
                _ip("netns", "del", h.netns, check=False)
                _ip("link", "del", h.veth, check=False)  # gone with the namespace's end, usually
            except BaseException as exc:  # go on: remove the rest
                first = first or exc
        with _locked():
            _ip("link", "del", self.bridge, check=False)
            _drop_safety_route_if_unused()
        self._release_run_lock()
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        if first is not None:
            raise first

    def _release_run_lock(self) -> None:
        if self._run_lock < 0:
            return
        with contextlib.suppress(OSError):
            os.unlink(_run_lock_path(self.run_id))
        with contextlib.suppress(OSError):
            os.close(self._run_lock)
        self._run_lock = -1

    def __enter__(self) -> NetnsLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _host(self, host: Host | str) -> Host:
        return host if isinstance(host, Host) else self.hosts[host]

    def __repr__(self) -> str:
        return f"NetnsLab({self.run_id} {self.subnet}.0/24 hosts={len(self.hosts)}{' closed' if self._closed else ''})"
