"""Request and failed-login limits without the app: the window counter, the failure
sketch per network, and their settings."""

import ipaddress

import pytest

from keysvc.config import ConfigError, build_settings
from keysvc.domain.ratelimit import FAILURE_WINDOW, FailureSketch, WindowCounter


def test_window_counter_counts_resets_and_stays_bounded() -> None:
    counter = WindowCounter(max_entries=10)
    decisions = [counter.hit("k", 3, 10, 100.5 + i) for i in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.remaining for d in decisions] == [2, 1, 0, 0]
    assert [d.reset for d in decisions] == [10, 9, 8, 7]  # the window is [100, 110)
    assert counter.hit("k", 3, 10, 110.0).allowed  # a new window
    assert counter.hit("k", 3, 10, 110.5).remaining == 1
    for n in range(50):
        counter.hit(f"other{n}", 3, 10, 200.0 + n)
    assert len(counter) <= 10


def test_a_changed_window_counts_again_and_resets_with_it() -> None:
    """A key moved from 100/10s to 1/60s inside a window both start at (120): the old
    count is not carried, and the new window's reset is its own, not the old one's."""
    counter = WindowCounter()
    for _ in range(5):
        counter.hit("key", 100, 10, 125.0)
    first = counter.hit("key", 1, 60, 125.0)
    assert first.allowed and first.remaining == 0 and first.reset == 55
    refused = counter.hit("key", 1, 60, 131.0)
    assert not refused.allowed and refused.reset == 49


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("off", None),
        ("", None),
        ("100/10s", (100, 10)),
        ("1000/m", (1000, 60)),
        ("5/2h", (5, 7200)),
    ],
)
def test_rate_setting(text: str, parsed: tuple[int, int] | None) -> None:
    assert build_settings(env={"KEYSVC_RATE_LIMIT": text}).rate_limit == parsed


@pytest.mark.parametrize("text", ["100", "0/s", "10/0s", "ten/s", "10/10d"])
def test_bad_rate_setting(text: str) -> None:
    with pytest.raises(ConfigError, match="is not a limit such as 100/10s"):
        build_settings(env={"KEYSVC_RATE_LIMIT": text})


def test_failure_sketch_counts_per_network_and_never_too_few() -> None:
    """Failures count against the address's network (/24 and /64 here), the count is
    never below the true one however many networks fill the table, and a new window
    starts from zero."""
    sketch = FailureSketch(v4_prefix=24, v6_prefix=64)
    now = 10 * FAILURE_WINDOW + 1.0
    truth: dict[ipaddress.IPv4Network | ipaddress.IPv6Network, int] = {}
    for n in range(3000):
        address = ipaddress.ip_address(f"10.{n % 7}.{n % 251}.{n % 13}")
        sketch.hit(address, now)
        network = ipaddress.ip_network(f"{address}/24", strict=False)
        truth[network] = truth.get(network, 0) + 1
    for network, count in truth.items():
        for host in (1, 254):
            assert sketch.count(network[host], now) >= count
    v6 = [ipaddress.ip_address(f"2001:db8:0:7:{n:x}::{n:x}") for n in range(1, 6)]
    for address in v6:
        sketch.hit(address, now)
    assert sketch.count(ipaddress.ip_address("2001:db8:0:7:ffff::1"), now) >= 5
    assert not sketch.allows(ipaddress.ip_address("2001:db8:0:7::9"), 5, now)
    assert sketch.retry_after(now) == FAILURE_WINDOW - 1
    later = now + FAILURE_WINDOW
    assert sketch.allows(v6[0], 1, later) and sketch.count(v6[0], later) == 0
    sketch.hit(v6[0], later)
    assert sketch.count(v6[0], later) == 1


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("KEYSVC_THROTTLE_PREFIX_V4", "33", "v4: 33 is not a prefix length from 1 to 32"),
        ("KEYSVC_THROTTLE_PREFIX_V4", "0", "v4: 0 is not a prefix length from 1 to 32"),
        ("KEYSVC_THROTTLE_PREFIX_V6", "129", "v6: 129 is not a prefix length from 1 to 128"),
        ("KEYSVC_THROTTLE_PREFIX_V6", "/64", "v6: '/64' is not a number"),
    ],
)
def test_bad_throttle_prefix_setting(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        build_settings(env={name: value})
    assert str(raised.value) == "throttle-prefix-" + message


def test_throttle_prefix_defaults_and_setting() -> None:
    defaults = build_settings(env={})
    assert (defaults.throttle_prefix_v4, defaults.throttle_prefix_v6) == (32, 64)
    chosen = build_settings(
        env={"KEYSVC_THROTTLE_PREFIX_V4": "24", "KEYSVC_THROTTLE_PREFIX_V6": "48"}
    )
    assert (chosen.throttle_prefix_v4, chosen.throttle_prefix_v6) == (24, 48)


def test_count_decides_and_counts_as_take_does() -> None:
    """``count`` (the verify whose answer shows no limit) against ``take`` on the same
    requests: the same admissions, and the same counts left behind, for one limit and
    for several, cost 0 checks, changed windows, and across window ends."""
    import random

    from keysvc.domain.ratelimit import Ask

    rng = random.Random(36)
    counting, taking = WindowCounter(max_entries=50), WindowCounter(max_entries=50)
    now = 1000.0
    for step in range(4000):
        now += rng.choice((0.0, 0.1, 0.7, 3.0))
        asks = tuple(
            Ask(
                f"r:k:{rng.randrange(60)}:{name}",
                rng.choice((1, 3, 10)),
                rng.choice((1, 10, 60)),
                rng.choice((0, 1, 1, 2)),
                f"org{rng.randrange(3)}",
            )
            for name in rng.sample("abc", rng.choice((1, 1, 1, 2, 3)))
        )
        fit = counting.count(asks, now)
        decisions = taking.take(asks, now)
        assert fit == all(d.allowed for d in decisions), step
        assert counting._counts == taking._counts and counting._owners == taking._owners, step
    assert len(counting) <= 50


def test_count_of_one_limit() -> None:
    from keysvc.domain.ratelimit import Ask

    counter = WindowCounter()
    ask = Ask("r:k:key:burst", 3, 10, 1, "org")
    assert [counter.count((ask,), 100.5 + i) for i in range(4)] == [True, True, True, False]
    check = Ask("r:k:key:burst", 3, 10, 0, "org")  # cost 0: passes only while room is left
    assert not counter.count((check,), 109.9)
    assert counter.take((ask,), 109.9)[0].remaining == 0  # the refusals counted nothing
    assert counter.count((check,), 110.0) and counter.count((ask,), 110.0)  # a new window
    assert counter.take((check,), 110.5)[0].remaining == 2
    # The window's length changed: it counts again.
    assert counter.count((Ask("r:k:key:burst", 1, 60, 1, "org"),), 120.0)
    assert not counter.count((Ask("r:k:key:burst", 1, 60, 1, "org"),), 121.0)
