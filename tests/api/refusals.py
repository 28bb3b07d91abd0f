"""What a refused authentication shows: its answer, and the metrics' count of
refusals as an unknown key or a wrong secret, for tests that compare one refusal
with an unknown key's."""

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import UNAUTHORIZED, Client, Creds, assert_error


async def invalid_credentials(client: Client, reason: str = "invalid_credentials") -> float:
    """The metrics' count of authentications refused as unknown key or wrong secret, or
    for another ``reason``."""
    text = await (await client.get("/metrics")).text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "keysvc_auth_outcomes_total" and sample.labels == {"reason": reason}:
                return sample.value
    return 0.0


async def refusal(client: Client, creds: Creds) -> tuple[int, dict[str, Any], dict[str, str]]:
    """The 401 for ``creds``: status, body without its requestId, and the headers that
    are not the request's own."""
    response = await client.get("/v1/whoami", headers=creds.headers)
    body = await assert_error(response, 401, UNAUTHORIZED)
    headers = {
        name.lower(): value
        for name, value in response.headers.items()
        if name.lower() not in ("x-request-id", "date", "content-length")
    }
    return response.status, {k: v for k, v in body.items() if k != "requestId"}, headers
