"""A standard private HTTP cache in front of a real `keysvc serve` that lets its verify
answers be reused (the default 1 s): the CacheControl library over requests, as a
service that checks keys from its own code might use it. keysvc's ``Vary`` names every
request header a verify answer depends on, so the cache serves a kept answer only to
the same credentials and requirements: a wrong secret, a key without the permission,
no credentials at all, another organization required or a bad cost each get keysvc's
own answer, never the earlier caller's 200.
"""

from collections.abc import Iterator

import pytest
import requests
from cachecontrol import CacheControl
from cachecontrol.cache import DictCache

from tests.helpers import Creds, basic
from tests.nginx import create_key
from tests.server import Server, admin_creds, bootstrap

OTHER_ORGANIZATION = "0e4f6b5a-1c2d-4e3f-8a9b-0c1d2e3f4a5b"


@pytest.fixture(scope="module")
def keysvc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Creds]]:
    db = tmp_path_factory.mktemp("vary") / "keysvc.db"
    admin = admin_creds(bootstrap(db))
    with Server(db, env={"KEYSVC_RATE_LIMIT": "off"}) as server:
        yield server, admin


def cached_session() -> requests.Session:
    return CacheControl(requests.Session(), cache=DictCache())


def test_a_kept_answer_is_served_only_to_the_same_request(keysvc: tuple[Server, Creds]) -> None:
    server, admin = keysvc
    key = create_key(server.port, admin, roles=["developer"])
    url = server.base + "/v1/verify"
    session = cached_session()
    first = session.get(url, headers=key.headers)
    assert first.status_code == 200
    assert first.headers["Cache-Control"].startswith("private, max-age=")
    again = session.get(url, headers=key.headers)
    assert again.status_code == 200
    assert getattr(again, "from_cache", False)  # the cache does keep it
    others = {
        "a wrong secret": (basic(key.key_id, key.secret + "x"), 401),
        "no credentials": ({}, 401),
        "a permission it lacks": ({**key.headers, "X-Required-Permission": "reports:read"}, 403),
        "another organization": (
            {**key.headers, "X-Required-Organization": OTHER_ORGANIZATION},
            403,
        ),
        "a bad cost": ({**key.headers, "X-Credit-Cost": "abc"}, 400),
        "a JSON answer": ({**key.headers, "Accept": "application/json"}, 200),
    }
    for what, (headers, status) in others.items():
        answer = session.get(url, headers=headers)
        assert (answer.status_code, getattr(answer, "from_cache", False)) == (status, False), what
    assert session.get(url, headers=key.headers).status_code == 200
