"""What PendingReports logs while its table cannot be read, through the real app on both
backends: one line with the traceback when the trouble starts, none for each round it
lasts (it polls every second: a line each would flood the log for as long as an outage
lasts), and one line when the reports are acted on again."""

import asyncio
import logging

import pytest

from keysvc.config import Settings
from keysvc.http.state import LEAK_REPORTS
from tests.handsql import hand_sql
from tests.helpers import Client, Creds

LOGGER = "keysvc"


def _lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "pending leak reports" in r.getMessage()]


async def test_an_outage_is_logged_once_and_its_end_once(
    client: Client, admin: Creds, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    tasks = client.app[LEAK_REPORTS]
    await tasks.close()
    tasks.poll = 0.02
    await asyncio.to_thread(
        hand_sql, settings, "alter table pending_leak_reports rename to test_away"
    )
    caplog.set_level(logging.INFO, logger=LOGGER)
    tasks.start()
    await asyncio.sleep(0.5)  # about 25 rounds, each failing
    failed = _lines(caplog)
    assert len(failed) == 1, [r.getMessage() for r in failed]
    assert failed[0].levelno == logging.ERROR and failed[0].exc_info is not None
    await asyncio.to_thread(
        hand_sql, settings, "alter table test_away rename to pending_leak_reports"
    )
    await asyncio.sleep(0.3)
    again = _lines(caplog)[1:]
    assert [r.levelno for r in again] == [logging.INFO], [r.getMessage() for r in again]
    assert "again" in again[0].getMessage()
