"""UTC timestamps: the one text form keysvc stores and answers with.

ISO-8601 in UTC with a trailing ``Z``; fractions of a second appear only when
the value has them. The text sorts in time order, so SQL can compare it.
"""

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(UTC)


def to_text(moment: datetime) -> str:
    moment = moment.astimezone(UTC)
    if moment.microsecond:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def from_text(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def to_minute(moment: datetime) -> datetime:
    if moment.tzinfo is not UTC:
        moment = moment.astimezone(UTC)
    return moment.replace(second=0, microsecond=0)
