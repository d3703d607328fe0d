"""The network-namespace lab itself (loomfs.testing.netns): addresses, reachability, cut and
heal, pause and kill, and that nothing is left behind (also after a dead owner)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loomfs.testing import netns

pytestmark = [pytest.mark.integration]

# one TCP server per host: accepts, answers b"ok", forever
SERVER = ("import socket,sys\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
          "s.bind((sys.argv[1],7777));s.listen()\nprint('up',flush=True)\n"
          "while True:\n c,_=s.accept();c.sendall(b'ok');c.close()\n")
# from another host: 'ok', 'timeout' or 'refused'
PROBE = ("import socket,sys\ntry:\n c=socket.create_connection((sys.argv[1],7777),timeout=float(sys.argv[2]))\n"
         " print(c.recv(2).decode())\nexcept TimeoutError: print('timeout')\n"
         "except ConnectionRefusedError: print('refused')\nexcept OSError as e: print('error',e)\n")


@pytest.fixture(autouse=True)
def _needs_netns() -> None:
    why = netns.available()
    if why:
        pytest.skip(why)


def _probe(lab: netns.NetnsLab, host: netns.Host, to: str, timeout_s: float = 1.0) -> str:
    return lab.run(host, [sys.executable, "-c", PROBE, to, str(timeout_s)], timeout_s=timeout_s + 20).stdout.strip()


def _names() -> tuple[set[str], set[str]]:
    ns = {line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                       text=True).stdout.splitlines() if line.strip()}
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    links = {line.split(":", 2)[1].strip().split("@")[0] for line in out.splitlines()}
    return ns, links


def _serve(lab: netns.NetnsLab, host: netns.Host) -> subprocess.Popen[bytes]:
    p = lab.popen(host, [sys.executable, "-c", SERVER, host.address], stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline().strip() == b"up"
    return p


def test_hosts_reach_each_other_and_faults_act_on_one_host() -> None:
    with netns.NetnsLab() as lab:
        a, b, c = (lab.add_host(n) for n in ("a", "b", "c"))
        assert len({a.address, b.address, c.address, lab.gateway}) == 4
        assert all(h.address.startswith(lab.subnet + ".") for h in (a, b, c))
        inside = lab.run(a, ["ip", "-4", "-o", "addr", "show"]).stdout
        assert f"inet {a.address}/24" in inside and "inet 127.0.0.1/8" in inside  # loopback up
        srv = _serve(lab, a)
        assert _probe(lab, b, a.address) == "ok"
        assert _probe(lab, c, a.address) == "ok"
        assert lab.pids(a) == [srv.pid]  # ip netns exec exec'd: the pid we hold is the program

        lab.cut(a)  # a blackhole: no refusal, the connect times out
        assert _probe(lab, b, a.address) == "timeout"
        assert _probe(lab, c, b.address) == "refused"  # the others still talk (nobody listens on b)
        lab.heal(a)
        assert _probe(lab, b, a.address, timeout_s=5.0) == "ok"

        lab.pause(a)
        assert Path(f"/proc/{srv.pid}/stat").read_text().rsplit(") ", 1)[1][0] == "T"  # pause() waited for it
        assert _probe(lab, b, a.address) == "timeout"  # the kernel accepts, nobody answers
        lab.resume(a)
        assert _probe(lab, b, a.address, timeout_s=5.0) == "ok"

        lab.kill(a)
        assert srv.poll() == -9 and lab.pids(a) == []
        assert _probe(lab, b, a.address) == "refused"
        run_id, bridge, netnses = lab.run_id, lab.bridge, [h.netns for h in (a, b, c)]
        _serve(lab, b)  # left running: close() must end it
        # while a lab exists, its /16 never leaves the machine by the default route
        used = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
        free = next(x for x in range(255, -1, -1) if f"inet {netns.SUBNET_FIRST}.{x}." not in used)  # no lab's
        gone = f"{netns.SUBNET_FIRST}.{free}.99"
        r = subprocess.run(["ip", "route", "get", gone], capture_output=True, text=True)
        assert r.returncode != 0 and "no route to host" in r.stderr.lower(), (r.stdout, r.stderr)
    ns, links = _names()
    assert not set(netnses) & ns and bridge not in links
    assert not [x for x in links if x.startswith(f"lf{run_id}")]


def test_leftovers_of_a_dead_lab_are_removed_and_a_live_labs_kept() -> None:
    # a child process makes a lab, then dies without closing it (SIGKILL: no atexit)
    code = ("import sys\nfrom loomfs.testing import netns\nlab=netns.NetnsLab()\nlab.add_host('x')\n"
            "print(lab.run_id,lab.bridge,lab.hosts['x'].netns,flush=True)\nsys.stdin.readline()\n")
    env = dict(os.environ, PYTHONPATH=str(Path(netns.__file__).resolve().parents[2]))
    with netns.NetnsLab() as mine:
        mine.add_host("y")
        child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 env=env)
        assert child.stdout is not None
        run_id, bridge, ns_name = child.stdout.readline().decode().split()
        with netns._locked():  # what a new lab does first, here without another run's sweep in between
            child.kill()
            child.wait(10)
            ns, links = _names()
            assert ns_name in ns and bridge in links  # left behind
            removed = netns._cleanup_leftovers(False)
            assert ns_name in removed and bridge in removed  # its lock died with it
            assert mine.hosts["y"].netns not in removed and mine.bridge not in removed  # ours lives
        ns, links = _names()
        assert ns_name not in ns and bridge not in links and mine.hosts["y"].netns in ns
    assert mine.bridge not in _names()[1]
