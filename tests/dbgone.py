"""Requests for the tests of a SQLite database file gone from under a serving keysvc
(tests/system/test_database_gone.py, test_wal_gone.py): plain urllib, the answer's
status, headers and JSON body, and the one refusal such a write gets."""

import json
import urllib.error
import urllib.request
import uuid
from typing import Any

from tests.helpers import basic

GONE = "database unavailable: its file is no longer where it was opened; nothing was written"


def _answer(url: str, creds: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    """A GET's status, headers and JSON body (None when it is not JSON)."""
    headers = {} if creds is None else basic(creds["keyId"], creds["keySecret"])
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, got, raw = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as refused:
        status, got, raw = refused.code, dict(refused.headers), refused.read()
    try:
        return status, got, json.loads(raw)
    except ValueError:
        return status, got, None


def _metric(base: str, name: str) -> float:
    """The value of the unlabelled metric ``name`` in a scrape of /metrics (200)."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as response:
        text = response.read().decode()
    [value] = [line.split()[1] for line in text.splitlines() if line.startswith(name + " ")]
    return float(value)


def _post_status(base: str, path: str, creds: dict[str, str], body: dict[str, Any]) -> Any:
    """A POST with ``creds``: its status, Retry-After and body."""
    data = json.dumps(body).encode()
    headers = {**basic(creds["keyId"], creds["keySecret"]), "Content-Type": "application/json"}
    request = urllib.request.Request(base + path, data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers.get("Retry-After"), json.loads(response.read())
    except urllib.error.HTTPError as refused:
        return refused.code, refused.headers.get("Retry-After"), json.loads(refused.read())


def _refused(status: int, retry_after: str | None, body: dict[str, Any]) -> None:
    assert (status, retry_after, body["status"], body["error"]) == (503, "5", 503, GONE), body
    assert uuid.UUID(body["requestId"]).version == 4
