"""bench/floor.py, the benchmark's floor: it must do the work it claims, and
answer the bytes keysvc answered, each with its own request ID."""

import asyncio
import json
import uuid
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from bench import floor
from bench.baseline import ROUTES, Shape

ORG, KEY = str(uuid.uuid4()), str(uuid.uuid4())
CAPTURED = "0" * 8 + "-0000-4000-8000-" + "0" * 12


def _shapes() -> dict[str, Shape]:
    body = json.dumps({"status": 200, "requestId": CAPTURED, "result": {"id": KEY}}).encode()
    keyed = Shape(200, {"Content-Type": "application/json; charset=utf-8"}, body)
    verify = Shape(200, {"X-Key-Id": KEY}, b"")
    return {"get": keyed, "list": keyed, "create": keyed, "verify": verify}


async def test_the_floor_does_its_work_with_fresh_ids(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    app = floor.create_app(_shapes(), log)
    async with TestClient(TestServer(app)) as client:
        seen = []
        for _ in range(2):
            response = await client.get(
                f"/v1/organizations/{ORG}/keys/{KEY}", headers={"Authorization": "Basic abc"}
            )
            body = await response.json()
            assert response.status == 200 and body["result"] == {"id": KEY}
            assert body["requestId"] == response.headers["X-Request-Id"] != CAPTURED
            assert uuid.UUID(body["requestId"]).version == 4
            seen.append(body["requestId"])
        assert seen[0] != seen[1]
        verified = await client.get("/v1/verify", headers={"Authorization": "Basic abc"})
        assert verified.status == 200 and verified.headers["X-Key-Id"] == KEY
        assert await verified.read() == b""
        for _ in range(100):  # the writer gathers lines for GATHER_SECONDS
            if log.exists() and len(log.read_text().splitlines()) == 3:
                break
            await asyncio.sleep(floor.GATHER_SECONDS)
        state = app[floor.FLOOR]
        assert len(state.seen) == 1  # one header, proven once, then looked up
        get = (ROUTES["get"][1], "GET", 200)
        assert state.counts == {get: 2, ("/v1/verify", "GET", 200): 1}
        state.keys.clear()  # as if the key had left the cache: the proof no longer holds
        refused = await client.get("/v1/verify", headers={"Authorization": "Basic abc"})
        assert refused.status == 401
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["requestId"] for line in lines[:2]] == seen
    assert [line["route"] for line in lines] == [ROUTES["get"][1]] * 2 + ["/v1/verify"]
