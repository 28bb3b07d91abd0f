"""Issue 36 behind the shipped docs/nginx-auth-request.conf, through a real nginx in
front of a real `keysvc serve`: a path's named rate limit, named by the config's
$keysvc_path_ratelimit map as its comment shows, is counted at the config's cost,
whatever X-Ratelimit the client sends; other paths count only the autoApply limits."""

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from tests.nginx import CLIENT, call, render, wrap
from tests.nginxstack import ENV, Stack, start_stack

# The map's commented example, as an operator would write it for a path of theirs.
EXAMPLE = '    # "~*^/v1/completions"  "tokens;cost=100";'
NAMED = '    "~*^/v1/completions"  "tokens;cost=100";'


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with ExitStack() as resources:
        running = start_stack(resources, tmp_path_factory.mktemp("nginx-ratelimits"), ENV)
        running.nginx.stop()
        assert running.keysvc.unix is not None
        rendered = render(
            running.nginx.port,
            running.keysvc.unix,
            running.upstream.base,
            running.admin.organization_id,
            running.nginx.cache,
        )
        assert rendered.count(EXAMPLE) == 1
        running.nginx.conf.write_text(
            wrap(running.nginx.directory, rendered.replace(EXAMPLE, NAMED))
        )
        running.nginx.test_config()
        running.nginx.start()
        yield running


def _status(stack: Stack, path: str, headers: dict[str, str]) -> int:
    return call(stack.nginx.port, path, headers=headers, source=CLIENT).status


def test_a_path_s_named_limit_counts_at_the_config_s_cost(stack: Stack) -> None:
    tokens = {"name": "tokens", "limit": 250, "windowSeconds": 3600}
    key = stack.create_key(roles=["developer"], ratelimits=[tokens])
    sent = {**key.headers, "X-Ratelimit": "tokens;cost=0"}  # never reaches keysvc
    assert [_status(stack, "/v1/completions", sent) for _ in range(3)] == [200, 200, 429]
    # Another path names no limit: the key's tokens are not counted there.
    assert [_status(stack, "/orders", sent) for _ in range(3)] == [200, 200, 200]


def test_a_key_without_the_path_s_limit_is_refused_with_a_400(stack: Stack) -> None:
    plain = stack.create_key(roles=["developer"])
    assert _status(stack, "/v1/completions", plain.headers) == 400
    assert _status(stack, "/orders", plain.headers) == 200
