"""Schemathesis hooks for tests/system/test_schemathesis.py, loaded by the schemathesis CLI.

Some of keysvc's rules cannot be written in JSON Schema: an expireAt in the
future, a source that is an IP network with its host bits clear, role and key
IDs that exist in the organization, a cursor keysvc issued for that list, the
permissions of a role and of its policies counted together, a usage query's
``from`` not after its ``to`` and its buckets within the most allowed, an
activity list's from_date no later than its to_date. The document
states them in prose, so schemathesis sends requests that are valid by the
schema and break one of them (mostly in its coverage phase, which does not use
the seeded values), and keysvc rightly answers 400. ``filter_failure`` drops
such a "schema-valid request rejected" failure only if every reason in the 400
is one of those rules and the request really breaks it; any other reason, or
a reason the request does not bear out, stays a failure.

It also drops one "schema-violating request accepted" failure: an empty
expireAt, which the upstream contract (and so keysvc) takes to mean "never"
although its schema says ``format: date-time``.

The test passes the values it seeded the run with in KEYSVC_SCHEMATHESIS (JSON).
"""

import ipaddress
import json
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import schemathesis

SEEDED: dict[str, list[str]] = json.loads(os.environ.get("KEYSVC_SCHEMATHESIS", "{}"))
# `st explain` codes: a schema-valid request rejected, a schema-violating one accepted.
REJECTED_VALID, ACCEPTED_INVALID = "ST202", "ST201"
EMPTY_EXPIRY = "Invalid component: in body - expireAt: Value not matching the 'date-time' format"
# keysvc lists at most ten reasons, then says how many it left out.
LEFT_OUT = re.compile(r"; and (?P<count>[0-9]+) more$")


def _body(case: Any) -> dict[str, Any]:
    return case.body if isinstance(case.body, dict) else {}


def _network(source: object, *, strict: bool) -> bool:
    try:
        ipaddress.ip_network(source, strict=strict)
    except (TypeError, ValueError):
        return False
    return "%" not in str(source)


def _in_past(value: object) -> bool:
    try:
        moment = datetime.fromisoformat(value).astimezone(UTC)
    except (TypeError, ValueError, OverflowError):
        return False
    return moment <= datetime.now(UTC)


def _source(case: Any, match: re.Match[str]) -> object:
    entries = _body(case).get("ipAccessList") or []
    index = int(match["index"])
    return entries[index].get("source") if index < len(entries) else None


def _forged_cursor(case: Any, match: re.Match[str]) -> bool:
    """Not a cursor keysvc issued for this list (each list's cursor is good for it only)."""
    cursor = (case.query or {}).get("cursor")
    lists = {"/roles": "roleCursors", "/activities": "activityCursors", "/identities": "-"}
    # No identity cursor is seeded: any cursor on that list is a forged one.
    own = SEEDED.get(next((v for k, v in lists.items() if case.path.endswith(k)), "cursors"), [])
    return cursor is not None and cursor not in own


def _repeated_limit_names(case: Any, match: re.Match[str]) -> bool:
    """Named rate limits whose names repeat (issue 36): unique by name, which JSON
    Schema's uniqueItems (whole entries) cannot say."""
    entries = _body(case).get("ratelimits") or []
    names = [entry.get("name") for entry in entries if isinstance(entry, dict)]
    return len(set(names)) < len(names)


def _named_limits(case: Any) -> list[str]:
    """The rate limit names a verify names (X-Ratelimit, or ?ratelimit= which wins)."""
    query = (case.query or {}).get("ratelimit")
    if query:
        items = query if isinstance(query, list) else [query]
        return [str(item).partition(":")[0] for item in items]
    header = str((case.headers or {}).get("X-Ratelimit") or "")
    return [part.partition(";")[0].strip() for part in header.split(",") if part.strip()]


