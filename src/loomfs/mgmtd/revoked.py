"""mgmtd's list of revoked tokens (``loomfs admin token revoke``), served to every service.

The list is part of the cluster state (``ClusterState.revoked_tokens``), saved in mgmtd's store
with everything else: the SQLite file of a single mgmtd, or, with several mgmtd
(docs/mgmtd-ha.md), the shared PostgreSQL row the primary writes under its lease. So a
revocation made on the primary is in the store before it is acknowledged, and a standby that
takes over loads it with the rest of the state. Only the primary answers (``NOT_PRIMARY``
elsewhere, which ``MgmtdSet`` follows), so every service's poll (``LIST_REVOKED`` every 2 s,
``common.service_main``) reads the one list. Each entry is kept until the token's own expiry.

``revocations.PROCESS`` (this process's verifier) follows the state after each change and
each load. ``DATA_DIR/revoked.json``, where earlier versions kept the list, is merged into the
state once it is loaded (``adopt``) and no longer written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from loomfs.errors import InvalidArgument
from loomfs.mgmtd.service import MgmtdService
from loomfs.net import revocations
from loomfs.net.credentials import TOKEN_ID_CHARS_MAX
from loomfs.net.rpc import CallContext, handles
from loomfs.wire import auth as wa
from loomfs.wire.message import Empty

logger = logging.getLogger(__name__)
DEFAULT_KEEP_S = 365 * 86400.0


class RevokedTokens:
    def __init__(self, service: MgmtdService, legacy_path: Path | None = None, *,
                 target: revocations.Revocations = revocations.PROCESS,
                 wall_clock: Callable[[], float] = time.time):
        self.service = service
        self.target = target
        self.wall_clock = wall_clock
        # what an earlier version kept in DATA_DIR/revoked.json: merged into the state at adopt()
        self._legacy = revocations.load(legacy_path) if legacy_path is not None else {}

    @property
    def _tokens(self) -> dict[str, float]:
        return self.service.state.revoked_tokens

    def _prune(self) -> bool:
        now = self.wall_clock()
        gone = [t for t, u in self._tokens.items() if u < now]
        for t in gone:
            del self._tokens[t]
        if len(self._tokens) > revocations.REVOKED_MAX:  # the soonest to expire go first
            keep = sorted(self._tokens.items(), key=lambda kv: kv[1])[-revocations.REVOKED_MAX:]
            self._tokens.clear()
            self._tokens.update(keep)
            return True
        return bool(gone)

    def _rsp(self) -> wa.RevokedRsp:
        snap = sorted(self._tokens.items())
        self.target.replace(dict(snap))  # this process's own verifier
        return wa.RevokedRsp(token_ids=[t for t, _ in snap], until_s=[u for _, u in snap])

    async def adopt(self) -> None:
        """After the state was loaded (start-up, or a standby taking over): merge the legacy
        file's entries (saved at once if they add any) and give this process's verifier the list."""
        svc = self.service
        async with svc._lock:
            if not svc.serving:
                return
            added = {t: u for t, u in self._legacy.items() if u > self._tokens.get(t, 0.0)}
            self._tokens.update(added)
            if self._prune() or added:
                await svc._commit(force=True)
                if added:
                    logger.info("%d revoked tokens from revoked.json moved into mgmtd's store", len(added))
            self._rsp()

    @handles(wa.REVOKE_TOKEN)
    async def revoke_token(self, req: wa.RevokeTokenReq, ctx: CallContext) -> wa.RevokedRsp:
        if not 0 < len(req.token_id) <= TOKEN_ID_CHARS_MAX:
            raise InvalidArgument("token_id: 1..64 characters")
        until = req.until_s if req.until_s > 0 else self.wall_clock() + DEFAULT_KEEP_S
        svc = self.service
        async with svc._lock:
            svc._guard()
            self._tokens[req.token_id] = max(until, self._tokens.get(req.token_id, 0.0))
            self._prune()
            await svc._commit(force=True)  # in the store (HA: under the lease) before the answer
            rsp = self._rsp()
        logger.info("token %s revoked by %s (kept until %.0f)", req.token_id, ctx.identity.token_id, until)
        return rsp

    @handles(wa.LIST_REVOKED)
    async def list_revoked(self, req: Empty, ctx: CallContext) -> wa.RevokedRsp:
        async with self.service._lock:
            self.service._guard()
            self._prune()  # saved with the next change (an expired entry refuses nothing anyway)
            return self._rsp()

    def __repr__(self) -> str:
        return f"RevokedTokens({len(self._tokens)} tokens {self.target!r})"
