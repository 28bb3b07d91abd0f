"""The failed-login throttle of a real ``keysvc serve --workers 2``: one count for
all workers, reached at the configured limit however the guesses are spread."""

import http.client
import re
import time
from pathlib import Path

import pytest

from keysvc.credentials import new_key_id, new_secret
from keysvc.domain.ratelimit import FAILURE_WINDOW
from tests.helpers import basic
from tests.server import Server, bootstrap

LIMIT = 20
# Long enough for this test's requests even on a loaded machine: they must all fall
# in one failure window, as a new window starts the count again.
WINDOW_MARGIN = 25.0
_INVALID = re.compile(
    r'^keysvc_auth_outcomes_total\{reason="invalid_credentials"\} ([0-9.e+]+)$', re.M
)


def _get(port: int, path: str, source: str, headers: dict[str, str]) -> tuple[int, str]:
    """One request on a new connection from ``source``: new connections are what the
    kernel spreads among the workers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        conn.request("GET", path, headers={**headers, "Connection": "close"})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def _wait_for_listeners(port: int, count: int) -> None:
    """Until ``count`` sockets listen on ``port``: the server answers as soon as its
    first worker does, and a guess must be able to reach either."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
        # local_address is HEXIP:HEXPORT, and state 0A is LISTEN.
        listening = [
            r for r in rows if r.split()[1].endswith(f":{port:04X}") and r.split()[3] == "0A"
        ]
        if len(listening) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} sockets listen on port {port}")


def _wait_for_room_in_the_window() -> None:
    into = time.time() % FAILURE_WINDOW
    if into > FAILURE_WINDOW - WINDOW_MARGIN:
        time.sleep(FAILURE_WINDOW - into + 0.2)


@pytest.mark.parametrize(
    ("prefix", "sources"),
    [
        ("32", ["127.0.0.1"]),  # one address: the workers' counts are one count
        ("24", [f"127.0.0.{n}" for n in range(2, 102)]),  # 100 addresses of one /24
    ],
    ids=["one-address", "one-v4-24"],
)
def test_workers_share_one_failure_count(tmp_path: Path, prefix: str, sources: list[str]) -> None:
    env = {
        "KEYSVC_WORKERS": "2",
        "KEYSVC_AUTH_FAILURES": str(LIMIT),
        "KEYSVC_THROTTLE_PREFIX_V4": prefix,
    }
    bootstrap(tmp_path / "k.db")
    with Server(tmp_path / "k.db", env=env) as server:
        _wait_for_listeners(server.port, 2)
        _wait_for_room_in_the_window()
        window = time.time() // FAILURE_WINDOW
        statuses = []
        for n in range(2 * LIMIT + 5):
            guess = basic(new_key_id(), new_secret())
            statuses.append(_get(server.port, "/v1/verify", sources[n % len(sources)], guess)[0])
        assert time.time() // FAILURE_WINDOW == window, "the requests outlasted the window"
        failed = statuses.count(401)
        assert statuses == [401] * LIMIT + [429] * (LIMIT + 5), f"{failed} failures admitted"
        # Both workers took part: each counted some of the failures, all of them together.
        seen = set()
        for n in range(40):
            body = _get(server.port, "/metrics", sources[n % len(sources)], {})[1]
            match = _INVALID.search(body)
            assert match is not None, body
            seen.add(int(float(match[1])))
        assert 0 not in seen and len(seen) <= 2, seen
        assert sum(seen) == LIMIT or seen == {LIMIT // 2}, seen
