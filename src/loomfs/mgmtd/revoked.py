"""mgmtd's list of revoked tokens (``loomfs admin token revoke``), served to every service.

Kept in ``DATA_DIR/revoked.json`` (0600) and in this process's ``revocations.PROCESS``; each
entry until the token's own expiry. Services poll ``LIST_REVOKED`` (``common.service_main``).
With several mgmtd (docs/mgmtd-ha.md) each keeps its own file: a revocation sent to the
primary is not copied to the standbys (revoke again after a failover, or use rpc.revoked_file).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from loomfs.errors import InvalidArgument
from loomfs.net import revocations
from loomfs.net.credentials import TOKEN_ID_CHARS_MAX
from loomfs.net.rpc import CallContext, handles
from loomfs.wire import auth as wa
from loomfs.wire.message import Empty

logger = logging.getLogger(__name__)
DEFAULT_KEEP_S = 365 * 86400.0


class RevokedTokens:
    def __init__(self, path: Path, target: revocations.Revocations = revocations.PROCESS):
        self.path = path
        self.target = target
        target.replace(revocations.load(path))
        target.prune(time.time())

    def _rsp(self) -> wa.RevokedRsp:
        self.target.prune(time.time())
        snap = sorted(self.target.snapshot().items())
        return wa.RevokedRsp(token_ids=[t for t, _ in snap], until_s=[u for _, u in snap])

    @handles(wa.REVOKE_TOKEN)
    async def revoke_token(self, req: wa.RevokeTokenReq, ctx: CallContext) -> wa.RevokedRsp:
        if not 0 < len(req.token_id) <= TOKEN_ID_CHARS_MAX:
            raise InvalidArgument("token_id: 1..64 characters")
        until = req.until_s if req.until_s > 0 else time.time() + DEFAULT_KEEP_S
        self.target.add(req.token_id, until)
        revocations.save(self.path, self.target.snapshot())
        logger.info("token %s revoked by %s (kept until %.0f)", req.token_id, ctx.identity.token_id, until)
        return self._rsp()

    @handles(wa.LIST_REVOKED)
    async def list_revoked(self, req: Empty, ctx: CallContext) -> wa.RevokedRsp:
        return self._rsp()

    def __repr__(self) -> str:
        return f"RevokedTokens({self.path} {self.target!r})"