def _no_such_limit(case: Any, match: re.Match[str]) -> bool:
    """A verify naming a rate limit its key has none of (issue 36): which limits a key
    has is data, not schema."""
    return match["name"] in _named_limits(case)


def _named_twice(case: Any, match: re.Match[str]) -> bool:
    """A verify naming one rate limit twice: its items differ by cost, which JSON
    Schema's uniqueItems (whole items) cannot say."""
    return _named_limits(case).count(match["name"]) > 1


def _too_many_named(case: Any, match: re.Match[str]) -> bool:
    """More named rate limits than a verify may name: a header's items are counted
    only once it is split, which JSON Schema cannot say."""
    return len(_named_limits(case)) > int(match["most"])


def _dates_reversed(case: Any, match: re.Match[str]) -> bool:
    """from_date after to_date: each a valid date-time alone."""
    query = case.query or {}
    try:
        since, until = (datetime.fromisoformat(query[n]) for n in ("from_date", "to_date"))
        return since > until
    except (KeyError, TypeError, ValueError, OverflowError):
        return False


def _past_expiry(case: Any, match: re.Match[str]) -> bool:
    return _in_past(_body(case).get("expireAt"))


def _not_a_network(case: Any, match: re.Match[str]) -> bool:
    source = _source(case, match)
    return isinstance(source, str) and not _network(source, strict=False)


def _host_bits(case: Any, match: re.Match[str]) -> bool:
    source = _source(case, match)
    return _network(source, strict=False) and not _network(source, strict=True)


def _zone_id(case: Any, match: re.Match[str]) -> bool:
    return "%" in str(_source(case, match))


def _unknown_role(case: Any, match: re.Match[str]) -> bool:
    role_id = match["id"]
    return role_id in (_body(case).get("assignedRoleIds") or []) and role_id not in SEEDED["roles"]


def _unknown_actor(case: Any, match: re.Match[str]) -> bool:
    actor = "apiKey/" + match["id"]
    return actor in (_body(case).get("actors") or []) and actor not in SEEDED["actors"]


def _permissions_in_all(case: Any, match: re.Match[str]) -> bool:
    """A role's permissions and its policies' together, which no JSON Schema can count."""
    body = _body(case)
    policies = [p for p in body.get("policies") or [] if isinstance(p, dict)]
    sent = len(body.get("permissions") or []) + sum(
        len(p.get("permissions") or []) for p in policies
    )
    return sent == int(match["count"]) > int(match["most"])


_WIDTHS = {"minute": timedelta(minutes=1), "hour": timedelta(hours=1), "day": timedelta(days=1)}


def _moment(case: Any, name: str) -> datetime | None:
    """The usage query's ``from`` or ``to`` as keysvc reads it; None when not given."""
    value = (case.query or {}).get(name)
    return None if value is None else datetime.fromisoformat(value).astimezone(UTC)


def _unreadable(case: Any, match: re.Match[str]) -> bool:
    """An RFC 3339 date-time that Python does not read (a leap second, say)."""
    try:
        _moment(case, match["name"])
    except (ValueError, OverflowError):
        return True
    return False


def _span(case: Any) -> tuple[datetime, datetime]:
    end = _moment(case, "to") or datetime.now(UTC)
    return _moment(case, "from") or end - timedelta(hours=24), end


def _backwards(case: Any, match: re.Match[str]) -> bool:
    start, end = _span(case)
    return start > end


def _too_many_buckets(case: Any, match: re.Match[str]) -> bool:
    start, end = _span(case)
    width = _WIDTHS[match["granularity"]]
    return (case.query or {}).get("granularity", "hour") == match["granularity"] and (
        (end - start) / width > int(match["most"])
    )


def _out_of_range(case: Any, match: re.Match[str]) -> bool:
    """Within a day of the first or the last date Python holds."""
    try:
        start, end = _span(case)
    except OverflowError:
        return True
    edge = timedelta(days=1)
    return (
        start.replace(tzinfo=None) - datetime.min < edge
        or datetime.max - end.replace(tzinfo=None) < edge
    )


