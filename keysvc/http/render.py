"""Key answers for the hot paths, written by hand rather than through marshmallow.

``api_key`` (``keysvc.keyview``) builds exactly what ``responses.ApiKeySchema`` dumps
(the same fields, the same order, the same omissions; tests/api/test_views.py holds
the two together), at a fraction of the cost. The schema stays the contract: the
OpenAPI document is built from it.

A ``Key`` is immutable, and the store hands out the same object for as long as
nothing about the key is committed, so its JSON text is made once per object
and kept on it (as ``functools.cached_property`` keeps a value); ``keysvc.http.envelope``
puts the envelope around it.
"""

import json
from collections.abc import Mapping
from types import MappingProxyType
from urllib.parse import quote

from keysvc.db.contract import Records
from keysvc.domain import activities
from keysvc.keyview import api_key as api_key
from keysvc.models import Key

# What the store writes that the layers above it shape (keysvc.db.contract.Records):
# the serving app's and the commands' alike.
STORE_RECORDS = Records(pre_log=activities.pre_log, key_event=api_key)

# json.dumps's defaults, as web.json_response uses them: ", " and ": ", ASCII only
# (for a string, encode_basestring_ascii, which the encoder calls).
_ENCODER = json.JSONEncoder()
_MEMO = "_api_json"
_PERMISSIONS_MEMO = "_permissions_header"
_VERIFY_MEMO = "_verify_headers"
_ANSWER_MEMO = "_verify_answer_headers"
# Longest X-Key-Permissions verify sends: with the rest of its headers it fits in one
# 4 KiB page, nginx's default proxy_buffer_size, which a longer answer overflows (nginx
# then fails the auth subrequest, and so the request, with a 500).
MAX_PERMISSIONS_HEADER = 3072


def key_json(key: Key) -> str:
    """``api_key(key)`` as JSON text, made once per ``Key`` object."""
    memo: str | None = key.__dict__.get(_MEMO)
    if memo is None:
        memo = _ENCODER.encode(api_key(key))
        # Beside the dataclass fields, as cached_property would store it: a frozen
        # Key cannot change, so neither can its text.
        key.__dict__[_MEMO] = memo
    return memo


def permissions_header(key: Key) -> str:
    """The key's permissions, sorted and comma-separated (verify's X-Key-Permissions),
    bounded by ``MAX_PERMISSIONS_HEADER`` (see ``bounded_permissions``)."""
    memo: str | None = key.__dict__.get(_PERMISSIONS_MEMO)
    if memo is None:
        memo = bounded_permissions(sorted(key.permissions))
        key.__dict__[_PERMISSIONS_MEMO] = memo
    return memo


def bounded_permissions(permissions: list[str]) -> str:
    """``permissions`` comma-separated, in at most ``MAX_PERMISSIONS_HEADER`` characters.
    A longer list keeps the whole entries that fit, in order, then one entry such as
    ``+12 more`` that says how many were left out: no permission looks like it, so an
    upstream that looks for one it needs among them finds it or refuses, never more."""
    joined = ",".join(permissions)
    if len(joined) <= MAX_PERMISSIONS_HEADER:
        return joined
    room = MAX_PERMISSIONS_HEADER - len(f",+{len(permissions)} more")
    kept: list[str] = []
    size = -1  # no comma before the first entry
    for permission in permissions:
        size += 1 + len(permission)
        if size > room:
            break
        kept.append(permission)
    return ",".join([*kept, f"+{len(permissions) - len(kept)} more"])


def keys_json(keys: list[Key]) -> str:
    return "[" + ", ".join(key_json(key) for key in keys) + "]"


def encode(value: object) -> str:
    return _ENCODER.encode(value)


# What X-Key-External-Id leaves as it is: printable ASCII but "%", the escape.
_AS_IS = "".join(chr(code) for code in range(0x20, 0x7F) if chr(code) != "%")


def external_id_header(external_id: str) -> str:
    """``external_id`` as X-Key-External-Id carries it: UTF-8, every byte outside
    printable ASCII and every "%" percent-encoded (RFC 3986), so the header is ASCII
    and an ASCII ID without "%" reads as itself; ``urllib.parse.unquote`` gives it back."""
    return quote(external_id, safe=_AS_IS)


def verify_headers(key: Key) -> Mapping[str, str]:
    """The headers a verify's 200 says of ``key`` (who it is, its organization, its
    permissions, its externalId if it has one), made once per ``Key`` object and shared:
    read-only."""
    memo: Mapping[str, str] | None = key.__dict__.get(_VERIFY_MEMO)
    if memo is None:
        headers = {
            "X-Key-Id": key.id,
            "X-Organization-Id": key.organization_id,
            "X-Key-Permissions": permissions_header(key),
        }
        if key.external_id is not None:
            headers["X-Key-External-Id"] = external_id_header(key.external_id)
        memo = key.__dict__[_VERIFY_MEMO] = MappingProxyType(headers)
    return memo


def verify_answer_headers(
    key: Key, reuse: Mapping[str, str], headers: Mapping[str, str]
) -> Mapping[str, str]:
    """A verify 200's headers: ``reuse`` (``keysvc.http.reuse``), then ``headers``, which
    win where both name one. For ``verify_headers(key)`` itself, kept on the key while
    ``reuse`` is the same object (the reuse headers are made once a second), so that most
    answers build no dict."""
    if headers is not key.__dict__.get(_VERIFY_MEMO):
        return {**reuse, **headers}
    kept: tuple[Mapping[str, str], Mapping[str, str]] | None = key.__dict__.get(_ANSWER_MEMO)
    if kept is not None and kept[0] is reuse:
        return kept[1]
    merged = MappingProxyType({**reuse, **headers})
    key.__dict__[_ANSWER_MEMO] = (reuse, merged)
    return merged
