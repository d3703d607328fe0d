"""Issue 15 item 20: background work (scrub passes, GC removals) yields to clients' I/O."""

from __future__ import annotations

import asyncio

from test_replication_defects import Chain3, run

from loomfs.storage.foreground import ForegroundGate
from loomfs.storage.scrub import Scrubber
from loomfs.testing.simloop import run_virtual


def test_quiet_waits_for_foreground_io_but_not_forever() -> None:
    async def main() -> None:
        gate = ForegroundGate()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await gate.quiet(1.0)
        assert loop.time() == t0  # idle: no wait
        release = asyncio.Event()

        async def client_io() -> None:
            with gate.busy():
                await release.wait()

        io = asyncio.ensure_future(client_io())
        await asyncio.sleep(0)
        waiter = asyncio.ensure_future(gate.quiet(5.0))
        await asyncio.sleep(0.3)
        assert not waiter.done()  # held back while the client's I/O runs
        release.set()
        await waiter
        assert 0.29 < loop.time() - t0 < 0.4
        with gate.busy():
            t1 = loop.time()
            await gate.quiet(0.2)  # never starved
            assert abs(loop.time() - t1 - 0.2) < 0.01
        await io
        assert gate.waits_total == 2

    run_virtual(main())


def test_a_scrub_pass_waits_while_a_client_write_is_in_flight() -> None:
    async def body(c: Chain3) -> None:
        await c.write(1, 0, b"x" * 100)
        svc = c.nodes[0].service
        scrub = Scrubber(svc, bytes_per_s=1 << 30, interval_s=3600)
        with svc.foreground.busy():  # a client's request in flight on the node
            task = asyncio.ensure_future(scrub.scrub_target(c.nodes[0].target))
            await asyncio.sleep(0.05)
            assert scrub.chunks_checked == 0
        await task
        assert scrub.chunks_checked == 1 and svc.foreground.waits_total == 1

    run(body)


def test_a_cancel_in_the_step_the_gate_opens_is_not_lost() -> None:
    """Simulator seed 218556: a node's crash cancelled its tasks in one step; the client handler's
    end opened the gate and the scrubber waiting on it was cancelled at the same time. Through
    3.11's ``asyncio.wait_for`` the inner wait finished first and the cancel was swallowed: the
    scrubber lived on after its node died. The cancel must reach the waiter."""

    async def main() -> None:
        gate = ForegroundGate()
        busy = gate.busy()
        busy.__enter__()
        waiter = asyncio.ensure_future(gate.quiet(5.0))
        await asyncio.sleep(0.1)
        assert not waiter.done()
        busy.__exit__(None, None, None)  # the gate opens...
        waiter.cancel()  # ...and the waiter is cancelled in the same step
        try:
            await waiter
        except asyncio.CancelledError:
            pass
        assert waiter.cancelled()

    run_virtual(main())
