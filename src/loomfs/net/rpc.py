"""RPC over frames: a server that dispatches by (service, method) and a pooled client.

Servers: every request runs in its own task (bounded per connection, reading pauses past
the bound), or, with ``RpcServer(eager=True)``, starts at once and gets a task only if its
handler suspends (``net.rpc_serve``, ``net.rpc_eager``); unknown methods, undecodable bodies and bad payload CRCs get an error status;
handler exceptions become status codes (never pickled); a broken peer only loses its own
connection. Clients: one multiplexed connection per peer, deadlines on every call, retry
with exponential backoff for idempotent methods, replies received straight into the
caller's buffer when one is given.
"""

from __future__ import annotations

from loomfs.net.rpc_base import (
    AUTH_CLOSE_DELAY_S,
    CallContext,
    Handler,
    Reply,
    RpcObserver,
    handles,
    remote_error,
)
from loomfs.net.rpc_client import ClientConnection, Response, RetryPolicy, RpcClient
from loomfs.net.rpc_server import RpcServer, _ServerConnection

__all__ = [
    "AUTH_CLOSE_DELAY_S", "CallContext", "ClientConnection", "Handler", "Reply", "Response",
    "RetryPolicy", "RpcClient", "RpcObserver", "RpcServer", "_ServerConnection", "handles",
    "remote_error",
]
