"""The reuse bound of a verify answer (keysvc.domain.reuse.reuse_bound): at most the
setting, within the current whole second's count as nginx keeps it, never past the
key's expiry or its previous credentials' grace, and none for a key keysvc must see
every request of; and KEYSVC_VERIFY_REUSE_SECONDS, refused in one line when malformed."""

from datetime import UTC, datetime, timedelta

import pytest

from keysvc.config import ConfigError, build_settings
from keysvc.domain.reuse import Reuse, reuse_bound

# 2026-01-01T00:00:00Z, and a moment 0.3 s into its second.
SECOND = 1767225600
NOW = datetime.fromtimestamp(SECOND + 0.3, UTC)


def at(offset: float) -> datetime:
    return datetime.fromtimestamp(SECOND + offset, UTC)


def test_one_second_is_reused_until_the_end_of_the_current_second() -> None:
    # nginx serves an entry while its whole-second clock is at or before @last_second:
    # here until SECOND + 1, 0.7 s from now, never into the next second.
    assert reuse_bound(NOW, 1) == Reuse(last_second=SECOND, max_age=1)


@pytest.mark.parametrize("offset", [0.0, 0.3, 0.999])
@pytest.mark.parametrize("seconds", [1, 2, 5, 60])
def test_no_cache_counting_whole_seconds_reuses_it_past_the_bound(
    offset: float, seconds: int
) -> None:
    now = at(offset)
    bound = reuse_bound(now, seconds)
    assert bound is not None
    # The cache stops at the start of the second after last_second.
    stops = bound.last_second + 1
    assert stops <= now.timestamp() + seconds
    assert stops > now.timestamp() + seconds - 1  # and keeps as much as it can
    assert bound.max_age == seconds


def test_zero_seconds_is_no_reuse() -> None:
    assert reuse_bound(NOW, 0) is None


def test_a_key_that_must_see_every_request_is_never_reused() -> None:
    assert reuse_bound(NOW, 60, every_request=True) is None


def test_the_key_expiry_caps_the_bound() -> None:
    # Expires 2.5 s from the second's start: reused in seconds 0 and 1, never at 2.5.
    assert reuse_bound(NOW, 10, ends=(at(2.5),)) == Reuse(last_second=SECOND + 1, max_age=2)
    # Expires at a whole second: served up to it, not in it.
    assert reuse_bound(NOW, 10, ends=(at(3),)) == Reuse(last_second=SECOND + 2, max_age=2)


def test_the_earliest_of_several_ends_counts_and_none_is_no_end() -> None:
    ends = (None, at(5), at(2.2), None)
    assert reuse_bound(NOW, 10, ends=ends) == Reuse(last_second=SECOND + 1, max_age=1)
    assert reuse_bound(NOW, 1, ends=(None, None)) == Reuse(last_second=SECOND, max_age=1)


def test_an_end_within_the_current_second_leaves_nothing_to_reuse() -> None:
    assert reuse_bound(NOW, 10, ends=(at(0.9),)) is None
    assert reuse_bound(NOW, 10, ends=(at(1),)) == Reuse(last_second=SECOND, max_age=0)
    # An end already past (the answer was a refusal of an expired key) too.
    assert reuse_bound(NOW, 10, ends=(NOW - timedelta(days=1),)) is None


@pytest.mark.parametrize(("given", "taken"), [("0", 0), ("1", 1), ("60", 60)])
def test_the_setting_within_its_bounds_is_taken(given: str, taken: int) -> None:
    settings = build_settings(env={"KEYSVC_VERIFY_REUSE_SECONDS": given})
    assert settings.verify_reuse_seconds == taken


def test_the_setting_defaults_to_one_second() -> None:
    assert build_settings(env={}).verify_reuse_seconds == 1


@pytest.mark.parametrize(
    ("given", "refusal"),
    [
        ("61", "61 must be from 0 (no reuse) to 60 s"),
        ("-1", "-1 must be from 0 (no reuse) to 60 s"),
        ("1.5", "'1.5' is not a number"),
        ("1s", "'1s' is not a number"),
        ("off", "'off' is not a number"),
    ],
)
def test_a_malformed_setting_is_refused_in_one_line(given: str, refusal: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build_settings(env={"KEYSVC_VERIFY_REUSE_SECONDS": given})
    assert str(caught.value) == f"verify-reuse-seconds: {refusal}"
