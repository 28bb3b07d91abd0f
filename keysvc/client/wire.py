"""What both transports share: a call to keysvc described as data (``Call``: method,
path, query, body, headers and how to read the answer), the answer as it came back
(``Answer``), and the one place an answer becomes a result or a ``KeysvcError``. The
async client (``keysvc.client.aio``) and the sync one (``keysvc.client.sync``) only
move bytes."""

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar
from urllib.parse import quote, urlencode

from keysvc.client.errors import error_from

T = TypeVar("T")
JsonObject = dict[str, Any]
USER_AGENT = "keysvc-client"


class Answer(NamedTuple):
    """An HTTP answer: its status, headers (looked up case-insensitively) and body. A
    tuple: one is made for every verify a middleware sends (a frozen dataclass costs
    twice as much to make)."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how its successful answer is read."""

    method: str
    path: str
    read: Callable[[Answer], T]
    query: Mapping[str, str] = field(default_factory=dict)
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def target(self) -> str:
        return self.path + ("?" + urlencode(self.query) if self.query else "")

    def payload(self) -> bytes | None:
        return None if self.body is None else json.dumps(self.body).encode()

    def request_headers(self, authorization: str | None) -> dict[str, str]:
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if authorization:
            headers["Authorization"] = authorization
        if self.body is not None:
            headers["Content-Type"] = "application/json"
        headers.update(self.headers)
        return headers


def outcome(call: Call[T], answer: Answer) -> T:
    """The call's result, or the ``KeysvcError`` of a refusal raised."""
    if answer.status >= 400:
        try:
            body = answer.json()
        except ValueError:
            body = None
        raise error_from(answer.status, body, answer.headers)
    return call.read(answer)


def segment(value: str) -> str:
    """A path segment, quoted so that no value changes the path's shape."""
    return quote(value, safe="")
