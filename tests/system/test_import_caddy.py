"""Issue 37's bearer tokens behind the shipped Caddy config (docs/Caddyfile), all real
processes: an imported token passes with its key's identity and never reaches the
upstream, and an unknown one (or a Basic key's secret sent as a bearer token) is
refused before the upstream, as an unknown Basic key is."""

import secrets
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from tests.caddy import ENV, Stack, start_stack
from tests.nginx import CLIENT, Answer, call, import_token


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    env = {**ENV, "KEYSVC_API_TOKEN_IMPORT": "1"}
    with ExitStack() as resources:
        yield start_stack(resources, tmp_path_factory.mktemp("caddy-bearer"), env)


def _bearer(stack: Stack, token: str) -> tuple[Answer, int]:
    """A request through Caddy with ``token``; its answer, and the upstream's hits."""
    hits = len(stack.upstream.seen)
    answer = call(
        stack.caddy.port, "/orders/7", headers={"Authorization": f"Bearer {token}"}, source=CLIENT
    )
    return answer, len(stack.upstream.seen) - hits


def test_an_imported_token_passes_with_its_identity(stack: Stack) -> None:
    token = "sk_live_" + secrets.token_urlsafe(32)
    key_id = import_token(stack.keysvc.port, stack.admin, token)
    answer, hits = _bearer(stack, token)
    assert (answer.status, hits) == (200, 1), (answer.body, stack.caddy.log()[-2000:])
    headers = answer.json()["headers"]
    assert headers["X-Key-Id"] == key_id
    assert headers["X-Organization-Id"] == stack.admin.organization_id
    assert headers["X-Key-Permissions"] == "keys:read,roles:read"
    assert "Authorization" not in headers  # the token stays with Caddy and keysvc


def test_unknown_tokens_and_disabled_keys_are_refused_before_the_upstream(stack: Stack) -> None:
    unknown, hits = _bearer(stack, "sk_live_" + secrets.token_urlsafe(32))
    assert (unknown.status, hits) == (401, 0), unknown.body
    basic_key = stack.create_key(roles=["developer"])
    as_bearer, hits = _bearer(stack, basic_key.secret)
    assert (as_bearer.status, hits) == (401, 0), as_bearer.body
    assert as_bearer.json()["error"] == unknown.json()["error"]
    token = "sk_live_" + secrets.token_urlsafe(32)
    import_token(stack.keysvc.port, stack.admin, token, state="disabled")
    disabled, hits = _bearer(stack, token)
    assert (disabled.status, hits) == (401, 0), disabled.body
