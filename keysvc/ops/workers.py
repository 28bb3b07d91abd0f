"""Several server processes on one port (``keysvc serve --workers N``).

The parent prepares the database once (migrations, pepper check) so that the
workers never race to upgrade it, and makes the failed-login table they share
(``keysvc.domain.ratelimit.FailureSketch``), then forks. Each worker opens its own
database connections after the fork and binds the same port with
SO_REUSEPORT, and the kernel spreads connections among them. The parent only
supervises: SIGTERM or Ctrl-C is passed on to every worker, a worker whose parent
dies (SIGKILL included) is sent SIGTERM (Linux), and if one dies
unexpectedly the others are stopped too and the parent exits non-zero, so a
supervisor such as systemd sees the failure.
"""

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType

from keysvc.config import Settings
from keysvc.db.backends import open_store, warn_if_exposed
from keysvc.db.contract import Records
from keysvc.domain import activities
from keysvc.domain.ratelimit import FailureSketch

logger = logging.getLogger("keysvc")
# (settings, reuse_port, the failed-login table shared by the workers)
Serve = Callable[[Settings, bool, FailureSketch], None]


async def prepare(settings: Settings) -> None:
    """Open the database once before serving: migrate it, check that it can be
    written and that the pepper matches. One ``bootstrap`` has not made is refused;
    one that others may read is served, with a warning."""
    async with open_store(settings, create=False, records=Records(pre_log=activities.pre_log)):
        pass
    warn_if_exposed(settings)


def _signal_all(children: list[int], signum: int) -> None:
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


# Linux's prctl option that sends the caller a signal when its parent dies.
_PR_SET_PDEATHSIG = 1


def _end_with(parent: int) -> None:
    """Have this worker get SIGTERM, and so stop cleanly, when the supervising parent
    dies, even by SIGKILL: orphaned workers would otherwise go on serving the port
    with no one to stop them. Linux only; elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        logger.warning("worker %d will outlive its parent: prctl failed", os.getpid())
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def run(settings: Settings, serve: Serve) -> int:
    """Fork ``settings.workers`` processes running ``serve``; returns the exit code."""
    asyncio.run(prepare(settings))
    failures = FailureSketch.of(settings)
    children: list[int] = []
    parent = os.getpid()
    for _ in range(settings.workers):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _end_with(parent)
                serve(settings, True, failures)
            except BaseException:
                logger.exception("worker %d failed", os.getpid())
                code = 1
            finally:
                os._exit(code)
        children.append(pid)
    logger.info("started %d workers: %s", len(children), " ".join(map(str, children)))
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        _signal_all(children, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    exit_code = 0
    while children:
        pid, status = os.wait()
        children.remove(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0 and not stopping:
            logger.error("worker %d exited with %d; stopping the others", pid, code)
            stopping, exit_code = True, 1
            _signal_all(children, signal.SIGTERM)
    return exit_code
