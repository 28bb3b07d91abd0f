"""UTC timestamps: the one text form keysvc stores and answers with.

ISO-8601 in UTC with a trailing ``Z``; fractions of a second appear only when
the value has them. The year always has four digits (strftime's ``%Y`` does not pad
years before 1000 on every platform), so that the text sorts in time order and SQL
can compare it.
"""

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(UTC)


def to_text(moment: datetime, fraction: bool = False) -> str:
    """``moment`` as stored and answered; with ``fraction``, its microseconds are
    written even when zero (the activity log's stamps, which must all sort alike)."""
    m = moment.astimezone(UTC)
    text = f"{m.year:04d}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:{m.second:02d}"
    if m.microsecond or fraction:
        return f"{text}.{m.microsecond:06d}Z"
    return f"{text}Z"


def from_text(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


# The minute last asked for, by its fields, and that minute: every authenticated
# request asks for the minute of now, and ``datetime.replace`` costs several times
# the comparison (about 2 against 0.3 µs by timeit). One tuple, read and replaced
# whole, so that any thread reads a matching pair.
_last_minute: tuple[tuple[int, int, int, int, int], datetime] = (
    (0, 0, 0, 0, 0),
    datetime.min.replace(tzinfo=UTC),
)


def to_minute(moment: datetime) -> datetime:
    """``moment`` in UTC, with its seconds and microseconds taken off."""
    global _last_minute
    if moment.tzinfo is not UTC:
        moment = moment.astimezone(UTC)
    fields = (moment.minute, moment.hour, moment.day, moment.month, moment.year)
    last = _last_minute
    if last[0] == fields:
        return last[1]
    minute = moment.replace(second=0, microsecond=0)
    _last_minute = (fields, minute)
    return minute
