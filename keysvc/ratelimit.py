"""Request limits per key, and failed-authentication limits per client address.

Windows are fixed and aligned to the clock: a window of W seconds starts at a
multiple of W since the epoch, and its count starts again at zero. Counting is
in this process's memory. With ``--workers N`` each process counts on its own,
so a key can be served up to N times its limit in one window; run one worker where
the limit must be exact. A key whose window length changes starts counting
again. The table is bounded: windows that have ended are dropped first, then
the oldest entries.
"""

import math
from collections.abc import Hashable
from dataclasses import dataclass

FAILURE_WINDOW = 60


@dataclass(frozen=True)
class Decision:
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


class WindowCounter:
    def __init__(self, max_entries: int = 100_000):
        self._max = max_entries
        self._counts: dict[Hashable, tuple[float, float, int]] = {}  # name -> (start, end, count)

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

    def hit(self, name: Hashable, limit: int, window: int, now: float) -> Decision:
        """Count one request; allowed while the window's count stays within ``limit``."""
        start, end, count = self._current(name, window, now)
        count += 1
        self._counts[name] = (start, end, count)
        if len(self._counts) > self._max:
            self._prune(now)
        return self._decide(limit, end, count, now, count <= limit)

    def allows(self, name: Hashable, limit: int, window: int, now: float) -> bool:
        """``peek(...).allowed``, without making the Decision: the common case, and cheap.
        A name with no count at all (every address that has not failed) is allowed at
        once, without working out the window."""
        if name not in self._counts:
            return limit > 0
        return self._current(name, window, now)[2] < limit

    def peek(self, name: Hashable, limit: int, window: int, now: float) -> Decision:
        """Whether one more would be allowed, without counting it."""
        _, end, count = self._current(name, window, now)
        return self._decide(limit, end, count, now, count < limit)

    def _prune(self, now: float) -> None:
        for name in [n for n, (_, end, _) in self._counts.items() if end <= now]:
            del self._counts[name]
        while len(self._counts) > self._max:
            del self._counts[next(iter(self._counts))]

    def __len__(self) -> int:
        return len(self._counts)


class Limits:
    """The process's two counters: requests per key, failed logins per address."""

    def __init__(self, max_entries: int = 100_000):
        self.requests = WindowCounter(max_entries)
        self.failures = WindowCounter(max_entries)
