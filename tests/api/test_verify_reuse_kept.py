"""The reuse headers of a verify answer that nothing ends sooner than the setting (no
expiry, no previous credentials, nothing counted) are worked out once a second and kept
for that second's other answers (keysvc.http.reuse); every other answer still works out
its own. The headers themselves are those the rule gives (tests/api/test_verify_reuse.py)."""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from keysvc.config import Settings
from keysvc.domain.reuse import Reuse, reuse_bound
from keysvc.http import reuse
from tests.api.rotation import rotate
from tests.helpers import (
    ClientFactory,
    FakeClock,
    bootstrap,
    client_with,
    create_creds,
)

VERIFY = "/v1/verify"


class Bounds:
    """How many times the rule was asked, in the real app (the rule itself still answers)."""

    def __init__(self) -> None:
        self.asked = 0

    def __call__(self, *args: object, **kwargs: object) -> Reuse | None:
        self.asked += 1
        return reuse_bound(*args, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def bounds(monkeypatch: pytest.MonkeyPatch) -> Iterator[Bounds]:
    counted = Bounds()
    monkeypatch.setattr(reuse, "reuse_bound", counted)
    yield counted


def at(clock: FakeClock, seconds: float) -> int:
    """Put the clock at ``seconds`` past a whole second of its own; that second."""
    second = int(clock.now.timestamp()) + 10
    clock.now = datetime.fromtimestamp(second + seconds, UTC)
    return second


async def test_a_plain_keys_bound_is_worked_out_once_a_second(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, bounds: Bounds
) -> None:
    client = await client_with(aiohttp_client, settings, clock, verify_reuse_seconds=3)
    admin = await bootstrap(client.app)
    dev = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    second = at(clock, 0.1)
    asked = bounds.asked
    for fraction in (0.1, 0.5, 0.99):
        clock.now = datetime.fromtimestamp(second + fraction, UTC)
        for caller in (dev, admin):
            response = await client.get(VERIFY, headers=caller.headers)
            assert response.status == 200
            assert response.headers["X-Accel-Expires"] == f"@{second + 2}"
            assert response.headers["Cache-Control"] == "private, max-age=3"
    assert bounds.asked == asked + 1
    clock.now = datetime.fromtimestamp(second + 1.2, UTC)
    response = await client.get(VERIFY, headers=dev.headers)
    assert response.headers["X-Accel-Expires"] == f"@{second + 3}"
    assert bounds.asked == asked + 2


async def test_a_key_with_an_end_works_out_each_answer(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, bounds: Bounds
) -> None:
    client = await client_with(aiohttp_client, settings, clock, verify_reuse_seconds=10)
    admin = await bootstrap(client.app)
    second = at(clock, 0.2)
    expiry = datetime.fromtimestamp(second + 3, UTC).isoformat()
    key = await create_creds(client, admin, {"name": "s", "roles": ["admin"], "expireAt": expiry})
    plain = await client.get(VERIFY, headers=admin.headers)
    assert plain.headers["X-Accel-Expires"] == f"@{second + 9}"
    asked = bounds.asked
    for _ in range(2):
        response = await client.get(VERIFY, headers=key.headers)
        assert response.headers["X-Accel-Expires"] == f"@{second + 2}"
        assert response.headers["Cache-Control"] == "private, max-age=2"
    assert bounds.asked == asked + 2
    # The plain key's kept headers did not take the expiring key's.
    plain = await client.get(VERIFY, headers=admin.headers)
    assert plain.headers["X-Accel-Expires"] == f"@{second + 9}"


async def test_previous_credentials_in_their_grace_are_not_given_the_kept_headers(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await client_with(aiohttp_client, settings, clock, verify_reuse_seconds=30)
    admin = await bootstrap(client.app)
    old = await create_creds(client, admin, {"name": "r", "roles": ["developer"]})
    second = at(clock, 0.3)
    new, _ = await rotate(client, admin, old, {"gracePeriodSeconds": 5})
    for _ in range(2):
        with_new = await client.get(VERIFY, headers=new.headers)
        assert with_new.headers["X-Accel-Expires"] == f"@{second + 29}"
        with_old = await client.get(VERIFY, headers=old.headers)
        assert with_old.headers["X-Accel-Expires"] == f"@{second + 4}"
        assert with_old.headers["Cache-Control"] == "private, max-age=5"
    clock.now += timedelta(seconds=0.5)
    with_new = await client.get(VERIFY, headers=new.headers)
    assert with_new.headers["X-Accel-Expires"] == f"@{second + 29}"


async def test_two_apps_with_other_settings_in_one_second_keep_their_own(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    short = await client_with(aiohttp_client, settings, clock, verify_reuse_seconds=1)
    admin = await bootstrap(short.app)
    long = await client_with(aiohttp_client, settings, clock, verify_reuse_seconds=7)
    second = at(clock, 0.4)
    for _ in range(2):
        for client, last, age in ((short, second, 1), (long, second + 6, 7)):
            response = await client.get(VERIFY, headers=admin.headers)
            assert response.status == 200
            assert response.headers["X-Accel-Expires"] == f"@{last}"
            assert response.headers["Cache-Control"] == f"private, max-age={age}"
