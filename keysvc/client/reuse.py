"""How long a verify answer may be kept, read from keysvc's own reuse headers
(``Cache-Control: private, max-age=N`` or ``no-store``, and nginx's ``X-Accel-Expires``:
``0`` or ``@<last unix second>``), and the bounded store the middlewares keep them in.

An answer is kept only when neither header forbids it, for ``max-age`` seconds counted
from when the request was sent (so never past keysvc's bound, however slow the answer);
only a 200 is kept (the caller's rule: a refusal is asked again), and an answer about a
key with credits or a request limit says ``no-store``, so each of its requests reaches
keysvc. Entries are keyed by a BLAKE2b digest of every input the answer depends on,
never by the raw Authorization header."""

import hashlib
import re
from collections import OrderedDict
from collections.abc import Mapping
from typing import Generic, TypeVar

V = TypeVar("V")
_MAX_AGE = re.compile(r"(?:^|[,\s])max-age=(\d+)")


def reuse_seconds(headers: Mapping[str, str], wall_now: float) -> float:
    """The seconds an answer with ``headers`` may be reused from when it was asked for;
    0: not at all (either header says so, or neither says anything). ``Cache-Control``
    is the bound for a cache with a precise clock, as this one is; ``X-Accel-Expires``
    (for nginx's whole-second clock: up to a second shorter) counts only without it."""
    control = headers.get("Cache-Control")
    accel = headers.get("X-Accel-Expires")
    if accel == "0" or (control is None and accel is None):
        return 0.0
    if control is not None:
        found = _MAX_AGE.search(control)
        if "no-store" in control or "no-cache" in control or found is None:
            return 0.0
        return float(found.group(1))
    if accel is not None and accel.startswith("@") and accel[1:].isdigit():
        return max(0.0, int(accel[1:]) + 1 - wall_now)  # served through that whole second
    if accel is not None and accel.isdigit():
        return float(accel)
    return 0.0


def digest(
    authorization: str, permission: str | None, organization: str | None, address: str | None
) -> bytes:
    """A 32-byte BLAKE2b digest of the four inputs a verify answer depends on, each
    length-prefixed (None, as ``-``, apart from ""), so that no two different inputs
    share a digest by moving text between parts. One text hashed in one call, as this
    runs on every request a kept answer serves (BLAKE2b, CPython's own, costs less than
    OpenSSL's SHA-256 for a header's length). A header's undecodable bytes (aiohttp
    keeps them as lone surrogates) are hashed too, each apart from any character."""
    text = f"{len(authorization)}:{authorization}{_part(permission)}{_part(organization)}"
    text += _part(address)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=32).digest()


def _part(value: str | None) -> str:
    return "-" if value is None else f"{len(value)}:{value}"


class ReuseStore(Generic[V]):
    """At most ``max_entries`` values, each until its deadline (on the monotonic clock),
    the least recently used dropped first."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, tuple[float, V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes, now: float) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= now:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, key: bytes, value: V, deadline: float) -> None:
        if self.max_entries <= 0:
            return
        self._entries[key] = (deadline, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
