"""``keysvc serve``: the app on its listeners, in one process or several workers
(``keysvc.ops.workers``), until SIGTERM or SIGINT."""

import asyncio
import functools
import logging
import signal
import socket
from collections.abc import Callable

import uvloop

from keysvc.config import Settings
from keysvc.domain.ratelimit import FailureSketch
from keysvc.http import listeners
from keysvc.http.app import create_app
from keysvc.http.connections import ServiceRunner
from keysvc.http.state import IN_FLIGHT
from keysvc.ops import workers

SHUTDOWN_SECONDS = 5.0


def run(settings: Settings) -> int:
    with listeners.prepared(settings) as unix:
        serve = functools.partial(_serve, unix=unix)
        if settings.workers > 1:
            return workers.run(settings, serve)
        asyncio.run(workers.prepare(settings))
        serve(settings)
    return 0


def loop_factory(settings: Settings) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the event loop ``serve`` runs on; None is asyncio's own."""
    return uvloop.new_event_loop if settings.loop == "uvloop" else None


def _serve(
    settings: Settings,
    reuse_port: bool = False,
    failures: FailureSketch | None = None,
    unix: socket.socket | None = None,
) -> None:
    # asyncio.run takes a loop_factory only from Python 3.12; Runner has one in 3.11.
    with asyncio.Runner(loop_factory=loop_factory(settings)) as runner:
        runner.run(_serve_until_stopped(settings, reuse_port, failures, unix))


async def _serve_until_stopped(
    settings: Settings,
    reuse_port: bool,
    failures: FailureSketch | None,
    unix: socket.socket | None,
) -> None:
    """Serve until SIGTERM or SIGINT; then stop accepting, let the requests already
    begun finish (their bodies still read), and close the database.

    Not ``web.run_app``: its shutdown marks every connection closing at once, and
    aiohttp then drops the rest of a request body still arriving (aiohttp#2298),
    so such a request would wait out the timeout unanswered.
    """
    log = logging.getLogger("keysvc")
    app = create_app(settings, failures=failures)
    runner = ServiceRunner(app, settings, access_log=None, handle_signals=False)
    await runner.setup()
    loop = asyncio.get_running_loop()
    # One bound for the whole stop, from the signal: the requests in flight, then the
    # connections still open (a client that stopped reading keeps its handler writing).
    deadline: float | None = None
    try:
        sites = await listeners.start(runner, settings, reuse_port, unix)
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        deadline = loop.time() + SHUTDOWN_SECONDS
        log.info("stopping: no new connections; finishing %d requests", app[IN_FLIGHT].count)
        for site in sites:
            await site.stop()
        while app[IN_FLIGHT].count and loop.time() < deadline:
            await asyncio.sleep(0.02)
    finally:
        # Closes idle connections, gives the rest what is left of the bound, then
        # closes the database.
        left = SHUTDOWN_SECONDS if deadline is None else deadline - loop.time()
        await runner.cleanup_within(left)
    log.info("stopped")
