"""bench/seed.py seeds through keysvc's own import (issue 37): one activity a batch
says so, and a real ``keysvc serve`` answers every scenario's keys as the scenario
needs them: credits, a named limit, identities with shared credits, the others read
by the admin with a usedAt."""

import json
import sqlite3
from pathlib import Path

from bench import scenarios, seed
from bench.servers import start_keysvc


def test_the_seed_imports_keys_that_every_scenario_can_use(tmp_path: Path) -> None:
    seeded = seed.seed(tmp_path / "keysvc.db", 3, rotate=8, others=40)
    groups = [seeded.credited, seeded.limited, seeded.identified, seeded.both]
    assert (len(seeded.sample), len(seeded.others), [len(g) for g in groups]) == (3, 40, [8] * 4)
    with sqlite3.connect(seeded.db) as conn:
        imported = conn.execute("select after from activities where type = 'key_import'")
        assert [json.loads(row[0])["count"] for row in imported] == [43]
    with start_keysvc(seeded.db, tmp_path / "keysvc.log") as server:
        answers = {
            s.name: scenarios.probe(server.base, s.lines(seeded)[0]) for s in scenarios.SCENARIOS
        }
        assert {name: a.status for name, a in answers.items()} == {
            s.name: 200 for s in scenarios.SCENARIOS
        }
        spent = str(seed.CREDITS - 1)
        assert answers["verify-credits"].headers["X-Credits-Remaining"] == spent
        assert "X-Credits-Remaining" not in answers["verify-identity"].headers
        assert answers["verify-identity"].headers["X-Credits-Identity-Remaining"] == spent
        both = answers["verify-identity-both"].headers
        assert (both["X-Credits-Remaining"], both["X-Credits-Identity-Remaining"]) == (spent,) * 2
        limited = scenarios.Line(
            "GET",
            f"/v1/organizations/{seeded.organization_id}/keys/{seeded.limited[0].id}",
            scenarios.basic(seeded.admin),
        )
        assert json.loads(scenarios.probe(server.base, limited).body)["result"]["ratelimits"] == (
            seed.LIMITS
        )
        other = json.loads(answers["get-other"].body)["result"]
        assert other["id"] == seeded.others[0] and other["usedAt"] is not None
