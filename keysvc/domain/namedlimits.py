"""Named rate limits (issue 36) on keys and on identities: ``[{"name": "tokens",
"limit": 100000, "windowSeconds": 60, "autoApply": false}, ...]``, at most
``MAX_NAMED_LIMITS`` on one owner, names unique on it.

An ``autoApply`` limit is counted on every verify of the key; the others only when the
verify names them (``X-Ratelimit: tokens;cost=512`` or ``?ratelimit=tokens:512``). A
key's limit and its identity's limit of the same name: the key's counts. An identity's
limit is one count for all of its keys. This module holds the shape both owners share
and the rules on it; the counting is ``keysvc.domain.ratelimit``'s.
"""

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

MAX_NAMED_LIMITS = 16
NAME_PATTERN = re.compile(r"[a-z0-9_.-]{1,64}")
MAX_LIMIT = 1_000_000_000
MAX_WINDOW_SECONDS = 86_400 * 31


@dataclass(frozen=True)
class NamedLimit:
    """One named limit: at most ``limit`` units (requests, or the cost a verify names) in
    each window of ``window_seconds``, aligned to the clock as the key's ``rateLimit``."""

    name: str
    limit: int
    window_seconds: int
    auto_apply: bool = False


def to_wire(limits: Sequence[NamedLimit]) -> list[dict[str, Any]]:
    """The limits as the API shows them, in their stored order."""
    return [
        {
            "name": limit.name,
            "limit": limit.limit,
            "windowSeconds": limit.window_seconds,
            "autoApply": limit.auto_apply,
        }
        for limit in limits
    ]


def from_wire(entries: Iterable[dict[str, Any]]) -> tuple[NamedLimit, ...]:
    """Limits from loaded (already validated) wire entries."""
    return tuple(
        NamedLimit(
            entry["name"],
            entry["limit"],
            entry["windowSeconds"],
            bool(entry.get("autoApply", False)),
        )
        for entry in entries
    )


def dumps(limits: Sequence[NamedLimit]) -> str:
    """The stored form: a JSON array of wire entries (a TEXT column on both backends)."""
    return json.dumps(to_wire(limits), separators=(",", ":"))


def loads(text: str | None) -> tuple[NamedLimit, ...]:
    """The limits from their stored form; NULL or empty is none."""
    return from_wire(json.loads(text)) if text else ()


def effective(
    key_limits: Sequence[NamedLimit], identity_limits: Sequence[NamedLimit]
) -> tuple[tuple[str, NamedLimit], ...]:
    """The limits a key's verify may check, each with its owner (``"key"`` or
    ``"identity"``): the key's, then the identity's whose name the key has none of."""
    own = {limit.name for limit in key_limits}
    return tuple(("key", limit) for limit in key_limits) + tuple(
        ("identity", limit) for limit in identity_limits if limit.name not in own
    )
