"""Networking: the Transport seam (TCP, simulated), framing protocol, RPC."""

from loomfs.net.rpc import CallContext, Reply, Response, RetryPolicy, RpcClient, RpcServer, handles
from loomfs.net.tcp import TcpTransport
from loomfs.net.transport import Address, Transport

__all__ = [
    "Address",
    "CallContext",
    "Reply",
    "Response",
    "RetryPolicy",
    "RpcClient",
    "RpcServer",
    "TcpTransport",
    "Transport",
    "handles",
]
