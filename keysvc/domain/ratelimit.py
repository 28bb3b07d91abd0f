"""Request limits per key, and failed-authentication limits per client network, in fixed
windows aligned to the clock (a window of W seconds starts at a multiple of W).

Requests per key are counted in this process's memory, in a bounded table (ended
windows dropped first, then the oldest counts of the organizations that hold the most,
so that one organization's churn of keys or limit names cannot reset another's); with
``--workers N`` a key may be served up to N times its limit. Failed authentications
are counted per network (the address cut to a prefix) in a ``FailureSketch``, a
count-min sketch in a shared mapping made before ``serve --workers`` forks, so every
worker counts into it; its counts can only be too high. On PostgreSQL both are also
shared with the other instances (``Limits.shared``, ``keysvc.domain.sharedlimits``).
The bounds: docs/SECURITY.md, "Guessing and brute force".
"""

import asyncio
import hashlib
import math
import mmap
import multiprocessing
import os
import struct
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from keysvc.config import Settings
from keysvc.domain.addresses import IPAddress

FAILURE_WINDOW = 60
# The sketch: _ROWS rows of 2**16 32-bit counters (one 16-bit index per row from
# one keyed hash), behind a header of the window's start and the failures counted in it.
_ROWS = 4
_COLUMNS = 1 << 16
_HEADER = struct.Struct("<qQ")
_CELL = struct.Struct("<I")
_INDEXES = struct.Struct(f"<{_ROWS}H")
_CELLS_BYTES = _ROWS * _COLUMNS * _CELL.size
_ZEROS = bytes(_CELLS_BYTES)


class Decision(NamedTuple):
    """One request's standing against one limit. A named tuple: made on every counted
    request, where a frozen dataclass sets each field through ``object.__setattr__``."""

    allowed: bool
    limit: int
    remaining: int
    reset: int  # whole seconds until the window ends, at least 1

    @property
    def headers(self) -> dict[str, str]:
        return {
            "X-RateLimit-Limit": str(self.limit),
            "X-RateLimit-Remaining": str(self.remaining),
            "X-RateLimit-Reset": str(self.reset),
        }


@dataclass(frozen=True)
class Ask:
    """One limit a request is checked against (a named limit, issue 36): counted under
    ``name`` (who owns the limit, and its name), ``cost`` units of ``limit`` per window
    of ``window`` seconds, for the organization ``owner``. Cost 0 checks without counting."""

    name: str
    limit: int
    window: int
    cost: int
    owner: str = ""

    def fits(self, count: int) -> bool:
        """Whether this ask fits beside ``count`` already counted in its window: its
        cost, and at least one unit (a check of cost 0 passes only while room is left)."""
        return count + max(self.cost, 1) <= self.limit


