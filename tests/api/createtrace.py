"""Watching the statements of SQLite's create batches' connection
(``keysvc.db.sqlite.createbatch``), which spend batches of credits write on too: shared
by the tests of both."""

import asyncio
from collections.abc import Callable

from keysvc.db.sqlite.store import Store


async def trace_creates(store: Store, trace: Callable[[str], object] | None) -> None:
    """Have the create thread's connection report every statement it runs to ``trace``
    (a statement run for many rows, once per row); None stops it."""
    creates = store._creates.thread
    assert creates._conn is not None
    # On the create thread, between batches: the connection is never used by two at once.
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(creates._thread, creates._conn.set_trace_callback, trace)