_SOURCE = r"ipAccessList\.(?P<index>[0-9]+)\.source: "
RULES: tuple[tuple[re.Pattern[str], Callable[[Any, re.Match[str]], bool]], ...] = (
    (
        re.compile(r"(?P<name>from|to): must be an ISO-8601 date-time such as \S+"),
        _unreadable,
    ),
    (re.compile(r"from: must not be after to"), _backwards),
    (
        re.compile(
            r"from, to: ask for at most (?P<most>[0-9]+) buckets of a (?P<granularity>[a-z]+),"
            r" not [0-9]+; narrow the range or choose a wider granularity"
        ),
        _too_many_buckets,
    ),
    (re.compile(r"from, to: out of range; ask for dates from year 1 to 9999"), _out_of_range),
    (re.compile(r"cursor: not a cursor from this list; start again without it"), _forged_cursor),
    (re.compile(r"expireAt: must be in the future"), _past_expiry),
    (re.compile(r"ratelimits: names must be unique"), _repeated_limit_names),
    (re.compile(r"ratelimit: this key has no rate limit named (?P<name>\S+)"), _no_such_limit),
    (re.compile(r"ratelimit: [^:]+: (?P<name>\S+) is named twice"), _named_twice),
    (re.compile(r"ratelimit: at most (?P<most>[0-9]+) limits may be named"), _too_many_named),
    (re.compile(r"from_date: must not be after to_date"), _dates_reversed),
    (re.compile(_SOURCE + r"must be an IPv4 or IPv6 address or CIDR"), _not_a_network),
    (re.compile(_SOURCE + r"has host bits set; did you mean \S+\?"), _host_bits),
    (re.compile(_SOURCE + r"must not carry an IPv6 zone ID"), _zone_id),
    (re.compile(r"assignedRoleIds: no role (?P<id>\S+) in this organization"), _unknown_role),
    (re.compile(r"actors: no key (?P<id>\S+) in this organization"), _unknown_actor),
    (
        re.compile(
            r"permissions: a role grants at most (?P<most>[0-9]+) permissions, its policies'"
            r" included; this body has (?P<count>[0-9]+)"
        ),
        _permissions_in_all,
    ),
)


def _field_violations(case: Any) -> int:
    """How many reasons of the field rules above the body earns (one per bad source)."""
    body = _body(case)
    sources = [e.get("source") for e in body.get("ipAccessList") or [] if isinstance(e, dict)]
    bad = [s for s in sources if isinstance(s, str) and not _network(s, strict=True)]
    return int(_in_past(body.get("expireAt"))) + len(bad)


def breaks_only_unwritable_rules(error: str, case: Any) -> bool:
    """Whether ``error`` names only rules JSON Schema cannot say, each borne out by ``case``."""
    left_out = LEFT_OUT.search(error)
    rest = error[: left_out.start()] if left_out else error
    named = 0
    for pattern, broken in RULES:
        for match in pattern.finditer(rest):
            if not broken(case, match):
                return False
            named += 1
        rest = pattern.sub("", rest)
    if named == 0 or rest.replace(";", "").strip():
        return False
    # The reasons left out cannot be read, but they can be counted from the request.
    return left_out is None or named + int(left_out["count"]) == _field_violations(case)


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """False drops the failure: see the module docstring for which ones."""
    if failure.code == REJECTED_VALID and response.status_code == 400:
        if case.method.upper() == "HEAD" and _named_limits(case):
            # No body to read the reason from: the GET of the same case is checked.
            return False
        try:
            error = json.loads(response.content)["error"]
        except (ValueError, KeyError, TypeError):
            return True
        return not breaks_only_unwritable_rules(error, case)
    if failure.code == ACCEPTED_INVALID:
        return not (failure.message.endswith(EMPTY_EXPIRY) and _body(case).get("expireAt") == "")
    return True
