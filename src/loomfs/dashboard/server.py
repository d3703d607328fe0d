"""``loomfs dashboard``: a read-only web page over a ``ClusterPoller``.

Routes: ``/`` (the page, self-contained: inline CSS, JS and SVG; no external assets),
``/api/state`` (the latest view plus throughput history as JSON), ``/healthz``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from importlib import resources

from loomfs.dashboard.poller import ClusterPoller
from loomfs.metrics.http import HttpResponse, HttpServer

logger = logging.getLogger(__name__)


def page_html(refresh_ms: int = 1000) -> bytes:
    html = resources.files("loomfs.dashboard").joinpath("page.html").read_text(encoding="utf-8")
    return html.replace("<script>", f"<script>window.LOOMFS_REFRESH_MS={int(refresh_ms)};</script><script>", 1).encode()


class Dashboard:
    def __init__(self, mgmtd: str, *, interval_s: float = 1.0):
        self.poller = ClusterPoller(mgmtd)
        self.interval_s = interval_s
        self._page = page_html(int(interval_s * 1000))
        self.http = HttpServer({"/": self._index, "/index.html": self._index, "/api/state": self._state,
                                "/healthz": lambda q: HttpResponse(b"ok\n")}, name="dashboard")
        self._task: asyncio.Task[None] | None = None

    def _index(self, query: dict[str, list[str]]) -> HttpResponse:
        return HttpResponse(self._page, "text/html; charset=utf-8")

    def _state(self, query: dict[str, list[str]]) -> HttpResponse:
        doc = {"view": self.poller.view or {}, "history": list(self.poller.history.points)}
        return HttpResponse(json.dumps(doc).encode(), "application/json")

    async def _loop(self) -> None:
        while True:
            try:
                await self.poller.poll()
            except Exception:
                logger.exception("dashboard poll failed")
            await asyncio.sleep(self.interval_s)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        await self.poller.poll()
        self._task = asyncio.get_running_loop().create_task(self._loop())
        return await self.http.start(host, port)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.http.close()
        await self.poller.close()

    def __repr__(self) -> str:
        return f"Dashboard({self.poller!r} {self.http!r})"
