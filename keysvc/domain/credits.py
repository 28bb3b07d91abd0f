"""Credits on keys (issue 29): when a refill is due, what a spend leaves and which
credit events it sends, and the ``POST .../credits`` changes. Pure functions on
``keysvc.models.Credits``; the store applies their answers in one write
(``Store.spend_credits``, ``keysvc.db.credits``).

A refill sets ``remaining`` to its amount at 00:00 UTC of its day: every day
(``daily``), or day ``refillDay`` of every month (``monthly``; a day past the month's
end means its last day: 31 is 30 April and 28 or 29 February). It is applied lazily:
the next spend or read after that moment applies it, and ``nextRefillAt`` is then the
first refill moment after now.
"""

import calendar
import secrets
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from keysvc.errors import Conflict
from keysvc.models import EXHAUSTED_SENT, LOW_SENT, Credits, Refill

DAILY, MONTHLY = "daily", "monthly"
INTERVALS = (DAILY, MONTHLY)
MAX_CREDITS = 1_000_000_000_000
MAX_COST = 1_000_000
# ``key.credits_low`` is sent once remaining falls to this share of the last set or
# refill amount, or below.
LOW_SHARE = 0.10
CREDITS_LOW, CREDITS_EXHAUSTED = "key.credits_low", "key.credits_exhausted"
EXHAUSTED = "credits exhausted for this key"


def _midnight(day: datetime) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def refill_day_in(year: int, month: int, day: int) -> datetime:
    """00:00 UTC of day ``day`` of that month, or of its last day when it has fewer."""
    last = calendar.monthrange(year, month)[1]
    return datetime(year, month, min(day, last), tzinfo=UTC)


def next_refill_at(refill: Refill, after: datetime) -> datetime:
    """The first refill moment strictly after ``after``."""
    after = after.astimezone(UTC)
    if refill.interval == DAILY:
        return _midnight(after) + timedelta(days=1)
    this_month = refill_day_in(after.year, after.month, refill.day)
    if this_month > after:
        return this_month
    year, month = (after.year + 1, 1) if after.month == 12 else (after.year, after.month + 1)
    return refill_day_in(year, month, refill.day)


def new_revision() -> int:
    """A revision for credits an admin has just changed (``Credits.revision``): drawn at
    random, so that no earlier ETag of the key can come back, whoever changed what."""
    return secrets.randbits(32)


def new_credits(remaining: int, refill: Refill | None, now: datetime) -> Credits:
    """Credits as set at ``now``: the amount is what ``key.credits_low`` is measured against."""
    due = None if refill is None else next_refill_at(refill, now)
    return Credits(remaining, refill, due, base=remaining, revision=new_revision())


def settled(credits: Credits, now: datetime) -> Credits:
    """``credits`` with a refill due by ``now`` applied (the same object when none is)."""
    due = credits.next_refill_at
    if credits.refill is None or due is None or now < due:
        return credits
    amount = credits.refill.amount
    due = next_refill_at(credits.refill, now)
    return Credits(amount, credits.refill, due, amount, 0, credits.revision)


def seconds_to_refill(credits: Credits, now: datetime) -> int | None:
    """Whole seconds until the next refill (at least 1); None without one."""
    due = credits.next_refill_at
    if due is None:
        return None
    return max(1, int((due - now).total_seconds() + 0.999))


def spent(credits: Credits, cost: int, now: datetime) -> tuple[bool, Credits, list[str]]:
    """A spend of ``cost`` at ``now`` from ``credits`` as stored: whether it is allowed,
    the credits after it (a due refill applied either way) and the credit events it
    sends. A refusal spends nothing; a cost of 0 checks without spending (and is
    refused only by a key with no credits left)."""
    current = settled(credits, now)
    if current.remaining < cost or (cost == 0 and current.remaining == 0):
        if current.flags & EXHAUSTED_SENT or current.remaining > 0:
            return False, current, []
        return False, replace(current, flags=current.flags | EXHAUSTED_SENT), [CREDITS_EXHAUSTED]
    remaining, base, flags = current.remaining - cost, current.base, current.flags
    events = []
    if not flags & LOW_SENT and remaining <= base * LOW_SHARE:
        flags |= LOW_SENT
        events.append(CREDITS_LOW)
    if remaining == 0 and not flags & EXHAUSTED_SENT:
        flags |= EXHAUSTED_SENT
        events.append(CREDITS_EXHAUSTED)
    # Made whole, not by dataclasses.replace (which inspects the fields each call): a
    # spend runs on every verify of a key or identity with credits.
    after = Credits(
        remaining, current.refill, current.next_refill_at, base, flags, current.revision
    )
    return True, after, events


def past_the_maximum(remaining: int, increment: int) -> str:
    """Why an increment of ``remaining`` by ``increment`` is refused."""
    return (
        f"increment: {increment} would take remaining from {remaining} past the maximum,"
        f" {MAX_CREDITS}; nothing was changed (increment by at most {MAX_CREDITS - remaining})"
    )


def changed(credits: Credits | None, change: dict[str, Any], now: datetime) -> Credits | None:
    """The credits after a validated ``POST .../credits`` body: ``set`` (null: unlimited;
    a number keeps the refill), ``increment`` or ``decrement`` (never below 0; on
    unlimited credits, a 409 is raised by the caller). An increment that would pass
    ``MAX_CREDITS`` is refused whole (409, ``past_the_maximum``), never capped: a
    client that counts what it added must not be told 200 for less. A set or an
    increase ends an exhaustion, so ``key.credits_exhausted`` may be sent again;
    ``key.credits_low`` measures from the new amount."""
    if "set" in change:
        if change["set"] is None:
            return None
        refill = None if credits is None else credits.refill
        return new_credits(change["set"], refill, now)
    assert credits is not None
    current = settled(credits, now)
    if "increment" in change:
        remaining = current.remaining + change["increment"]
        if remaining > MAX_CREDITS:
            raise Conflict(past_the_maximum(current.remaining, change["increment"]))
        base = max(current.base, remaining)
        flags = 0 if remaining > base * LOW_SHARE else current.flags & LOW_SENT
        return replace(
            current, remaining=remaining, base=base, flags=flags, revision=new_revision()
        )
    remaining = max(0, current.remaining - change["decrement"])
    return replace(current, remaining=remaining, revision=new_revision())


def credits_of(value: Mapping[str, Any] | None, now: datetime) -> Credits | None:
    """Credits from a validated ``credits`` object (a key's or an identity's), as set at
    ``now``; None: unlimited."""
    if value is None:
        return None
    plan = value.get("refill")
    refill = (
        None if plan is None else Refill(plan["interval"], plan["amount"], plan.get("refillDay", 1))
    )
    return new_credits(value["remaining"], refill, now)
