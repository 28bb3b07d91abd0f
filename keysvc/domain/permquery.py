"""Permission queries: what a proxy may require of a key on verify (issue 36).

A query is permission names joined by ``AND`` and ``OR``, with parentheses:
``reports:read AND (region:eu OR region:any)``. AND binds tighter than OR, so
``a:x OR b:y AND c:z`` is ``a:x OR (b:y AND c:z)``. The words are written all upper
or all lower case, and spaces or tabs separate them; a permission name is never a
bare word (it always has a colon, or is ``*``), so a word cannot be read both ways.
A single name is a query of one term, as before queries existed.

Each name is matched with ``keysvc.domain.permissions.has_permission`` (wildcards
apply). A query is bounded (``MAX_QUERY_LENGTH`` characters, ``MAX_TERMS`` names,
``MAX_DEPTH`` nested parentheses), so a hostile one costs little to refuse; a
malformed or oversized one is a 400 that says where it went wrong.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from keysvc.domain.permissions import MAX_PERMISSION_LENGTH, PERMISSION, has_permission
from keysvc.errors import BadRequest

MAX_QUERY_LENGTH = 1024
MAX_TERMS = 32
MAX_DEPTH = 8
# The OpenAPI document's pattern for a query, a part of what the parser takes that stays
# within its bounds: up to 8 terms, each a name or up to 4 names in parentheses (so at
# most MAX_TERMS names, one level deep). The document states the whole rule in words.
_NAME = PERMISSION.pattern
_JOIN = r"[ \t]+(?:AND|and|OR|or)[ \t]+"
_GROUP = rf"\([ \t]*(?:{_NAME})(?:{_JOIN}(?:{_NAME})){{0,3}}[ \t]*\)"
QUERY_PATTERN = rf"^[ \t]*(?:{_NAME}|{_GROUP})(?:{_JOIN}(?:{_NAME}|{_GROUP})){{0,7}}[ \t]*$"
# The message a malformed single name has always had.
MALFORMED_NAME = "permission: must be namespace:action, such as reports:read"

_TOKEN = re.compile(r"\(|\)|[^ \t()]+")
_WORDS = {"AND": "AND", "and": "AND", "OR": "OR", "or": "OR"}


@dataclass(frozen=True)
class Query:
    """A parsed query: a name (``op`` "name"), or "AND"/"OR" over ``parts``."""

    op: str
    name: str = ""
    parts: tuple["Query", ...] = ()

    def met_by(self, granted: frozenset[str]) -> bool:
        if self.op == "name":
            return has_permission(granted, self.name)
        if self.op == "AND":
            return all(part.met_by(granted) for part in self.parts)
        return any(part.met_by(granted) for part in self.parts)

    def text(self, nested: bool = False) -> str:
        """The query written back, with parentheses only where they are needed."""
        if self.op == "name":
            return self.name
        joined = f" {self.op} ".join(part.text(nested=True) for part in self.parts)
        return f"({joined})" if nested and self.op == "OR" else joined


def _is_name(value: str) -> bool:
    return len(value) <= MAX_PERMISSION_LENGTH and PERMISSION.fullmatch(value) is not None


def _error(where: str) -> BadRequest:
    return BadRequest(f"permission: {where}")


class _Parser:
    """Recursive descent over the tokens; depth is bounded before any recursion."""

    def __init__(self, text: str):
        self.tokens = [(m.group(), m.start() + 1) for m in _TOKEN.finditer(text)]
        self.at = 0
        self.depth = 0
        self.terms = 0

    def peek(self) -> tuple[str, int] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def word(self) -> str | None:
        token = self.peek()
        return None if token is None else _WORDS.get(token[0])

    def either(self) -> Query:
        return self.joined("OR", self.both)

    def both(self) -> Query:
        return self.joined("AND", self.term)

    def joined(self, op: str, operand: Callable[[], Query]) -> Query:
        """Operands joined by ``op``: the operand alone when there is one."""
        parts = [operand()]
        while self.word() == op:
            self.at += 1
            parts.append(operand())
        return parts[0] if len(parts) == 1 else Query(op, parts=tuple(parts))

    def term(self) -> Query:
        token = self.peek()
        if token is None:
            raise _error("the query ends where a permission name or ( was expected")
        value, position = token
        self.at += 1
        if value == "(":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise _error(f"more than {MAX_DEPTH} nested parentheses at character {position}")
            inner = self.either()
            closing = self.peek()
            if closing is None or closing[0] != ")":
                raise _error(f"the ( at character {position} is never closed")
            self.at += 1
            self.depth -= 1
            return inner
        if value == ")" or value in _WORDS:
            raise _error(f"unexpected {value} at character {position}")
        if not _is_name(value):
            raise _error(
                f"{value[:40]!r} at character {position} must be namespace:action,"
                " such as reports:read"
            )
        self.terms += 1
        if self.terms > MAX_TERMS:
            raise _error(f"more than {MAX_TERMS} permission names (at character {position})")
        return Query("name", name=value)


@lru_cache(maxsize=512)
def parse(text: str) -> Query:
    """The query ``text`` holds; a 400 (``BadRequest``) that says where it is wrong."""
    if len(text) > MAX_QUERY_LENGTH:
        raise _error(f"a query may be at most {MAX_QUERY_LENGTH} characters")
    if _is_name(text):
        return Query("name", name=text)
    parser = _Parser(text)
    if not parser.tokens:
        raise BadRequest(MALFORMED_NAME)
    alone = parser.tokens[0][0]
    if len(parser.tokens) == 1 and alone not in ("(", ")") and not _is_name(alone):
        raise BadRequest(MALFORMED_NAME)  # one malformed name keeps its old message
    query = parser.either()
    leftover = parser.peek()
    if leftover is not None:
        raise _error(f"unexpected {leftover[0][:40]} at character {leftover[1]}")
    return query
