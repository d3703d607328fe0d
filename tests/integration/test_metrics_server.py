"""``/metrics`` is prometheus_client's own server (issue 15 item 15): its filters and gzip
work, and collectors still run on the service's event loop thread, not the server's."""

from __future__ import annotations

import asyncio
import gzip
import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from loomfs.metrics import start_service_metrics
from loomfs.metrics.scrape import parse_metrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


class _ThreadSeen(Collector):
    def __init__(self) -> None:
        self.threads: list[int] = []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.threads.append(threading.get_ident())
        yield GaugeMetricFamily("loomfs_test_value", "a value", value=42)


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as rsp:
        return rsp.status, dict(rsp.headers), rsp.read()


def test_metrics_served_by_prometheus_client_collected_on_the_loop() -> None:
    seen = _ThreadSeen()

    async def main() -> tuple[int, int]:
        m = await start_service_metrics("teststorage", collectors=[seen])
        url = f"http://127.0.0.1:{m.port}/metrics"
        try:
            status, headers, body = await asyncio.to_thread(_get, url)
            assert status == 200 and headers["Content-Type"].startswith("text/plain; version=")
            assert "WSGIServer" in headers.get("Server", "")  # prometheus_client's wsgiref server
            s = parse_metrics(body.decode(), 0.0)
            assert s.total("loomfs_test_value") == 42
            assert s.total("loomfs_service_info", service="teststorage") == 1
            _, _, only = await asyncio.to_thread(_get, url + "?name[]=loomfs_test_value")
            assert b"loomfs_test_value 42" in only and b"loomfs_service_info" not in only
            _, zh, zipped = await asyncio.to_thread(_get, url, {"Accept-Encoding": "gzip"})
            assert zh.get("Content-Encoding") == "gzip" and b"loomfs_test_value" in gzip.decompress(zipped)
            return threading.get_ident(), m.port
        finally:
            await m.close()

    loop_thread, port = asyncio.run(main())
    assert seen.threads and set(seen.threads) == {loop_thread}
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass  # closed: the port no longer listens
