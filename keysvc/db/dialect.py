"""The two SQL dialects keysvc speaks, SQLite's and PostgreSQL's, side by side.

Every statement is written once, in SQLite's dialect, with ``?`` parameters. Most
read the same on PostgreSQL once their parameters are numbered (``$1``, ``$2``...),
which ``postgres_text`` does. A statement whose PostgreSQL form differs (``json_each``,
``julianday``, ``insert or ignore``) is an ``Sql``: still the SQLite text itself, a
``str`` that SQLite's connections take unchanged at no cost, carrying its PostgreSQL
form beside it, so that a reader sees both where the statement is declared.

Neither form is ever built from values: only ``?`` placeholders are numbered.
"""

import re
from functools import lru_cache


class Sql(str):
    """A statement: the SQLite text (the string itself) and its PostgreSQL form."""

    postgres: str

    def __new__(cls, sqlite: str, postgres: str) -> "Sql":
        made = super().__new__(cls, sqlite)
        made.postgres = postgres
        return made


# A quoted literal or identifier (kept whole, with any ? inside), or a placeholder.
_TOKENS = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\?")


@lru_cache(maxsize=1024)
def _numbered(text: str) -> str:
    count = 0

    def number(match: re.Match[str]) -> str:
        nonlocal count
        if match[0] != "?":
            return match[0]
        count += 1
        return f"${count}"

    return _TOKENS.sub(number, text)


def postgres_text(sql: str) -> str:
    """``sql`` as PostgreSQL runs it: its own PostgreSQL form for an ``Sql``, with
    ``?`` placeholders numbered in order either way."""
    return _numbered(sql.postgres if isinstance(sql, Sql) else str(sql))


# A parameter holding a JSON array of text, as the set of its elements: the one form
# lists of IDs take in statements, so that no statement is built from a list's length.
JSON_LIST = "{json_list}"
_JSON_LIST_SQLITE = "(select value from json_each(?))"
_JSON_LIST_POSTGRES = "(select jsonb_array_elements_text(?::jsonb))"


def with_json_list(template: str, postgres: str | None = None) -> Sql:
    """``template`` (or, on PostgreSQL, ``postgres``) with each ``{json_list}`` the set
    of a JSON array parameter's elements."""
    return Sql(
        template.replace(JSON_LIST, _JSON_LIST_SQLITE),
        (postgres or template).replace(JSON_LIST, _JSON_LIST_POSTGRES),
    )
