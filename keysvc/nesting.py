"""How deep JSON nests, measured without recursion.

Python's json, copy and comparisons recurse once per level, and a request handler
already stands some frames deep: a value nested a few hundred levels may parse and
still fail later with RecursionError, a 500. So keysvc bounds nesting where a value
is taken in: a body (``MAX_BODY_DEPTH``, ``keysvc.http.views.common.decode_json``),
a key's ``meta`` (``MAX_META_DEPTH``, ``keysvc.http.keyfields.Meta``), and a ``meta``
read back from the database (``stored_meta``), each measured here by a loop that
counts levels with a stack of its own.
"""

import json
from collections.abc import Iterable
from typing import Any

# Levels a key's meta may nest, itself included: {} is 1, {"a": [1]} is 2.
MAX_META_DEPTH = 32
# Levels any request body may nest, itself included: a meta at its bound, inside the
# body, and room to spare. No field of any body needs more.
MAX_BODY_DEPTH = 64


def depth_of(value: Any) -> int:
    """How many levels of objects and arrays ``value`` nests (a scalar is 0)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        inner: Iterable[Any]
        if isinstance(item, dict):
            inner = item.values()
        elif isinstance(item, list):
            inner = item
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in inner)
    return deepest


def may_nest_deeper(text: str, levels: int) -> bool:
    """False when the JSON ``text`` cannot nest deeper than ``levels``: it opens no more
    objects and arrays than that (counted at C speed, strings included). Most texts end
    here, and only the others are measured."""
    return text.count("[") + text.count("{") > levels


def text_depth(text: str) -> int:
    """How many levels of objects and arrays the JSON ``text`` nests, read from its
    brackets outside strings (the text is not parsed, so it may be any depth)."""
    deepest = level = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            level += 1
            deepest = max(deepest, level)
        elif char in "]}":
            level -= 1
    return deepest


def stored_meta(text: str | None) -> dict[str, Any] | None:
    """A key's meta as stored. One nested deeper than ``MAX_META_DEPTH`` (stored before
    keysvc bounded it) is read as none: parsed, it could fail every read of the key,
    and so its PATCH and its disable, with RecursionError."""
    if text is None:
        return None
    if may_nest_deeper(text, MAX_META_DEPTH) and text_depth(text) > MAX_META_DEPTH:
        return None
    meta: dict[str, Any] = json.loads(text)
    return meta
