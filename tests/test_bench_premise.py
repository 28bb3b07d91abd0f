"""bench/premise.py, the issue's premise apps: each reads the key's row from a real
seeded database, then answers what the baseline answers, or 404 without a row."""

import uuid
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bench import premise, seed
from bench.baseline import ROUTES, Shape

SHAPE = Shape(200, {"Content-Type": "application/json; charset=utf-8"}, b'{"status": 200}')


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> seed.Seeded:
    return seed.seed(tmp_path_factory.mktemp("premise") / "keysvc.db", 3, rotate=3)


def _path(seeded: seed.Seeded, key: str) -> str:
    return ROUTES["get"][1].format(organizationId=seeded.organization_id, keyId=key)


@pytest.mark.parametrize("read", premise.READS)
async def test_a_row_read_then_the_baselines_answer(seeded: seed.Seeded, read: str) -> None:
    app = premise.create_app(SHAPE, seeded.db, read)
    async with TestClient(TestServer(app)) as client:
        ids = []
        for cred in seeded.sample:
            response = await client.get(_path(seeded, cred.id))
            assert response.status == 200
            assert await response.read() == SHAPE.body
            ids.append(response.headers["X-Request-Id"])
        assert len(set(ids)) == len(seeded.sample)  # fresh, as the baseline's are
        missing = await client.get(_path(seeded, str(uuid.uuid4())))
        assert missing.status == 404


@pytest.mark.parametrize("read", premise.READS)
async def test_the_database_is_opened_read_only(seeded: seed.Seeded, read: str) -> None:
    before = seeded.db.read_bytes()
    app = premise.create_app(SHAPE, seeded.db, read)
    async with TestClient(TestServer(app)) as client:
        assert (await client.get(_path(seeded, seeded.sample[0].id))).status == 200
    assert seeded.db.read_bytes() == before


def test_an_unknown_read_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="read: one of"):
        premise.create_app(SHAPE, tmp_path / "none.db", "postgres")