class WindowCounter:
    def __init__(self, max_entries: int = 100_000):
        self._max = max_entries
        self._counts: dict[Hashable, tuple[float, float, int]] = {}  # name -> (start, end, count)
        self._owners: dict[Hashable, str] = {}  # name -> the organization it counts for

    def _keep(self, name: Hashable, owner: str, value: tuple[float, float, int]) -> None:
        if name not in self._counts:
            self._owners[name] = owner
        self._counts[name] = value

    def _current(self, name: Hashable, window: int, now: float) -> tuple[float, float, int]:
        start = math.floor(now / window) * window
        end = start + window
        known = self._counts.get(name)
        # The same window only if it also ends the same: a key whose window length was
        # changed starts counting again, in a window that ends when the new one does.
        if known is not None and known[0] == start and known[1] == end:
            return known
        return start, end, 0

    def _decide(self, limit: int, end: float, count: int, now: float, allowed: bool) -> Decision:
        reset = max(1, math.ceil(end - now))
        return Decision(allowed, limit, max(0, limit - count), reset)

    def hit(self, name: Hashable, limit: int, window: int, now: float, owner: str = "") -> Decision:
        """Count one request (of organization ``owner``); allowed while the window's count
        stays within ``limit``."""
        start, end, count = self._current(name, window, now)
        count += 1
        self._keep(name, owner, (start, end, count))
        if len(self._counts) > self._max:
            self._prune(now)
        return self._decide(limit, end, count, now, count <= limit)

    def take(self, asks: Sequence[Ask], now: float) -> list[Decision]:
        """Each ask's decision, counted only if all of them fit: checked first, then
        counted, with nothing awaited between, so a refused request counts against none."""
        if len(asks) == 1:  # most verifies: one limit, and no lists
            ask = asks[0]
            start, end, count = self._current(ask.name, ask.window, now)
            fit = ask.fits(count)
            if fit and ask.cost:
                count += ask.cost
                self._keep(ask.name, ask.owner, (start, end, count))
                if len(self._counts) > self._max:
                    self._prune(now)
            return [self._decide(ask.limit, end, count, now, fit)]
        current = [self._current(ask.name, ask.window, now) for ask in asks]
        fits = [ask.fits(count) for ask, (_, _, count) in zip(asks, current, strict=True)]
        every = all(fits)
        decisions = []
        for ask, (start, end, count), fit in zip(asks, current, fits, strict=True):
            if every and ask.cost:
                count += ask.cost
                self._keep(ask.name, ask.owner, (start, end, count))
            decisions.append(self._decide(ask.limit, end, count, now, fit))
        if len(self._counts) > self._max:
            self._prune(now)
        return decisions

    def count(self, asks: Sequence[Ask], now: float) -> bool:
        """``take`` for an answer that shows no decision (most verifies): count ``asks``
        only if all fit, and say whether they did, making no Decision. A refusal's
        decisions are ``take``'s, asked with nothing awaited between: it counts nothing
        either, and refuses alike."""
        if len(asks) != 1:
            return all(decision.allowed for decision in self.take(asks, now))
        ask = asks[0]
        name, window, cost = ask.name, ask.window, ask.cost
        start = math.floor(now / window) * window
        end = start + window
        counts = self._counts
        known = counts.get(name)
        count = known[2] if known is not None and known[0] == start and known[1] == end else 0
        if count + (cost or 1) > ask.limit:
            return False
        if cost:
            if known is None:
                self._owners[name] = ask.owner
            counts[name] = (start, end, count + cost)
            if len(counts) > self._max:
                self._prune(now)
        return True

    def _prune(self, now: float) -> None:
        """Down to nine tenths of the bound (so that a full table is not scanned on each
        new name): ended windows first, then the oldest counts of the organizations that
        hold more than a fair share (``_fair_share``): an organization that makes names
        without end (limits renamed, keys made and deleted) drops its own counts, not
        another's."""
        for name in [n for n, (_, end, _) in self._counts.items() if end <= now]:
            del self._counts[name]
            del self._owners[name]
        target = self._max * 9 // 10
        if len(self._counts) <= target:
            return
        held = Counter(self._owners.values())
        share = _fair_share(sorted(held.values()), target)
        over = {owner: count - share for owner, count in held.items() if count > share}
        for name in list(self._counts):  # oldest first
            owner = self._owners[name]
            if over.get(owner, 0) > 0:
                over[owner] -= 1
                del self._counts[name]
                del self._owners[name]

    def __len__(self) -> int:
        return len(self._counts)


def _fair_share(held: Sequence[int], target: int) -> int:
    """The most counts each organization keeps so that all keep at most ``target``: those
    holding less keep all of theirs, the others the same share of the rest. ``held``:
    each organization's counts, in ascending order."""
    for index, count in enumerate(held):
        left = len(held) - index
        if count * left > target:
            return target // left
        target -= count
    return held[-1] if held else 0


