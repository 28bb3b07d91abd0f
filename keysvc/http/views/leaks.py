"""Reports of leaked secrets (``keysvc.domain.leaks``): revoke-by-secret, public, for
whoever found a key's secret, whose answer is the same whether or not the secret was a
key's, given once the report is written and before the work a hit causes (no oracle,
in the answer or its time; ``keysvc.domain.leaks.receive``); and
GitHub secret scanning's reports, verified against GitHub's public keys before anything
else and answered in GitHub's feedback format."""

import hashlib
import logging

from aiohttp import hdrs, web

from keysvc.domain import leaks
from keysvc.domain.activities import bounded_user_agent
from keysvc.domain.addresses import IPAddress
from keysvc.errors import BadRequest, Forbidden, ServiceUnavailable, UnsupportedMediaType
from keysvc.http.auth import admit_unproven, throttled_address
from keysvc.http.envelope import ok
from keysvc.http.reports import RevokeLeakedSchema, ScanningReportSchema
from keysvc.http.routes import serves
from keysvc.http.schemas import load
from keysvc.http.state import CLOCK, HASHER, LEAK_REPORTS, LIMITS, SETTINGS, STORE
from keysvc.http.views.common import decode_json, read_json_object, read_raw_body
from keysvc.http.webhook_routes import GITHUB_SCANNING, REVOKE_LEAKED
from keysvc.models import Actor
from keysvc.scanning import IDENTIFIER_HEADER, SIGNATURE_HEADER

logger = logging.getLogger("keysvc")

_revoke = RevokeLeakedSchema()
_scanning = ScanningReportSchema()
# The one answer of a revoke-by-secret, match or not.
RECEIVED = {"status": "received"}
REFUSED = "the report is not signed by a key of KEYSVC_GITHUB_SCANNING_KEYS"
UNFINISHED = "some of the report's tokens could not be acted on now; send the report again"
RETRY_UNFINISHED = 5
ENCODED = (
    "a secret scanning report is verified over its body as sent: send it without Content-Encoding"
)


def _actor(address: IPAddress | None, request: web.Request, details: str) -> Actor:
    return Actor(
        "system",
        ip=None if address is None else str(address),
        user_agent=bounded_user_agent(request.headers.get(hdrs.USER_AGENT)),
        details=details,
    )


@serves(REVOKE_LEAKED)
async def revoke_leaked(request: web.Request) -> web.Response:
    address = await admit_unproven(request)
    data = load(_revoke, await read_json_object(request))
    app = request.app
    actor = _actor(address, request, "revoke-leaked")
    settings = app[SETTINGS]
    # Written before the answer, acted on after it: nothing of the work, its time
    # included, tells a hit from a miss, and nothing acknowledged is lost.
    await leaks.receive(
        app[STORE], app[HASHER], data["secret"], actor, settings.leaked_key_action, app[CLOCK]()
    )
    app[LEAK_REPORTS].wake()
    return ok(request, RECEIVED)


@serves(GITHUB_SCANNING)
async def github_scanning(request: web.Request) -> web.Response:
    """Verify the report, then act on each token; GitHub's feedback, not the envelope.
    A refused report changes nothing and is logged in one line, without its body."""
    app = request.app
    settings, limits = app[SETTINGS], app[LIMITS]
    keys = settings.github_scanning_keys
    if keys is None:  # off: answered as a path keysvc does not serve
        raise web.HTTPNotFound()
    address = await throttled_address(request)
    moment = app[CLOCK]()
    if request.headers.get(hdrs.CONTENT_ENCODING, "identity").strip().lower() != "identity":
        # aiohttp would decode it before the signature is checked: not the body as sent.
        raise UnsupportedMediaType(ENCODED)
    body = await read_raw_body(request)
    why = keys.verify(
        request.headers.get(IDENTIFIER_HEADER), request.headers.get(SIGNATURE_HEADER), body
    )
    if why is not None:
        limits.failed(address, moment.timestamp())
        logger.warning("secret scanning report refused from %s: %s", address, why)
        raise Forbidden(f"{REFUSED}: {why}")
    try:
        tokens = load(_scanning, {"tokens": decode_json(body, list, "a JSON array")})["tokens"]
    except BadRequest:
        logger.warning("secret scanning report refused from %s: not GitHub's format", address)
        raise
    actor = _actor(address, request, "GitHub secret scanning")
    found = [
        (token["token"], leaks.Report(leaks.GITHUB, actor, token["url"], token["source"],
                                      token["type"]))
        for token in tokens
    ]  # fmt: skip
    outcomes = await leaks.report_each(
        app[STORE], app[HASHER], found, settings.leaked_key_action, moment
    )
    if None in outcomes:
        # Every other token was acted on; the report is sent again, and those are then
        # already reported. Nothing of any organization is named.
        raise ServiceUnavailable(UNFINISHED, headers={"Retry-After": str(RETRY_UNFINISHED)})
    feedback = [
        {
            "token_hash": hashlib.sha256(token["token"].encode()).hexdigest(),
            "token_type": token["type"],
            "label": "true_positive" if matched else "false_positive",
        }
        for token, matched in zip(tokens, outcomes, strict=True)
    ]
    return web.json_response(feedback)
