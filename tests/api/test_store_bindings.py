"""The serving store's methods are the ones that run: none is shadowed by an
attribute of the same name set on the instance, which would leave the method's
body dead and its docstring describing code that never runs."""

import inspect

from keysvc.db.sqlite.store import Store
from keysvc.http.state import STORE
from tests.helpers import Client, Creds


async def test_no_method_of_the_store_is_shadowed(client: Client, admin: Creds) -> None:
    store = client.app[STORE]
    methods = {name for name, member in vars(Store).items() if inspect.isfunction(member)}
    assert methods, "Store defines its methods in its class body"
    assert sorted(methods & set(vars(store))) == []


async def test_the_bound_shortcuts_still_count_and_touch(client: Client, admin: Creds) -> None:
    """What the shortcuts bound in ``__init__`` answer: a request of the admin's key
    is counted in its usage, and its usedAt is then up to date."""
    response = await client.get("/v1/whoami", headers=admin.headers)
    response.release()
    store = client.app[STORE]
    await store.write_usage()
    key = await store.get_key(admin.organization_id, admin.id)
    assert key is not None and key.used_at is not None
    assert not store.needs_touch(key, key.used_at)
    url = f"/v1/organizations/{admin.organization_id}/keys/{admin.id}/usage?granularity=day"
    response = await client.get(url, headers=admin.headers)
    body = await response.json()
    assert sum(bucket["success"] for bucket in body["result"]["series"]) >= 1
