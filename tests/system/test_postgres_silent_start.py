"""A command started against a PostgreSQL server that accepts the connection and then
never answers (frozen: SIGSTOP, a paused VM) gave up after its connect bound with an
empty reason, "cannot use the PostgreSQL database: " (a TimeoutError's text is empty;
the hostile review rt63 F3). It now says that nothing answered, and within what."""

import asyncio
import socket
from collections.abc import Iterator

import pytest

from keysvc.config import ConfigError, Settings
from keysvc.db.backends import open_store
from keysvc.db.postgres import store as pg_store
from tests.postgres import PEPPER


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port whose listener takes connections and never says a word."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


async def test_a_silent_server_is_named_as_such(
    silent_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg_store, "START_CONNECT_SECONDS", 0.5)
    url = f"postgresql://keysvc@127.0.0.1:{silent_port}/keysvc"
    settings = Settings(db_url=url, pepper=PEPPER.hex().encode())
    with pytest.raises(ConfigError) as refused:
        async with asyncio.timeout(10), open_store(settings, create=False):
            pass
    message = str(refused.value)
    assert message.startswith("cannot use the PostgreSQL database: ")
    assert message == "cannot use the PostgreSQL database: no answer within 0.5 s", message
