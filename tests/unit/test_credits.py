"""Issue 29's credit rules (keysvc.domain.credits): refill moments (month ends, leap
years, the last instant before midnight), lazy refills, spends and their events, and
the credits endpoint's changes."""

from datetime import UTC, datetime, timedelta

from keysvc.domain import credits as rules
from keysvc.models import EXHAUSTED_SENT, LOW_SENT, Credits, Refill


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


DAILY = Refill("daily", 100)


def monthly(day: int, amount: int = 100) -> Refill:
    return Refill("monthly", amount, day)


def test_daily_refills_at_the_next_midnight() -> None:
    assert rules.next_refill_at(DAILY, at("2026-03-05T13:20:00")) == at("2026-03-06T00:00:00")
    # At midnight exactly, the next one is tomorrow's: strictly after.
    assert rules.next_refill_at(DAILY, at("2026-03-05T00:00:00")) == at("2026-03-06T00:00:00")
    last = at("2026-12-31T23:59:59.999999")
    assert rules.next_refill_at(DAILY, last) == at("2027-01-01T00:00:00")


def test_monthly_on_its_day_this_month_or_next() -> None:
    assert rules.next_refill_at(monthly(15), at("2026-03-05T10:00:00")) == at("2026-03-15T00:00:00")
    assert rules.next_refill_at(monthly(15), at("2026-03-15T00:00:00")) == at("2026-04-15T00:00:00")
    assert rules.next_refill_at(monthly(1), at("2026-12-20T00:00:00")) == at("2027-01-01T00:00:00")


def test_a_day_past_the_months_end_is_its_last_day() -> None:
    assert rules.next_refill_at(monthly(31), at("2026-04-02T00:00:00")) == at("2026-04-30T00:00:00")
    assert rules.next_refill_at(monthly(31), at("2026-04-30T00:00:00")) == at("2026-05-31T00:00:00")
    assert rules.next_refill_at(monthly(30), at("2026-01-31T00:00:00")) == at("2026-02-28T00:00:00")
    # Leap years: 29 February; not in 2100 (divisible by 100), yes in 2000 (by 400).
    assert rules.next_refill_at(monthly(31), at("2028-02-01T00:00:00")) == at("2028-02-29T00:00:00")
    assert rules.next_refill_at(monthly(29), at("2100-02-01T00:00:00")) == at("2100-02-28T00:00:00")
    assert rules.next_refill_at(monthly(30), at("2000-02-10T00:00:00")) == at("2000-02-29T00:00:00")
    # From the end of a short month, a 31st refill comes back in full next month.
    assert rules.next_refill_at(monthly(31), at("2026-02-28T00:00:00")) == at("2026-03-31T00:00:00")


def test_refill_day_in() -> None:
    assert rules.refill_day_in(2026, 2, 31) == at("2026-02-28T00:00:00")
    assert rules.refill_day_in(2024, 2, 31) == at("2024-02-29T00:00:00")
    assert rules.refill_day_in(2026, 6, 1) == at("2026-06-01T00:00:00")


def test_refills_are_lazy_and_apply_once() -> None:
    now = at("2026-03-05T10:00:00")
    made = rules.new_credits(3, DAILY, now)
    assert made == Credits(3, DAILY, at("2026-03-06T00:00:00"), base=3)
    assert rules.settled(made, at("2026-03-05T23:59:59")) is made
    later = rules.settled(made, at("2026-03-09T08:00:00"))  # days missed: one refill
    assert later == Credits(100, DAILY, at("2026-03-10T00:00:00"), 100, 0)
    assert rules.settled(later, at("2026-03-09T09:00:00")) is later
    unrefilled = Credits(5)
    assert rules.settled(unrefilled, at("2099-01-01T00:00:00")) is unrefilled


def test_a_spend_takes_the_cost_and_a_refusal_takes_nothing() -> None:
    now = at("2026-03-05T10:00:00")
    credits = Credits(10, base=10)
    allowed, after, events = rules.spent(credits, 4, now)
    assert (allowed, after.remaining, events) == (True, 6, [])
    allowed, after, events = rules.spent(Credits(3, base=10, flags=LOW_SENT), 4, now)
    assert (allowed, after.remaining, events) == (False, 3, [])  # not exhausted: 3 remain
    allowed, after, _ = rules.spent(Credits(4, base=10, flags=LOW_SENT), 0, now)
    assert (allowed, after.remaining) == (True, 4)  # a check spends nothing


def test_credits_low_once_then_exhausted_once() -> None:
    now = at("2026-03-05T10:00:00")
    credits = Credits(12, base=100)
    allowed, credits, events = rules.spent(credits, 1, now)
    assert events == []  # 11 > 10% of 100
    allowed, credits, events = rules.spent(credits, 1, now)
    assert events == [rules.CREDITS_LOW] and credits.flags == LOW_SENT
    allowed, credits, events = rules.spent(credits, 1, now)
    assert events == []
    allowed, credits, events = rules.spent(credits, 9, now)
    assert (allowed, credits.remaining, events) == (True, 0, [rules.CREDITS_EXHAUSTED])
    allowed, credits, events = rules.spent(credits, 1, now)
    assert (allowed, events) == (False, [])  # once per exhaustion
    assert credits.flags == LOW_SENT | EXHAUSTED_SENT


def test_a_refusal_of_an_empty_key_is_its_exhaustion() -> None:
    now = at("2026-03-05T10:00:00")
    allowed, after, events = rules.spent(Credits(0, base=5, flags=LOW_SENT), 1, now)
    assert (allowed, events, after.flags & EXHAUSTED_SENT) == (False, [rules.CREDITS_EXHAUSTED], 2)
    allowed, _, _ = rules.spent(Credits(0, base=5), 0, now)
    assert not allowed  # a check of an empty key is refused


def test_a_due_refill_comes_before_the_spend_and_ends_the_exhaustion() -> None:
    now = at("2026-03-05T10:00:00")
    empty = Credits(0, DAILY, now - timedelta(hours=1), 100, LOW_SENT | EXHAUSTED_SENT)
    allowed, after, events = rules.spent(empty, 30, now)
    assert (allowed, after.remaining, after.flags, events) == (True, 70, 0, [])
    assert after.next_refill_at == at("2026-03-06T00:00:00")


def test_changes_set_increment_decrement() -> None:
    now = at("2026-03-05T10:00:00")
    current = Credits(2, DAILY, at("2026-03-06T00:00:00"), 100, LOW_SENT | EXHAUSTED_SENT)
    assert rules.changed(current, {"set": None}, now) is None
    made = rules.changed(current, {"set": 50}, now)
    assert made == Credits(50, DAILY, at("2026-03-06T00:00:00"), 50, 0)
    assert rules.changed(None, {"set": 7}, now) == Credits(7, base=7)
    up = rules.changed(Credits(0, base=100, flags=LOW_SENT | EXHAUSTED_SENT), {"increment": 5}, now)
    assert up is not None and (up.remaining, up.flags) == (5, LOW_SENT)  # exhaustion over
    up = rules.changed(
        Credits(0, base=100, flags=LOW_SENT | EXHAUSTED_SENT), {"increment": 500}, now
    )
    assert up is not None and (up.remaining, up.base, up.flags) == (500, 500, 0)
    down = rules.changed(Credits(3, base=10), {"decrement": 5}, now)
    assert down is not None and down.remaining == 0
