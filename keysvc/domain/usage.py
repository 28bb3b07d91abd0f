"""A key's usage series: its authentications per minute, hour or day, by outcome.

The counts are kept by ``keysvc.db.usage`` (what is counted, and when it is
written); here a query becomes buckets. ``from`` is rounded down and ``to`` up to
whole buckets, in UTC; every bucket between is answered, zero-filled, so a
series has no gaps to guess at. Without ``from``, an hour's or a day's series
starts 24 hours before ``to``, a minute's 1,440 minutes before ``to`` rounded up
(``default_start``): every granularity answers its defaults within
MAX_USAGE_BUCKETS. Counts reach the series once written: within one
flush interval (``KEYSVC_USAGE_FLUSH_SECONDS``) of the request.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from keysvc.db.contract import Store
from keysvc.db.usage import COUNTED
from keysvc.domain.keys import NOT_FOUND
from keysvc.domain.limits import MAX_USAGE_BUCKETS
from keysvc.errors import BadRequest, NotFound
from keysvc.timeutil import to_text

DEFAULT_SPAN = timedelta(hours=24)
# Each granularity's bucket width, and how many leading characters of a minute's
# text (2026-01-02T03:04:00Z) name its bucket.
_STEPS: dict[str, tuple[timedelta, int]] = {
    "minute": (timedelta(minutes=1), 16),
    "hour": (timedelta(hours=1), 13),
    "day": (timedelta(days=1), 10),
}


@dataclass(frozen=True)
class UsageSeries:
    granularity: str
    start: datetime
    end: datetime
    # Each bucket: its start, and a count per outcome (keysvc.db.usage.COUNTED).
    buckets: list[dict[str, Any]]


def _floor(moment: datetime, granularity: str) -> datetime:
    moment = moment.replace(second=0, microsecond=0)
    if granularity == "minute":
        return moment
    moment = moment.replace(minute=0)
    return moment if granularity == "hour" else moment.replace(hour=0)


def default_start(end: datetime, granularity: str) -> datetime:
    """Where a series ending at ``end`` starts when the query names no ``from``."""
    if granularity != "minute":
        return end - DEFAULT_SPAN
    # 24 hours before a ``to`` inside a minute would round out to one bucket too many.
    step = _STEPS[granularity][0]
    last = _floor(end, granularity)
    return (last if last == end else last + step) - MAX_USAGE_BUCKETS * step


def bucket_range(params: Mapping[str, Any], now: datetime) -> tuple[datetime, datetime, int]:
    """The first bucket's start, the last one's end and how many buckets the query
    ``params`` (``UsageQuerySchema``) asks for, at ``now``."""
    granularity = params["granularity"]
    step = _STEPS[granularity][0]
    try:
        end = params.get("end") or now
        asked = params.get("start") or default_start(end, granularity)
        if asked > end:
            raise BadRequest("from: must not be after to")
        start = _floor(asked, granularity)
        count = -((start - end) // step)  # whole buckets, the last one rounded up
        if count > MAX_USAGE_BUCKETS:
            raise BadRequest(
                f"from, to: ask for at most {MAX_USAGE_BUCKETS} buckets of a {granularity},"
                f" not {count}; narrow the range or choose a wider granularity"
            )
        return start, start + count * step, count
    except OverflowError:
        raise BadRequest("from, to: out of range; ask for dates from year 1 to 9999") from None


async def key_usage(
    store: Store, organization_id: str, key_id: str, params: Mapping[str, Any], now: datetime
) -> UsageSeries:
    """The usage series of the organization's key ``key_id`` (404 for a key it does
    not hold) that the query ``params`` asks for, at ``now``."""
    if await store.get_key(organization_id, key_id) is None:
        raise NotFound(NOT_FOUND)
    granularity = params["granularity"]
    start, end, count = bucket_range(params, now)
    step, width = _STEPS[granularity]
    counted = await store.usage_series(key_id, start, end, width)
    buckets = []
    zeros = (0,) * len(COUNTED)
    for n in range(count):
        moment = start + n * step
        numbers = counted.get(to_text(moment)[:width], zeros)
        buckets.append({"start": moment, **dict(zip(COUNTED, numbers, strict=True))})
    return UsageSeries(granularity, start, end, buckets)
