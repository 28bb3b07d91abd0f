"""``GET /`` names every place to start, the console among them, and each link it
gives answers without credentials; the OpenAPI document describes the same fields."""

from tests.helpers import Client, assert_ok


async def test_root_links_to_the_console_too(client: Client) -> None:
    result = await assert_ok(await client.get("/"))  # no credentials
    assert result == {"console": "/console", "docs": "/docs", "openapi": "/v1/openapi.json"}
    console = await client.get(result["console"])
    assert (console.status, console.content_type) == (200, "text/html")


async def test_the_document_describes_the_root_s_fields(client: Client) -> None:
    document = await (await client.get("/v1/openapi.json")).json()
    answer = document["paths"]["/"]["get"]["responses"]["200"]["content"]["application/json"]
    text = repr(answer)
    assert all(field in text for field in ("console", "docs", "openapi")), text
