"""Reports of leaked secrets: revoke-by-secret, public, for whoever found a key's
secret (``keysvc.domain.leaks``). Its answer is the same whether or not the secret was
a key's: no oracle."""

from aiohttp import hdrs, web

from keysvc.domain import leaks
from keysvc.domain.activities import bounded_user_agent
from keysvc.http.auth import admit_unproven
from keysvc.http.envelope import ok
from keysvc.http.routes import REVOKE_LEAKED, serves
from keysvc.http.schemas import RevokeLeakedSchema, load
from keysvc.http.state import CLOCK, HASHER, SETTINGS, STORE
from keysvc.http.views.common import read_json_object
from keysvc.models import Actor

_revoke = RevokeLeakedSchema()
# The one answer of a revoke-by-secret, match or not.
RECEIVED = {"status": "received"}


@serves(REVOKE_LEAKED)
async def revoke_leaked(request: web.Request) -> web.Response:
    address = await admit_unproven(request)
    data = load(_revoke, await read_json_object(request))
    app = request.app
    actor = Actor(
        "system",
        ip=None if address is None else str(address),
        user_agent=bounded_user_agent(request.headers.get(hdrs.USER_AGENT)),
        details="revoke-leaked: a holder of the secret",
    )
    report = leaks.Report(leaks.REVOKE_LEAKED, actor)
    await leaks.report_leak(
        app[STORE], app[HASHER], data["secret"], report, app[SETTINGS].leaked_key_action,
        app[CLOCK](),
    )  # fmt: skip
    return ok(request, RECEIVED)
