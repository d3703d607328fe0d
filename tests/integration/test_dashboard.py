"""The web dashboard in a real headless Chromium (Debian chromium + chromedriver, driven by
plain WebDriver JSON calls): the page loads, shows the cluster's nodes, and updates when a
storage process is stopped."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from loomfs.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class WebDriver:
    def __init__(self, url: str):
        self.url = url
        self.session = ""

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as rsp:
            return json.loads(rsp.read())["value"]

    def start(self, user_data_dir: str) -> None:
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run",
                "--disable-dev-shm-usage", f"--user-data-dir={user_data_dir}", "--window-size=1280,1000"]
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome",
                                                 "goog:chromeOptions": {"binary": CHROMIUM, "args": args}}}}
        self.session = self._call("POST", "/session", caps)["sessionId"]

    def get(self, url: str) -> None:
        self._call("POST", f"/session/{self.session}/url", {"url": url})

    def js(self, script: str) -> Any:
        return self._call("POST", f"/session/{self.session}/execute/sync", {"script": script, "args": []})

    def screenshot(self, path: Path) -> None:
        import base64

        path.write_bytes(base64.b64decode(self._call("GET", f"/session/{self.session}/screenshot")))

    def quit(self) -> None:
        if self.session:
            try:
                self._call("DELETE", f"/session/{self.session}")
            except OSError:
                pass


def _wait(what: str, fn: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    end = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < end:
        last = fn()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


@pytest.fixture()
def short_lease_cluster() -> Iterator[LocalCluster]:
    root = tempfile.mkdtemp(prefix="loomfs-it-dashboard-")
    c = LocalCluster(root, heartbeat_interval_s=0.3, lease_s=1.5)
    try:
        c.start(timeout_s=60)
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian chromium + chromium-driver (scripts/test.sh installs them)")
def test_dashboard_in_headless_chromium(short_lease_cluster: LocalCluster, tmp_path: Path) -> None:
    c = short_lease_cluster
    dash = subprocess.Popen(
        [sys.executable, "-m", "loomfs.cli.main", "--mgmtd", c.mgmtd_address, "dashboard", "--port", "0",
         "--interval-s", "0.3"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    driver_port = _free_port()
    drv = subprocess.Popen([str(DRIVER), f"--port={driver_port}"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    wd = WebDriver(f"http://127.0.0.1:{driver_port}")
    try:
        assert dash.stdout is not None
        line = dash.stdout.readline()
        assert "dashboard on http://" in line, line
        url = line.split("dashboard on ", 1)[1].strip()
        with urllib.request.urlopen(url + "api/state", timeout=5) as rsp:
            state = json.loads(rsp.read())
        assert len(state["view"]["nodes"]) == 4  # 1 meta + 3 storage
        _wait("chromedriver", lambda: _listening(driver_port), 20)
        wd.start(str(tmp_path / "chromium-profile"))
        wd.get(url)
        assert _wait("page title", lambda: wd.js("return document.title")) == "LoomFS dashboard"
        _wait("4 node rows", lambda: wd.js("return document.querySelectorAll('#nodes tr').length") == 4)
        assert wd.js("return document.getElementById('alive-count').textContent") == "3"
        assert wd.js("return document.getElementById('health').textContent") == "ok"
        assert wd.js("return document.querySelectorAll('#targets tr').length") == 6
        assert wd.js("return document.querySelectorAll('script[src], link[href]').length") == 0  # no external assets
        # charts have axes: three y gridline labels in the chart's unit, the time span on x
        _wait("chart axes", lambda: wd.js("return document.querySelectorAll('#g-tput .y-label').length") == 3)
        ys = wd.js("return [...document.querySelectorAll('#g-tput .y-label')].map(e => e.textContent)")
        assert ys[0] == "0 B/s" and all(y.endswith("/s") for y in ys), ys
        assert all(y.endswith("IOPS") for y in wd.js(
            "return [...document.querySelectorAll('#g-iops .y-label')].map(e => e.textContent)"))
        _wait("a time span on x", lambda: wd.js(
            "return document.querySelector('#g-meta .x-label').textContent").endswith(" s"), 20)
        cap = wd.js("return document.getElementById('capacity').textContent")
        assert cap.endswith("(1 disk)"), cap  # 6 targets on this machine's one disk, counted once
        wd.screenshot(tmp_path / "before.png")
        c.stop_service("storage2")
        _wait("storage2 shown dead", lambda: wd.js(
            "const r=document.querySelector('#nodes tr[data-node=\"2\"]'); return r && r.dataset.state"
        ) == "dead", 30)
        assert wd.js("return document.getElementById('alive-count').textContent") == "2"
        assert wd.js("return document.getElementById('health').textContent") != "ok"
        assert wd.js("return document.querySelectorAll('#nodes tr').length") == 4
        wd.screenshot(tmp_path / "after.png")
    finally:
        wd.quit()
        drv.terminate()
        dash.terminate()
        for p in (drv, dash):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False
