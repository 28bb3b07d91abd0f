"""Request limits and the failed-login throttle shared by the instances serving one
PostgreSQL database (``--shared-limits``, on by default there): ``SharedCounts``.
Each process counts in its memory within a local budget (``budget_of``) and adds its
counts to the ``shared_limits`` table (``keysvc.db.postgres.sharedcounts``) in one
statement, which reads back the totals; no statement runs on a request's path but a
wait for one under way. Failed logins count under a keyed hash of the network. The
bound this gives, and what happens while the database does not answer:
docs/SECURITY.md, "Limits shared by several instances".
"""

import asyncio
import contextlib
import functools
import hashlib
import hmac
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from keysvc.domain.ratelimit import FAILURE_WINDOW, Ask, Decision

logger = logging.getLogger("keysvc")

FLUSH_SECONDS = 1.0
STATEMENT_TIMEOUT = 2.0
PRUNE_SECONDS = 60.0
# A process may hold this share of a limit's counts (1/BUDGET_SHARE) not yet in the table.
BUDGET_SHARE = 10
# Names a process follows at once. Past it a network not followed yet is left to the
# process's FailureSketch, which is bounded: failures from ever new networks must not
# grow this table, nor the statement that sends it.
MAX_NAMES = 100_000
# Network names (keyed hashes) remembered, to hash each network once while it is active.
NAMES_REMEMBERED = 4096
# What the network key is derived from the pepper for (Hasher.derive).
NETWORK_PURPOSE = "shared failed-login networks"


def budget_of(limit: int) -> int:
    """The counts of one name a process may hold that the table has not had."""
    return max(1, math.ceil(limit / BUDGET_SHARE))


@runtime_checkable
class CountStore(Protocol):
    """What the shared counts are written through: PostgreSQL's store (PgStore)."""

    async def add_shared_counts(
        self, rows: list[tuple[str, int, float, int]]
    ) -> dict[tuple[str, int], int]: ...

    async def prune_shared_counts(self, now: float) -> None: ...

    async def blocked_networks(self, start: int, limit: int, most: int) -> dict[str, int]: ...


@dataclass
class _Count:
    """One name's window: the table's total as last read, and this process's counts
    not in it yet (``sending``: in the statement under way)."""

    expires_at: float
    shared: int = 0
    sending: int = 0
    pending: int = 0

    @property
    def unsent(self) -> int:
        return self.sending + self.pending

    @property
    def total(self) -> int:
        return self.shared + self.sending + self.pending


