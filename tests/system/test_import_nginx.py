"""Issue 37's bearer tokens behind the shipped nginx config (docs/nginx-auth-request.conf),
all real processes: an imported token passes with its key's
identity, an unknown one is refused before the upstream, and a reused answer is keyed
on the whole Authorization header's digest, so one token's answer is never another's."""

import secrets
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.nginx import CLIENT, Answer, call, import_token
from tests.nginxstack import ENV, Stack, start_stack


def bearer_get(stack: Stack, path: str, token: str) -> Answer:
    """A request through nginx with ``token`` as a bearer token, from the client's address."""
    return call(stack.nginx.port, path, headers={"Authorization": f"Bearer {token}"}, source=CLIENT)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # Answers may be reused for 5 s: the cache key is what this test is about.
    env = {**ENV, "KEYSVC_VERIFY_REUSE_SECONDS": "5", "KEYSVC_API_TOKEN_IMPORT": "1"}
    with ExitStack() as resources:
        yield start_stack(resources, tmp_path_factory.mktemp("nginx-bearer"), env)


def test_an_imported_token_passes_with_its_identity(stack: Stack) -> None:
    token = "sk_live_" + secrets.token_urlsafe(32)
    key_id = import_token(stack.keysvc.port, stack.admin, token)
    answer = bearer_get(stack, "/orders/1", token)
    assert answer.status == 200, (answer.body, stack.nginx.log()[-2000:])
    headers = answer.json()["headers"]
    assert headers["X-Key-Id"] == key_id
    assert headers["X-Organization-Id"] == stack.admin.organization_id
    assert "Authorization" not in headers  # the token stays with nginx and keysvc


def test_an_unknown_token_is_refused_before_the_upstream(stack: Stack) -> None:
    hits = len(stack.upstream.seen)
    answer = bearer_get(stack, "/orders/1", secrets.token_urlsafe(32))
    assert answer.status == 401
    assert len(stack.upstream.seen) == hits


def test_a_reused_answer_is_never_another_tokens(stack: Stack) -> None:
    token = secrets.token_urlsafe(32)
    import_token(stack.keysvc.port, stack.admin, token)
    assert bearer_get(stack, "/orders/2", token).status == 200  # kept for 5 s
    # Another token, however close: its own answer, not the kept one.
    for other in (token[:-1], token + "A", token.upper()):
        assert bearer_get(stack, "/orders/2", other).status == 401
    # A token the key limits to one address answers for that address only: the
    # client's address is in the cache key too.
    limited = secrets.token_urlsafe(32)
    import_token(stack.keysvc.port, stack.admin, limited, ipAccessList=[{"source": "127.0.0.9/32"}])
    assert bearer_get(stack, "/orders/3", limited).status == 403


def test_the_documented_config_names_no_scheme(tmp_path: Path) -> None:
    """The cache key takes the whole header's digest, whatever its scheme: nothing in the
    shipped files reads Basic alone."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    for name in ("nginx-auth-request.conf",):
        text = (docs / name).read_text()
        assert "Basic" not in text and "basic " not in text.lower().replace("auth_basic", "")
