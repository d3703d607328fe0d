"""Revoked tokens, cluster-wide: mgmtd keeps the list, every service polls it.

Each entry lives until the token's own expiry (after it the token is refused anyway), so the
list stays as small as the set of live revoked tokens. ``PROCESS`` is what every ``Verifier`` of
this process consults, on the handshake and on each call of a token's open connection.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

logger = logging.getLogger(__name__)

REVOKED_MAX = 100_000  # entries kept (the oldest-expiring go first past it)
POLL_S = 2.0  # how often a service asks mgmtd for the list


class Revocations:
    def __init__(self) -> None:
        self._until: dict[str, float] = {}
        self.ids: frozenset[str] = frozenset()

    def add(self, token_id: str, until_s: float) -> None:
        self._until[token_id] = max(until_s, self._until.get(token_id, 0.0))
        self._changed()

    def replace(self, entries: dict[str, float]) -> None:
        """mgmtd's whole list (what a poll brings): entries mgmtd dropped go here too."""
        if entries != self._until:
            self._until = dict(entries)
            self._changed()

    def prune(self, now_s: float) -> None:
        if any(u < now_s for u in self._until.values()):
            self._until = {t: u for t, u in self._until.items() if u >= now_s}
            self._changed()

    def snapshot(self) -> dict[str, float]:
        return dict(self._until)

    def _changed(self) -> None:
        if len(self._until) > REVOKED_MAX:
            keep = sorted(self._until.items(), key=lambda kv: kv[1])[-REVOKED_MAX:]
            self._until = dict(keep)
        self.ids = frozenset(self._until)

    def __repr__(self) -> str:
        return f"Revocations({len(self._until)} tokens)"


PROCESS = Revocations()


def load(path: Path) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        logger.warning("revocations %s unreadable: %s", path, exc)
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}


def save(path: Path, entries: dict[str, float]) -> None:
    """Atomically, mode 0600 (token ids are not secret, but the file tells who was revoked)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(entries).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def now_s() -> float:
    return time.time()
