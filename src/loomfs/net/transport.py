"""The Transport seam: TCP today, an in-memory simulated network for deterministic tests.

A transport connects and listens; what it hands back is a ``Channel`` that carries whole
frames both ways. RPC logic (``net.rpc``) sits on channels and never sees sockets.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from loomfs.net.protocol import FrameSink

if TYPE_CHECKING:
    from loomfs.net.auth import AuthConfig


class Channel(Protocol):
    peer: str

    async def send(self, prefix_and_header: bytes, payload: bytes | bytearray | memoryview | None) -> None:
        """Send one whole frame; the payload may be reused once this returns."""
        ...

    def abort(self, exc: BaseException | None = None) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    @property
    def closed(self) -> bool: ...


SinkFactory = Callable[[Channel], FrameSink]


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> Address:
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"address must be HOST:PORT, got {text!r}")
        return cls(host or "127.0.0.1", int(port))


class Listener(ABC):
    address: Address

    @abstractmethod
    async def close(self) -> None: ...


class Transport(ABC):
    max_payload_bytes: int
    # the credentials RPC servers and clients on this transport use (``loomfs.net.auth``); None: no auth
    auth: AuthConfig | None = None

    @abstractmethod
    async def connect(self, address: Address, sink_factory: SinkFactory, *, timeout_s: float) -> Channel: ...

    @abstractmethod
    async def listen(self, address: Address, sink_factory: SinkFactory) -> Listener: ...