class FailureSketch:
    """Failed authentications per client network in the current window, shared by
    the processes forked after it was made.

    A failure is counted under a lock, in one cell of each row, chosen by a hash
    keyed with a secret of this table (so a caller cannot aim its failures at
    another network's cells); a network's count is the least of its cells. Reads
    take no lock: a read racing a count sees it or not, as if it came a moment
    earlier or later. A first failure in a new window clears the table.
    """

    def __init__(self, v4_prefix: int = 32, v6_prefix: int = 64):
        self._v4_shift = 32 - v4_prefix
        self._v6_shift = 128 - v6_prefix
        # Anonymous and MAP_SHARED (mmap's default): forked children write the same pages.
        self._table = mmap.mmap(-1, _HEADER.size + _CELLS_BYTES)
        # Shared through os.fork (keysvc.ops.workers), whatever the default start method.
        self._lock = multiprocessing.get_context("fork").Lock()
        self._secret = os.urandom(16)

    @classmethod
    def of(cls, settings: Settings) -> "FailureSketch":
        """An empty table with ``settings``' prefix lengths."""
        return cls(settings.throttle_prefix_v4, settings.throttle_prefix_v6)

    def network_key(self, address: IPAddress | None) -> bytes:
        """What ``address`` is counted as: its network, cut to this table's prefixes."""
        if address is None:
            return b""
        if address.version == 4:
            return b"4" + (int(address) >> self._v4_shift).to_bytes(4, "big")
        return b"6" + (int(address) >> self._v6_shift).to_bytes(16, "big")

    def _cells(self, address: IPAddress | None) -> list[int]:
        digest = hashlib.blake2b(
            self.network_key(address), key=self._secret, digest_size=_INDEXES.size
        ).digest()
        return [
            _HEADER.size + (row * _COLUMNS + column) * _CELL.size
            for row, column in enumerate(_INDEXES.unpack(digest))
        ]

    def count(self, address: IPAddress | None, now: float) -> int:
        """Failures counted for ``address``'s network in the window of ``now``, or more."""
        start, total = _HEADER.unpack_from(self._table)
        # A table already in a later window (another worker's clock ran ahead) is read
        # as it is: too high rather than too low.
        if total == 0 or start < _window_start(now):
            return 0
        counts: list[int] = [
            _CELL.unpack_from(self._table, cell)[0] for cell in self._cells(address)
        ]
        return min(counts)

    def allows(self, address: IPAddress | None, limit: int, now: float) -> bool:
        """Whether ``address`` is still under ``limit`` failures in this window. While
        the whole table has fewer than ``limit`` failures no network can be over it,
        and nothing is hashed: the common case, and cheap."""
        start, total = _HEADER.unpack_from(self._table)
        if total < limit or start < _window_start(now):
            return limit > 0
        return self.count(address, now) < limit

    def hit(self, address: IPAddress | None, now: float) -> None:
        """Count one failure from ``address``'s network."""
        cells = self._cells(address)
        window = _window_start(now)
        with self._lock:
            start, total = _HEADER.unpack_from(self._table)
            if start < window:
                if total:
                    self._table[_HEADER.size :] = _ZEROS
                start, total = window, 0
            for cell in cells:
                (count,) = _CELL.unpack_from(self._table, cell)
                _CELL.pack_into(self._table, cell, min(count + 1, 0xFFFFFFFF))
            _HEADER.pack_into(self._table, 0, start, total + 1)

    def retry_after(self, now: float) -> int:
        """Whole seconds until the window of ``now`` ends, at least 1."""
        return max(1, math.ceil(_window_start(now) + FAILURE_WINDOW - now))


def _window_start(now: float) -> int:
    return math.floor(now / FAILURE_WINDOW) * FAILURE_WINDOW


class Shared(Protocol):
    """Counts shared with other instances (``keysvc.domain.sharedlimits.SharedCounts``)."""

    async def hit(self, key_id: str, limit: int, window: int, now: float) -> Decision: ...

    async def allows_failures(self, network: bytes, limit: int, now: float) -> bool: ...

    def failed(self, network: bytes, now: float) -> None: ...

    async def take(self, asks: Sequence[Ask], now: float) -> list[Decision]: ...


