"""The hostile input corpus against a real `keysvc serve`: past aiohttp's parser limits
it is still the envelope, from the server itself and not only the test client."""

import asyncio
from pathlib import Path

from tests.api.hostile import (
    AUTH_TOO_LONG,
    PARSER_REFUSALS,
    TOO_LONG_LINE,
    assert_raw_error,
    exchange,
    http,
)
from tests.server import Server, bootstrap


def test_real_server_answers_long_headers_in_the_envelope(tmp_path: Path) -> None:
    """Through `keysvc serve` itself: the raised parser limits and the envelope
    for what is past them are the server's, not only the test client's."""

    async def probe(port: int) -> None:
        eight_kib = http("GET", "/v1/whoami", [("Authorization", "Basic " + "A" * 8192)])
        assert_raw_error(await exchange("127.0.0.1", port, eight_kib), 401, AUTH_TOO_LONG)
        answer = await exchange("127.0.0.1", port, PARSER_REFUSALS["header-over-limit"])
        assert_raw_error(answer, 400, TOO_LONG_LINE)
        answer = await exchange("127.0.0.1", port, PARSER_REFUSALS["url-over-limit"])
        assert_raw_error(answer, 400, TOO_LONG_LINE)

    db = tmp_path / "keysvc.db"
    bootstrap(db)
    with Server(db) as server:
        asyncio.run(probe(server.port))
        assert server.proc.poll() is None
