"""Which named rate limits (``keysvc.domain.namedlimits``) a verify checks, and at what
cost; the counting itself is ``keysvc.domain.ratelimit.Limits.named``'s.

The rules:
- a key's ``autoApply`` limits are checked on every verify of it, at cost 1;
- the others only when the verify names them: ``X-Ratelimit: tokens;cost=512``
  (repeatable, or comma-separated) or ``?ratelimit=tokens:512`` (repeatable); the cost
  defaults to 1, and 0 checks without counting. A named autoApply limit is counted at
  the cost named, but at least 1 when named in the header: a client whose headers a
  proxy forwards could otherwise send ``X-Ratelimit: requests;cost=0`` and never be
  counted by a limit that applies to every verify;
- a proxy that names limits in the query decides alone: the header is then not read,
  so a client whose headers the proxy forwards cannot lower a cost or drop a limit;
- a name that neither the key nor its identity has a limit of is a 400, so that a typo
  in a proxy's config is seen at once rather than counting nothing;
- a key's limit is counted under the key, an identity's under the identity (one count
  for all its keys); of a name both have, the key's (``namedlimits.effective``).
"""

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from keysvc.domain import namedlimits
from keysvc.domain.namedlimits import MAX_NAMED_LIMITS, NAME_PATTERN, NamedLimit
from keysvc.domain.ratelimit import Ask
from keysvc.errors import BadRequest

MAX_COST = 1_000_000
# The longest X-Ratelimit accepted, all of its lines together: 16 names of 64 and
# their costs fit.
MAX_HEADER = 2048
HEADER = "X-Ratelimit"
PARAM = "ratelimit"
_COST_DIGITS = len(str(MAX_COST))


@functools.lru_cache(maxsize=4096)
def limits_of(stored: str | None) -> tuple[NamedLimit, ...]:
    """The limits in their stored form (``models.Key.ratelimits``), parsed once per text."""
    return namedlimits.loads(stored)


def _cost(text: str, where: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= _COST_DIGITS):
        raise BadRequest(f"ratelimit: {where}: the cost must be an integer from 0 to {MAX_COST}")
    cost = int(text)
    if cost > MAX_COST:
        raise BadRequest(f"ratelimit: {where}: the cost must be an integer from 0 to {MAX_COST}")
    return cost


def _name(text: str, where: str) -> str:
    if not NAME_PATTERN.fullmatch(text):
        raise BadRequest(f"ratelimit: {where}: a name must be 1 to 64 of a-z, 0-9, _, . and -")
    return text


def _header_item(item: str, where: str) -> tuple[str, int]:
    """``name`` or ``name;cost=N``."""
    name, semicolon, rest = item.partition(";")
    cost = 1
    if semicolon:
        key, equals, value = rest.partition("=")
        if key.strip() != "cost" or not equals:
            raise BadRequest(f"ratelimit: {where}: expected name or name;cost=N")
        cost = _cost(value.strip(), where)
    return _name(name.strip(), where), cost


def _param_item(item: str, where: str) -> tuple[str, int]:
    """``name`` or ``name:N``."""
    name, colon, cost = item.partition(":")
    return _name(name, where), _cost(cost, where) if colon else 1


def asked(headers: Sequence[str], params: Sequence[str]) -> dict[str, int]:
    """The limits a verify names, each with its cost: from the query's ``ratelimit``
    parameters when there are any, else from the X-Ratelimit header lines. Malformed, too
    long, over MAX_NAMED_LIMITS or a name twice: a 400 that says where."""
    if params:
        items = [(f"?{PARAM}= #{n}", item, _param_item) for n, item in enumerate(params, 1)]
    else:
        if sum(len(line) for line in headers) > MAX_HEADER:
            raise BadRequest(f"ratelimit: {HEADER} is longer than {MAX_HEADER} characters")
        parts = [part for line in headers for part in line.split(",")]
        items = [(f"{HEADER} item {n}", part, _header_item) for n, part in enumerate(parts, 1)]
    if len(items) > MAX_NAMED_LIMITS:
        raise BadRequest(f"ratelimit: at most {MAX_NAMED_LIMITS} limits may be named")
    named: dict[str, int] = {}
    for where, item, parse in items:
        name, cost = parse(item, where)
        if name in named:
            raise BadRequest(f"ratelimit: {where}: {name} is named twice")
        named[name] = cost
    return named


def asks(
    key_id: str,
    key_limits: str | None,
    identity_id: str | None,
    identity_limits: str | None,
    named: Mapping[str, int],
    header: bool = False,
    organization: str = "",
) -> "Asked":
    """What a verify checks, each with its limit's name: every autoApply limit, and each
    named one at its cost (an autoApply one at least 1 when ``header``: named in
    X-Ratelimit). ``key_limits``, ``identity_limits``: the stored forms
    (``models.Key.ratelimits``); ``identity_id``: the key's identity, None for a key
    without one; ``organization``: theirs. Without names, the same for every verify of
    the key: made once, and found again by the stored texts, so that a limit changed
    (a new text) is never answered from what the old one made."""
    if not named:
        return auto_applied(key_id, key_limits, identity_id, identity_limits, organization)
    least = 1 if header else 0
    return _asks(
        key_id, limits_of(key_limits), identity_id, limits_of(identity_limits), named, least,
        organization,
    )  # fmt: skip


@functools.lru_cache(maxsize=65536)
def auto_applied(
    key_id: str,
    key_limits: str | None,
    identity_id: str | None,
    identity_limits: str | None,
    organization: str,
) -> "Asked":
    """``asks`` of a verify that names no limit: the autoApply limits alone."""
    # Keyed by strings, whose hashes Python keeps: a lookup hashes no limit again.
    own, shared = limits_of(key_limits), limits_of(identity_limits)
    return _asks(key_id, own, identity_id, shared, {}, 0, organization)


@dataclass(frozen=True)
class Asked:
    """What a verify checks: the limits' names, and their asks in the same order."""

    names: tuple[str, ...]
    asks: tuple[Ask, ...]


def _asks(
    key_id: str,
    key_limits: Sequence[NamedLimit],
    identity_id: str | None,
    identity_limits: Sequence[NamedLimit],
    named: Mapping[str, int],
    least_auto: int = 0,
    organization: str = "",
) -> Asked:
    names: list[str] = []
    checked: list[Ask] = []
    left = dict(named)
    for owner, limit in namedlimits.effective(key_limits, identity_limits):
        cost = left.pop(limit.name, 1 if limit.auto_apply else None)
        if cost is None:
            continue
        if limit.auto_apply:
            cost = max(cost, least_auto)
        counter = f"k:{key_id}" if owner == "key" else f"i:{identity_id}"
        ask = Ask(
            f"r:{counter}:{limit.name}", limit.limit, limit.window_seconds, cost, organization
        )
        names.append(limit.name)
        checked.append(ask)
    if left:
        unknown = next(iter(left))
        raise BadRequest(f"ratelimit: this key has no rate limit named {unknown}")
    return Asked(tuple(names), tuple(checked))
