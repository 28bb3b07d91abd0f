"""bench/report.py: the table compares requests/s, but p99 for a paced scenario, where
every app got the same rate; bench/scenarios.py: each scenario calls a baseline route."""

from bench import baseline, report, scenarios
from bench.report import Cell, Column
from bench.wrk import Result

A = Column("A", "baseline", False)
B = Column("B", "keysvc", True)


def _result(rps: float, p99_ms: float) -> Result:
    return Result(int(rps), 1.0, int(rps) * 100, 0, 0, p99_ms / 2, p99_ms)


def test_a_paced_row_gives_the_p99_ratio_and_a_flat_out_row_the_rate_ratio() -> None:
    grid = {
        "verify": {"A": Cell([_result(10_000, 2.0)]), "B": Cell([_result(6_000, 4.0)], 0)},
        "verify-paced": {"A": Cell([_result(3_000, 1.0)]), "B": Cell([_result(2_990, 1.2)], 0)},
    }
    names = [("verify", "flat out"), ("verify-paced", "paced")]
    rows = report.table(names, [A, B], grid, paced=["verify-paced"]).splitlines()[2:]
    flat, paced = ([cell.strip() for cell in row.split("|")[1:-1]] for row in rows)
    assert flat[:4] == ["flat out", "10,000", "6,000", "0.60"]
    assert paced[:4] == ["paced", "3,000", "2,990", "p99 1.20"]
    assert paced[6:8] == ["-", "-"]  # hey's byte counts are not wrk's


def test_every_scenario_calls_a_baseline_route_and_paced_ones_follow_their_peak() -> None:
    order = [s.name for s in scenarios.SCENARIOS]
    for scenario in scenarios.SCENARIOS:
        assert scenario.calls in baseline.ROUTES
        if scenario.paced:
            assert order.index(scenario.calls) < order.index(scenario.name)
    assert scenarios.BY_NAME["get-other"].calls == "get"
