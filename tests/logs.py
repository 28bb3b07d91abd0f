"""What the log tests (tests/unit/test_logs.py, tests/api/test_logs.py) share: route
templates, reading JSON lines back, and the root logger put back after each test."""

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

KEYS = "/v1/organizations/{organizationId}/keys"
KEY = KEYS + "/{keyId}"


@pytest.fixture(autouse=True)
def root_logger_restored() -> Iterator[None]:
    """Every test here may change the root logger's handlers and level: put them back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    text = stream.getvalue()
    assert text.endswith("\n")
    # Every line is exactly one JSON object: nothing spills onto a second line.
    return [json.loads(line) for line in text.splitlines()]


def access_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [line for line in json_lines(stream) if line["logger"] == "keysvc.access"]
