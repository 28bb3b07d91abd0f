"""The app's background tasks stop when the app stops, whatever arrives with the stop
(through the real app, on both backends). Python 3.11's ``asyncio.wait_for`` returns
the awaited result when the task is cancelled in the same turn as that result comes,
and the cancellation is lost: a loop that waits for a wake-up that way, woken as it is
stopped, carries on for ever, and so does the app's shutdown (a CI run hung in
``test_readyz_503_when_database_is_gone`` so)."""

import asyncio
import contextlib
from typing import Any

import pytest

from keysvc.db import outbox
from keysvc.errors import DatabaseUnavailable
from keysvc.http.state import LEAK_REPORTS, STORE
from tests.helpers import Client, assert_error

STOP_SECONDS = 5.0


async def _idle() -> None:
    """Long enough for a background task's first round: it now waits for a wake-up."""
    await asyncio.sleep(0.3)


async def test_leak_reports_woken_as_they_are_stopped_stop(client: Client) -> None:
    reports = client.app[LEAK_REPORTS]
    await _idle()
    reports.wake()
    async with asyncio.timeout(STOP_SECONDS):
        await reports.close()


async def test_an_app_whose_store_is_closed_stops(client: Client) -> None:
    """The store closed under the running app (the database gone): the app's own
    shutdown closes it again, and finishes."""
    store = client.app[STORE]
    await store.close()
    await assert_error(await client.get("/readyz"), 503, "not ready: the database does not answer")
    async with asyncio.timeout(STOP_SECONDS * 4):
        await client.close()
    await store.close()  # a third time: still nothing to do


async def test_deliveries_stop_when_their_cancel_is_lost(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read whose driver swallows the cancel that stops the deliveries and raises its
    own error (asyncpg's pool acquire under Python 3.11's wait_for, with the database
    gone): the loop took it for a failed read and tried again for ever, and the app's
    shutdown never ended (a CI run, 2026-11-29)."""

    async def lost(*args: Any) -> bool:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)
        raise DatabaseUnavailable()

    monkeypatch.setattr(outbox, "any_due", lost)
    await _idle()
    async with asyncio.timeout(STOP_SECONDS):
        await client.close()
