"""keysvc.timeutil.to_minute: the minute of a moment, in UTC, whatever was asked before."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from keysvc.timeutil import to_minute

START = datetime(2026, 12, 31, 23, 58, 59, 999_999, tzinfo=UTC)


def test_each_moment_gets_its_own_minute_across_every_boundary() -> None:
    # Every 7 s for 3 minutes around a new year: minute, hour, day, month and year change.
    for step in range(30):
        moment = START + timedelta(seconds=7 * step)
        assert to_minute(moment) == moment.replace(second=0, microsecond=0)
        assert to_minute(moment).tzinfo is UTC


@pytest.mark.parametrize(
    ("first", "then"),
    [
        # The same minute and hour on other days, months and years: never the minute before.
        (datetime(2026, 5, 1, 12, 30, 5, tzinfo=UTC), datetime(2026, 5, 2, 12, 30, 5, tzinfo=UTC)),
        (datetime(2026, 5, 1, 12, 30, 5, tzinfo=UTC), datetime(2026, 6, 1, 12, 30, 5, tzinfo=UTC)),
        (datetime(2026, 5, 1, 12, 30, 5, tzinfo=UTC), datetime(2027, 5, 1, 12, 30, 5, tzinfo=UTC)),
        # Back in time, as a test clock may go.
        (datetime(2026, 5, 1, 12, 31, 0, tzinfo=UTC), datetime(2026, 5, 1, 12, 30, 59, tzinfo=UTC)),
    ],
)
def test_a_minute_asked_for_before_is_not_given_for_another(
    first: datetime, then: datetime
) -> None:
    to_minute(first)
    assert to_minute(then) == then.replace(second=0, microsecond=0)


def test_another_zone_is_taken_to_utc_first() -> None:
    plus_two = timezone(timedelta(hours=2))
    moment = datetime(2026, 5, 1, 14, 30, 5, 7, tzinfo=plus_two)
    minute = to_minute(moment)
    assert minute == datetime(2026, 5, 1, 12, 30, tzinfo=UTC)
    assert minute.tzinfo is UTC