class Limits:
    """The two counters: requests per key (this process's), failed logins per
    network (shared with the other workers when ``failures`` was made before the fork);
    with ``shared`` set, both are also counted with the other instances on the same
    database, and requests per key only there."""

    def __init__(self, failures: FailureSketch, max_entries: int = 100_000):
        self.requests = WindowCounter(max_entries)
        self.failures = failures
        self.shared: Shared | None = None
        # Credential checks under way in this process, per network, and what each
        # network's waiting checks wait on (begin_check).
        self._checking: dict[bytes, int] = {}
        self._settled: dict[bytes, asyncio.Event] = {}

    async def request(
        self, key_id: str, limit: int, window: int, now: float, owner: str = ""
    ) -> Decision:
        """Count one request of key ``key_id`` (of organization ``owner``) against
        ``limit`` per ``window`` seconds."""
        if self.shared is None:
            return self.requests.hit(key_id, limit, window, now, owner)
        return await self.shared.hit(key_id, limit, window, now)

    def named_here(self, asks: Sequence[Ask], now: float) -> list[Decision] | None:
        """``named``'s answer when nothing is shared (no await); None: ask it."""
        return self.requests.take(asks, now) if self.shared is None else None

    def counted_here(self, asks: Sequence[Ask], now: float) -> bool | None:
        """Whether ``asks`` all fit and were counted (``WindowCounter.count``), when
        nothing is shared (no await, no Decision); None: ask ``named``."""
        return self.requests.count(asks, now) if self.shared is None else None

    async def named(self, asks: Sequence[Ask], now: float) -> list[Decision]:
        """Check ``asks`` (a verify's named limits) and count them all only if all fit
        (``WindowCounter.take``; shared: ``SharedCounts.take``)."""
        if self.shared is None:
            return self.requests.take(asks, now)
        return await self.shared.take(asks, now)

    def failures_allow_here(self, address: IPAddress | None, limit: int, now: float) -> bool | None:
        """``failures_allow``'s answer when nothing is shared (no await); None: ask it."""
        if self.shared is not None:
            return None
        return self.failures.allows(address, limit, now)

    async def failures_allow(self, address: IPAddress | None, limit: int, now: float) -> bool:
        """Whether ``address``'s network is still under ``limit`` failed logins."""
        if not self.failures.allows(address, limit, now):
            return False
        if self.shared is None:
            return True
        return await self.shared.allows_failures(self.failures.network_key(address), limit, now)

    def failed(self, address: IPAddress | None, now: float) -> None:
        """Count one failed login from ``address``'s network."""
        self.failures.hit(address, now)
        if self.shared is not None:
            self.shared.failed(self.failures.network_key(address), now)

    async def begin_check(self, address: IPAddress | None, limit: int, now: float) -> bytes | None:
        """Room for one more credential check from ``address``'s network: None if the
        network is at ``limit`` failed logins; else, once the checks already under way
        from it, should they all fail, would leave room for this one (waiting for them
        to end as long as not), the network, to hand to ``end_check``.

        Counted only as they fail, checks sent all at once would each pass the limit
        before any had failed. Waiting rather than refusing keeps a burst of valid
        first logins from one network (a service starting many clients) from being
        refused. Each process counts its own checks under way, so with N workers up
        to N times the rest of the limit may be checked at once."""
        network = self.failures.network_key(address)
        while True:
            if not await self.failures_allow(address, limit, now):
                return None
            under_way = self._checking.get(network, 0)
            if not under_way or await self.failures_allow(address, limit - under_way, now):
                break
            settled = self._settled.get(network)
            if settled is None:
                settled = self._settled[network] = asyncio.Event()
            await settled.wait()
        self._checking[network] = self._checking.get(network, 0) + 1
        return network

    def end_check(self, network: bytes) -> None:
        """A check ``begin_check`` let through is over: the checks waiting look again."""
        left = self._checking[network] - 1
        if left:
            self._checking[network] = left
        else:
            del self._checking[network]
        settled = self._settled.pop(network, None)
        if settled is not None:
            settled.set()
