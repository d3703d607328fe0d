"""An interrupted blocking call (KeyboardInterrupt while the caller waits) returns only once
its work on the loop thread has ended: until then reads may still land in the caller's
buffers (``readinto``, a KV cache's ``into=``). No sockets: the bridge's loop thread only."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pytest

from loomfs.client.sync_bridge import SyncBridge


def test_an_interrupted_call_waits_for_its_work_to_stop() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    bridge = object.__new__(SyncBridge)
    bridge._loop = loop
    started = threading.Event()
    ended: list[float] = []

    async def work() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        finally:  # a read being torn down: it still writes for a moment
            await asyncio.sleep(0.2)
            ended.append(time.monotonic())

    main = threading.main_thread().ident
    assert threading.get_ident() == main  # a signal's handler runs in the main thread
    assert main is not None

    native = threading.main_thread().native_id

    def blocked() -> bool:  # the caller sleeps in its wait (state S in /proc)
        with open(f"/proc/self/task/{native}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "S"

    def interrupt() -> None:
        assert started.wait(10)
        deadline = time.monotonic() + 10
        while not blocked() and time.monotonic() < deadline:
            time.sleep(0.001)
        signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C: the default handler raises there

    threading.Thread(target=interrupt, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            bridge._submit(work())
        raised_at = time.monotonic()
        assert ended and ended[0] <= raised_at, "the call raised while its work was still running"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
