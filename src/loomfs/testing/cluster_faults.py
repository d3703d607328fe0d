"""Faults injected into a local cluster: network cuts between services (rules each process
reads from ``faults/<name>.json``, with ``fault_injection=True``) and SIGSTOP pauses.

Part of ``LocalCluster`` (``testing.cluster``), on top of ``ClusterWaits``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from loomfs.errors import LoomError
from loomfs.net.faults import Rule, write_rules
from loomfs.testing.cluster_waits import ClusterWaits


class ClusterFaults(ClusterWaits):
    """Network cuts and process pauses of a local cluster."""

    # ---- network faults (fault_injection=True) ------------------------------------------
    def faults_path(self, name: str) -> Path:
        return self.root / "faults" / f"{name}.json"

    def _write_faults(self, name: str) -> None:
        path = self.faults_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_rules(path, self._fault_rules.get(name, []))

    def cut(self, a: str, b: str, *, action: str = "blackhole", both_ways: bool = True,
            delay_ms: float = 0.0) -> None:
        """Cut the network from service ``a`` to service ``b`` (and back, by default):
        ``blackhole`` drops every frame (a partition), ``reset`` refuses connections,
        ``delay`` slows every frame. Takes effect within 0.1 s, on existing connections too."""
        if not self.fault_injection:
            raise LoomError("this cluster was started without fault_injection=True")
        pairs = [(a, b), (b, a)] if both_ways else [(a, b)]
        for src, dst in pairs:
            rules = [r for r in self._fault_rules.get(src, []) if r.to != self.services[dst].address]
            rules.append(Rule(self.services[dst].address, action, delay_ms))
            self._fault_rules[src] = rules
            self._write_faults(src)

    def heal(self, a: str | None = None, b: str | None = None) -> None:
        """Remove the cut between ``a`` and ``b`` (both ways), or every cut."""
        for src in list(self._fault_rules):
            if a is None:
                self._fault_rules[src] = []
            elif src in (a, b):
                other = b if src == a else a
                drop = {self.services[other].address} if other else {s.address for s in self.services.values()}
                self._fault_rules[src] = [r for r in self._fault_rules[src] if r.to not in drop]
            self._write_faults(src)

    # ---- fault injection -------------------------------------------------------------------
    def pause_service(self, name: str) -> None:
        """SIGSTOP: the process hangs (a gray failure) until ``resume_service``."""
        s = self.services[name]
        if s.alive():
            os.kill(s.pid, signal.SIGSTOP)

    def resume_service(self, name: str) -> None:
        s = self.services[name]
        if s.pid:
            os.kill(s.pid, signal.SIGCONT)
