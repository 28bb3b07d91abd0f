"""The bench's PostgreSQL path (C, bench/postgres.py and bench.seed.seed_postgres), on
the throwaway cluster the bench starts itself: seeded by keysvc's import with the keys
SQLite's seeding makes from the same seed, served by a real `keysvc serve`, and a tiny run of
bench.run with C writing the PostgreSQL section beside SQLite's."""

import json
from pathlib import Path

import pytest

from bench import postgres, run, scenarios, seed
from bench.servers import start_keysvc
from tests.components import require_command


@pytest.fixture
def cluster() -> postgres.Cluster:
    bindir = postgres.server_bin()
    if bindir is None:
        require_command("initdb", package="postgresql")  # skips, or fails under CI
    assert bindir is not None
    return postgres.Cluster(bindir)


def test_postgres_is_seeded_with_sqlites_keys_and_serves_them(
    cluster: postgres.Cluster, tmp_path: Path
) -> None:
    with cluster:
        on_pg = seed.seed_postgres(cluster.url, postgres.PEPPER, 3, rotate=8, others=40)
        on_sqlite = seed.seed(tmp_path / "keysvc.db", 3, rotate=8, others=40)
        # The same key IDs and secrets; the UUIDs are each import's own.
        pairs = [(c.key_id, c.secret) for c in on_pg.sample]
        assert pairs == [(c.key_id, c.secret) for c in on_sqlite.sample]
        assert len(on_pg.others) == len(on_sqlite.others) == 40
        for group in ("credited", "limited", "identified", "both"):
            pairs = [(c.key_id, c.secret) for c in getattr(on_pg, group)]
            assert pairs == [(c.key_id, c.secret) for c in getattr(on_sqlite, group)], group
        env = {"KEYSVC_PEPPER": postgres.PEPPER}
        with start_keysvc(on_pg.db, tmp_path / "keysvc.log", env) as server:
            for scenario in scenarios.SCENARIOS:
                line = scenario.lines(on_pg)[0]
                assert scenarios.probe(server.base, line).status == 200, scenario.name
            line = scenarios.BY_NAME["verify-identity-both"].lines(on_pg)[0]
            spent = scenarios.probe(server.base, line).headers["X-Credits-Identity-Remaining"]
            assert spent == str(seed.CREDITS - 2)
            listed = scenarios.probe(server.base, scenarios.BY_NAME["list"].lines(on_pg)[0])
            answer = json.loads(listed.body)
            # The admin key and the create scenario's too; the count is the one
            # PostgreSQL's triggers kept.
            assert (answer["totalCount"], len(answer["result"])) == (45, 45)


def test_a_tiny_run_writes_the_postgres_section(tmp_path: Path) -> None:
    require_command("wrk", package="wrk")
    if postgres.server_bin() is None:
        require_command("initdb", package="postgresql")
    doc = tmp_path / "PERFORMANCE.md"
    argv = ["--backend", "postgres", "--only", "get,verify", "--rounds", "1", "--seconds", "1"]
    argv += ["--warmup", "0", "--others", "3", "--rotate", "5", "--doc", str(doc)]
    assert run.main(argv) == 0
    text = doc.read_text()
    main = text.split("<!-- bench:postgres -->")[0]
    assert "| A req/s | B req/s | B/A |" in main and "C req/s" not in main
    section = text.split("<!-- bench:postgres -->")[1]
    assert "| B req/s | C req/s | C/B |" in section
    assert "- target: verify and GET on a cache hit" in section