class SharedCounts:
    """This process's side of the shared counts (see the module)."""

    def __init__(
        self,
        store: CountStore,
        network_key: bytes,
        failure_limit: int,
        max_names: int = MAX_NAMES,
        clock: Callable[[], float] = time.time,
    ):
        """``clock``: the seconds of the app's clock, the windows' (Limits take theirs
        from it)."""
        self._store = store
        self._clock = clock
        self._max_names = max_names
        self._network_key = network_key
        self._failure_limit = failure_limit
        self._failure_budget = budget_of(failure_limit)
        self._counts: dict[tuple[str, int], _Count] = {}
        # Every credential check names its network (a keyed hash): remembered for the
        # networks seen most lately, so that a request does not hash again.
        self._names = functools.lru_cache(maxsize=NAMES_REMEMBERED)(self._network_name)
        self._wake = asyncio.Event()
        # Set, and replaced, as each flush ends: what a request over its budget waits on.
        self._flushed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # True while the database does not answer: each process counts on its own.
        self.local = False
        # Statements that added counts, and those of them that failed.
        self.flushes = 0
        self.failed_flushes = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="keysvc-shared-limits")

    async def close(self) -> None:
        """Stop, after one last flush: a stopping instance's counts still count."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait((self._task,), timeout=STATEMENT_TIMEOUT)
        await self._flush()
        # Nothing waits for a flush that will not come.
        self.local = True
        self._flushed.set()

    async def hit(self, key_id: str, limit: int, window: int, now: float) -> Decision:
        """Count one request of key ``key_id``; allowed while the window's count, as far
        as this process knows it, stays within ``limit``."""
        name = f"k:{key_id}:{window}"
        budget = budget_of(limit)
        count = await self._room(name, limit, window, now, budget)
        if count is None:
            count = self._count(name, window, now)
            return Decision(False, limit, 0, _reset(count, now))
        self._add(count, budget)
        return Decision(True, limit, max(0, limit - count.total), _reset(count, now))

    async def take(self, asks: Sequence[Ask], now: float) -> list[Decision]:
        """A verify's named limits (``Limits.named``): refused as soon as one does not fit
        the totals this process knows; else, once each has budget for its cost (waiting
        for a flush while one has not: a cost above a budget passes only with nothing of
        its name unsent), checked again and counted, all of them or none, with nothing
        awaited between the check and the count."""
        while True:
            counts = [self._count(f"{ask.name}:{ask.window}", ask.window, now) for ask in asks]
            fits = [ask.fits(count.total) for ask, count in zip(asks, counts, strict=True)]
            every = all(fits)
            if (
                not every
                or self.local
                or all(
                    not count.unsent or count.unsent + ask.cost <= budget_of(ask.limit)
                    for ask, count in zip(asks, counts, strict=True)
                )
            ):
                break
            flushed = self._flushed
            self._wake.set()
            await flushed.wait()
        decisions = []
        for ask, count, fit in zip(asks, counts, fits, strict=True):
            if every and ask.cost:
                self._add(count, budget_of(ask.limit), ask.cost)
            remaining = max(0, ask.limit - count.total)
            decisions.append(Decision(fit, ask.limit, remaining, _reset(count, now)))
        return decisions

    async def allows_failures(self, network: bytes, limit: int, now: float) -> bool:
        """Whether ``network`` (``FailureSketch.network_key``) is under ``limit`` failed
        logins in this window, counted by every instance."""
        name = self._names(network)
        if (name, _start(now, FAILURE_WINDOW)) not in self._counts:
            # No failure from it here, and no instance had it blocked at the last read.
            return True
        return await self._room(name, limit, FAILURE_WINDOW, now, self._failure_budget) is not None

    def failed(self, network: bytes, now: float) -> None:
        """Count one failed login from ``network``."""
        name = self._names(network)
        if not self._full(name, FAILURE_WINDOW, now):
            self._add(self._count(name, FAILURE_WINDOW, now), self._failure_budget)

    def __len__(self) -> int:
        """Names followed in their current window."""
        return len(self._counts)

    def _full(self, name: str, window: int, now: float) -> bool:
        """Whether ``name`` is not followed and no more can be."""
        full = len(self._counts) >= self._max_names
        return full and (name, _start(now, window)) not in self._counts

    def _network_name(self, network: bytes) -> str:
        digest = hmac.new(self._network_key, network, hashlib.sha256).hexdigest()
        return "n:" + digest[:32]

    def _count(self, name: str, window: int, now: float) -> _Count:
        start = _start(now, window)
        count = self._counts.get((name, start))
        if count is None:
            count = self._counts[(name, start)] = _Count(float(start + window))
        return count

    async def _room(
        self, name: str, limit: int, window: int, now: float, budget: int
    ) -> _Count | None:
        """The count of ``name``'s window if it has room for one more, else None; while
        this process's counts not in the table fill ``budget``, waits for a flush."""
        while True:
            count = self._count(name, window, now)
            if count.total >= limit:
                return None
            if self.local or count.unsent < budget:
                return count
            flushed = self._flushed
            self._wake.set()
            await flushed.wait()

    def _add(self, count: _Count, budget: int, cost: int = 1) -> None:
        count.pending += cost
        # Sent before the budget is used up, so that a request rarely waits for it.
        if count.unsent * 2 >= budget:
            self._wake.set()

    async def _run(self) -> None:
        pruned_at = read_at = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FLUSH_SECONDS):
                    await self._wake.wait()
            self._wake.clear()
            await self._flush()
            if time.monotonic() - read_at >= FLUSH_SECONDS:
                read_at = time.monotonic()
                await self._read_blocked()
            if time.monotonic() - pruned_at >= PRUNE_SECONDS:
                pruned_at = time.monotonic()
                await self._prune()

    async def _flush(self) -> None:
        """Add the counts not in the table yet, in one statement, and read back their
        totals; then wake whoever waits for room."""
        now = self._clock()
        for slot in [s for s, c in self._counts.items() if c.expires_at <= now and not c.sending]:
            del self._counts[slot]
        # In one order in every process: the statement locks its rows in this order, and
        # two processes locking the same rows in different orders could deadlock.
        batch = sorted(
            ((slot, count) for slot, count in self._counts.items() if count.pending),
            key=lambda item: item[0],
        )
        flushed, self._flushed = self._flushed, asyncio.Event()
        try:
            if batch:
                await self._send(batch)
        finally:
            flushed.set()

    async def _send(self, batch: list[tuple[tuple[str, int], _Count]]) -> None:
        rows = []
        for (name, start), count in batch:
            count.sending, count.pending = count.pending, 0
            rows.append((name, start, count.expires_at, count.sending))
        self.flushes += 1
        try:
            async with asyncio.timeout(STATEMENT_TIMEOUT):
                totals = await self._store.add_shared_counts(rows)
        except BaseException as exc:
            # Kept to be added again, cancelled (a stop) or failed.
            for _, count in batch:
                count.pending += count.sending
                count.sending = 0
            if not isinstance(exc, Exception):
                raise
            self.failed_flushes += 1
            if not self.local:
                self.local = True
                logger.warning(
                    "shared limits: PostgreSQL does not answer (%s); each process counts"
                    " on its own until it does",
                    type(exc).__name__,
                )
            return
        for slot, count in batch:
            count.shared = max(count.shared, totals.get(slot, 0))
            count.sending = 0
        if self.local:
            self.local = False
            logger.warning("shared limits: PostgreSQL answers again; counting shared")

    async def _read_blocked(self) -> None:
        """Learn the networks other instances blocked, so that this one refuses them
        too, valid credentials included, though none failed here."""
        now = self._clock()
        start = _start(now, FAILURE_WINDOW)
        try:
            async with asyncio.timeout(STATEMENT_TIMEOUT):
                blocked = await self._store.blocked_networks(
                    start, self._failure_limit, self._max_names
                )
        except Exception as exc:
            # A failed flush logs the outage; read again next time.
            logger.debug("shared limits: reading blocked networks failed: %s", type(exc).__name__)
            return
        for name, total in blocked.items():
            if not self._full(name, FAILURE_WINDOW, now):
                count = self._count(name, FAILURE_WINDOW, now)
                count.shared = max(count.shared, total)

    async def _prune(self) -> None:
        try:
            async with asyncio.timeout(STATEMENT_TIMEOUT):
                await self._store.prune_shared_counts(self._clock())
        except Exception as exc:
            # A failed flush logs the outage; ended windows are pruned next time.
            logger.debug("shared limits: pruning failed: %s", type(exc).__name__)


def _start(now: float, window: int) -> int:
    return math.floor(now / window) * window


def _reset(count: _Count, now: float) -> int:
    return max(1, math.ceil(count.expires_at - now))
