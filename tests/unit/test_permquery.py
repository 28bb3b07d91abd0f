"""Permission queries (keysvc.domain.permquery): grammar, precedence, bounds, errors."""

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keysvc.domain.permquery import (
    MALFORMED_NAME,
    MAX_DEPTH,
    MAX_QUERY_LENGTH,
    MAX_TERMS,
    QUERY_PATTERN,
    parse,
)
from keysvc.errors import BadRequest


def met(query: str, *granted: str) -> bool:
    return parse(query).met_by(frozenset(granted))


@pytest.mark.parametrize(
    ("query", "granted", "expected"),
    [
        ("reports:read", ["reports:read"], True),
        ("reports:read", ["reports:*"], True),
        ("reports:read", ["*"], True),
        ("reports:read", ["reports:write"], False),
        ("reports:read AND region:eu", ["reports:read", "region:eu"], True),
        ("reports:read AND region:eu", ["reports:read"], False),
        ("reports:read OR region:eu", ["region:eu"], True),
        ("reports:read OR region:eu", [], False),
        ("reports:read AND (region:eu OR region:any)", ["reports:read", "region:any"], True),
        ("reports:read AND (region:eu OR region:any)", ["region:any"], False),
        ("reports:read AND (region:eu OR region:any)", ["reports:read", "region:us"], False),
        # AND binds tighter than OR: a OR (b AND c)
        ("a:x OR b:y AND c:z", ["a:x"], True),
        ("a:x OR b:y AND c:z", ["b:y"], False),
        ("a:x OR b:y AND c:z", ["b:y", "c:z"], True),
        ("(a:x OR b:y) AND c:z", ["a:x"], False),
        ("(a:x OR b:y) AND c:z", ["a:x", "c:z"], True),
        ("a:x and (b:y or c:z)", ["a:x", "c:z"], True),
        ("((((a:x))))", ["a:x"], True),
        ("*" + " " * 1000, ["*"], True),
        ("  a:x  ", ["a:x"], True),
        ("  a:x\tAND b:y  ", ["a:x", "b:y"], True),
    ],
)
def test_queries_are_met_as_written(query: str, granted: list[str], expected: bool) -> None:
    assert met(query, *granted) is expected


@pytest.mark.parametrize(
    ("query", "text"),
    [
        ("a:x", "a:x"),
        ("a:x and b:y", "a:x AND b:y"),
        ("a:x OR b:y AND c:z", "a:x OR b:y AND c:z"),
        ("(a:x OR b:y) AND c:z", "(a:x OR b:y) AND c:z"),
        ("((a:x))", "a:x"),
    ],
)
def test_queries_are_written_back_with_the_parentheses_they_need(query: str, text: str) -> None:
    assert parse(query).text() == text
    assert parse(parse(query).text()) == parse(query)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("NOPE", MALFORMED_NAME),
        ("", MALFORMED_NAME),
        ("   ", MALFORMED_NAME),
        ("reports: read", "permission: 'reports:' at character 1 must be namespace:action,"
         " such as reports:read"),
        ("a:x AND", "permission: the query ends where a permission name or ( was expected"),
        ("a:x AND OR b:y", "permission: unexpected OR at character 9"),
        ("(a:x OR b:y", "permission: the ( at character 1 is never closed"),
        ("a:x)", "permission: unexpected ) at character 4"),
        ("a:x b:y", "permission: unexpected b:y at character 5"),
        ("()", "permission: unexpected ) at character 2"),
        ("a:x AND B:Y", "permission: 'B:Y' at character 9 must be namespace:action,"
         " such as reports:read"),
        ("a:x|b:y", MALFORMED_NAME),
        ("a:x And b:y", "permission: unexpected And at character 5"),
        ("a:x\nAND b:y", "permission: 'a:x\\nAND' at character 1 must be namespace:action,"
         " such as reports:read"),
    ],
)  # fmt: skip
def test_a_malformed_query_is_a_400_that_says_where(query: str, message: str) -> None:
    with pytest.raises(BadRequest) as raised:
        parse(query)
    assert raised.value.message == message


@pytest.mark.parametrize(
    "query",
    ["a:x", " a:x AND b:y ", "(a:x OR b:y) AND c:z", "a:x or (b:y and c:z)", "*", "a:*"],
)
def test_the_documents_pattern_admits_what_the_parser_takes(query: str) -> None:
    assert re.fullmatch(QUERY_PATTERN, query)
    parse(query)


@pytest.mark.parametrize("query", ["a:x AND", "(a:x", "a:x b:y", "A:X", "a:x And b:y", ""])
def test_the_documents_pattern_refuses_what_the_parser_refuses(query: str) -> None:
    assert not re.fullmatch(QUERY_PATTERN, query)
    with pytest.raises(BadRequest):
        parse(query)


def test_a_query_is_bounded_in_length_terms_and_depth() -> None:
    with pytest.raises(BadRequest, match="at most 1024 characters"):
        parse("a:" + "x" * 1030)
    many = " OR ".join(f"a:x{i}" for i in range(MAX_TERMS + 1))
    with pytest.raises(BadRequest, match=f"more than {MAX_TERMS} permission names"):
        parse(many)
    assert met(" OR ".join(f"a:x{i}" for i in range(MAX_TERMS)), "a:x31")
    deep = "(" * (MAX_DEPTH + 1) + "a:x" + ")" * (MAX_DEPTH + 1)
    with pytest.raises(BadRequest, match=f"more than {MAX_DEPTH} nested parentheses"):
        parse(deep)
    assert met("(" * MAX_DEPTH + "a:x" + ")" * MAX_DEPTH, "a:x")


def test_a_hostile_query_costs_little_to_refuse() -> None:
    """Thousands of parentheses or words stop at the first bound, never a RecursionError."""
    for hostile in ("(" * 1000, "a:x AND " * 120 + "a:x", ")" * 1000):
        with pytest.raises(BadRequest):
            parse(hostile)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.from_regex(QUERY_PATTERN, fullmatch=True))
def test_every_query_the_documents_pattern_admits_is_taken(query: str) -> None:
    """What the OpenAPI document calls valid, verify accepts (schemathesis relies on it)."""
    if len(query) <= MAX_QUERY_LENGTH:
        parse(query)
